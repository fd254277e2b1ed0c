"""Where the rungs of successive halving and Hyperband are, one home for the pruner that
runs them (:func:`harness.study.worker.make_pruner`) and the report that states them."""

from __future__ import annotations

from harness.study.schema import StudyConfig


def budget_steps(config: StudyConfig) -> int | None:
    """Each run's steps under a step budget; None when a compute budget sets them per candidate."""
    return config.budget.steps if config.budget.currency == "steps" else None


def first_rung(config: StudyConfig) -> int:
    """Steps of the first rung of successive halving or Hyperband: ``pruner.min_resource``,
    else ``train.val_every``, at most the budget's steps."""
    steps = budget_steps(config)
    first = config.pruner.min_resource or int(config.train.get("val_every", 250))
    return min(first, steps or first)


def rungs_in_words(config: StudyConfig) -> str:
    """The pruner as the report states it: ``successive_halving pruner, rungs at 100 and 300
    of 600 steps (factor 3)``."""
    p = config.pruner
    if config.multi_objective or p.name == "none":
        return "no pruner"
    if p.name == "median":
        return (f"median pruner from step {p.warmup_steps}, once {p.startup_trials} "
                f"trial{'s' if p.startup_trials != 1 else ''} completed")
    first, steps = first_rung(config), budget_steps(config)
    if p.name == "hyperband" or steps is None:
        return f"{p.name} pruner, first rung at {first} steps (factor {p.reduction_factor})"
    rungs = []
    while first < steps:  # a run is never pruned at its last step
        rungs.append(first)
        first *= p.reduction_factor
    if not rungs:
        return f"{p.name} pruner, no rung before the last step (nothing is pruned)"
    at = " and ".join([", ".join(str(r) for r in rungs[:-1]), str(rungs[-1])] if len(rungs) > 1
                      else [str(rungs[0])])
    return (f"{p.name} pruner, rung{'s' if len(rungs) > 1 else ''} at {at} of {steps} steps "
            f"(factor {p.reduction_factor})")
