"""Where the harness's tiny step differs from a bare Lightning Trainer's, function by function.

    python benchmarks/step_cost/profile_diff.py [--steps 1000] [--top 45]

cProfile over the same number of steps of each (the harness's ``train`` and a bare
``L.Trainer`` on the same model, optimiser and clipping, 16 batches collated once), in one
process, one torch thread; prints the functions whose own time grew most in the harness. A
profiler inflates Python-heavy code: read the ranking, not the milliseconds
(benchmarks/step_cost.md, "Where the tiny shape's remaining gap goes"). The harness's
figures include its per-run setup (registry, MLflow store).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--top", type=int, default=45)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import lightning as L
    from step_cost import Batches, bare_module, collated, config, single_thread

    from harness.config import parse_run_config
    from harness.run.build import build
    from harness.run.pipeline import train
    from harness.run.plan import load_registry, plan

    single_thread()
    n = args.steps
    cfg = parse_run_config(config("tiny", n, None))
    p = plan(cfg, load_registry(cfg, None))
    built = build(p)
    batches = collated(p, built, cfg.train.batch_size)
    t = cfg.train

    def bare() -> None:
        trainer = L.Trainer(max_steps=n, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False, gradient_clip_val=t.grad_clip,
                            num_sanity_val_steps=0, limit_val_batches=0)
        trainer.fit(bare_module(built.model, p.fmt, t), train_dataloaders=Batches([batches[i % 16] for i in range(n)]))

    def harness() -> None:
        train(config("tiny", n, None))

    train(config("tiny", 5, None))  # first-use costs out of the profile
    stats = {}
    for name, run in (("bare", bare), ("harness", harness)):
        profile = cProfile.Profile()
        profile.enable()
        run()
        profile.disable()
        stats[name] = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    total = {k: sum(v[2] for v in s.values()) for k, s in stats.items()}
    print(f"own time in all functions: bare Lightning {total['bare']:.3f} s, harness {total['harness']:.3f} s "
          f"({n} steps each, profiled)")
    rows = []
    for key in set(stats["bare"]) | set(stats["harness"]):
        b, h = stats["bare"].get(key, (0, 0, 0.0)), stats["harness"].get(key, (0, 0, 0.0))
        rows.append((h[2] - b[2], h[1], b[1], key))
    site = str(Path(L.__file__).resolve().parents[1]) + "/"
    print("| own time harness - bare, s | calls harness | calls bare | function |\n|---|---|---|---|")
    for diff, hn, bn, (path, line, func) in sorted(rows, reverse=True)[: args.top]:
        print(f"| {diff:+.3f} | {hn} | {bn} | {path.replace(site, '')}:{line} ({func}) |")


if __name__ == "__main__":
    main()
