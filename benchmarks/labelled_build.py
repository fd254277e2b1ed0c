"""What building a labelled task costs: time and peak memory of tokenizing a labelled file
when ``text_classification`` is built (the labelled tasks tokenize at build, see
docs/data.md, "Labelled data").

    python benchmarks/labelled_build.py [--records 20000 200000] [--tokenizers bytes chars bpe:1000]

Generates ``--records`` JSONL records of 16 words (about 117 bytes each, 5 labels) in a
temporary folder, then builds the task in a fresh process per (records, tokenizer), so each
peak RSS is that build's alone (the process's maximum resident set, the imports included).
Appends the table to ``benchmarks/labelled_build.md`` (``--out``) with the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]

CHILD = """
import json, resource, sys, time, warnings
import harness
warnings.simplefilter("ignore")
registry = harness.load_plugins()
start = time.perf_counter()
task = harness.create_task("text_classification", registry=registry, train=sys.argv[1],
                           tokenizer=sys.argv[2], length=128)
seconds = time.perf_counter() - start
tokens = sum(len(task.tokens[s].ids) for s in ("train", "val", "test"))
print(json.dumps({"seconds": seconds, "tokens": tokens,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def generate(path: Path, n: int) -> None:
    rng = random.Random(0)
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(16)),
                                "label": str(i % 5)}) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, nargs="+", default=[20_000, 200_000])
    ap.add_argument("--tokenizers", nargs="+", default=["bytes", "chars", "bpe:1000"])
    ap.add_argument("--out", type=Path, default=HERE / "labelled_build.md", help="the record to append to")
    args = ap.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    load_start = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.records:
            path = Path(tmp) / f"records_{n}.jsonl"
            generate(path, n)
            for spec in args.tokenizers:
                out = subprocess.run([sys.executable, "-c", CHILD, str(path), spec], env=env,
                                     capture_output=True, text=True, check=True)
                r = json.loads(out.stdout.strip().splitlines()[-1])
                rows.append(f"| {n:,} | {path.stat().st_size / 1e6:.1f} | `{spec}` | {r['seconds']:.1f} | "
                            f"{r['tokens'] / 1e6:.2f} | {r['rss_mb']:.0f} |")
                print(rows[-1], flush=True)
    load_end = os.getloadavg()
    record = "\n".join([
        f"## {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
        f"`python benchmarks/labelled_build.py --records {' '.join(map(str, args.records))} "
        f"--tokenizers {' '.join(args.tokenizers)}`", "",
        f"Machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}; load average "
        f"{load_start[0]:.1f} / {load_start[1]:.1f} / {load_start[2]:.1f} at the start, "
        f"{load_end[0]:.1f} at the end (shared machine).", "",
        "| records | MB | tokenizer | build (s) | tokens stored (M) | peak RSS (MB) |",
        "|---|---|---|---|---|---|", *rows, "", ""])
    with args.out.open("a") as f:
        f.write(record)


if __name__ == "__main__":
    main()
