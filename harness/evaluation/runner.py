"""Running lm-eval tasks on a trained run, offline, and recording what they found.

:func:`evaluate` checks the request before loading anything heavy (every task is known to
lm-eval or to ``include_path``'s YAMLs; every local data file a task names exists), then runs
``lm_eval.simple_evaluate`` on :class:`~harness.evaluation.adapter.HarnessLM` with fixed
seeds. Only ``include_path``'s tasks are indexed when they are all there (lm-eval's own 14,000
task files take seconds to index). Datasets are read offline (``HF_DATASETS_OFFLINE``):
nothing is downloaded.

:func:`metrics` flattens lm-eval's results into ``eval/<task>/<metric>`` (a filter other than
``none`` is appended: ``eval/<task>/exact_match_strict``); :func:`record` logs them to the
run's MLflow run with the results as ``eval/results.json``.
"""

from __future__ import annotations

import difflib
import logging
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.errors import ConfigError, HarnessError

#: dataset_path values whose data_files are local files read by ``datasets``' own builders.
LOCAL_BUILDERS = ("json", "csv", "parquet", "text", "arrow")
RESULTS_ARTIFACT = "eval/results.json"
#: Where the results keep the characters read as <unk> (harness.evaluation.text).
UNKNOWN = "harness_unknown_characters"


def task_manager(tasks: Sequence[str], include_path: str | Path | None) -> Any:
    """lm-eval's TaskManager knowing ``tasks``; a ConfigError naming any it does not know."""
    from lm_eval.tasks import TaskManager

    if include_path is not None and not Path(include_path).is_dir():
        raise ConfigError(f"--include-path {include_path} is not a folder; give the folder that "
                          f"holds your task YAMLs (docs/evaluation.md).")
    manager = None
    if include_path is not None:
        manager = TaskManager(include_path=str(include_path), include_defaults=False)
        if any(t not in manager.all_tasks for t in tasks):
            manager = None
    if manager is None:
        manager = TaskManager(include_path=str(include_path) if include_path else None)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        close = difflib.get_close_matches(unknown[0], manager.all_tasks, n=3)
        where = f"neither lm-eval nor {include_path} has" if include_path else \
            "lm-eval has no task of that name (add your own with --include-path DIR)"
        raise ConfigError(
            f"unknown task {unknown[0]!r}: {where}{' one of that name' if include_path else ''}."
            f"{' Close: ' + ', '.join(close) + '.' if close else ''} List them with `lm-eval ls tasks`.")
    return manager


