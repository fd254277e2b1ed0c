"""``harness study run | create | status | list`` and ``harness report``.

Only argparse is imported here: ``harness --help`` must stay fast, so every handler imports
the study and report modules (and through them optuna, mlflow, torch) when it runs.
"""

from __future__ import annotations

import argparse
from typing import Any

from harness.cli.completion import hint


def _storage_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--storage", default=None, metavar="URL",
                   help="Optuna storage, any SQLAlchemy URL (default: SQLite in $HARNESS_HOME "
                        "or ./.harness); e.g. postgresql+psycopg://user@host:5432/db")
    p.add_argument("--tracking-uri", default=None,
                   help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else the one the "
                        "study was created with)")


def _say(text: str) -> None:
    """What the command is doing, at once (the heavy imports come after)."""
    print(text, flush=True)


def _quiet(workers: bool = False) -> None:
    """Optuna configures its own logger when first used: keep it to warnings (and a worker's
    Lightning output to one line per trial)."""
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
    from harness.store import tracking
    from harness.study.schema import load_study_config

    cfg = load_study_config(args.file, args.study_name, args.profile, args.set)
    # in seconds, before torch, and before the study's record is created in the storage
    tracking.preflight(args.tracking_uri)
    _check_storage(args.storage)
    if cfg.profile:
        print(f"profile: {cfg.profile} (study '{cfg.name}'; choose another with --profile)", flush=True)
    _say(f"study '{cfg.name}': checking {len(cfg.candidates)} candidate(s) against the "
         f"installed plugins (loads torch) ...")
    from harness.study.space import load_registry, validate

    space = validate(cfg, load_registry(cfg))
    _warn_seeds(cfg)
    from harness.study.storage import create_or_resume, open_storage, redact, storage_url

    _quiet(workers=True)
    url = storage_url(args.storage)
    _say(f"study '{cfg.name}': opening the Optuna storage {redact(url)} and the MLflow store ...")
    r = cfg.resume
    storage = open_storage(url, r.heartbeat_s, r.grace_s, r.max_retry)
    handle = create_or_resume(space, storage, url, args.tracking_uri)
    from harness.study.summary import publish_view

    publish_view(handle)  # the link `harness ui --study` prints opens this view
    return handle, space


def _check_storage(explicit: str | None) -> None:
    """A SQLite storage that exists but is damaged, or cannot be written: refused before the
    plugins load (it is checked again under its lock when it is opened)."""
    import os

    from harness.store import tracking
    from harness.store.guard import check_sqlite, check_writable
    from harness.store.lock import sqlite_file

    tracking.checked_home()
    path = sqlite_file(explicit or os.environ.get("HARNESS_STORAGE")
                       or f"sqlite:///{tracking.home() / 'optuna.db'}")  # nothing created
    if path is not None:
        check_writable(path, "optuna")
        check_sqlite(path, "optuna")


def _warn_seeds(cfg: Any) -> None:
    """Before anything trains: say so when the confirmation seeds are too few for the study's
    test to resolve any difference (Holm over every pair of candidates)."""
    import sys

    from harness.report.stats import resolution_floor

    k = len(cfg.candidates)
    if k < 2:
        return
    floor = resolution_floor(cfg.confirm.test, cfg.confirm.seeds, k * (k - 1) // 2,
                             round(1 - cfg.confirm.confidence, 12))
    if not floor.possible:
        print(f"warning: {floor.sentence()}", file=sys.stderr, flush=True)


def cmd_study_create(args: argparse.Namespace) -> int:
    _say(f"reading {args.file} ...")
    handle, _ = _prepare(args)
    print(f"study '{handle.name}' is ready; start workers with `harness study run {args.file}"
          f"{_same_study(args)}`")
    return 0


