"""Stage 1 of a run: resolve a run config against the registry into a :class:`Plan`.

Everything that can be checked without building anything is checked here (names, parameters
against their declared types and bounds, presets, the pairing of the position scheme with
every attention variant and mixer, the batch format), so a bad config fails before anything
is recorded.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.config import ComponentConfig, ModelConfig, RunConfig
from harness.data.formats import BatchFormat, batch_format
from harness.errors import (
    ConfigError,
    IncompatibleError,
    PluginError,
    UnknownNameError,
)
from harness.params import resolve, to_dict
from harness.registry.specs import ModelSpec, PositionSpec, Registry, SequenceMixerSpec, TaskSpec

#: Attention roles whose keys and values come from another sequence (the encoder's
#: memory). Position hooks never apply there (see ``harness.nn.attention``), so these roles
#: are not checked against the position scheme; every other role is self-attention.
CROSS_ROLES = frozenset({"cross"})


@dataclass
class Component:
    spec: Any
    params: Any  # an instance of spec.config

    @property
    def name(self) -> str:
        return str(self.spec.name)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "params": to_dict(self.params)}


@dataclass
class ModelParts:
    """A model config resolved: the model and the components it is built with."""

    model: Component
    attention: Component | None = None
    position: Component | None = None
    mixer: Component | None = None
    #: per-role attention overrides (``model.attention_roles``), in the model's role order
    attention_roles: dict[str, Component] = field(default_factory=dict)
    #: ``standard`` or ``mup`` (``harness.nn.parametrization``), and μP's base shape
    parametrization: str = "standard"
    base: dict[str, int] = field(default_factory=dict)
    #: μP's base-width multipliers (``model.mup``: harness.nn.multipliers), as given
    multipliers: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The model's part of a resolved config (every default filled in)."""
        model = self.model.as_dict()
        model["attention"] = self.attention.as_dict() if self.attention else None
        if self.mixer:
            model["mixer"] = self.mixer.as_dict()
        model["position"] = self.position.as_dict() if self.position else None
        if self.attention_roles:
            model["attention_roles"] = {r: c.as_dict() for r, c in self.attention_roles.items()}
        if self.parametrization != "standard":
            model["parametrization"], model["base"] = self.parametrization, dict(self.base)
        if self.multipliers:
            model["mup"] = dict(self.multipliers)
        return model

    def components(self) -> dict[str, Component]:
        """Components by role; an attention override is ``attention.<role>``."""
        items = {"model": self.model}
        if self.attention:
            items["attention"] = self.attention
        items.update({f"attention.{r}": c for r, c in self.attention_roles.items()})
        if self.mixer:
            items["mixer"] = self.mixer
        if self.position:
            items["position"] = self.position
        return items


@dataclass
class Plan:
    """A run config resolved against the registry: specs and validated params."""

    config: RunConfig
    task: Component
    parts: ModelParts
    fmt: BatchFormat  # the batch format the model receives
    #: what one step costs, measured before a compute-budgeted run (harness.run.flops.StepCost)
    step_cost: Any = None

    @property
    def model(self) -> Component:
        return self.parts.model

    @property
    def attention(self) -> Component | None:
        return self.parts.attention

    @property
    def position(self) -> Component | None:
        return self.parts.position

    @property
    def mixer(self) -> Component | None:
        return self.parts.mixer

    @property
    def attention_roles(self) -> dict[str, Component]:
        return self.parts.attention_roles

    def role_attention(self, role: str) -> Component | None:
        """The attention variant serving ``role``: its override, else the shared one."""
        return self.attention_roles.get(role, self.attention)

    def resolved_config(self) -> dict[str, Any]:
        """The full config with every default filled in (logged as the run's config)."""
        data = self.config.model_dump(mode="json")
        data["task"] = self.task.as_dict()
        data["model"] = self.parts.as_dict()
        return data

    def components(self) -> dict[str, Component]:
        """Components by role (task, model, attention, attention.<role>, mixer, position)."""
        return {"task": self.task, **self.parts.components()}


def _component(registry: Registry, kind: str, cfg: ComponentConfig, where: str) -> Component:
    spec = registry.get(kind, cfg.name)
    return Component(spec, resolve(spec.config, cfg.params, f"{where}.params"))


def check_pairing(layer: SequenceMixerSpec, position: PositionSpec) -> None:
    """Reject an attention variant or mixer with a position scheme acting at a hook point the
    layer cannot apply, with the layer's own reason."""
    hooks = layer.position_hooks or frozenset()
    missing = sorted((position.hooks or frozenset()) - hooks)
    if missing:
        why_not = layer.why_not or {}
        reasons = "; ".join(why_not.get(h, f"it does not apply '{h}' hooks") for h in missing)
        raise IncompatibleError(
            f"{layer.kind} '{layer.name}' cannot be paired with position '{position.name}': "
            f"the scheme acts through {', '.join(missing)} and {reasons}. Pick a position scheme "
            f"that acts only at {', '.join(sorted(hooks)) or 'no hook'}."
        )


