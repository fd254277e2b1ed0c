"""Where the rungs of successive halving and Hyperband are, one home for the pruner that
runs them (:func:`harness.study.worker.make_pruner`) and the report that states them."""

from __future__ import annotations

from harness.study.schema import StudyConfig


def first_rung(config: StudyConfig) -> int:
    """Steps of the first rung of successive halving or Hyperband: ``pruner.min_resource``,
    else ``train.val_every``, at most the budget's steps."""
    steps = config.budget.steps if config.budget.currency == "steps" else None
    first = config.pruner.min_resource or int(config.train.get("val_every", 250))
    return min(first, steps or first)


def rungs_in_words(config: StudyConfig) -> str:
    """The pruner as the report states it: ``successive_halving pruner, rungs at 100 and 300
    steps (factor 3)``."""
    p = config.pruner
    if config.multi_objective or p.name == "none":
        return "no pruner"
    if p.name == "median":
        return (f"median pruner from step {p.warmup_steps}, once {p.startup_trials} "
                f"trial{'s' if p.startup_trials != 1 else ''} completed")
    first, steps = first_rung(config), config.budget.steps if config.budget.currency == "steps" else None
    if p.name == "hyperband" or steps is None:
        return f"{p.name} pruner, first rung at {first} steps (factor {p.reduction_factor})"
    rungs = [first * p.reduction_factor ** k for k in range(64)
             if first * p.reduction_factor ** k < steps]
    at = ", ".join(str(r) for r in rungs[:-1]) + (" and " if len(rungs) > 1 else "") + str(rungs[-1])
    return f"{p.name} pruner, rung{'s' if len(rungs) > 1 else ''} at {at} of {steps} steps (factor {p.reduction_factor})"