def _files(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [f for v in value.values() for f in _files(v)]
    if isinstance(value, (list, tuple)):
        return [f for v in value for f in _files(v)]
    return []


def check_local_files(manager: Any, tasks: Sequence[str]) -> None:
    """Every data file a task's YAML names for a local builder exists (a glob: matches one)."""
    import glob

    for name in tasks:
        entry = manager.task_index.get(name)
        path = getattr(entry, "yaml_path", None)
        if not path or not Path(path).is_file():
            continue
        try:
            import yaml

            config = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        except (OSError, ValueError, yaml.YAMLError):  # lm-eval's own tags (!function): it will say
            continue
        if not isinstance(config, dict) or config.get("dataset_path") not in LOCAL_BUILDERS:
            continue
        kwargs = config.get("dataset_kwargs") or {}
        for file in _files(kwargs.get("data_files") if isinstance(kwargs, dict) else None):
            if not glob.glob(os.path.expanduser(file)):
                raise ConfigError(
                    f"task {name!r} reads {file}, which does not exist ({path}, "
                    f"dataset_kwargs.data_files; a relative path is read from the folder the "
                    f"command runs in: {Path.cwd()}). Put the file there or fix the path "
                    f"(docs/evaluation.md).")


def evaluate(run: Any, tasks: Sequence[str], *, include_path: str | Path | None = None,
             limit: float | None = None, num_fewshot: int | None = None, batch_size: int | None = None,
             max_length: int | None = None, seed: int = 0, bootstrap_iters: int = 1000) -> dict[str, Any]:
    """lm-eval's results (its dict, samples left out) of ``tasks`` on ``run`` (a run id, an
    exported folder, or a loaded :class:`~harness.run.trained.Trained`)."""
    tasks = [t.strip() for t in tasks if t.strip()]
    if not tasks:
        raise ConfigError("--tasks is empty; name at least one lm-eval task (comma-separated).")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from harness.runtime.noise import verbose_from_env

    if not verbose_from_env():  # lm-eval's per-YAML notices and progress bars
        logging.getLogger("lm_eval").setLevel(logging.ERROR)
    manager = task_manager(tasks, include_path)
    check_local_files(manager, tasks)

    import datasets

    datasets.disable_progress_bars()
    return _evaluate(run, tasks, manager, limit=limit, num_fewshot=num_fewshot, batch_size=batch_size,
                     max_length=max_length, seed=seed, bootstrap_iters=bootstrap_iters)


def _evaluate(run: Any, tasks: Sequence[str], manager: Any, *, limit: float | None, num_fewshot: int | None,
              batch_size: int | None, max_length: int | None, seed: int, bootstrap_iters: int) -> dict[str, Any]:
    from lm_eval import simple_evaluate

    from harness.evaluation.adapter import HarnessLM

    lm = HarnessLM(trained=run if not isinstance(run, (str, os.PathLike)) else None,
                   run=None if not isinstance(run, (str, os.PathLike)) else str(run),
                   batch_size=batch_size, max_length=max_length, seed=seed)
    try:
        results = simple_evaluate(
            model=lm, tasks=list(tasks), num_fewshot=num_fewshot, limit=limit, task_manager=manager,
            log_samples=False, bootstrap_iters=bootstrap_iters, random_seed=seed,
            numpy_random_seed=seed, torch_random_seed=seed, fewshot_random_seed=seed)
    except FileNotFoundError as exc:
        raise ConfigError(f"a task's data file is missing: {exc}. Put the file where its YAML "
                          f"says (docs/evaluation.md).") from None
    except ConnectionError as exc:
        raise ConfigError(f"a task wanted to download its data ({exc}); nothing is downloaded "
                          f"here: point its YAML at local files (docs/evaluation.md).") from None
    if results is None:
        raise HarnessError("lm-eval returned no results (a process other than rank 0).")
    results = dict(results)
    from harness.evaluation.text import TokenizerCodec

    codec = lm.codec
    report = codec.unknown_report() if isinstance(codec, TokenizerCodec) else None
    if isinstance(codec, TokenizerCodec) and report is not None:  # said, counted, kept (text.py)
        from harness.errors import warning

        warning(report)
        results[UNKNOWN] = {"characters": sum(codec.unknown.values()),
                            "distinct": dict(codec.unknown.most_common()), "message": report}
    return results


def _key(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_./ -]+", "_", text)


def metrics(results: dict[str, Any]) -> dict[str, float]:
    """``eval/<task>/<metric>`` of lm-eval's results (stderr as ``<metric>_stderr``)."""
    out: dict[str, float] = {}
    for task, values in (results.get("results") or {}).items():
        for name, value in values.items():
            if "," not in name or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            metric, _, filt = name.partition(",")
            if not math.isfinite(float(value)):
                continue
            out[_key(f"eval/{task}/{metric}{'' if filt == 'none' else '_' + filt}")] = float(value)
    if results.get(UNKNOWN):
        from harness.keys import Metric

        out[Metric.EVAL_UNKNOWN_CHARS] = float(results[UNKNOWN]["characters"])
    return out


def run_tracker(run_id: str, tracking_uri: str | None = None) -> Any:
    """The tracker of the store that holds run ``run_id`` (a HarnessError naming the store when
    it does not): where an evaluation of a finished run is logged."""
    from harness.store.masking import mask_url
    from harness.store.tracking import Tracker

    tracker = Tracker(tracking_uri)
    try:
        tracker.client.get_run(run_id)
    except Exception as exc:  # MlflowException: no such run
        raise HarnessError(f"there is no run {run_id} in the tracking store {mask_url(tracker.uri)} "
                           f"({type(exc).__name__}); pass the --tracking-uri it was recorded in, "
                           f"or --no-log.") from None
    return tracker


def record(run_id: str, results: dict[str, Any], tracking_uri: str | None = None) -> dict[str, float]:
    """Log :func:`metrics` and the results JSON (``eval/results.json``) to an MLflow run."""
    tracker = run_tracker(run_id, tracking_uri)
    values = metrics(results)
    import time

    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    tracker.client.log_batch(run_id, metrics=[Metric(k, v, now, 0) for k, v in values.items()])
    if results.get(UNKNOWN):
        from harness.keys import Tag

        tracker.set_tags(run_id, {Tag.EVAL_UNKNOWN: str(results[UNKNOWN]["message"])[:5000]})
    tracker.client.log_dict(run_id, jsonable(results), RESULTS_ARTIFACT)
    return values


def jsonable(data: Any) -> Any:
    """lm-eval's results as plain JSON (its configs hold functions and numpy values)."""
    import json

    return json.loads(json.dumps(data, default=str))
