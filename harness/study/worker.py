"""The worker loop: claim a slot, train its trial, report to Optuna, repeat.

Owns the sampler and pruner of a trial, which slot a worker claims next, the Lightning
callback that reports validations to Optuna and prunes, turning a finished run into
objective values, recording a failed or interrupted trial (with a FAILED MLflow run that
says why), and :func:`run_worker`, which runs slots until the study is complete and keeps the
parent MLflow run's status in step.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from harness.errors import ConfigError, HarnessError, RunFailed, shorten
from harness.keys import Attr, Phase, Tag, val_key
from harness.runtime.threads import register_worker
from harness.study.candidates import CandidateSpace
from harness.study.counts import cache_trial
from harness.study.display import StudyDisplay
from harness.study.progress import (
    StudyProgress,
    best_trial,
    fail_stale,
    progress,
    reconcile,
    settle_parent,
    slot_progress,
)
from harness.study.rungs import budget_steps, first_rung
from harness.study.schema import COSTS, StudyConfig
from harness.study.space import StudySpace
from harness.study.storage import (
    StudyHandle,
    claim_slot,
    heartbeat,
    retry_callback,
)


# -- sampler, pruner and the next slot ----------------------------------------------------------
def make_sampler(config: StudyConfig, seed: int | None) -> Any:
    import optuna

    classes = {"tpe": optuna.samplers.TPESampler, "random": optuna.samplers.RandomSampler,
               "nsgaii": optuna.samplers.NSGAIISampler,
               "grid": optuna.samplers.RandomSampler}  # grid: each slot's values are enqueued
    try:
        return classes[config.sampler.name](seed=seed, **config.sampler.options)
    except TypeError as exc:
        raise ConfigError(f"sampler.options: {exc}.") from None


def make_pruner(config: StudyConfig) -> Any:
    import optuna

    p = config.pruner
    if config.multi_objective or p.name == "none":
        return optuna.pruners.NopPruner()
    if p.name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=p.startup_trials,
                                           n_warmup_steps=p.warmup_steps)
    steps = budget_steps(config)
    if p.name == "successive_halving":
        # asynchronous successive halving (Li et al. 2020): a trial passes rung k (first rung
        # x factor^k steps) only in the top 1/factor of the trials that reached it; Optuna
        # cannot pause trials, so while fewer than 2 x factor trials reached a rung only the
        # best so far passes it (docs/scaling.md, "Where the rungs go")
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=first_rung(config), reduction_factor=p.reduction_factor,
            min_early_stopping_rate=0)
    # a compute budget gives each candidate its own steps: Optuna's "auto" takes the first
    # trial's last reported step
    return optuna.pruners.HyperbandPruner(min_resource=first_rung(config),
                                          max_resource=steps or "auto",
                                          reduction_factor=p.reduction_factor)


@dataclass
class Job:
    phase: str
    cand: CandidateSpace
    trial: Any  # FrozenTrial as claimed


def claim_next(handle: StudyHandle, space: StudySpace, prog: StudyProgress) -> Job | None:
    """Tuning first, the candidate with the fewest slots started (so an interrupted study has
    tuned every candidate about equally); then confirmation of candidates whose tuning ended."""
    by_name = {c.name: c for c in prog.candidates}
    fewest_started = sorted(space.candidates, key=lambda c: (-by_name[c.name].tune.waiting, c.index))
    for cand in fewest_started:
        if by_name[cand.name].tune.waiting:
            trial = claim_slot(handle, Phase.TUNE, cand.name)
            if trial is not None:
                return Job(Phase.TUNE, cand, trial)
    for cand in space.candidates:
        if by_name[cand.name].tune.finished and by_name[cand.name].confirm.waiting:
            trial = claim_slot(handle, Phase.CONFIRM, cand.name)
            if trial is not None:
                return Job(Phase.CONFIRM, cand, trial)
    return None


# -- running one job -----------------------------------------------------------------------------
def trial_callback(trial: Any, monitor: str, *, report: bool, prune: bool, max_steps: int,
                   length: int | None = None, fixed: bool = False) -> Any:
    """The Lightning callback that reports a trial to Optuna (:mod:`harness.study.pruning`)."""
    from harness.study.pruning import OptunaTrialCallback

    return OptunaTrialCallback(trial, monitor, report=report, prune=prune, max_steps=max_steps,
                               length=length, fixed=fixed)


def pruning_metric(config: StudyConfig, space: StudySpace, cand: CandidateSpace | None = None) -> str:
    """What the pruner compares trials by: the objective's metric at the objective's length
    (``cand``'s own: :meth:`StudySpace.objective_length_of`)."""
    length, train = _lengths(space, cand)
    return val_key(config.objective.metric) if length == train else \
        val_key(config.objective.metric, length)


def _lengths(space: StudySpace, cand: CandidateSpace | None) -> tuple[int, int]:
    """(objective length, training length) of a candidate's runs (the study's without one)."""
    if cand is None:
        return space.objective_length, space.train_length
    return space.objective_length_of(cand), space.train_length_of(cand)


def run_cannot_extrapolate(run: dict[str, Any], space: StudySpace, cand: CandidateSpace | None = None) -> bool:
    """Whether a trial's model declares it cannot run past its training inputs (only asked when
    the objective is at another length: the pruner then validates there too)."""
    length, train = _lengths(space, cand)
    if length == train:
        return False
    from harness.config import parse_run_config
    from harness.run.evaluate import fixed_length
    from harness.run.plan import plan

    return fixed_length(plan(parse_run_config(run), space.registry))


def objective_values(config: StudyConfig, space: StudySpace, result: Any,
                     length: int | None = None) -> list[float]:
    o = config.objective
    key = val_key(o.name) if o.over != "length" else val_key(o.metric, length or space.objective_length)
    if key not in result.metrics:
        na = f" It cannot run at lengths {result.not_applicable}." if result.not_applicable else ""
        raise HarnessError(
            f"the objective metric {key} was not logged.{na} Logged: "
            f"{', '.join(sorted(k for k in result.metrics if k.startswith('val/')))}."
        )
    values = [float(result.metrics[key])]
    if config.cost is not None:
        keys = COSTS[config.cost.metric][0]
        found = next((k for k in keys if k in result.metrics), None)
        if found is None:
            raise HarnessError(f"the cost metric ({' or '.join(keys)}) was not logged.")
        values.append(float(result.metrics[found]))
    if not all(math.isfinite(v) for v in values):
        raise HarnessError(f"the objective is not finite ({values}); the run diverged.")
    return values


def grid_objective(handle: StudyHandle, space: StudySpace, result: Any) -> None:
    """The objective summarised over the run's evaluation grid (``objective.over``: the mean
    over every depth x length cell, or the longest length held at the threshold), put in the
    run's metrics as ``val/<metric>_<over>`` and logged to its MLflow run (nothing when the
    run logged nothing to summarise: :func:`objective_values` then says so)."""
    from harness.run import grid

    o = handle.config.objective
    value = grid.summary(result.metrics, o.metric, o.over, o.threshold, list(space.eval_lengths))
    if value is not None:
        result.metrics[val_key(o.name)] = value
        if result.run_id:
            handle.tracker.log_metrics(result.run_id, {val_key(o.name): value})


def downstream(handle: StudyHandle, space: StudySpace, result: Any) -> str:
    """Run the study's lm-eval tasks on a finished run and log them to it (``eval/...``).
    A downstream objective is also logged as the validation metric the study reads
    (``val/eval/<task>/<metric>`` and at the objective's length), so that ranking, report and
    statistics treat it like any other objective. A failure is tagged on the run: it fails the
    trial when the objective is downstream, and otherwise leaves it complete."""
    from harness.evaluation import runner

    cfg = handle.config
    d, run_id = cfg.downstream, result.run_id
    assert d is not None
    try:
        results = runner.evaluate(run_id, d.tasks, include_path=d.include_path, limit=d.limit,
                                  num_fewshot=d.num_fewshot, batch_size=d.batch_size)
        values = runner.record(run_id, results, handle.tracker.uri)
        if cfg.objective.downstream:
            if cfg.objective.metric not in values:
                raise HarnessError(f"the downstream objective {cfg.objective.metric} was not among "
                                   f"lm-eval's results ({', '.join(sorted(values))}).")
            value = values[cfg.objective.metric]
            aliases = {val_key(cfg.objective.metric): value,
                       val_key(cfg.objective.metric, space.objective_length): value}
            handle.tracker.log_metrics(run_id, aliases)
            result.metrics.update(aliases)
    except HarnessError as exc:
        reason = shorten(str(exc), 500)
        handle.tracker.set_tags(run_id, {Tag.DOWNSTREAM_FAILED: reason})
        if cfg.objective.downstream:
            raise
        return f"downstream evaluation failed: {reason}"
    shown = ", ".join(f"{k.removeprefix('eval/')} {v:.4g}" for k, v in values.items()
                      if not k.endswith("_stderr"))
    return f"downstream: {shown}"


def _find_run(handle: StudyHandle, key: str) -> str | None:
    runs = handle.tracker.client.search_runs(
        [handle.experiment_id()], f"tags.`{Tag.TRIAL}` = '{key}'", max_results=1)
    return runs[0].info.run_id if runs else None


def run_job(handle: StudyHandle, space: StudySpace, job: Job, worker: str, display: StudyDisplay) -> str:
    """Run one claimed slot to a final Optuna state; returns that state's name."""
    import optuna
    from optuna.trial import TrialState

    from harness.run.pipeline import train

    cfg = handle.config
    number = job.trial.number
    slot = int(job.trial.user_attrs[Attr.SLOT])
    seed_base = cfg.sampler.seed
    sampler = make_sampler(cfg, None if seed_base is None else seed_base + 7919 * job.cand.index + slot)
    study = handle.load(job.phase, job.cand.name, sampler, make_pruner(cfg) if job.phase == Phase.TUNE else None)
    study_id = handle.storage.get_study_id_from_name(study.study_name)
    trial_id = handle.storage.get_trial_id_from_study_id_trial_number(study_id, number)
    key = f"{study.study_name}#{number}"
    tags: dict[str, str] = {Tag.STUDY: handle.name, Tag.PHASE: str(job.phase), Tag.CANDIDATE: job.cand.name,
            Tag.TRIAL: key, Tag.TRIAL_NUMBER: str(number), Tag.SLOT: str(slot), Tag.WORKER: worker}
    if job.phase == Phase.CONFIRM:  # known before the run config (which may fail)
        tags[Tag.SEED] = str(job.trial.user_attrs[Attr.SEED])
    label = f"[{run_name(tags)}]"
    log = display.log
    display.job_started(run_name(tags))
    started = time.monotonic()
    with heartbeat(handle.storage, trial_id, cfg.resume.heartbeat_s):
        cache_trial(study, trial_id)  # like ask(): the study's storage now knows the trial
        trial = optuna.trial.Trial(study, trial_id)
        try:
            run = _job_run_config(handle, space, job, trial)
            tags[Tag.SEED] = str(run["train"]["seed"])
            run["tracking"] = {"uri": handle.tracker.uri, "experiment": handle.record["experiment"],
                               "run_name": run_name(tags)}
            trial.set_user_attr(Attr.CONFIG, run)
            length = space.objective_length_of(job.cand)
            callback = trial_callback(
                trial, pruning_metric(cfg, space, job.cand), report=not cfg.multi_objective,
                prune=job.phase == Phase.TUNE and not cfg.multi_objective,
                max_steps=int(run["train"].get("max_steps") or 10**9), length=length,
                fixed=run_cannot_extrapolate(run, space, job.cand))
            resume = resumable_run(handle, job.trial)
            if resume is not None:
                log(f"{label} resuming run {resume} from its last checkpoint")
            result = train(run, registry=space.registry, parent_run_id=handle.parent_run_id,
                           callbacks=[callback], extra_tags=tags, resume=resume)
            trial.set_user_attr(Attr.RUN, result.run_id)
            if cfg.downstream is not None and result.run_id and (
                    job.phase == Phase.CONFIRM or cfg.objective.downstream):
                log(f"{label} {downstream(handle, space, result)}")
            if cfg.objective.over != "length":
                grid_objective(handle, space, result)
            values = objective_values(cfg, space, result, length)
            if result.run_id:
                handle.tracker.set_tags(result.run_id, {Tag.NOTE: child_note(handle, space, tags, values[0])})
            study.tell(trial, values, skip_if_finished=True)
            log(f"{label} {' / '.join(f'{v:.4g}' for v in values)} ({time.monotonic() - started:.1f} s)")
            return "COMPLETE"
        except optuna.TrialPruned as exc:
            study.tell(trial, state=TrialState.PRUNED, skip_if_finished=True)
            log(f"{label} {exc}")
            return "PRUNED"
        except (KeyboardInterrupt, SystemExit) as exc:
            # Lightning turns Ctrl-C into SystemExit(1) and SIGTERM into SIGTERMException
            # (a SystemExit) after its own shutdown: the trial is interrupted, not failed.
            # SIGUSR1 checkpoints first (Preempted): the retry resumes it, however often.
            preempted = type(exc).__name__ == "Preempted"
            _fail(handle, study, trial, key, tags,
                  "preempted (SIGUSR1; checkpointed)" if preempted else "interrupted (Ctrl-C or SIGTERM)")
            retry = handle.storage.get_heartbeat_stale_trial_callback()
            if preempted:
                retry = retry_callback(max_retry=None)
            if retry is not None:  # re-enqueue it like a trial whose worker died
                retry(study, handle.storage.get_trial(trial_id))
            raise
        except Exception as exc:
            # A RunFailed already names the plugin, the stage and the frame.
            reason = str(exc) if isinstance(exc, RunFailed) else f"{type(exc).__name__}: {exc}"
            reason = shorten(reason, 2000)
            _fail(handle, study, trial, key, tags, reason)
            log(f"{label} FAILED: {reason}")
            return "FAIL"


def resumable_run(handle: StudyHandle, trial: Any) -> str | None:
    """The MLflow run a retried trial continues: the run of the trial it retries (inherited in
    its user attributes), when that run stopped (KILLED, or RUNNING when its worker died) and
    left a checkpoint; else None (it starts afresh)."""
    from harness.run import checkpoint

    run_id = trial.user_attrs.get(Attr.RUN)
    if trial.system_attrs.get("failed_trial") is None or not run_id:
        return None
    try:
        if handle.tracker.client.get_run(str(run_id)).info.status not in ("KILLED", "RUNNING"):
            return None
        return str(run_id) if checkpoint.latest(checkpoint.folder(str(run_id))) is not None else None
    except Exception:  # no such run or folder: start afresh
        return None


def child_note(handle: StudyHandle, space: StudySpace, tags: dict[str, str], value: float) -> str:
    """A child run's description, the first thing its page shows: what the run is, its
    objective, and where the comparison is (the parent run)."""
    cfg = handle.config
    objective = f"val/{cfg.objective.metric} at length {space.objective_length}" \
        if cfg.objective.over == "length" else cfg.objective.words
    cand = tags[Tag.CANDIDATE]
    if tags[Tag.PHASE] == Phase.CONFIRM:
        what = (f"Confirmation run of candidate **{cand}** with seed {tags.get(Tag.SEED)}, its best "
                f"tuned configuration re-run")
    else:
        what = f"Tuning trial {tags[Tag.TRIAL_NUMBER]} of candidate **{cand}**"
    return (f"{what} in study {handle.name}: {objective} = **{value:.4g}**. One run says little "
            f"on its own: each candidate's mean over the confirmation seeds, its interval, the "
            f"ranking and the verdict are on the study's parent run ({handle.name}), and the "
            f"study's runs grouped by candidate open with `harness ui`.")


def run_name(tags: dict[str, str]) -> str:
    """A child run's name: ``rope/tune/trial-3`` (tuning trial 3) or ``rope/confirm/seed-2``
    (the confirmation run with seed 2), so the runs table reads like the study."""
    if tags[Tag.PHASE] == Phase.CONFIRM and Tag.SEED in tags:
        return f"{tags[Tag.CANDIDATE]}/{Phase.CONFIRM}/seed-{tags[Tag.SEED]}"
    return f"{tags[Tag.CANDIDATE]}/{tags[Tag.PHASE]}/trial-{tags[Tag.TRIAL_NUMBER]}"


def _job_run_config(handle: StudyHandle, space: StudySpace, job: Job, trial: Any) -> dict[str, Any]:
    cfg = handle.config
    if job.phase == Phase.TUNE:
        return space.run_config(job.cand, trial, seed=cfg.seed)
    best = best_trial(handle.load(Phase.TUNE, job.cand.name), cfg)
    if best is None:
        raise HarnessError(
            f"candidate '{job.cand.name}' has no completed tuning trial (all failed or were "
            f"pruned), so there is no configuration to confirm; see `harness study status`."
        )
    run = space.confirm_run_config(best.user_attrs[Attr.CONFIG], int(job.trial.user_attrs[Attr.SEED]),
                                   cand=job.cand)
    trial.set_user_attr(Attr.TUNING_TRIAL, best.number)
    return dict(run)


def _fail(handle: StudyHandle, study: Any, trial: Any, key: str, tags: dict[str, str], reason: str) -> None:
    """FAIL the trial with its reason; make sure it has a (FAILED) MLflow run to show it."""
    from optuna.trial import TrialState

    trial.set_user_attr(Attr.FAILURE, reason[:2000])
    run_id = _find_run(handle, key)
    if run_id is None:
        run_id = handle.tracker.start_run(handle.record["experiment"], parent_run_id=handle.parent_run_id,
                                          run_name=run_name(tags), tags={**tags, Tag.FAILURE: reason})
        handle.tracker.end_run(run_id, "FAILED")
    trial.set_user_attr(Attr.RUN, run_id)
    study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)


