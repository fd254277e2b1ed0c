"""Resolve a run config against the registry and build its task and model.

Everything that can be checked before training is checked here, so a bad name, a bad
hyper-parameter or an incompatible pairing fails before anything is recorded.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from harness.config import ComponentConfig, ModelConfig, RunConfig
from harness.data import BatchFormat, Task, TaskInfo, batch_format
from harness.errors import (
    ConfigError,
    HarnessError,
    IncompatibleError,
    PluginError,
    UnknownNameError,
)
from harness.params import resolve, to_dict
from harness.registry import AttentionSpec, ModelSpec, PositionSpec, Registry, TaskSpec

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
class Plan:
    """A run config resolved against the registry: specs and validated params."""

    config: RunConfig
    task: Component
    model: Component
    attention: Component | None
    position: Component | None
    fmt: BatchFormat  # the batch format the model receives
    #: per-role attention overrides (``model.attention_roles``), in the model's role order
    attention_roles: dict[str, Component] = field(default_factory=dict)

    def role_attention(self, role: str) -> Component | None:
        """The attention variant serving ``role``: its override, else the shared one."""
        return self.attention_roles.get(role, self.attention)

    def resolved_config(self) -> dict[str, Any]:
        """The full config with every default filled in (logged as the run's config)."""
        data = self.config.model_dump(mode="json")
        data["task"] = self.task.as_dict()
        model = self.model.as_dict()
        model["attention"] = self.attention.as_dict() if self.attention else None
        model["position"] = self.position.as_dict() if self.position else None
        if self.attention_roles:
            model["attention_roles"] = {r: c.as_dict() for r, c in self.attention_roles.items()}
        data["model"] = model
        return data

    def components(self) -> dict[str, Component]:
        """Components by role; an attention override is ``attention.<role>``."""
        items = {"task": self.task, "model": self.model}
        if self.attention:
            items["attention"] = self.attention
        items.update({f"attention.{r}": c for r, c in self.attention_roles.items()})
        if self.position:
            items["position"] = self.position
        return items


def _component(registry: Registry, kind: str, cfg: ComponentConfig, where: str) -> Component:
    spec = registry.get(kind, cfg.name)
    return Component(spec, resolve(spec.config, cfg.params, f"{where}.params"))


def check_pairing(attention: AttentionSpec, position: PositionSpec) -> None:
    missing = sorted(position.hooks - attention.position_hooks)
    if missing:
        reasons = "; ".join(attention.why_not.get(h, f"it does not apply '{h}' hooks") for h in missing)
        raise IncompatibleError(
            f"attention '{attention.name}' cannot be paired with position '{position.name}': "
            f"the scheme acts through {', '.join(missing)} and {reasons}. Pick a position scheme "
            f"that acts only at {', '.join(sorted(attention.position_hooks)) or 'no hook'}."
        )


def resolve_model(
    registry: Registry, cfg: ModelConfig
) -> tuple[Component, Component | None, Component | None, dict[str, Component]]:
    """The model, attention and position components of a model config and its per-role
    attention overrides, with defaults filled in and the attention x position pairing
    checked for every self-attention role."""
    model = _component(registry, "model", cfg, "model")
    mspec: ModelSpec = model.spec
    attention = position = None
    acfg, pcfg = cfg.attention, cfg.position
    if mspec.uses_attention:
        if acfg is None and mspec.default_attention:
            acfg = ComponentConfig(name=mspec.default_attention)
        if acfg is None and mspec.attention_required:
            raise ConfigError(
                f"model.attention: model '{mspec.name}' needs an attention variant; add "
                f"model.attention.name (one of {', '.join(registry.names('attention'))})."
            )
        if acfg is not None:
            attention = _component(registry, "attention", acfg, "model.attention")
    elif acfg is not None:
        raise ConfigError(
            f"model.attention: model '{mspec.name}' takes no attention variant; remove it."
        )
    if mspec.uses_position:
        if pcfg is None and mspec.default_position:
            pcfg = ComponentConfig(name=mspec.default_position)
        if pcfg is not None:
            position = _component(registry, "position", pcfg, "model.position")
    elif pcfg is not None:
        raise ConfigError(f"model.position: model '{mspec.name}' takes no position scheme; remove it.")
    roles = resolve_roles(registry, mspec, cfg.attention_roles)
    if position is not None:  # the variant of every self-attention role (or the only one)
        uses = {r: roles.get(r, attention) for r in mspec.attention_roles if r not in CROSS_ROLES}
        for role, comp in (uses if mspec.attention_roles else {"": attention}).items():
            if comp is None:
                continue
            try:
                check_pairing(comp.spec, position.spec)
            except IncompatibleError as exc:
                if role in roles:
                    raise IncompatibleError(f"model.attention_roles.{role}: {exc}") from None
                raise
    return model, attention, position, roles


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
    model, attention, position, roles = resolve_model(registry, config.model)
    tspec: TaskSpec = task.spec
    fmt = batch_format(tspec.task_kind, model.spec.task_kinds, model.name, tspec.name)
    return Plan(config, task, model, attention, position, fmt, roles)


def _user_error(what: str, exc: Exception) -> HarnessError:
    return ConfigError(f"{what} could not be built: {exc}. Check its params.")


def build_task(p: Plan, seed: int) -> Task:
    try:
        return p.task.spec.build(p.task.params, seed=seed)  # type: ignore[no-any-return]
    except (ValueError, TypeError) as exc:
        raise _user_error(f"task '{p.task.name}'", exc) from None


def task_info(p: Plan, task: Task) -> TaskInfo:
    examples = task.examples("train", task.train_length)
    max_len = max(p.fmt.input_length(e, task.task_kind) for e in examples)
    return TaskInfo(
        format=str(p.fmt), vocab_size=task.vocab.size, max_length=max_len, num_classes=task.num_classes
    )


def build_model(p: Plan, info: TaskInfo) -> Any:
    return build_model_from(p.model, p.attention, p.position, info, p.attention_roles)


def attention_factory(
    model: Component, shared: Component | None, roles: dict[str, Component]
) -> Any:
    """The ``attention`` argument of a model's build: ``attention(d_model, num_heads)``
    builds the shared variant, ``attention(d_model, num_heads, role="cross")`` that role's
    override (the shared variant when it has none; None when neither exists). None when the
    model gets no attention at all."""
    if shared is None and not roles:
        return None
    declared = model.spec.attention_roles

    def attention(d_model: int, num_heads: int, *, role: str | None = None) -> Any:
        if role is not None and role not in declared:
            raise PluginError(
                f"model '{model.name}' ({model.spec.provenance()}) asked for attention role "
                f"'{role}', which its ModelSpec does not declare (attention_roles: "
                f"{', '.join(declared) or 'none'}). The plugin must declare every role it uses."
            )
        comp = roles.get(role, shared) if role is not None else shared
        if comp is None:
            return None
        return comp.spec.build(comp.params, d_model=d_model, num_heads=num_heads)

    return attention


def build_model_from(
    model: Component, attn: Component | None, pos: Component | None, info: TaskInfo,
    roles: dict[str, Component] | None = None,
) -> Any:
    """Build a model with factories for its attention variants (shared and per role) and
    position scheme."""
    attention = attention_factory(model, attn, roles or {})
    position = None
    if pos is not None:
        pspec, pparams = pos.spec, pos.params

        def position(**kwargs: Any) -> Any:
            return pspec.build(pparams, **kwargs)

    try:
        return model.spec.build(model.params, task=info, attention=attention, position=position)
    except (ValueError, TypeError) as exc:
        raise _user_error(f"model '{model.name}' (with its attention and position)", exc) from None


def count_parameters(model: Any) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
