"""``harness data prepare`` throughput and peak memory on a generated corpus.

    python benchmarks/data_prepare.py [--sizes 20 200] [--tokenizers bytes bpe:8192] [--workers 1 2]

Generates a corpus of each size in MB (JSONL files of 25 MB, documents of 50-2,000 words drawn
from a Zipf-distributed vocabulary of 20,000 made-up words with punctuation and some
non-ASCII letters; seeded, so every run reads the same text), then prepares it with each
tokenizer in a fresh process and measures: wall time, text MB/s (UTF-8 bytes of the
documents over the wall time, tokenizer learning included), the peak resident set of the
preparing process (its ``VmHWM``) and the largest of its worker processes (``ru_maxrss`` of
its children: an upper bound, as it includes the preparing process's resident set at the
moment it spawned them). Memory must not grow with the corpus: compare the rows of two sizes
10x apart. Appended to
``benchmarks/data.md`` with the machine, its load and the command.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from harness.bench import common

FILE_MB = 25
CHILD = """
import json, resource, sys, time
from harness.data.prepare import prepare
def hwm_mb():  # this process's own high-water mark (ru_maxrss would include the forked parent's)
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024
args = json.loads(sys.argv[1])
t0 = time.perf_counter()
result = prepare(args["sources"], args["out"], tokenizer=args["tokenizer"], workers=args["workers"], progress=False)
seconds = time.perf_counter() - t0
m = result.manifest
print(json.dumps({
    "seconds": seconds,
    "text_bytes": sum(s["bytes"] for s in m["splits"].values()),
    "tokens": sum(s["tokens"] for s in m["splits"].values()),
    "self_mb": hwm_mb(),
    "workers_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
}))
"""


def vocabulary(rng: np.random.Generator, size: int = 20_000) -> list[str]:
    letters = list("abcdefghijklmnopqrstuvwxyz") * 4 + list("éèüößçñ")
    return ["".join(rng.choice(letters, size=int(rng.integers(1, 11)))) for _ in range(size)]


def generate(folder: Path, mb: int, seed: int = 0) -> list[Path]:
    """JSONL files of about ``mb`` MB of text in all (see the module)."""
    rng = np.random.default_rng(seed)
    words = np.array(vocabulary(rng))
    ranks = np.arange(1, len(words) + 1)
    p = 1.0 / ranks
    p /= p.sum()
    punct = np.array(["", "", "", "", "", ",", ".", ";", "!", "?"])
    files, written, index = [], 0, 0
    target = mb * 1_000_000
    while written < target:
        path = folder / f"part-{index:04d}.jsonl"
        size = 0
        with open(path, "w", encoding="utf-8") as f:
            while size < FILE_MB * 1_000_000 and written + size < target:
                n = int(rng.integers(50, 2000))
                text = " ".join(w + q for w, q in zip(rng.choice(words, size=n, p=p),
                                                      rng.choice(punct, size=n), strict=True))
                line = json.dumps({"text": text}, ensure_ascii=False) + "\n"
                f.write(line)
                size += len(line.encode())
        files.append(path)
        written += size
        index += 1
    return files


def measure(sources: list[Path], tokenizer: str, workers: int, out: Path) -> dict[str, float]:
    job = {"sources": [str(s) for s in sources], "out": str(out), "tokenizer": tokenizer, "workers": workers}
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(job)], capture_output=True, text=True,
                          check=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    shutil.rmtree(out, ignore_errors=True)
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[20, 200], help="corpus sizes in MB")
    parser.add_argument("--tokenizers", nargs="+", default=["bytes", "bpe:8192"])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--out", default="benchmarks/data.md")
    parser.add_argument("--scratch", default=None, help="folder for the generated corpora (default: a temporary one)")
    args = parser.parse_args()
    load_before = common.load_line()
    rows = ["| corpus MB | tokenizer | workers | wall s | text MB/s | tokens | peak RSS MB (main) | "
            "peak RSS MB (largest worker) |", "|---|---|---|---|---|---|---|---|"]
    scratch = Path(args.scratch or tempfile.mkdtemp(prefix="harness-data-bench-"))
    try:
        for mb in args.sizes:
            folder = scratch / f"corpus-{mb}"
            folder.mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            sources = generate(folder, mb)
            print(f"generated {mb} MB in {time.perf_counter() - t0:.0f} s", flush=True)
            for tok in args.tokenizers:
                for workers in args.workers:
                    r = measure(sources, tok, workers, scratch / "prepared")
                    row = (f"| {mb} | {tok} | {workers} | {r['seconds']:.1f} | "
                           f"{r['text_bytes'] / 1e6 / r['seconds']:.1f} | {int(r['tokens']):,} | "
                           f"{r['self_mb']:.0f} | {r['workers_mb']:.0f} |")
                    print(row, flush=True)
                    rows.append(row)
            shutil.rmtree(folder)
    finally:
        if not args.scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    command = "python " + " ".join(sys.argv)
    common.append_record(args.out, "harness data prepare: throughput and peak memory", command, load_before, rows)


if __name__ == "__main__":
    main()
