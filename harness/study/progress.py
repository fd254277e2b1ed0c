"""Where a study stands: its slots by state, the status text, and keeping MLflow in step.

Owns counting each candidate's slots by state (:func:`progress`, read by the worker loop, the
status and list commands and the report; it reads the Optuna storage only, never MLflow,
and writes nothing), the best tuning trial, the text of ``harness study status`` and
``harness study list``, and reconciliation (writes, done by ``study run`` and ``report``):
failing trials whose worker stopped beating, ending the MLflow runs of trials that no longer
run, and ending the parent run once the study is complete.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.keys import Attr, Phase, Tag
from harness.study.counts import best_values, state_counts
from harness.study.schema import StudyConfig
from harness.study.storage import (
    StudyHandle,
    phase_study_name,
    quiet_experimental,
    redact,
)


# -- progress ----------------------------------------------------------------------------------
@dataclass
class PhaseProgress:
    """The slots of one candidate in one phase, by state."""

    slots: int
    complete: int = 0
    pruned: int = 0
    failed: int = 0  # finally failed (not retried)
    retried: int = 0  # failed and re-enqueued (interrupted)
    running: int = 0
    waiting: int = 0

    @property
    def done(self) -> int:
        return self.complete + self.pruned + self.failed

    @property
    def finished(self) -> bool:
        return self.running == 0 and self.waiting == 0


@dataclass
class CandidateProgress:
    name: str
    tune: PhaseProgress
    confirm: PhaseProgress
    best_value: float | None = None
    best_trial: int | None = None
    confirm_values: dict[int, float] = field(default_factory=dict)  # seed -> objective


@dataclass
class StudyProgress:
    name: str
    candidates: list[CandidateProgress]

    @property
    def complete(self) -> bool:
        return all(c.tune.finished and c.confirm.finished for c in self.candidates)

    @property
    def running(self) -> int:
        return sum(c.tune.running + c.confirm.running for c in self.candidates)

    @property
    def done(self) -> int:
        """Slots that reached a final state (complete, pruned or finally failed)."""
        return sum(c.tune.done + c.confirm.done for c in self.candidates)

    @property
    def total(self) -> int:
        return sum(c.tune.slots + c.confirm.slots for c in self.candidates)

    @property
    def state(self) -> str:
        if self.complete:
            return "complete"
        return "in progress" if self.done or self.running else "not started"


def _retried_numbers(trials: list[Any]) -> set[int]:
    return {n for t in trials for n in t.system_attrs.get("retry_history", [])}


def phase_progress(trials: list[Any], slots: int) -> PhaseProgress:
    from optuna.trial import TrialState

    retried = _retried_numbers(trials)
    prog = PhaseProgress(slots)
    for t in trials:
        if t.state == TrialState.COMPLETE:
            prog.complete += 1
        elif t.state == TrialState.PRUNED:
            prog.pruned += 1
        elif t.state == TrialState.FAIL:
            if t.number in retried:
                prog.retried += 1
            else:
                prog.failed += 1
        elif t.state == TrialState.RUNNING:
            prog.running += 1
        else:
            prog.waiting += 1
    return prog


def best_trial(study: Any, config: StudyConfig) -> Any | None:
    """The best COMPLETE tuning trial: best objective; in a multi-objective study, the
    quality-best trial of the Pareto front."""
    from optuna.trial import TrialState

    if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        return None
    if not config.multi_objective:
        return study.best_trial
    sign = 1 if config.objective.direction == "maximize" else -1
    return max(study.best_trials, key=lambda t: (sign * t.values[0], -t.number))


def progress(handle: StudyHandle) -> StudyProgress:
    from optuna.trial import TrialState

    config = handle.config
    out = []
    for cand in config.candidates:
        tune = handle.load(Phase.TUNE, cand.name)
        confirm = handle.load(Phase.CONFIRM, cand.name)
        cp = CandidateProgress(cand.name, phase_progress(tune.get_trials(deepcopy=False), config.budget.trials),
                               phase_progress(confirm.get_trials(deepcopy=False), config.confirm.seeds))
        best = best_trial(tune, config)
        if best is not None:
            cp.best_value, cp.best_trial = best.values[0], best.number
        for t in confirm.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            cp.confirm_values[int(t.user_attrs[Attr.SEED])] = t.values[0]
        out.append(cp)
    return StudyProgress(handle.name, out)


def describe(handle: StudyHandle, prog: StudyProgress) -> str:
    """The text of ``harness study status``."""
    cfg = handle.config
    obj = cfg.objective
    length = f"length {obj.length}" if obj.length else "the training length"
    lines = [
        f"study {handle.name}: {prog.state}, {prog.done}/{prog.total} trials"
        f" ({prog.running} running now)",
        f"  storage {redact(handle.storage_url)}; MLflow {redact(handle.tracker.uri)}, parent run "
        f"{handle.parent_run_id} (browse: harness ui --study {handle.name})",
        f"  objective: {obj.direction} "
        + (f"val/{obj.metric} at {length}" if obj.over == "length" else obj.words)
        + (f"; cost: {cfg.cost.metric}" if cfg.cost else "")
        + f"; sampler {cfg.sampler.name}; pruner {cfg.pruner.name}",
    ]
    lines += [f"  note: {n}" for n in handle.record.get("notes", [])]
    lines.append(f"  {'candidate':<24} {'tuning (done/budget)':<38} {'best':>8}   "
                 f"{'confirmation':<14} {'mean':>8}")
    for c in prog.candidates:
        t = c.tune
        detail = f"{t.complete} complete, {t.pruned} pruned, {t.failed} failed"
        if t.running or t.retried:
            detail += f", {t.running} running, {t.retried} interrupted"
        best = f"{c.best_value:.4g}" if c.best_value is not None else "-"
        mean = (f"{sum(c.confirm_values.values()) / len(c.confirm_values):.4g}"
                if c.confirm_values else "-")
        lines.append(f"  {c.name:<24} {f'{t.done}/{t.slots} ({detail})':<38} {best:>8}   "
                     f"{f'{c.confirm.done}/{c.confirm.slots} seeds':<14} {mean:>8}")
    if not prog.complete and prog.running == 0:
        lines.append("  no trial is running: resume with `harness study run FILE`.")
    return "\n".join(lines)


def describe_list(storage: Any, storage_url: str) -> str:
    """The text of ``harness study list``: each study's state and progress."""
    import time

    from harness.study.storage import open_study, study_names

    names = study_names(storage)
    old = study_names(storage, old_layout=True)
    if not names and not old:
        return f"no studies in {redact(storage_url)}; start one with `harness study run FILE`."
    lines = [f"studies in {redact(storage_url)}:",
             f"  {'study':<24} {'state':<12} {'trials':>9} {'running':>8}   created"]
    for name in names:
        handle = open_study(name, storage, storage_url, check_tracking=False)
        prog = progress(handle)
        created = handle.record.get("created")
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(created)) if created else "-"
        lines.append(f"  {name:<24} {prog.state:<12} {f'{prog.done}/{prog.total}':>9} "
                     f"{prog.running:>8}   {when}")
    lines += [f"  {name:<24} created by an earlier harness version (not readable by this one)"
              for name in old]
    return "\n".join(lines)


