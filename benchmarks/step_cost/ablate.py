"""One of the harness's per-step cuts against its reversal, in one process, alternating.

    python benchmarks/step_cost/ablate.py [--steps 800] [--alternations 4]

Trains issue 51's tiny shape (benchmarks/step_cost.py) with ``harness.train`` as it is and
with a cut reverted: ``setattr`` puts ``nn.Module.__setattr__`` back for Lightning's
``_current_fx_name`` (the harness's module stores it directly: harness/run/system.py). Each
run's step time is taken between consecutive ``on_train_batch_start`` calls after the first
100 steps; printed: the median of each run's median step, per variant, and the runs' means.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--alternations", type=int, default=4)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import torch
    from step_cost import config, single_thread

    from harness.run import system
    from harness.run.pipeline import train

    single_thread()
    stamps: list[float] = []
    system.HarnessSystem.on_train_batch_start = lambda self, batch, idx: stamps.append(time.perf_counter())
    kept = system.HarnessSystem.__dict__["__setattr__"]

    def run(reverted: bool) -> tuple[float, float]:
        if reverted:
            system.HarnessSystem.__setattr__ = torch.nn.Module.__setattr__  # type: ignore[method-assign,assignment]
        try:
            stamps.clear()
            train(config("tiny", args.steps, None))
        finally:
            system.HarnessSystem.__setattr__ = kept  # type: ignore[method-assign]
        steps = [b - a for a, b in zip(stamps[100:], stamps[101:], strict=False)]
        return 1000 * statistics.median(steps), 1000 * statistics.fmean(steps)

    train(config("tiny", 5, None))  # first-use costs
    results: dict[str, list[Any]] = {"as it is": [], "setattr reverted": []}
    for _ in range(args.alternations):
        for name in results:
            results[name].append(run(name != "as it is"))
    print("| variant | median of the runs' median step, ms | each run's mean step, ms |\n|---|---|---|")
    for name, runs in results.items():
        print(f"| {name} | {statistics.median(m for m, _ in runs):.3f} | "
              f"{', '.join(f'{mean:.2f}' for _, mean in runs)} |")


if __name__ == "__main__":
    main()
