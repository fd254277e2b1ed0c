"""Compute budgets of a study and the grid of a scaling study.

A study's ``budget`` fixes each run's length in one of four currencies: ``steps``, ``flops``
(training FLOPs: the steps follow from the candidate's FLOPs per token, counted on one step,
:mod:`harness.run.flops`), ``tokens`` (training tokens) or ``seconds`` (wall clock on the
machine at hand: machine-dependent, and the report says so). :func:`run_budget` is what a
run config gets for it.

A ``scaling:`` section crosses every candidate with a size schedule (model parameters per
size: a width/depth schedule) and at least 3 compute budgets spanning at least 10x;
:func:`expand` turns each (candidate, size, budget) into one study candidate
(``attention.s2.c1e13``) carrying its :class:`~harness.study.schema.ScalingCell`, so the
worker, the stores and the report's tables need nothing new. How the learning rate carries
across sizes is the ``transfer`` rule:

* ``per_size`` tunes every cell with the study's search;
* ``scaled`` fixes one global learning rate per size, lr(width) = lr x (width / base
  width)^-power, the base lr tuned beforehand at the base width. It scales *every*
  parameter's lr alike (embeddings, norms' gains, biases and the readout included) and leaves
  the model in the standard parametrization (its initialisation, its readout, its 1/sqrt(d)
  attention scores). That is not μP at any power: μP divides only the hidden matrices' Adam lr
  by the width and changes the initialisation and multipliers too;
* ``mup`` builds every cell's model in μP (``model.parametrization: mup`` with the rule's
  ``base``: :mod:`harness.nn.parametrization`), whose hyper-parameters are the same at every
  size: ``lr`` fixed when the rule gives it (tuned beforehand at the base shape), else searched
  per cell like ``per_size``.
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any

from harness.errors import ConfigError
from harness.study.profiles import merge

#: Above this many estimated steps the one-step check does not measure: the estimate
#: (harness.run.flops.estimate) is within a factor 2 of the count for every registered model.
ROUGH_ENOUGH = 100
#: The smallest size of each candidate is measured (its uncounted share) unless it trains this
#: many steps or more (then it is too large to measure quickly on a CPU).
MEASURE_BELOW = 10**6
#: Measured step costs by configuration (the budgets of a scaling study share them).
_PROBED: dict[str, Any] = {}
_INFO: dict[tuple[int, str], Any] = {}


def budget_label(value: float) -> str:
    """``1e13``, ``3e12``, ``2.5e14``: a budget as it appears in a candidate's name."""
    mantissa, exponent = f"{value:.2g}".split("e") if "e" in f"{value:.2g}" else (f"{value:.2g}", "0")
    return f"{mantissa}e{int(exponent)}"


def cell_name(base: str, size: int, budget: float, unit: str) -> str:
    return f"{base}.s{size + 1}.{'c' if unit == 'flops' else 't'}{budget_label(budget)}"


def scaled_lr(transfer: dict[str, Any], size: dict[str, Any]) -> float | None:
    """The learning rate of one size under the ``scaled`` rule, or ``mup``'s fixed lr (the
    same at every size); None when the cell's search sets it."""
    if transfer.get("rule") == "mup":
        lr = transfer.get("lr")
        return float(lr) if isinstance(lr, int | float) and not isinstance(lr, bool) and lr > 0 else None
    if transfer.get("rule", "per_size") != "scaled":
        return None
    lr, base = transfer.get("lr"), transfer.get("width")
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in (lr, base)):
        return None  # the schema names the missing or bad field (scaling.transfer.lr / width)
    param = transfer.get("width_param", "d_model")
    width = size.get(param)
    if not isinstance(width, int | float) or width <= 0:
        raise ConfigError(f"scaling.sizes: transfer rule 'scaled' scales lr by "
                          f"scaling.transfer.width_param '{param}', which every size must set "
                          f"(a positive number); got {width!r} in {size}.")
    power = transfer.get("power", 1.0)
    if not isinstance(power, int | float) or isinstance(power, bool):
        return None  # the schema names it
    return float(lr) * (float(width) / float(base)) ** -float(power)  # type: ignore[arg-type]