# -- reconciliation -----------------------------------------------------------------------------
def _trial_state(storage: Any, key: str) -> Any | None:
    from optuna.exceptions import OptunaError

    study_name, _, number = key.rpartition("#")
    try:
        study_id = storage.get_study_id_from_name(study_name)
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, int(number))
        return storage.get_trial(trial_id).state
    except (KeyError, ValueError, OptunaError):
        return None


def reconcile(handle: StudyHandle) -> list[str]:
    """End every child MLflow run still RUNNING whose Optuna trial is no longer running (its
    worker died): KILLED, tagged ``harness.interrupted=true``. Returns the run ids ended."""
    from optuna.trial import TrialState

    client = handle.tracker.client
    runs = client.search_runs(
        [handle.experiment_id()],
        f"tags.`{Tag.PARENT_RUN}` = '{handle.parent_run_id}' and attributes.status = 'RUNNING'",
    )
    ended = []
    for run in runs:
        state = _trial_state(handle.storage, run.data.tags.get(Tag.TRIAL, ""))
        if state in (TrialState.RUNNING, TrialState.WAITING):
            continue
        handle.tracker.set_tags(run.info.run_id, {Tag.INTERRUPTED: "true"})
        handle.tracker.end_run(run.info.run_id, "KILLED")
        ended.append(run.info.run_id)
    return ended


def settle_parent(handle: StudyHandle, prog: StudyProgress) -> None:
    """A complete study's parent run ends FINISHED (whoever notices first)."""
    if not prog.complete:
        return
    if handle.tracker.client.get_run(handle.parent_run_id).info.status != "FINISHED":
        handle.tracker.set_tags(handle.parent_run_id, {Tag.STUDY_STATE: "complete"})
        handle.tracker.end_run(handle.parent_run_id, "FINISHED")


def fail_stale(handle: StudyHandle) -> None:
    """Mark trials whose worker stopped beating as FAIL; the storage's retry callback
    re-enqueues them (see :func:`open_storage`)."""
    import optuna

    with quiet_experimental():
        for cand in handle.config.candidates:
            for phase in Phase:
                optuna.storages.fail_stale_trials(handle.load(phase, cand.name))


def slot_progress(handle: Any) -> Any:
    """The worker loop's view of a study (:class:`~harness.study.progress.StudyProgress`):
    each candidate's slots by state from one count query, without best values (the status
    command and the report load the trials they show). Failed trials are not split into
    retried and final failures (``failed`` counts both); the loop reads only the waiting,
    running and finished slots, and the display the tuning's best value so far."""
    cfg = handle.config
    names = {(p, c.name): phase_study_name(handle.name, p, c.name) for c in cfg.candidates for p in Phase}
    counts = state_counts(handle.storage, list(names.values()))

    def phase(p: Phase, cand: str, slots: int) -> PhaseProgress:
        c = counts[names[(p, cand)]]
        return PhaseProgress(slots, complete=c["COMPLETE"], pruned=c["PRUNED"], failed=c["FAIL"],
                             running=c["RUNNING"], waiting=c["WAITING"])

    best = best_values(handle.storage, [names[(Phase.TUNE, c.name)] for c in cfg.candidates],
                       cfg.objective.direction == "maximize")
    candidates = [CandidateProgress(c.name, phase(Phase.TUNE, c.name, cfg.budget.trials),
                                    phase(Phase.CONFIRM, c.name, cfg.confirm.seeds),
                                    best_value=best.get(names[(Phase.TUNE, c.name)]))
                  for c in cfg.candidates]
    return StudyProgress(handle.name, candidates)
