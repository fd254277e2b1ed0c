"""Stage 2 of a run: build the task and the model a :class:`~harness.run.plan.Plan` names.

Models receive factories for their components (``attention(d_model, num_heads, role=...)``,
``mixer(d_model, num_heads)``, ``position(**context)``); a component that rejects its
arguments (``ValueError``/``TypeError`` from a constructor) becomes a config error naming it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.data.tasks import Task, TaskInfo
from harness.errors import (
    ConfigError,
    HarnessError,
    IncompatibleError,
    OutOfMemory,
    PluginError,
    shorten,
)
from harness.run.plan import Component, ModelParts, Plan
from harness.runtime.threads import run_threads


@dataclass
class Built:
    """What a plan built: the task (its data), what the model learned about it, the model."""

    task: Task
    info: TaskInfo
    model: Any  # torch.nn.Module
    num_params: int
    kernel_tags: dict[str, str] = field(default_factory=dict)  # the kernel gate's (gate_kernels)
    kernel_warning: str | None = None


def build(p: Plan, check: Callable[[TaskInfo], Any] | None = None) -> Built:
    """Build the task from ``train.data_seed`` and the model from ``train.seed``; ``check``
    sees the task's info before the model is built (the pipeline's memory check)."""
    import lightning as L
    import torch

    t = p.config.train
    task = build_task(p, seed=t.data_seed)
    info = task_info(p, task)
    if check is not None:
        check(info)
    threads = run_threads(t.num_threads)  # a study worker splits the cores (harness.runtime.threads)
    if threads:
        torch.set_num_threads(threads)
    L.seed_everything(t.seed, workers=True, verbose=False)
    model = build_model(p, info)
    from harness.nn import fast_path

    fast_path.select(model, t.kernels)  # the mixers' implementation (auto: FLA on CUDA)
    return Built(task, info, model, count_parameters(model))


def gate_kernels(p: Plan, built: Built, device: Any) -> None:
    """Before training on the fast path, check its kernels against the reference
    (:mod:`harness.nn.kernel_gate`): a failure falls back to the reference, with a warning
    and the tags ``harness.kernel=reference`` and ``harness.kernel_gate`` saying why
    (``train.kernels: auto``), or refuses the run (``fla``)."""
    from harness.keys import Tag
    from harness.nn import fast_path, kernel_gate
    from harness.runtime import devices

    if not fast_path.use_fla("auto", _probe_tensor(device)):
        return  # no kernel runs here (the CPU, no fla): nothing to check
    dtype = kernel_gate.dtype_of(devices.precision(p.config.train.precision, device))
    verdicts = kernel_gate.gate(built.model, dtype, device)
    if not verdicts:
        return
    failed = {name: v for name, v in verdicts.items() if not v.passed}
    built.kernel_tags[Tag.KERNEL_GATE] = "; ".join(f"{name} {v.tag()}" for name, v in verdicts.items())
    if not failed:
        return
    why = "; ".join(f"{name}: {v.reason}" for name, v in failed.items())
    if p.config.train.kernels == fast_path.FLA:
        raise ConfigError(f"train.kernels is 'fla', but the FLA kernel failed its check against the "
                          f"reference on this device ({why}). Set train.kernels to 'auto' (the "
                          f"reference where a kernel fails) or 'reference'.")
    built.kernel_tags[Tag.KERNEL] = fast_path.REFERENCE
    built.kernel_warning = (f"the FLA kernel failed its check against the reference ({why}); this run "
                            f"trains on the reference implementation (tags {Tag.KERNEL}, {Tag.KERNEL_GATE}).")


def _probe_tensor(device: Any) -> Any:
    import torch

    return torch.empty(0, device=device)


def _user_error(what: str, exc: Exception) -> HarnessError:
    """The first line of the exception only (torch's C++ errors carry a backtrace), bounded."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return ConfigError(f"{what} could not be built: {shorten(first, 300).rstrip('.')}. Check its params.")


def build_task(p: Plan, seed: int) -> Task:
    try:
        return p.task.spec.build(p.task.params, seed=seed)  # type: ignore[no-any-return]
    except (ValueError, TypeError) as exc:
        raise _user_error(f"task '{p.task.name}'", exc) from None


def task_info(p: Plan, task: Task) -> TaskInfo:
    if task.streams:  # windows of train_length predicted tokens, never padded
        return TaskInfo(format=str(p.fmt), vocab_size=task.vocab.size, max_length=task.train_length,
                        num_classes=task.num_classes, document_token=task.document_token)
    examples = task.examples("train", task.train_length)
    if not examples:
        files = [f"{k}={shorten(v, 160)}" for k, v in p.task.as_dict()["params"].items() if isinstance(v, str) and v]
        read = f" It read {', '.join(files)}: check that this holds the task's data." if files else ""
        raise ConfigError(f"task '{p.task.name}' has no training examples (at length "
                          f"{task.train_length}).{read} Check its params (task.params).")
    max_len = max(p.fmt.input_length(e, task.task_kind) for e in examples)
    return TaskInfo(
        format=str(p.fmt), vocab_size=task.vocab.size, max_length=max_len, num_classes=task.num_classes,
        extra=dict(task.model_hints), document_token=task.document_token,
    )


def build_model(p: Plan, info: TaskInfo) -> Any:
    return build_model_from(p.parts, info)


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


def _factory(comp: Component | None) -> Any:
    """``build(**context)`` of a component with its params bound; None without one."""
    if comp is None:
        return None
    return functools.partial(comp.spec.build, comp.params)


def build_model_from(parts: ModelParts, info: TaskInfo) -> Any:
    """Build a model with factories for its attention variants (shared and per role), its
    mixer and its position scheme."""
    model = parts.model
    kwargs: dict[str, Any] = {
        "task": info, "attention": attention_factory(model, parts.attention, parts.attention_roles),
        "position": _factory(parts.position),
    }
    if model.spec.uses_mixer:
        mixer = _factory(parts.mixer)
        kwargs["mixer"] = None if mixer is None else (
            lambda d_model, num_heads: mixer(d_model=d_model, num_heads=num_heads))
    try:
        built = model.spec.build(model.params, **kwargs)
        check_bottleneck(built, model.name, info)
        if parts.parametrization == "mup":
            with_mup(built, parts, kwargs)
        return built
    except (ValueError, TypeError) as exc:
        raise _user_error(f"model '{model.name}' (with its {', '.join(parts.components())})", exc) from None
    except (RuntimeError, MemoryError) as exc:  # wherever a model is built: a run, a probe, a load
        from harness.run import failure

        if not failure.is_out_of_memory(exc):
            raise
        sizes = ", ".join(f"{k}={v}" for k, v in model.as_dict()["params"].items()
                          if isinstance(v, int | float) and not isinstance(v, bool))
        raise OutOfMemory(
            f"model '{model.name}' cannot be allocated with its params ({shorten(sizes, 300)}): "
            f"{shorten(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__, 200)}. "
            f"Nothing was trained or recorded. Lower the model's size.") from None


def check_bottleneck(built: Any, name: str, info: TaskInfo) -> None:
    """A task that reads a model through one position (``extra["bottleneck"]``: compression)
    needs a model that honours it; one that ignores it would copy every token through its
    own position and score perfectly without compressing anything."""
    wanted = info.extra.get("bottleneck")
    if wanted is not None and getattr(built, "bottleneck", None) != wanted:
        raise IncompatibleError(
            f"the task reads the model through one position (bottleneck: {wanted}, MAD's "
            f"compression) and model '{name}' does not implement that readout (its module sets "
            f"no bottleneck = {wanted!r}). Use the transformer model (with any attention or "
            f"mixer), or give your model harness.plugin.BottleneckReadout.")


def with_mup(built: Any, parts: ModelParts, kwargs: dict[str, Any]) -> None:
    """μP for a model just built (:mod:`harness.nn.parametrization`): its roles from the model
    built again at the base shape and at ``DELTA`` times it (from a forked random state)."""
    import dataclasses

    from harness.nn import parametrization

    spec, params = parts.model.spec, parts.model.params
    bases, deltas = parametrization.build(
        lambda values: spec.build(dataclasses.replace(params, **values), **kwargs), parts.base)
    name, value = next(iter(parts.base.items()))
    parametrization.apply(built, bases, deltas, getattr(params, name) / value)
    if parts.multipliers:
        from harness.nn import multipliers

        multipliers.apply(built, parts.multipliers)


def count_parameters(model: Any) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
