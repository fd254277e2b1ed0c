"""Bounds on budgets and sizes from what a machine can do in a plausible time.

A value the schema accepts can still be one no run could finish: ``train.max_flops=1e30``
is fourteen million years on the fastest accelerator there is; ``train.max_tokens=1e16``
with a small model is 3e14 steps. Such values are refused with what they would cost, not
left to train for ever. The yardstick is :data:`harness.runtime.devices.PEAKS`, the fastest
device the harness knows, at 100% of its dense bf16 peak (no run does better), for at most
:data:`MAX_SECONDS` (a year):

* a FLOP budget above ``peak x a year`` (:func:`flops_problem`);
* a run of more steps than a year of :data:`MIN_STEP_S` steps (:func:`steps_problem`; no
  optimizer step of any model takes less on any device: a kernel launch alone is ~5 us);
* a grid of more than :data:`MAX_GRID_CELLS` cells (a scaling study's candidates x sizes x
  budgets, each an Optuna study with its own trials: :func:`grid_problem`).
"""

from __future__ import annotations

from harness.runtime.devices import PEAKS

#: The longest a run may plausibly take.
MAX_SECONDS = 365.25 * 24 * 3600
#: The shortest an optimizer step takes anywhere (a generous floor: ~20 kernel launches).
MIN_STEP_S = 1e-4
#: Cells of a scaling grid at most (candidates x sizes x budgets).
MAX_GRID_CELLS = 300


def fastest() -> tuple[str, float]:
    """The fastest device in the peak table and its dense bf16 FLOP/s."""
    best = max(PEAKS, key=lambda p: p.bf16_tflops)
    return best.name, best.bf16_tflops * 1e12


def max_flops() -> float:
    """The largest FLOP budget accepted: a year at the fastest device's peak."""
    return fastest()[1] * MAX_SECONDS


def max_steps() -> int:
    """The most optimizer steps a run may resolve to (a year of the fastest possible steps)."""
    return int(MAX_SECONDS / MIN_STEP_S)


def _years(seconds: float) -> str:
    years = seconds / MAX_SECONDS
    return f"{years:,.0f} years" if years >= 2 else f"{seconds / 86400:,.0f} days"


def flops_problem(flops: float) -> str | None:
    """Why a FLOP budget cannot be meant, or None."""
    name, peak = fastest()
    if flops <= max_flops():
        return None
    return (f"{flops:.3g} FLOPs would take {_years(flops / peak)} on the fastest device the harness "
            f"knows ({name}, {peak:.3g} FLOP/s dense bf16, at 100% utilisation); a budget is at most "
            f"a year there, {max_flops():.3g} FLOPs")


def steps_problem(steps: float, what: str) -> str | None:
    """Why a run of ``steps`` optimizer steps (from ``what``) cannot be meant, or None."""
    if steps <= max_steps():
        return None
    return (f"{what} resolves to {steps:.3g} optimizer steps: over a year even at "
            f"{MIN_STEP_S * 1e6:.0f} us a step, faster than any device runs one (at most "
            f"{max_steps():.3g} steps)")


def grid_problem(cells: int, parts: str, trials: int) -> str | None:
    """Why a scaling grid of ``cells`` cells (``parts``: how they multiply) is too large, or None."""
    if cells <= MAX_GRID_CELLS:
        return None
    return (f"the scaling grid has {parts} = {cells:,} cells, each tuned with {trials:,} trial(s): "
            f"{cells * trials:,} runs before confirmation; at most {MAX_GRID_CELLS} cells are "
            f"accepted. Fewer sizes or budgets (3 to 6 of each fit a scaling law)")