def _with_preset(registry: Registry, cfg: ModelConfig) -> ModelConfig:
    """The model config with its named preset filled in under the values it sets itself."""
    if cfg.preset is None:
        return cfg
    mspec: ModelSpec = registry.get("model", cfg.name)
    if cfg.preset not in mspec.presets:
        close = difflib.get_close_matches(cfg.preset, list(mspec.presets), n=1, cutoff=0.5)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise ConfigError(
            f"model.preset: model '{mspec.name}' has no preset '{cfg.preset}'.{hint} Its presets: "
            f"{', '.join(mspec.presets) or 'none'}."
        )
    preset = mspec.presets[cfg.preset]
    update: dict[str, Any] = {"params": {**preset.get("params", {}), **cfg.params}}
    for role in ("attention", "mixer", "position"):
        if getattr(cfg, role) is None and preset.get(role) is not None:
            update[role] = ComponentConfig.model_validate(preset[role])
    return cfg.model_copy(update=update)


def resolve_model(registry: Registry, cfg: ModelConfig) -> ModelParts:
    """The components of a model config (its preset and defaults filled in), with the pairing
    of the position scheme checked against every self-attention role and the mixer."""
    cfg = _with_preset(registry, cfg)
    model = _component(registry, "model", cfg, "model")
    mspec: ModelSpec = model.spec
    parts = ModelParts(model)
    acfg, mcfg, pcfg = cfg.attention, cfg.mixer, cfg.position
    if mcfg is not None:
        if not mspec.uses_mixer:
            raise ConfigError(f"model.mixer: model '{mspec.name}' takes no mixer; remove it"
                              + (" or use model.attention." if mspec.uses_attention else "."))
        parts.mixer = _component(registry, "mixer", mcfg, "model.mixer")
    if mspec.uses_attention:
        if acfg is None and mcfg is None and mspec.default_attention:
            acfg = ComponentConfig(name=mspec.default_attention)
        if acfg is None and mcfg is None and mspec.attention_required:
            raise ConfigError(
                f"model.attention: model '{mspec.name}' needs an attention variant; add "
                f"model.attention.name (one of {', '.join(registry.names('attention'))})."
            )
        if acfg is not None:
            parts.attention = _component(registry, "attention", acfg, "model.attention")
    elif acfg is not None:
        raise ConfigError(
            f"model.attention: model '{mspec.name}' takes no attention variant; remove it."
        )
    if mspec.uses_position:
        if pcfg is None and mspec.default_position:
            pcfg = ComponentConfig(name=mspec.default_position)
        if pcfg is not None:
            parts.position = _component(registry, "position", pcfg, "model.position")
    elif pcfg is not None:
        raise ConfigError(f"model.position: model '{mspec.name}' takes no position scheme; remove it.")
    parts.attention_roles = resolve_roles(registry, mspec, cfg.attention_roles)
    if parts.position is not None:
        _check_pairings(mspec, parts)
    if cfg.parametrization == "mup":
        parts.parametrization, parts.base = "mup", mup_base(model, cfg.base)
        if cfg.mup is not None:
            parts.multipliers = cfg.mup.model_dump()
    return parts


def mup_base(model: Component, base: dict[str, int]) -> dict[str, int]:
    """μP's base shape checked against the model's params: each an int param of the model
    that builds at the base and at ``DELTA`` times it; unset, the model's width_param at its
    declared default."""
    import dataclasses

    from harness.nn.parametrization import DELTA

    mspec: ModelSpec = model.spec
    if not base:
        width = mspec.width_param
        fields = {f.name: f for f in dataclasses.fields(mspec.config)}
        default = fields[width].default if width in fields else None
        if not isinstance(default, int):
            raise ConfigError(f"model.base: model '{mspec.name}' declares no width_param with a "
                              f"default, so μP cannot tell its base width; set model.base to the "
                              f"params that grow with width at their base values, e.g. {{d_model: 64}}.")
        base = {str(width): default}
    current = to_dict(model.params)
    for name in base:
        if not isinstance(current.get(name), int) or isinstance(current.get(name), bool):
            ints = sorted(k for k, v in current.items() if isinstance(v, int) and not isinstance(v, bool))
            raise ConfigError(f"model.base.{name}: not an int parameter of model '{mspec.name}'; "
                              f"the base shape names the params that grow with width "
                              f"(its int params: {', '.join(ints) or 'none'}).")
    for scale, what in ((1, "base"), (DELTA, f"{DELTA} x base")):
        resolve(mspec.config, {**current, **{k: scale * v for k, v in base.items()}},
                f"model.base ({what}: {', '.join(f'{k}={scale * v}' for k, v in base.items())})")
    return dict(base)


