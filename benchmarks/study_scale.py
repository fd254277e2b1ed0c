"""How claiming, ``harness study status`` and ``harness report`` scale with a study's size.

    python benchmarks/study_scale.py --backend sqlite   [--sizes 250,500,1000,2000] [--workers 4]
    python benchmarks/study_scale.py --backend postgres [--sizes ...]   (starts its own server)

For each size N, a fresh study of N trials (5 candidates, each N/5 slots: N/5 - 5 tuning
trials and 5 confirmation seeds; random sampler, no pruner) is created in fresh stores and
run to completion by ``--workers`` worker processes, each the real ``run_worker`` loop
(claiming, heartbeats, reconciliation, progress, Optuna's tell, failure handling) with one
part replaced: a trial's run is *recorded without training*. The replacement plans the
trial's run config like a real run (``harness.run.plan``), then writes what a finished run
writes to MLflow: provenance tags, the resolved config as params and ``config.yaml``, the
final metrics (per length and ``cost/*``) and a ``train/loss`` curve of 8 points. It does not
report intermediate values to Optuna (a real run's pruning callback adds one storage write
per validation: O(1) per trial).

Measured: per trial, the worker loop's own time (everything but recording the run), split
into claiming (``claim_next``), progress, reconciliation and failing stale trials; the wall
time of ``harness study status`` and ``harness report`` (the CLI, Python start-up included)
on the finished study; the size of the MLflow store (database and artifacts) and of the
Optuna storage. The report's time is fitted as ``a + b N`` and as a power law on its part
above the smallest size. Results are appended to ``benchmarks/study_scale.md`` with the
machine, its load and the command.

PostgreSQL: the server binaries in ``$HARNESS_PG_BIN`` (default /usr/lib/postgresql/15/bin),
started on 127.0.0.1 in a temporary folder (as the ``postgres`` user when run as root), one
database per size for Optuna and one for MLflow; stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import yaml

CANDIDATES = [("sinusoidal", "sinusoidal"), ("nope", "none"), ("rope", "rope"), ("alibi", "alibi"),
              ("learned", "learned")]
SEEDS = 5
PG_BIN = Path(os.environ.get("HARNESS_PG_BIN", "/usr/lib/postgresql/15/bin"))


def study_file(n: int, folder: Path) -> Path:
    per = n // len(CANDIDATES)
    data = {
        "name": f"scale{n}",
        "task": {"name": "copy", "params": {"length": 8, "vocab": 8, "num_train": 64, "num_val": 16,
                                            "eval_lengths": [16, 32]}},
        "candidates": [
            {"name": name, "model": {"name": "transformer",
                                     "params": {"layers": 1, "heads": 2, "d_model": 16},
                                     "search_declared": False,
                                     "attention": {"name": "multi_head", "search_declared": False},
                                     "position": {"name": pos, "search_declared": False}}}
            for name, pos in CANDIDATES],
        "search": {"lr": {"low": 1.0e-4, "high": 1.0e-2, "log": True},
                   "warmup_steps": [10, 100]},
        "train": {"batch_size": 16, "val_every": 50, "num_threads": 1},
        "budget": {"trials": per - SEEDS, "steps": 400},
        "sampler": {"name": "random", "seed": 0},
        "pruner": {"name": "none"},
        "confirm": {"seeds": SEEDS},
        "resume": {"heartbeat_s": 30, "grace_s": 600, "poll_s": 0.2},
    }
    path = folder / f"scale{n}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# -- a trial's run, recorded without training -----------------------------------------------
def recorded_train(config: Any, *, registry: Any = None, parent_run_id: str | None = None,
                   callbacks: Any = None, extra_tags: dict[str, str] | None = None,
                   resume: Any = None) -> Any:
    """What ``harness.run.pipeline.train`` records for a finished run, without training."""
    from harness.keys import Metric, val_key
    from harness.run.pipeline import RunResult, as_config
    from harness.run.plan import plan
    from harness.run.record import default_run_name, provenance_tags
    from harness.store import tracking

    cfg = as_config(config)
    p = plan(cfg, registry)
    resolved = p.resolved_config()
    tracker = tracking.Tracker(cfg.tracking.uri)
    run_id = tracker.start_run(cfg.tracking.experiment, run_name=cfg.tracking.run_name or default_run_name(p),
                               parent_run_id=parent_run_id,
                               tags={**provenance_tags(p), **cfg.tracking.tags, **(extra_tags or {})})
    tracker.log_params(run_id, resolved)
    tracker.log_dict(run_id, resolved, "config.yaml")
    rng = random.Random(f"{cfg.train.seed}/{cfg.train.lr}/{p.position.name if p.position else ''}")
    quality = rng.uniform(0.3, 0.95)
    steps = cfg.train.max_steps
    from mlflow.entities import Metric as Point

    now = int(time.time() * 1000)
    tracker.client.log_batch(run_id, metrics=[Point("train/loss", 2.0 * (1 - quality) + 1.0 / i, now,
                                                    i * steps // 8) for i in range(1, 9)])
    metrics: dict[str, float] = {}
    for length in (8, 16, 32):
        acc = quality * (1.0 if length == 8 else rng.uniform(0.3, 0.9))
        metrics[val_key("acc", length)] = acc
        metrics[val_key("loss", length)] = 2.0 * (1 - acc)
    metrics[val_key("acc")], metrics[val_key("loss")] = metrics[val_key("acc", 8)], metrics[val_key("loss", 8)]
    metrics.update({Metric.PARAMS: 9000.0, Metric.TOKENS_PER_S: rng.uniform(2e4, 4e4),
                    Metric.EVAL_TOKENS_PER_S: 1e5, Metric.PEAK_TENSOR_MB: 1.5, Metric.FIT_S: 10.0,
                    Metric.EVAL_S: 1.0, Metric.TOTAL_S: 12.0, Metric.TRAIN_STEPS: float(steps)})
    tracker.log_metrics(run_id, metrics, step=steps)
    tracker.end_run(run_id, "FINISHED")
    return RunResult(run_id, "FINISHED", metrics, 9000, resolved)


# -- the workers ------------------------------------------------------------------------------
class Timer:
    def __init__(self) -> None:
        self.seconds: dict[str, list[float]] = {}

    def wrap(self, module: Any, name: str, key: str | None = None) -> None:
        fn = getattr(module, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds.setdefault(key or name, []).append(time.perf_counter() - t0)

        setattr(module, name, timed)


def worker_main(path: str, storage: str, tracking_uri: str, out: str) -> None:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from harness.study import worker
    from harness.study.cli import _quiet
    from harness.study.schema import load_study_config
    from harness.study.space import load_registry, validate
    from harness.study.storage import open_storage, open_study

    _quiet(workers=True)
    import harness.run.pipeline as pipeline

    timer = Timer()
    pipeline.train = recorded_train  # type: ignore[assignment]
    timer.wrap(pipeline, "train", "record_run")  # the run itself (MLflow writes)
    for name in ("claim_next", "progress", "slot_progress", "reconcile", "fail_stale", "run_job"):
        if hasattr(worker, name):  # slot_progress: the loop's progress since the fix
            timer.wrap(worker, name, "progress" if name == "slot_progress" else name)
    cfg = load_study_config(path)
    space = validate(cfg, load_registry(cfg))
    r = cfg.resume
    handle = open_study(str(cfg.name), open_storage(storage, r.heartbeat_s, r.grace_s, r.max_retry),
                        storage, tracking_uri)
    import io

    from harness.study.display import StudyDisplay

    summary = worker.run_worker(handle, space, StudyDisplay(stream=io.StringIO(), live=False))
    Path(out).write_text(json.dumps({"seconds": timer.seconds, "jobs": summary.jobs}))


def run_study(n: int, storage: str, tracking_uri: str, folder: Path, workers: int) -> dict[str, Any]:
    path = study_file(n, folder)
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    store = ["--storage", storage, "--tracking-uri", tracking_uri]
    subprocess.run([sys.executable, "-m", "harness.cli", "study", "create", str(path), *store],
                   check=True, env=env, capture_output=True)
    ctx = mp.get_context("spawn")
    outs = [folder / f"worker{n}_{i}.json" for i in range(workers)]
    started = time.perf_counter()
    procs = [ctx.Process(target=worker_main, args=(str(path), storage, tracking_uri, str(o)))
             for o in outs]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    wall = time.perf_counter() - started
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    seconds: dict[str, list[float]] = {}
    jobs: dict[str, int] = {}
    for o in outs:
        data = json.loads(o.read_text())
        for k, v in data["seconds"].items():
            seconds.setdefault(k, []).extend(v)
        for k, v in data["jobs"].items():
            jobs[k] = jobs.get(k, 0) + v
    assert jobs == {"COMPLETE": n - n % len(CANDIDATES)}, jobs
    timings = {"status": cli_seconds(["study", "status", f"scale{n}", *store], env),
               "report": cli_seconds(["report", f"scale{n}", *store, "--out", str(folder / f"report{n}")], env)}
    return {"n": n, "wall": wall, "seconds": seconds, **timings}


def cli_seconds(args: list[str], env: dict[str, str], repeat: int = 2) -> float:
    """The fastest of ``repeat`` runs of a harness command (wall time, start-up included)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "harness.cli", *args], check=True, env=env,
                       capture_output=True)
        best = min(best, time.perf_counter() - t0)
    return best


