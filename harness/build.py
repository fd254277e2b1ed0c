"""Resolve a run config against the registry and build its task and model.

Everything that can be checked before training is checked here, so a bad name, a bad
hyper-parameter or an incompatible pairing fails before anything is recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.config import ComponentConfig, ModelConfig, RunConfig
from harness.data import Task, TaskInfo, batch_format, input_length
from harness.errors import ConfigError, HarnessError, IncompatibleError
from harness.params import resolve, to_dict
from harness.registry import AttentionSpec, ModelSpec, PositionSpec, Registry, TaskSpec


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
    fmt: str  # the batch format the model receives

    def resolved_config(self) -> dict[str, Any]:
        """The full config with every default filled in (logged as the run's config)."""
        data = self.config.model_dump(mode="json")
        data["task"] = self.task.as_dict()
        model = self.model.as_dict()
        model["attention"] = self.attention.as_dict() if self.attention else None
        model["position"] = self.position.as_dict() if self.position else None
        data["model"] = model
        return data

    def components(self) -> dict[str, Component]:
        items = {"task": self.task, "model": self.model}
        if self.attention:
            items["attention"] = self.attention
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
) -> tuple[Component, Component | None, Component | None]:
    """The model, attention and position components of a model config, with defaults
    filled in and the attention x position pairing checked."""
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
    if attention is not None and position is not None:
        check_pairing(attention.spec, position.spec)
    return model, attention, position


def plan(config: RunConfig, registry: Registry) -> Plan:
    task = _component(registry, "task", config.task, "task")
    model, attention, position = resolve_model(registry, config.model)
    tspec: TaskSpec = task.spec
    fmt = batch_format(tspec.task_kind, model.spec.task_kinds, model.name, tspec.name)
    return Plan(config, task, model, attention, position, fmt)


def _user_error(what: str, exc: Exception) -> HarnessError:
    return ConfigError(f"{what} could not be built: {exc}. Check its params.")


def build_task(p: Plan, seed: int) -> Task:
    try:
        return p.task.spec.build(p.task.params, seed=seed)  # type: ignore[no-any-return]
    except (ValueError, TypeError) as exc:
        raise _user_error(f"task '{p.task.name}'", exc) from None


def task_info(p: Plan, task: Task) -> TaskInfo:
    examples = task.examples("train", task.train_length)
    max_len = max(input_length(e, p.fmt, task.kind) for e in examples)
    return TaskInfo(
        kind=p.fmt, vocab_size=task.vocab.size, max_length=max_len, num_classes=task.num_classes
    )


def build_model(p: Plan, info: TaskInfo) -> Any:
    return build_model_from(p.model, p.attention, p.position, info)


def build_model_from(
    model: Component, attn: Component | None, pos: Component | None, info: TaskInfo
) -> Any:
    """Build a model with factories for its attention variant and position scheme."""
    attention = position = None
    if attn is not None:
        aspec, aparams = attn.spec, attn.params

        def attention(d_model: int, num_heads: int) -> Any:
            return aspec.build(aparams, d_model=d_model, num_heads=num_heads)

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
