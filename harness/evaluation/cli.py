"""``harness eval RUN_ID --tasks ...``: lm-eval tasks on a trained run, logged to its MLflow run
(:mod:`harness.evaluation.runner`). Imports lm-eval and torch only when the command runs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def require_lm_eval() -> None:
    import importlib.util

    from harness.errors import HarnessError

    if importlib.util.find_spec("lm_eval") is None:
        raise HarnessError("harness eval needs lm-evaluation-harness: pip install "
                           "'attention-harness[eval]' (lm-eval 0.4.x).")


def cmd_eval(args: argparse.Namespace) -> int:
    import os

    from harness.errors import ConfigError
    from harness.runtime.noise import verbose_from_env

    if not verbose_from_env():  # lm-eval's progress bars (tqdm reads this when it is imported)
        os.environ.setdefault("TQDM_DISABLE", "1")

    require_lm_eval()
    if args.out is not None and Path(args.out).exists():
        raise ConfigError(f"--out {args.out} already exists; give a new file for the results JSON.")
    if args.limit is not None and args.limit <= 0:
        raise ConfigError(f"--limit must be positive (a count, or a fraction below 1), got {args.limit}.")
    from harness.evaluation import runner

    tasks = [t for t in args.tasks.split(",") if t.strip()]
    limit = int(args.limit) if args.limit is not None and args.limit >= 1 else args.limit
    results = runner.evaluate(args.run, tasks, include_path=args.include_path, limit=limit,
                              num_fewshot=args.num_fewshot, batch_size=args.batch_size,
                              max_length=args.max_length, seed=args.seed)
    values = runner.metrics(results)
    width = max((len(k) for k in values), default=0)
    for key, value in sorted(values.items()):
        print(f"{key:<{width}}  {value:.4f}")
    if args.out is not None:
        Path(args.out).write_text(json.dumps(runner.jsonable(results), indent=1))
        print(f"results written to {args.out}")
    if Path(args.run).is_dir() or args.no_log:
        print("(not logged: " + ("--no-log" if args.no_log else f"{args.run} is a folder, not a run") + ")")
    else:
        runner.record(args.run, results, args.tracking_uri)
        print(f"logged to run {args.run}: {len(values)} metrics eval/<task>/<metric> and "
              f"{runner.RESULTS_ARTIFACT}")
    return 0


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("eval", help="score a trained language-model run on lm-eval tasks (offline)",
                       description="Run lm-evaluation-harness tasks on a trained language-model run "
                                   "(a run id, or a folder written by `harness export`) through its "
                                   "own tokenizer, and log the results to the run as metrics "
                                   "eval/<task>/<metric> and the artifact eval/results.json. Task "
                                   "data is read from local files (--include-path: a folder of task "
                                   "YAMLs; docs/evaluation.md); nothing is downloaded.")
    p.add_argument("run", metavar="RUN_ID_OR_DIR")
    p.add_argument("--tasks", required=True, help="comma-separated lm-eval task names")
    p.add_argument("--include-path", default=None, metavar="DIR", help="a folder of task YAMLs")
    p.add_argument("--limit", type=float, default=None,
                   help="documents per task (a fraction below 1: that share)")
    p.add_argument("--num-fewshot", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--max-length", type=int, default=None,
                   help="the model's context in tokens (default: the longest input it trained on)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, metavar="FILE", help="also write the results JSON here")
    p.add_argument("--tracking-uri", default=None)
    p.add_argument("--no-log", action="store_true", help="print only; log nothing to the run")
    p.set_defaults(handler=cmd_eval)