def _same_study(args: argparse.Namespace) -> str:
    """The options that make another `harness study run` work on this study (name, profile,
    stores and --set overrides), passwords masked: for the commands the CLI suggests."""
    from harness.store.masking import mask_url

    named = "".join(f" --{flag.replace('_', '-')} {mask_url(str(value))}" for flag, value in (
        ("study_name", args.study_name), ("profile", args.profile), ("storage", args.storage),
        ("tracking_uri", args.tracking_uri)) if value)
    return named + "".join(f" --set {item}" for item in args.set)


def cmd_study_run(args: argparse.Namespace) -> int:
    from harness.cli.main import ctrl_c
    from harness.errors import Interrupted
    from harness.runtime.threads import passive_wait

    passive_wait()  # before torch loads: this worker's idle OpenMP threads sleep, not spin
    args.gpu_env = _gpus(args)  # before CUDA starts here: this process is the first worker

    same = _same_study(args)  # the resume command keeps --set too: the study's config depends on it
    with ctrl_c("The running trial stays RUNNING until its heartbeat goes stale; the next "
                "worker retries it."):
        try:
            return _study_run(args)
        except Interrupted as exc:
            exc.kept = ("every finished trial; a trial this worker was running is recorded FAILED "
                        "(its MLflow run KILLED) and queued again")
            exc.resume = f"Resume with `harness study run {args.file}{same}`."
            raise


def _gpus(args: argparse.Namespace) -> list[dict[str, str]]:
    """Each worker's GPUs (``CUDA_VISIBLE_DEVICES``), this process's set now, said in the
    command's first line; more workers than GPUs refused (exit 2)."""
    import os

    from harness.study.spawn import gpu_plan

    workers = getattr(args, "workers", 1)
    if workers == 1:  # one worker sees what the command sees (and torch loads later)
        return [{}]
    envs, line = gpu_plan(workers, getattr(args, "gpus_per_worker", 1))
    if line:
        os.environ.update(envs[0])
        print(f"{line} (CUDA_VISIBLE_DEVICES per worker; --gpus-per-worker sets how many each)",
              flush=True)
    return envs


def _check_gpus_per_worker(args: argparse.Namespace, train: dict[str, Any]) -> None:
    """A study whose trials use more devices than each worker was given fails in every trial:
    refused before the first."""
    from harness.errors import ConfigError

    devices = train.get("devices", 1)
    if not any(getattr(args, "gpu_env", [{}])) or not isinstance(devices, int):
        return
    if devices == -1 or devices > args.gpus_per_worker:
        raise ConfigError(
            f"train.devices: {devices} in the study, but each worker was given "
            f"{args.gpus_per_worker} GPU(s). Start the workers with --gpus-per-worker "
            f"{devices if devices > 0 else 'K'} (and --workers at most the GPUs divided by it).")