# -- the worker ---------------------------------------------------------------------------------
@dataclass
class WorkerSummary:
    jobs: dict[str, int] = field(default_factory=dict)  # final state -> count
    complete: bool = False


def run_worker(handle: StudyHandle, space: StudySpace, display: StudyDisplay | None = None) -> WorkerSummary:
    """Claim and run slots until the study is complete (or ``budget.time_total_s`` passed):
    retry interrupted trials, end orphaned runs, wait while other workers hold the last
    slots, and end the parent run FINISHED when everything is done. ``display`` shows each
    finished trial and where the study stands (default: plain lines on stdout)."""
    display = display or StudyDisplay(live=False)
    log = display.log
    cfg = handle.config
    worker = f"{socket.gethostname()}:{os.getpid()}"
    started = time.monotonic()
    summary = WorkerSummary()
    parent_running = False
    unregister = register_worker()  # its runs split the cores with the machine's other workers
    try:
        while True:
            fail_stale(handle)
            reconcile(handle)
            prog = slot_progress(handle)  # counts only: loading every trial grows with the study
            display.update(prog)
            if prog.complete:
                settle_parent(handle, prog)
                summary.complete = True
                return summary
            if cfg.budget.time_total_s and time.monotonic() - started > cfg.budget.time_total_s:
                log(f"budget.time_total_s ({cfg.budget.time_total_s:g} s) reached; stopping this worker")
                return summary
            from harness.run.checkpoint import Preempted, stop_requested

            if stop_requested():  # SIGUSR1 between trials: claim nothing more
                raise Preempted()
            job = claim_next(handle, space, prog)
            if job is None:
                time.sleep(cfg.resume.poll_s)  # other workers hold the remaining slots
                continue
            if not parent_running:
                handle.tracker.client.update_run(handle.parent_run_id, status="RUNNING")
                parent_running = True
            try:
                state = run_job(handle, space, job, worker, display)
            finally:
                display.job_started(None)
            summary.jobs[state] = summary.jobs.get(state, 0) + 1
    finally:
        unregister()
        if not summary.complete and parent_running:
            _leave_parent(handle)


def _leave_parent(handle: StudyHandle) -> None:
    """An incomplete study's parent run stays RUNNING only while some trial runs."""
    with contextlib.suppress(Exception):
        prog = progress(handle)
        if prog.complete:
            settle_parent(handle, prog)
        elif prog.running == 0:
            handle.tracker.set_tags(handle.parent_run_id, {Tag.STUDY_STATE: "incomplete"})
            handle.tracker.end_run(handle.parent_run_id, "KILLED")
