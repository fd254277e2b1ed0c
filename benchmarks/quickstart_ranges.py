"""Evidence for studies/quickstart.yaml's search ranges: each candidate's tuned configuration
trained at learning rates and weight decays inside and past the ranges, on the study's tuning
seed (0) and one more, scored by the study's objective (val/acc at length 24, copy task,
400 steps, the cpu profile's settings).

    OMP_WAIT_POLICY=PASSIVE python benchmarks/quickstart_ranges.py > benchmarks/quickstart_ranges.md

Prints a Markdown table per candidate (mean over the seeds, each seed in brackets) with the
machine and its load; the quickstart's header cites the record.
"""

from __future__ import annotations

import copy
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "benchmarks" / "studies" / "quickstart" / "configs"  # the tuned configurations
GRID = {  # (lr, weight_decay): inside the ranges [1e-3, 1e-2] x [0, 0.1] and past them
    "nope": [(3e-3, 0.09), (9.4e-3, 0.09), (2e-2, 0.09), (9.4e-3, 0.3), (2e-2, 0.3)],
    "sinusoidal": [(3.5e-3, 0.07), (2e-2, 0.07)],
    "rope": [(3e-4, 0.07), (1.2e-3, 0.07), (2e-2, 0.07)],
}
SEEDS = (0,)  # the study's tuning seed


def main() -> None:
    import harness
    from harness.keys import val_key

    store = tempfile.mkdtemp(prefix="quickstart-ranges-")
    os.environ["HARNESS_HOME"] = store
    started, load0 = time.time(), os.getloadavg()
    out = ["# Quickstart search ranges: the objective past the ranges", "",
           "`OMP_WAIT_POLICY=PASSIVE python benchmarks/quickstart_ranges.py` on "
           f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
           f"{platform.python_version()}; load average at start {load0[0]:.2f}.", "",
           "Each candidate's tuned configuration (benchmarks/studies/quickstart/configs/) with "
           "train.lr and train.weight_decay set as listed, seeds " + ", ".join(map(str, SEEDS)) +
           "; val/acc at length 24 (the study's objective), mean [per seed]. Ranges searched "
           "until this record: lr [1e-3, 1e-2] (log), weight_decay [0, 0.1].", ""]
    for name, grid in GRID.items():
        base = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
        base["train"].update(progress=False, save_model=False, log_attention=False)
        out += [f"## {name}", "", "| lr | weight_decay | val/acc @24 | val/acc @12 |", "|---|---|---|---|"]
        for lr, wd in grid:
            scores, at12 = [], []
            for seed in SEEDS:
                cfg = copy.deepcopy(base)
                cfg["train"].update(lr=lr, weight_decay=wd, seed=seed)
                result = harness.train(cfg)
                scores.append(result.metrics[val_key("acc", 24)])
                at12.append(result.metrics[val_key("acc", 12)])
            out.append(f"| {lr:g} | {wd:g} | {sum(scores) / len(scores):.4f} "
                       f"[{', '.join(f'{s:.4f}' for s in scores)}] | {sum(at12) / len(at12):.4f} |")
            print(out[-1], file=sys.stderr, flush=True)
        out.append("")
    load1 = os.getloadavg()
    out.append(f"{time.time() - started:.0f} s wall; load average at end {load1[0]:.2f} "
               f"(5-minute {load1[1]:.2f}).")
    print("\n".join(out))


if __name__ == "__main__":
    main()