def _study_run(args: argparse.Namespace) -> int:
    from harness.report.export import parse_formats

    formats = parse_formats(args.format)  # a typo fails now, not after the training
    _say(f"reading {args.file} ...")
    handle, space = _prepare(args)
    _check_gpus_per_worker(args, handle.config.train)
    from harness.study.display import StudyDisplay
    from harness.study.progress import describe, progress
    from harness.study.worker import run_worker

    for note in handle.record.get("notes", []):
        print(f"note: {note}")
    cfg = handle.config
    print(f"study '{handle.name}': {len(cfg.candidates)} candidate(s) x ({cfg.budget.trials} "
          f"tuning trials + {cfg.confirm.seeds} confirmation seeds); MLflow parent run "
          f"{handle.parent_run_id}; browse with `harness ui --study {handle.name}`", flush=True)
    from harness.study.estimate import estimate, runs_left

    guess = estimate(space, runs_left(handle), args.workers)
    if guess is not None:
        print(guess.line(), flush=True)
    metric = f"val/{cfg.objective.metric}" + (f"@{cfg.objective.length}" if cfg.objective.length else "") \
        if cfg.objective.over == "length" else cfg.objective.words
    from harness.study.spawn import extra_workers, log_path, worker_command, worker_env

    extra = args.workers - 1
    command = worker_command(args.file, handle.name, cfg.profile, args.set)
    env = worker_env(handle.storage_url, args.tracking_uri)
    if extra:
        print(f"starting {extra} more worker(s) on this machine (logs: "
              f"{log_path(handle.name, 1).parent}/{handle.name}-worker-N.log)", flush=True)
    from harness.run.checkpoint import stop_on_sigusr1

    with extra_workers(extra, command, handle.name, env=env, own=args.gpu_env[1:]) as procs, \
            StudyDisplay(metric=metric) as display, \
            stop_on_sigusr1(forward=procs):  # SIGUSR1: checkpoint the trials, stop (exit 75)
        summary = run_worker(handle, space, display)
    ran = ", ".join(f"{n} {state.lower()}" for state, n in sorted(summary.jobs.items()))
    print(f"this worker ran {sum(summary.jobs.values())} trial(s){': ' + ran if ran else ''}")
    print(describe(handle, progress(handle)))
    storage = f" --storage {_masked(args.storage)}" if args.storage else ""
    if summary.complete:
        from harness.report.summary import write_summary

        if args.report:
            from harness.report.write import write_report, written_files

            out = write_report(handle, args.out, formats=formats)
            print(f"report: {', '.join(map(str, written_files(out, formats)))} (also logged to "
                  f"the parent run)")
        else:
            print(f"write the report with `harness report {handle.name}{storage}`")
        print(write_summary(handle).text())
        print(f"summary on the MLflow parent run; browse with `harness ui --study {handle.name}`")
    return _exit_code(summary, handle.name, storage)


def _exit_code(summary: Any, name: str, storage: str) -> int:
    """1 when every trial this worker ran failed (a study that cannot produce a result must
    not look like a success to a script or a scheduler), else 0."""
    import sys

    failed = summary.jobs.get("FAIL", 0)
    if failed and failed == sum(summary.jobs.values()):
        print(f"harness: every trial this worker ran failed ({failed}); their reasons are in "
              f"`harness study status {name}{storage}` and on the FAILED MLflow runs.",
              file=sys.stderr)
        return 1
    return 0


def _masked(url: str) -> str:
    from harness.study.storage import redact

    return redact(url)


def _open(args: argparse.Namespace) -> Any:
    from harness.study.storage import open_storage, open_study, storage_url

    _quiet()
    url = storage_url(args.storage)
    storage = open_storage(url, must_exist=True)
    return open_study(args.study, storage, url, args.tracking_uri)


def _open_read_only(args: argparse.Namespace, name: str | None) -> tuple[Any, str]:
    """The storage opened read-only (and the study, when ``name``): no MLflow, no writes."""
    from harness.study.storage import open_storage, open_study, storage_url

    url = storage_url(args.storage)
    storage = open_storage(url, read_only=True)
    if name is None:
        return storage, url
    return open_study(name, storage, url, args.tracking_uri, check_tracking=False), url


def cmd_study_status(args: argparse.Namespace) -> int:
    """Read-only: computes the view from the Optuna storage; reconciling MLflow runs of
    interrupted trials is left to ``study run`` and ``report``."""
    from harness.study.progress import describe, progress

    handle, _ = _open_read_only(args, args.study)
    print(describe(handle, progress(handle)))
    return 0


def cmd_study_list(args: argparse.Namespace) -> int:
    from harness.study.progress import describe_list

    storage, url = _open_read_only(args, None)
    print(describe_list(storage, url))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from harness.report.export import parse_formats
    from harness.report.summary import write_summary
    from harness.report.write import write_report, written_files

    formats = parse_formats(args.format)  # before opening anything: a typo exits at once
    handle = _open(args)
    out = write_report(handle, args.out, formats=formats)
    print(write_summary(handle).text())
    print(f"report written to {out} and logged to MLflow run {handle.parent_run_id}:")
    for path in written_files(out, formats):
        print(f"  {path}")
    print(f"browse it with `harness ui --study {handle.name}`")
    return 0