def _check_pairings(mspec: ModelSpec, parts: ModelParts) -> None:
    """The position scheme against the variant of every self-attention role and the mixer."""
    assert parts.position is not None
    roles = parts.attention_roles
    uses = {r: roles.get(r, parts.attention) for r in mspec.attention_roles if r not in CROSS_ROLES}
    layers = dict(uses) if mspec.attention_roles else {"": parts.attention}
    layers["mixer"] = parts.mixer
    for role, comp in layers.items():
        if comp is None:
            continue
        try:
            check_pairing(comp.spec, parts.position.spec)
        except IncompatibleError as exc:
            if role in roles:
                raise IncompatibleError(f"model.attention_roles.{role}: {exc}") from None
            raise


def resolve_roles(
    registry: Registry, mspec: ModelSpec, cfgs: dict[str, ComponentConfig]
) -> dict[str, Component]:
    """The per-role attention overrides of a model config, in the model's role order."""
    if not cfgs:
        return {}
    declared = mspec.attention_roles
    if not declared:
        fix = "set its attention variant with model.attention" if mspec.uses_attention else "remove it"
        raise ConfigError(
            f"model.attention_roles: model '{mspec.name}' declares no attention roles; {fix}."
        )
    for role in cfgs:
        if role not in declared:
            close = difflib.get_close_matches(role, declared, n=1, cutoff=0.5)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise ConfigError(
                f"model.attention_roles.{role}: unknown role for model '{mspec.name}'; its roles "
                f"are {', '.join(declared)}.{hint}"
            )
    roles = {}
    for role in (r for r in declared if r in cfgs):
        where = f"model.attention_roles.{role}"
        try:
            spec = registry.get("attention", cfgs[role].name)
        except (UnknownNameError, PluginError) as exc:
            raise type(exc)(f"{where}.name: {exc}") from None
        roles[role] = Component(spec, resolve(spec.config, cfgs[role].params, f"{where}.params"))
    return roles


def plan(config: RunConfig, registry: Registry) -> Plan:
    task = _component(registry, "task", config.task, "task")
    parts = resolve_model(registry, config.model)
    tspec: TaskSpec = task.spec
    fmt = batch_format(tspec.task_kind or "lm", parts.model.spec.task_kinds, parts.model.name, tspec.name)
    check_documents(task, parts.model)
    if parts.parametrization == "mup" and config.train.strategy == "fsdp":
        raise ConfigError("model.parametrization: mup gives each parameter its own learning rate "
                          "by role, which FSDP's flattened parameters cannot carry; train μP with "
                          "train.strategy: ddp (or auto), or the standard parametrization with fsdp.")
    if config.train.kernels == "fla":  # refused before anything is built
        from harness.nn import fast_path
        from harness.runtime import devices

        fast_path.require_fla(mixer_class(parts), parts.mixer.name if parts.mixer else "",
                              devices.run_device(config.train.accelerator))
    return Plan(config, task, parts, fmt)


def documents_of(task_params: Any) -> str | None:
    """How a task's windows treat documents: ``packed``, ``separate``, or None (a task whose
    sequences are not windows of packed documents); what the ``harness.documents`` tag says."""
    separate = getattr(task_params, "separate_documents", None)
    flag = separate() if separate is not None else None
    return None if flag is None else ("separate" if flag else "packed")


def check_documents(task: Component, model: Component) -> None:
    """Refuse a model that cannot keep documents apart for a task that asks it to."""
    if documents_of(task.params) == "separate" and not model.spec.separates_documents:
        raise IncompatibleError(
            f"task '{task.name}' keeps documents apart (task.params.documents: separate) and "
            f"model '{model.name}' cannot (its ModelSpec does not declare separates_documents: "
            f"it would let one document see another). Use a model that does (transformer, lstm, "
            f"gru; `harness list --kind model --verbose` says which) or documents: packed, the "
            f"same for every candidate of a study."
        )


def mixer_class(parts: ModelParts) -> type | None:
    """The class of the model's mixer (what its spec builds), None without one."""
    build = parts.mixer.spec.build if parts.mixer is not None else None
    return build if isinstance(build, type) else None


def load_registry(config: RunConfig, registry: Registry | None) -> Registry:
    """The registry a run config needs: the given one, or every installed plugin plus the
    config's local plugin files (which must load)."""
    from harness.registry import loader

    if registry is not None and not config.plugins:
        return registry
    reg = loader.load(config.plugins)
    local = {Path(p).resolve().stem for p in config.plugins}
    broken = [f for f in reg.failures if f.plugin in local]
    if broken:
        raise PluginError(
            "a plugin file named in the config failed to load: "
            + "; ".join(f.describe() for f in broken)
            + ". Fix the file or remove it from `plugins:`."
        )
    return reg