# -- stores -----------------------------------------------------------------------------------
def folder_bytes(path: Path) -> int:
    """The size of a file, or of every file under a folder (0 if it does not exist)."""
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


@contextmanager
def postgres() -> Any:
    """A throwaway server on 127.0.0.1; yields (url of database NAME, create database)."""
    import psycopg

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from servers import free_port

    root = Path(tempfile.mkdtemp(prefix="harness-pg-scale-"))
    as_postgres: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        as_postgres = ["runuser", "-u", "postgres", "--"]
    data, port = root / "data", free_port()
    subprocess.run([*as_postgres, str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"],
                   check=True, capture_output=True)
    ctl = [*as_postgres, str(PG_BIN / "pg_ctl"), "-D", str(data)]
    subprocess.run([*ctl, "-o", f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c max_connections=200",
                    "-l", str(root / "log"), "-w", "start"], check=True, capture_output=True)

    def database(name: str) -> tuple[str, Any]:
        with psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres", autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/{name}"

        def size() -> int:
            with psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres") as conn:
                row = conn.execute("SELECT pg_database_size(%s)", (name,)).fetchone()
                return int(row[0]) if row else 0
        return url, size

    try:
        yield database
    finally:
        subprocess.run([*ctl, "-m", "fast", "stop"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def measure(backend: str, sizes: list[int], workers: int) -> list[dict[str, Any]]:
    results = []
    with tempfile.TemporaryDirectory(prefix="harness-scale-") as tmp, \
            (postgres() if backend == "postgres" else _nothing()) as database:
        root = Path(tmp)
        os.environ["HARNESS_HOME"] = str(root / ".harness")
        for n in sizes:
            folder = root / f"n{n}"
            folder.mkdir()
            artifacts = root / ".harness" / "artifacts"
            if backend == "sqlite":
                storage, tracking_uri = f"sqlite:///{folder / 'optuna.db'}", f"sqlite:///{folder / 'mlflow.db'}"
                optuna_size = partial(folder_bytes, folder / "optuna.db")
                mlflow_db = partial(folder_bytes, folder / "mlflow.db")
            else:
                storage, optuna_size = database(f"optuna{n}")
                tracking_uri, mlflow_db = database(f"mlflow{n}")
            before = folder_bytes(artifacts)
            res = run_study(n, storage, tracking_uri, folder, workers)
            res.update(optuna_bytes=optuna_size(), mlflow_db_bytes=mlflow_db(),
                       artifact_bytes=folder_bytes(artifacts) - before)
            results.append(res)
            print(summary_line(res), flush=True)
    return results


@contextmanager
def _nothing() -> Any:
    yield None


# -- the record ------------------------------------------------------------------------------
def per_trial_ms(res: dict[str, Any], key: str) -> float:
    values = res["seconds"].get(key, [])
    return 1000 * sum(values) / res["n"] if values else 0.0


def loop_ms(res: dict[str, Any]) -> float:
    """The worker loop's own time per trial: everything but recording the run."""
    s = res["seconds"]
    own = sum(sum(s.get(k, [])) for k in ("claim_next", "progress", "reconcile", "fail_stale", "run_job"))
    return 1000 * (own - sum(s.get("record_run", []))) / res["n"]


def summary_line(res: dict[str, Any]) -> str:
    claims = res["seconds"].get("claim_next", [0.0])
    return (f"N={res['n']}: wall {res['wall']:.0f} s, loop {loop_ms(res):.0f} ms/trial (claim median "
            f"{1000 * statistics.median(claims):.0f} ms), status {res['status']:.2f} s, report "
            f"{res['report']:.2f} s, MLflow {(res['mlflow_db_bytes'] + res['artifact_bytes']) / 2**20:.1f} MB")


def fit_report(results: list[dict[str, Any]]) -> str:
    import numpy as np

    if len(results) < 2:
        return "one size: no fit (run several --sizes to see the growth)"
    n = np.array([r["n"] for r in results], dtype=float)
    t = np.array([r["report"] for r in results])
    b, a = np.polyfit(n, t, 1)
    above = t - t[0]
    line = f"report time ≈ {a:.2f} s + {1000 * b:.2f} ms × N (least squares)"
    if len(n) > 2 and np.all(above[1:] > 0):
        k = np.polyfit(np.log(n[1:] - n[0]), np.log(above[1:]), 1)[0]
        line += f"; the part above N={int(n[0])} grows as N^{k:.2f}"
    return line


def table(backend: str, workers: int, results: list[dict[str, Any]]) -> str:
    head = ("| trials | wall (s) | loop ms/trial | claim ms (median / p95) | progress ms/trial | "
            "reconcile ms/trial | run recording ms/trial | status (s) | report (s) | MLflow DB (MB) | "
            "artifacts (MB) | Optuna (MB) |\n|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for r in results:
        claims = sorted(r["seconds"].get("claim_next", [0.0]))
        p95 = claims[min(len(claims) - 1, int(0.95 * len(claims)))]
        rows.append(
            f"| {r['n']} | {r['wall']:.0f} | {loop_ms(r):.0f} | {1000 * statistics.median(claims):.0f} / "
            f"{1000 * p95:.0f} | {per_trial_ms(r, 'progress'):.0f} | {per_trial_ms(r, 'reconcile'):.0f} | "
            f"{per_trial_ms(r, 'record_run'):.0f} | {r['status']:.2f} | {r['report']:.2f} | "
            f"{r['mlflow_db_bytes'] / 2**20:.1f} | {r['artifact_bytes'] / 2**20:.1f} | "
            f"{r['optuna_bytes'] / 2**20:.1f} |")
    return f"### {backend}, {workers} workers\n\n" + head + "\n" + "\n".join(rows) + "\n\n" + fit_report(results) + "\n"


def machine() -> str:
    import mlflow
    import optuna
    import torch

    load = os.getloadavg()
    return (f"{platform.node()}: {os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), "
            f"load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (shared machine); Python "
            f"{platform.python_version()}, torch {torch.__version__}, optuna {optuna.__version__}, "
            f"mlflow {mlflow.__version__}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    ap.add_argument("--sizes", default="250,500,1000,2000")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--out", default=str(Path(__file__).with_suffix(".md")))
    ap.add_argument("--label", default="", help="a note for the record (e.g. before/after a change)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    started = machine()
    results = measure(args.backend, sizes, args.workers)
    text = (f"\n## {time.strftime('%Y-%m-%d %H:%M')} {args.label}\n\n`python benchmarks/study_scale.py "
            f"--backend {args.backend} --sizes {args.sizes} --workers {args.workers}`\n\nMachine at the start: "
            f"{started}; at the end: load {os.getloadavg()[0]:.1f}.\n\n" + table(args.backend, args.workers, results))
    print(text)
    with open(args.out, "a") as f:
        f.write(text)


if __name__ == "__main__":
    main()