def _format_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", action="append", default=None, metavar="FORMAT",
                   help="md, html, csv, latex, json (repeat or give a comma list; default "
                        "md,html,json). csv: candidates.csv and seeds.csv; latex: table.tex "
                        "(booktabs)")


def add_parsers(subparsers: Any) -> None:
    """Add ``study`` (run, create, status, list) and ``report`` to the ``harness`` command."""
    study = subparsers.add_parser("study", help="comparison studies: run, create, status, list")
    sub = study.add_subparsers(dest="study_command", metavar="COMMAND")
    study.set_defaults(handler=lambda args: study.print_help() or 0)

    p = sub.add_parser("run", help="create (or resume) a study and work on it until it is complete")
    _file_args(p, "study YAML (see studies/quickstart.yaml)")
    p.add_argument("--report", action="store_true", help="write the report when the study completes")
    p.add_argument("--out", default=None, help="report folder (with --report)")
    p.add_argument("--workers", type=_workers, default=1, metavar="N",
                   help="workers on this machine: this process and N-1 more (they share the "
                        "cores, and on a machine with GPUs each gets its own; default 1)")
    p.add_argument("--gpus-per-worker", type=_gpus_per_worker, default=1, metavar="K",
                   help="GPUs each worker gets (CUDA_VISIBLE_DEVICES; the pool is the GPUs "
                        "this process sees); 0: no assignment, every worker sees them all "
                        "(default 1; ignored without GPUs)")
    _format_arg(p)
    _storage_args(p)
    p.set_defaults(handler=cmd_study_run)

    p = sub.add_parser("create", help="create a study without running it (before starting "
                                      "several workers)")
    _file_args(p, "study YAML")
    _storage_args(p)
    p.set_defaults(handler=cmd_study_create)

    p = sub.add_parser("status", help="progress of a study (reads the storage, writes nothing)")
    hint(p.add_argument("study", help="study name"), "study")
    _storage_args(p)
    p.set_defaults(handler=cmd_study_status)

    p = sub.add_parser("list", help="the studies of a storage, with their progress")
    _storage_args(p)
    p.set_defaults(handler=cmd_study_list)

    p = subparsers.add_parser("report", help="ranked table, curves, front and plots of a study")
    hint(p.add_argument("study", help="study name"), "study")
    p.add_argument("--out", default=None,
                   help="report folder (default: $HARNESS_HOME/reports/<study>)")
    _format_arg(p)
    _storage_args(p)
    p.set_defaults(handler=cmd_report)


MAX_WORKERS = 64


def _workers(text: str) -> int:
    """``--workers``: a whole number from 1 to :data:`MAX_WORKERS`."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_WORKERS:
        raise argparse.ArgumentTypeError(
            f"--workers must be a whole number from 1 to {MAX_WORKERS} (got {text!r}); use about "
            f"one per core (each worker trains one trial at a time)")
    return n


def _gpus_per_worker(text: str) -> int:
    """``--gpus-per-worker``: a whole number from 0 to 64."""
    if not text.isdigit() or int(text) > 64:
        raise argparse.ArgumentTypeError(
            f"--gpus-per-worker must be a whole number from 0 to 64 (got {text!r}): the GPUs "
            f"each worker trains on, 0 to let every worker see all of them")
    return int(text)


def _file_args(p: argparse.ArgumentParser, what: str) -> None:
    hint(p.add_argument("file", help=what), "yaml")
    p.add_argument("--study-name", default=None, help="override the study's name")
    p.add_argument("--profile", default=None, metavar="NAME",
                   help="the study file's profile (cpu, full, ...; default: full with a GPU, else cpu)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field of the study file, e.g. --set budget.trials=8")
