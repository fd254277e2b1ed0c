"""``harness study run | create | status`` and ``harness report``.

Only argparse is imported here: ``harness --help`` must stay fast, so every handler imports
the study and report modules (and through them optuna, mlflow, torch) when it runs.
"""

from __future__ import annotations

import argparse
from typing import Any


def _storage_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--storage", default=None, metavar="URL",
                   help="Optuna storage, any SQLAlchemy URL (default: SQLite in $HARNESS_HOME "
                        "or ./.harness); e.g. postgresql+psycopg://user@host:5432/db")
    p.add_argument("--tracking-uri", default=None,
                   help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else the one the "
                        "study was created with)")


def _quiet(workers: bool = False) -> None:
    """Keep a worker's output to one line per trial."""
    import logging

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if workers:
        import lightning.pytorch  # noqa: F401  (it sets its loggers' levels on import)

        for name in ("lightning.pytorch", "lightning.fabric"):
            logging.getLogger(name).setLevel(logging.WARNING)


def _prepare(args: argparse.Namespace) -> tuple[Any, Any]:
    """Load and validate the study file (before anything is created), open the storage and
    create or resume the study."""
    from harness.study.schema import load_study_config
    from harness.study.space import load_registry, validate
    from harness.study.storage import create_or_resume, default_storage_url, open_storage

    cfg = load_study_config(args.file, args.study_name, args.profile)
    if cfg.profile:
        print(f"profile: {cfg.profile} (study '{cfg.name}'; choose another with --profile)", flush=True)
    space = validate(cfg, load_registry(cfg))
    _warn_seeds(cfg)
    _quiet(workers=True)
    url = args.storage or default_storage_url()
    r = cfg.resume
    storage = open_storage(url, r.heartbeat_s, r.grace_s, r.max_retry)
    return create_or_resume(space, storage, url, args.tracking_uri), space


def _warn_seeds(cfg: Any) -> None:
    """Before anything trains: say so when the confirmation seeds are too few for the study's
    test to resolve any difference (Holm over every pair of candidates)."""
    import sys

    from harness.stats import resolution_floor

    k = len(cfg.candidates)
    if k < 2:
        return
    floor = resolution_floor(cfg.confirm.test, cfg.confirm.seeds, k * (k - 1) // 2,
                             round(1 - cfg.confirm.confidence, 12))
    if not floor.possible:
        print(f"warning: {floor.sentence()}", file=sys.stderr, flush=True)


def cmd_study_create(args: argparse.Namespace) -> int:
    handle, _ = _prepare(args)
    print(f"study '{handle.name}' is ready; start workers with `harness study run {args.file}"
          + (f" --storage {args.storage}`" if args.storage else "`"))
    return 0


def cmd_study_run(args: argparse.Namespace) -> int:
    from harness.threads import passive_wait

    passive_wait()  # before torch loads: this worker's idle OpenMP threads sleep, not spin
    from harness.report.export import parse_formats
    from harness.study.progress import describe, progress
    from harness.study.worker import run_worker

    formats = parse_formats(args.format)  # a typo fails now, not after the training
    handle, space = _prepare(args)
    for note in handle.record.get("notes", []):
        print(f"note: {note}")
    print(f"study '{handle.name}': MLflow parent run {handle.parent_run_id} at {handle.tracker.uri}",
          flush=True)
    summary = run_worker(handle, space, log=lambda line: print(line, flush=True))
    ran = ", ".join(f"{n} {state.lower()}" for state, n in sorted(summary.jobs.items()))
    print(f"this worker ran {sum(summary.jobs.values())} trial(s){': ' + ran if ran else ''}")
    print(describe(handle, progress(handle)))
    storage = f" --storage {args.storage}" if args.storage else ""
    if summary.complete and args.report:
        from harness.report.write import write_report, written_files

        out = write_report(handle, args.out, formats=formats)
        print(f"report: {', '.join(map(str, written_files(out, formats)))} (also logged to the "
              f"parent run)")
    elif summary.complete:
        print(f"write the report with `harness report {handle.name}{storage}`; browse with `harness ui`")
    return 0


def _open(args: argparse.Namespace) -> Any:
    from harness.study.storage import default_storage_url, open_storage, open_study

    _quiet()
    url = args.storage or default_storage_url()
    storage = open_storage(url, must_exist=True)
    return open_study(args.study, storage, url, args.tracking_uri)


def cmd_study_status(args: argparse.Namespace) -> int:
    from harness.study.progress import describe, progress, reconcile, settle_parent

    handle = _open(args)
    ended = reconcile(handle)
    prog = progress(handle)
    settle_parent(handle, prog)
    print(describe(handle, prog))
    if ended:
        print(f"  ended {len(ended)} orphaned MLflow run(s) of interrupted trials as KILLED")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from harness.report.export import parse_formats
    from harness.report.write import write_report, written_files

    formats = parse_formats(args.format)  # before opening anything: a typo exits at once
    handle = _open(args)
    out = write_report(handle, args.out, formats=formats)
    print(f"report written to {out} and logged to MLflow run {handle.parent_run_id}:")
    for path in written_files(out, formats):
        print(f"  {path}")
    return 0


def _format_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", action="append", default=None, metavar="FORMAT",
                   help="md, html, csv, latex, json (repeat or give a comma list; default "
                        "md,html,json). csv: candidates.csv and seeds.csv; latex: table.tex "
                        "(booktabs)")


def add_parsers(subparsers: Any) -> None:
    """Add ``study`` (run, create, status) and ``report`` to the ``harness`` command."""
    study = subparsers.add_parser("study", help="comparison studies: run, create, status")
    sub = study.add_subparsers(dest="study_command", metavar="COMMAND")
    study.set_defaults(handler=lambda args: study.print_help() or 0)

    p = sub.add_parser("run", help="create (or resume) a study and work on it until it is complete")
    p.add_argument("file", help="study YAML (see studies/quickstart.yaml)")
    p.add_argument("--study-name", default=None, help="override the study's name")
    p.add_argument("--profile", default=None, metavar="NAME",
                   help="the study file's profile (cpu, full, ...; default: full with a GPU, else cpu)")
    p.add_argument("--report", action="store_true", help="write the report when the study completes")
    p.add_argument("--out", default=None, help="report folder (with --report)")
    _format_arg(p)
    _storage_args(p)
    p.set_defaults(handler=cmd_study_run)

    p = sub.add_parser("create", help="create a study without running it (before starting "
                                      "several workers)")
    p.add_argument("file", help="study YAML")
    p.add_argument("--study-name", default=None, help="override the study's name")
    p.add_argument("--profile", default=None, metavar="NAME",
                   help="the study file's profile (cpu, full, ...; default: full with a GPU, else cpu)")
    _storage_args(p)
    p.set_defaults(handler=cmd_study_create)

    p = sub.add_parser("status", help="progress of a study")
    p.add_argument("study", help="study name")
    _storage_args(p)
    p.set_defaults(handler=cmd_study_status)

    p = subparsers.add_parser("report", help="ranked table, curves, front and plots of a study")
    p.add_argument("study", help="study name")
    p.add_argument("--out", default=None,
                   help="report folder (default: $HARNESS_HOME/reports/<study>)")
    _format_arg(p)
    _storage_args(p)
    p.set_defaults(handler=cmd_report)
