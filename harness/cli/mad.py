"""``harness mad``: a MAD suite (``kind: mad``, docs/mad.md) from start to report.

Each MAD task runs as an ordinary study (its candidates: every suite candidate at every
setting, tuned on the grid; :mod:`harness.study.mad`), in the same Optuna storage and MLflow
experiment; a second run of the command resumes them. When every task is complete the MAD
report (:mod:`harness.report.mad`) is written and logged to its own MLflow run. Only argparse
is imported at the top: ``harness --help`` stays fast.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from harness.cli.completion import hint


def cmd_mad(args: argparse.Namespace) -> int:
    from harness.cli.main import ctrl_c
    from harness.runtime.threads import passive_wait

    passive_wait()
    with ctrl_c("Finished trials are kept; run the same command again to resume."):
        return _mad(args)


def _mad(args: argparse.Namespace) -> int:
    from harness.store import tracking
    from harness.study.cli import _check_storage, _quiet
    from harness.study.mad import load_suite, studies

    print(f"reading {args.file} ...", flush=True)
    suite = load_suite(args.file, args.profile, args.set, args.suite_name)
    configs = studies(suite)  # every task's study validated as a study file is
    tracking.preflight(args.tracking_uri)
    _check_storage(args.storage)
    if suite.profile:
        print(f"profile: {suite.profile} (suite '{suite.name}'; choose another with --profile)", flush=True)
    print(f"suite '{suite.name}': {len(suite.candidates)} candidate(s) x {len(configs)} task(s); "
          f"checking them against the installed plugins (loads torch) ...", flush=True)
    from harness.study.space import load_registry, validate

    registry = load_registry(next(iter(configs.values())))
    spaces = {task: validate(cfg, registry) for task, cfg in configs.items()}  # all before any run
    from harness.study.storage import open_storage, storage_url

    _quiet(workers=True)
    url = storage_url(args.storage)
    r = next(iter(configs.values())).resume
    storage = open_storage(url, r.heartbeat_s, r.grace_s, r.max_retry)
    handles = _run_tasks(suite, spaces, storage, url, args)
    if handles is None:
        return 1
    from harness.report.mad import gather, write

    name = str(suite.name)  # load_suite names every suite
    out = Path(args.out) if args.out else tracking.home() / "reports" / name
    res = gather(suite, handles)
    first = next(iter(handles.values()))
    folder, run = write(res, out, first.tracker, name)
    print(f"MAD report: {folder / 'mad.md'} (also {folder / 'mad.html'}, mad.json and a figure "
          f"per task); MLflow run {run} in experiment '{suite.name}'")
    for cand in sorted(res.candidates, key=lambda c: -_finite(res.score(c).mean)):
        print(f"  {cand}: MAD score {100 * res.score(cand).mean:.1f}")
    return 0


def _finite(value: float) -> float:
    return value if value == value else -1.0


def _run_tasks(suite: Any, spaces: dict[str, Any], storage: Any, url: str,
               args: argparse.Namespace) -> dict[str, Any] | None:
    """Create (or resume) and run each task's study; None when one is not complete."""
    from harness.study.display import StudyDisplay
    from harness.study.storage import create_or_resume
    from harness.study.worker import run_worker

    handles = {}
    for task, space in spaces.items():
        handle = create_or_resume(space, storage, url, args.tracking_uri)
        cfg = handle.config
        print(f"task {task}: study '{handle.name}', {len(cfg.candidates)} candidate-settings x "
              f"({cfg.budget.trials} grid points + {cfg.confirm.seeds} seeds)", flush=True)
        with StudyDisplay(metric="val/acc") as display:
            summary = run_worker(handle, space, display)
        if not summary.complete:
            print(f"task {task} is not complete (another worker holds its last trials, or a "
                  f"time limit stopped it); run the command again to finish it.", flush=True)
            return None
        if args.study_reports:
            from harness.report.write import write_report

            out = write_report(handle, Path(args.out or "mad-reports") / task)
            print(f"  study report: {out}", flush=True)
        handles[task] = handle
    return handles


def add_parsers(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "mad", help="score candidates on the MAD suite (Poli et al. 2024): six tasks, their "
                    "difficulty grids, tuned on lr x weight decay; the MAD score per task and overall",
        description="Run a MAD suite file (kind: mad, e.g. studies/mad.yaml): every candidate at "
                    "every setting of each MAD task, tuned on the suite's grid, the best point "
                    "re-run on the confirmation seeds; then the report (scores with intervals "
                    "over seeds, a table and a figure per task) in --out and in MLflow. "
                    "Running it again resumes. See docs/mad.md.")
    hint(p.add_argument("file", help="MAD suite YAML (kind: mad)"), "yaml")
    p.add_argument("--profile", default=None, metavar="NAME",
                   help="the suite's profile (cpu, full; default: full with a GPU, else cpu)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field of the suite file, e.g. --set confirm.seeds=5")
    p.add_argument("--suite-name", default=None, help="override the suite's name")
    p.add_argument("--out", default=None, help="report folder (default: $HARNESS_HOME/reports/<suite>)")
    p.add_argument("--study-reports", action="store_true",
                   help="also write each task study's own report (under --out/<task>)")
    p.add_argument("--storage", default=None, metavar="URL",
                   help="Optuna storage (default: SQLite in $HARNESS_HOME or ./.harness)")
    p.add_argument("--tracking-uri", default=None, help="MLflow tracking URI")
    p.set_defaults(handler=cmd_mad)
