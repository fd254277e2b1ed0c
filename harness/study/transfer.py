"""Tuning small, confirming at full width: μP's hyper-parameter transfer in a study.

An ordinary study with ``transfer: {rule: mup, base: {d_model: 64}}`` tunes every candidate
at the base shape and confirms it at its own width: each tuning trial's model is the
candidate's with the base's params (those its model has) in μP (``model.parametrization:
mup``, ``model.base`` = those params), and the confirmation re-runs the best trial's
hyper-parameters unchanged at the candidate's width (its fixed value, its plugin's default,
or the width that matches ``budget.params``), in μP with the same base. At the base width μP
is the standard parametrization, so the trials tune the model a standard study at that width
would; μP is what lets the values hold at the larger width (Yang et al. 2022; the evidence for
each model family is ``benchmarks/mup_width_cpu.md`` and ``benchmarks/mup_transfer_cpu.md``,
and docs/scaling.md says where it does not hold). μP's multipliers (``model.mup``, fixed in a
candidate or searched with ``search: {mup.FIELD: ...}``) are tuned with the rest and carried
unchanged.

Each trial trains as many steps as the full-width run will: a step or token budget is the same
at any width; a FLOP budget is turned into the steps it buys at the full width (the trials of a
small model would otherwise train several times longer than the run they stand for). A budget
in seconds is refused (the steps it buys depend on the width). The report's protocol says how
each candidate was tuned (:func:`protocol_text`).
"""

from __future__ import annotations

import copy
from typing import Any

from harness.errors import ConfigError


def check_transfer(config: Any) -> None:
    """A study's ``transfer`` against the rest of it (ValueError: the schema's message)."""
    t = config.transfer
    if t is None:
        return
    if config.scaling is not None:
        raise ValueError("transfer: a scaling study says how hyper-parameters carry across its sizes "
                         "in scaling.transfer (rule: mup with its base); remove the top-level transfer")
    if config.budget.seconds is not None:
        raise ValueError("transfer: tuning at a small width trains as many steps as the full-width "
                         "run, which a budget in seconds does not fix; give budget.steps, tokens or flops")
    for cand in config.candidates:
        searched = sorted(set(cand.model.search) & set(t.base))
        if searched:
            raise ValueError(f"candidates ({cand.name}): model.search.{searched[0]}: transfer tunes at "
                             f"the base shape and confirms at the candidate's own width, so the "
                             f"width is not searched; fix it in model.params")
        if cand.model.parametrization == "standard" and cand.model.base:
            raise ValueError(f"candidates ({cand.name}): model.base needs model.parametrization: mup")


def check_space(space: Any) -> None:
    """``transfer.base`` against every candidate, before anything is created: each base param
    is some candidate's, no base is wider than the candidate it stands for, and each
    candidate's tuning run (its model at the base, in μP, with the study's train settings)
    plans as a run (μP refuses ``strategy: fsdp``); a ConfigError naming the field otherwise."""
    import dataclasses

    from harness.config import parse_run_config
    from harness.errors import HarnessError
    from harness.run.plan import plan

    t = space.config.transfer
    if t is None:
        return
    used: set[str] = set()
    for cand in space.candidates:
        mine = base_for(cand, t.base)
        used |= set(mine)
        run = {**space.base_run_config(cand), "train": dict(space.config.train)}
        defaults = {f.name: f.default for f in dataclasses.fields(cand.model.spec.config)}
        for key, value in mine.items():
            full = run["model"]["params"].get(key, defaults.get(key))
            matched = key == cand.width_param and space.config.width_target is not None
            if not matched and isinstance(full, int) and value > full:
                raise ConfigError(
                    f"transfer.base.{key}: {value} is wider than candidate '{cand.name}' ({key} = {full}): "
                    f"the trials tune a smaller model than the one confirmed, never a wider one. Set "
                    f"transfer.base.{key} to at most {full} (μP's base is the smallest width).")
        try:
            plan(parse_run_config(tuning_run(run, cand, t.base)), space.registry)
        except HarnessError as exc:
            raise ConfigError(f"transfer: candidate '{cand.name}' tuned at the base shape "
                              f"({', '.join(f'{k} = {v}' for k, v in mine.items())}, in μP): {exc}") from None
    unknown = [k for k in t.base if k not in used]
    if unknown:
        raise ConfigError(
            f"transfer.base.{unknown[0]}: no candidate's model has a param '{unknown[0]}', so it sets "
            f"nothing (a misspelt width?). Remove it, or name a param of the candidates' models "
            f"that sets their width, e.g. d_model.")


def base_for(cand: Any, base: dict[str, int]) -> dict[str, int]:
    """The base's params that the candidate's model has (a ConfigError naming it when none)."""
    import dataclasses

    fields = {f.name for f in dataclasses.fields(cand.model.spec.config)}
    mine = {k: v for k, v in base.items() if k in fields}
    if not mine:
        raise ConfigError(
            f"transfer.base: candidate '{cand.name}' (model '{cand.model.spec.name}') has none of "
            f"its params ({', '.join(base)}); add the params that set its width, e.g. "
            f"{cand.model.spec.width_param or 'd_model'}: 64")
    return mine


def tuning_run(run: dict[str, Any], cand: Any, base: dict[str, int]) -> dict[str, Any]:
    """A tuning trial's run config: the full-width run's model at the base shape, in μP."""
    out = copy.deepcopy(run)
    mine = base_for(cand, base)
    out["model"]["params"].update(mine)
    out["model"]["parametrization"], out["model"]["base"] = "mup", dict(mine)
    fixed = cand.candidate.model.mup
    if fixed is not None or "mup" in out["model"]:  # μP's multipliers: tuned here, carried unchanged
        out["model"]["mup"] = {**(fixed.model_dump() if fixed is not None else {}), **out["model"].get("mup", {})}
    return out


def full_width_run(tuned: dict[str, Any], full: dict[str, Any]) -> dict[str, Any]:
    """The confirmation's run config: the tuned trial's, with the width params of ``full`` (the
    candidate's run config at its own width) and the same μP base."""
    out = copy.deepcopy(tuned)
    for key in tuned["model"].get("base", {}):
        if key in full["model"]["params"]:
            out["model"]["params"][key] = full["model"]["params"][key]
        else:  # the candidate leaves it to its plugin's default
            out["model"]["params"].pop(key, None)
    return out


def run_budget(space: Any, cand: Any, full: dict[str, Any]) -> dict[str, Any]:
    """The training settings a tuning trial's length takes from the full-width run: a FLOP
    budget becomes the steps it buys at the full width."""
    train = dict(full["train"])
    if "max_flops" not in train:
        return train
    from harness.study.budget import check_one_step

    steps, _ = check_one_step(space, cand, full)
    train.pop("max_flops")
    train["max_steps"] = int(steps or 1)
    return train


def protocol_text(config: Any) -> str:
    """What the report's protocol says of the transfer (empty without one)."""
    t = config.transfer
    if t is None:
        return ""
    base = ", ".join(f"{k} = {v}" for k, v in t.base.items())
    return (f"tuned at the base shape ({base}, each candidate's model where it has the param) in μP "
            f"(model.parametrization: mup), then confirmed at each candidate's own width in μP with "
            f"the tuned hyper-parameters unchanged (μP's transfer; the trials trained as many steps "
            f"as the full-width runs; μP's multipliers, model.mup, are among the hyper-parameters "
            f"carried; measured at CPU sizes with its output multiplier tuned at the base, μP "
            f"matched the standard parametrization tuned per width for a Transformer grown by heads "
            f"and beat it for an LSTM: benchmarks/mup_width_cpu.md)")
