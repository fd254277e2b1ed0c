"""Two trials on a 2-core machine: one worker with 2 threads, or two workers with 1 thread each?

    python benchmarks/thread_policy.py [--config benchmarks/configs/transformer_small.yaml] [--steps 60]

Runs the same training run (``harness.train``, the config's model, ``--steps`` steps) twice
in each arrangement, every run in its own process with ``OMP_WAIT_POLICY=PASSIVE``:

- ``1 worker x 2 threads``: the two runs one after the other, ``train.num_threads = 2``;
- ``2 workers x 1 thread``: the two runs at the same time, ``train.num_threads = 1`` each
  (what ``harness.runtime.threads`` gives two local workers on 2 cores).

Measured: the wall time of the two runs (the study's throughput: trials per hour follow from
it) and each run's ``cost/train_tokens_per_s``. The arrangements alternate ``--repeats``
times (A, B, A, B, ...) so a change in the machine's load hits both. Appended to
``benchmarks/thread_policy.md`` with the machine, its load and the command.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.bench import common

CHILD = """
import json, sys, yaml, harness
cfg = yaml.safe_load(open(sys.argv[1]))
cfg.setdefault("train", {}).update(max_steps=int(sys.argv[2]), num_threads=int(sys.argv[3]), progress=False,
                                   log_attention=False)
r = harness.train(cfg)
print(json.dumps({"tokens_per_s": r.metrics["cost/train_tokens_per_s"], "threads": r.metrics["cost/cpu_threads"]}))
"""


def start(config: str, steps: int, threads: int, home: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "HARNESS_HOME": str(home)}
    return subprocess.Popen([sys.executable, "-c", CHILD, config, str(steps), str(threads)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def finish(proc: subprocess.Popen[str]) -> dict[str, float]:
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"a run failed (exit {proc.returncode})")
    return json.loads(out.strip().splitlines()[-1])


def arrangement(workers: int, config: str, steps: int, home: Path) -> tuple[float, list[float]]:
    """Two runs: ``workers`` = 1 (sequential, 2 threads) or 2 (concurrent, 1 thread each)."""
    t0 = time.perf_counter()
    if workers == 1:
        results = [finish(start(config, steps, 2, home)) for _ in range(2)]
    else:
        procs = [start(config, steps, 1, home) for _ in range(2)]
        results = [finish(p) for p in procs]
    return time.perf_counter() - t0, [r["tokens_per_s"] for r in results]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="benchmarks/configs/transformer_small.yaml")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=str(Path(__file__).with_suffix(".md")))
    args = ap.parse_args()
    load = common.load_line()
    walls: dict[int, list[float]] = {1: [], 2: []}
    speeds: dict[int, list[float]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory(prefix="harness-threads-") as tmp:
        for _ in range(args.repeats):
            for workers in (1, 2):
                wall, tps = arrangement(workers, args.config, args.steps, Path(tmp) / ".harness")
                walls[workers].append(wall)
                speeds[workers].extend(tps)
                print(f"{workers} worker(s): {wall:.1f} s for two runs, tokens/s {[round(t) for t in tps]}",
                      flush=True)
    rows = [f"| {label} | {statistics.median(walls[w]):.1f} | {', '.join(f'{x:.1f}' for x in walls[w])} | "
            f"{statistics.median(speeds[w]):,.0f} | {statistics.median(walls[1]) / statistics.median(walls[w]):.2f} |"
            for w, label in ((1, "1 worker x 2 threads"), (2, "2 workers x 1 thread"))]
    common.append_record(args.out, "", f"python benchmarks/thread_policy.py --config {args.config} --steps "
                         f"{args.steps} --repeats {args.repeats}", load, [
        "| arrangement | wall for two runs, median (s) | each repeat (s) | tokens/s per run, median | "
        "throughput vs 1 x 2 |",
        "|---|---|---|---|---|",
        *rows,
    ])


if __name__ == "__main__":
    main()
