"""Long-context recall studies: the width sweep behind a recall-versus-state frontier, and
what a study that ranks by an evaluation grid should be told.

A ``sweep:`` section (``sweep: {widths: [16, 32, 64]}``) runs every candidate at every width:
:func:`expand` turns each (candidate, width) into one study candidate (``gla.w32``) carrying
its :class:`~harness.study.schema.SweptWidth`, and :func:`with_width` sets that width on the
candidate's model through the model's declared ``width_param`` (``d_model`` for the
Transformer, ``width`` for the LSTM), so the worker, the stores and the report's tables need
nothing new. The report then plots each base candidate's metric against its decoding-state
bytes per layer, with its Pareto front (:mod:`harness.report.recall`).
"""

from __future__ import annotations

import copy
from typing import Any

from harness.errors import ConfigError, HarnessError


def swept_name(base: str, width: int) -> str:
    return f"{base}.w{width}"


def expand(data: dict[str, Any]) -> dict[str, Any]:
    """The raw study data with each candidate crossed with ``sweep.widths``; data whose
    candidates already carry their width (a stored record) is returned as is."""
    sweep = data.get("sweep")
    cands = data.get("candidates")
    if not isinstance(sweep, dict) or not isinstance(cands, list):
        return data
    if any(isinstance(c, dict) and c.get("swept") for c in cands):
        return data
    widths = sweep.get("widths")
    if not isinstance(widths, list) or not all(isinstance(w, int) and not isinstance(w, bool) for w in widths):
        return data  # the schema names the bad field
    widths = sorted(widths)
    out = []
    for cand in cands:
        if not isinstance(cand, dict):
            return data
        for width in widths:
            out.append({**copy.deepcopy(cand), "name": swept_name(str(cand.get("name")), width),
                        "swept": {"base": cand.get("name"), "width": width}})
    confirm = data.get("confirm")
    if isinstance(confirm, dict) and confirm.get("baseline") in {c.get("name") for c in cands}:
        # the baseline of the tables: the named candidate at its largest width
        confirm = {**confirm, "baseline": swept_name(str(confirm["baseline"]), max(widths))}
        return {**data, "candidates": out, "confirm": confirm}
    return {**data, "candidates": out}


def with_width(registry: Any, cand: Any, where: str) -> Any:
    """``cand`` with its swept width set on its model's ``width_param`` (a fixed value)."""
    if cand.swept is None:
        return cand
    try:
        spec = registry.get("model", cand.model.name)
    except HarnessError as exc:
        raise ConfigError(f"{where}.name: {exc}") from None
    param = spec.width_param
    if param is None:
        raise ConfigError(f"{where}.name: sweep.widths sets each candidate's width, but model "
                          f"'{spec.name}' declares no width_param; drop this candidate from the "
                          f"sweep (or ask the plugin author to set width_param).")
    if param in cand.model.params or param in cand.model.search:
        raise ConfigError(f"{where}.params.{param}: sweep.widths sets the width; remove "
                          f"{param} from the candidate's params and search.")
    model = cand.model.model_copy(update={"params": {**cand.model.params, param: cand.swept.width}})
    return cand.model_copy(update={"model": model})


def grid_notes(space: Any) -> list[str]:
    """What a study ranking by an evaluation grid (``objective.over``) should be told."""
    cfg = space.config
    o = cfg.objective
    if o.over == "length":
        return []
    notes = []
    if len(space.eval_lengths) < 2 and not getattr(space.task, "depths", ()):
        notes.append(f"objective over: {o.over} on a task evaluated at one length and no "
                     f"depths: it is val/{o.metric} at length {space.train_length}; add "
                     f"task.params.eval_lengths")
    if cfg.pruner.name != "none" and not cfg.multi_objective:
        notes.append(f"pruner '{cfg.pruner.name}' compares tuning trials by val/{o.metric} at "
                     f"length {space.objective_length} (a grid is evaluated once, after "
                     f"training), not by {o.words}; pruner: {{name: none}} tunes on the "
                     f"objective alone")
    return notes