def expand(data: dict[str, Any]) -> dict[str, Any]:
    """The raw study data with its candidates crossed with ``scaling.sizes`` and
    ``scaling.budgets`` (each size's params merged into the candidate's ``model.params``);
    data whose candidates already carry a cell (a study's stored record) is returned as is."""
    scaling = data.get("scaling")
    cands = data.get("candidates")
    if not isinstance(scaling, dict) or not isinstance(cands, list):
        return data
    if any(isinstance(c, dict) and c.get("cell") for c in cands):
        return data
    sizes, budgets = scaling.get("sizes"), scaling.get("budgets")
    if not isinstance(sizes, list) or not isinstance(budgets, list):
        return data  # the schema names the missing field
    unit = scaling.get("unit", "flops")
    transfer = scaling.get("transfer") or {}
    out = []
    for cand in cands:
        if not isinstance(cand, dict) or not isinstance(cand.get("model"), dict):
            return data
        for i, size in enumerate(sizes):
            if not isinstance(size, dict):
                return data
            for budget in budgets:
                if not isinstance(budget, int | float) or isinstance(budget, bool):
                    return data
                model = copy.deepcopy(cand["model"])
                model["params"] = merge(model.get("params") or {}, size)
                if transfer.get("rule") == "mup" and isinstance(transfer.get("base"), dict):
                    model["parametrization"], model["base"] = "mup", dict(transfer["base"])
                out.append({**cand, "name": cell_name(str(cand.get("name")), i, float(budget), unit),
                            "model": model,
                            "cell": {"base": cand.get("name"), "size": i, "budget": float(budget),
                                     "unit": unit, "lr": scaled_lr(transfer, size)}})
    confirm = data.get("confirm")
    if isinstance(confirm, dict) and confirm.get("baseline") in {c.get("name") for c in cands}:
        # the baseline of the per-cell tables: its largest size at the largest budget
        confirm = {**confirm, "baseline": cell_name(str(confirm["baseline"]), len(sizes) - 1,
                                                    float(max(budgets)), unit)}
        return {**data, "candidates": out, "confirm": confirm}
    return {**data, "candidates": out}


def check_budgets(budgets: list[float]) -> None:
    """At least 3 distinct positive budgets spanning at least 10x (else ValueError)."""
    if len(set(budgets)) < 3:
        raise ValueError(f"a scaling fit needs at least 3 distinct budgets; got "
                         f"{len(set(budgets))} ({', '.join(f'{b:.3g}' for b in budgets)})")
    if min(budgets) <= 0:
        raise ValueError("budgets must be positive")
    if max(budgets) < 10 * min(budgets):
        raise ValueError(f"the budgets must span at least 10x (a scaling exponent from less is "
                         f"mostly noise); {min(budgets):.3g} to {max(budgets):.3g} spans "
                         f"{max(budgets) / min(budgets):.3g}x")


def run_budget(config: Any, cand: Any) -> dict[str, Any]:
    """The run-config training settings that fix a run's length: ``max_steps``, or
    ``max_flops`` / ``max_tokens`` (the run resolves the steps), and ``max_time_s``."""
    b = config.budget
    cell = cand.candidate.cell if cand is not None else None
    out: dict[str, Any] = {"max_time_s": b.seconds or b.time_per_run_s}
    if b.count == "all":
        out["flops_count"] = "all"
    if cell is not None:
        out["max_flops" if cell.unit == "flops" else "max_tokens"] = (
            cell.budget if cell.unit == "flops" else int(round(cell.budget)))
    elif b.flops is not None:
        out["max_flops"] = b.flops
    elif b.tokens is not None:
        out["max_tokens"] = b.tokens
    else:
        out["max_steps"] = b.steps
    return out


def check_one_step(space: Any, cand: Any, run: dict[str, Any]) -> tuple[int | None, float | None]:
    """The steps a candidate's base configuration trains under a compute budget (None for a
    step budget) and, where it was measured, the share of uncounted work (element-wise,
    FFT) in its counted FLOPs; a ConfigError naming the candidate when the budget buys less
    than one step."""
    if "max_flops" not in run["train"] and "max_tokens" not in run["train"]:
        return None, None
    from harness.config import parse_run_config
    from harness.run.build import task_info
    from harness.run.flops import estimate, probe, resolve_steps
    from harness.run.plan import plan

    try:
        p = plan(parse_run_config(run), space.registry)
        task = space.task_for(run["task"]["params"])  # the candidate's own task params over the study's
        info_key = (id(task), str(p.fmt))
        if info_key not in _INFO:
            _INFO[info_key] = task_info(p, task)
        rough = estimate(p, task, _INFO[info_key])
        t = p.config.train
        rough_steps = (rough.steps_for_flops(t.max_flops) if t.max_flops is not None
                       else rough.steps_for_tokens(float(t.max_tokens or 0)))
        first = cand.candidate.cell is None or cand.candidate.cell.size == 0
        if rough_steps > ROUGH_ENOUGH and not (first and rough_steps < MEASURE_BELOW):
            # a hundred steps or more: measuring cannot change the answer (the uncounted
            # share is measured on each candidate's smallest size)
            return round(rough_steps), None
        key = json.dumps({k: run[k] for k in ("task", "model")} | {
            "train": {k: v for k, v in run["train"].items() if k not in ("max_flops", "max_tokens")}},
            sort_keys=True, default=str)
        if key not in _PROBED:
            _PROBED[key] = probe(p, task=task, measure_uncounted=True)
        cost = _PROBED[key]
        share = cost.uncounted_per_token / cost.flops_per_token if cost.flops_per_token else None
        return resolve_steps(p, cost), share
    except ConfigError as exc:
        cell = cand.candidate.cell
        where = (f"scaling.budgets ({cell.budget:.3g}) at scaling.sizes[{cell.size}]"
                 if cell is not None else "budget")
        raise ConfigError(f"candidates[{cand.index}] ({cand.name}): {where}: {exc}") from None


def off_budget(realised: float | None, budget: float | None) -> float | None:
    """The relative deviation of a run's realised compute from its budget."""
    if realised is None or budget is None or budget <= 0 or not math.isfinite(realised):
        return None
    return realised / budget - 1.0
