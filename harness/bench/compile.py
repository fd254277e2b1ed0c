"""Does every built-in compile? ``torch.compile`` of each plugin in a small model, with dynamo's
own counters: graph breaks, graphs compiled, and recompiles once the first steps compiled.

:func:`status` builds a model as a run does (``harness.run.plan``/``build``), compiles it in
place as ``train.compile`` does (``nn.Module.compile``), and trains it a few steps on one
batch shape (forward, loss, backward, an SGD step). A model compiles cleanly when dynamo
broke no graph and compiled nothing after the second step: one recompile in the second step
is a one-off (a cache a module fills on its first call, a training-mode flag that changes
once), a recompile in every step is not (the recompile limit would end compilation). The checks run with the
``aot_eager`` backend by default: graph breaks and recompiles are dynamo's (the same for
every backend), and ``aot_eager`` also traces the backward through AOT autograd, without
inductor's C++/Triton code generation. ``tests/test_compile.py`` runs it per plugin family,
``benchmarks/compile_status.py`` writes the table of docs/performance.md and times inductor
against eager.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

#: The task of each check (small: the counters do not depend on the size).
COPY = {"name": "copy", "params": {"length": 8, "vocab": 6, "num_train": 16, "num_val": 4}}
LISTOPS = {"name": "listops", "params": {"length": 32, "min_length": 8, "num_train": 16, "num_val": 4}}
SMALL = {"d_model": 16, "layers": 2, "heads": 2}

#: Plugins that only run bidirectionally, checked on a classification task.
BIDIRECTIONAL = {"linformer"}


def cases() -> dict[str, dict[str, dict[str, Any]]]:
    """Per family (attention, position, mixers, models), each built-in's run config."""
    import harness

    def transformer(**extra: Any) -> dict[str, Any]:
        return {"task": COPY, "model": {"name": "transformer", "params": dict(SMALL), **extra}}

    out: dict[str, dict[str, dict[str, Any]]] = {"attention": {}, "position": {}, "mixers": {}, "models": {}}
    for spec in harness.list_plugins("attention"):
        cfg = transformer(attention={"name": spec.name})
        if spec.name in BIDIRECTIONAL:
            cfg["task"] = LISTOPS
        out["attention"][spec.name] = cfg
    for spec in harness.list_plugins("position"):
        out["position"][spec.name] = transformer(position={"name": spec.name})
    for spec in harness.list_plugins("mixer"):
        out["mixers"][spec.name] = transformer(mixer={"name": spec.name})
    models = {
        "transformer": transformer(),
        "gru": {"task": COPY, "model": {"name": "gru", "params": {"width": 16, "layers": 1}}},
        "lstm": {"task": COPY, "model": {"name": "lstm", "params": {"width": 16, "layers": 1}}},
        "mlp_mixer": {"task": COPY, "model": {"name": "mlp_mixer", "params": {"d_model": 16, "layers": 2}}},
        "encoder_decoder": {"task": COPY, "model": {"name": "encoder_decoder", "params": {
            "d_model": 16, "encoder_layers": 1, "decoder_layers": 1, "heads": 2}}},
        "rnn_seq2seq": {"task": COPY, "model": {"name": "rnn_seq2seq", "params": {"hidden": 16}}},
    }
    out["models"] = {spec.name: models[spec.name] for spec in harness.list_plugins("model")
                     if spec.name in models}
    return out


@dataclass
class Status:
    """What dynamo did with one model."""

    graph_breaks: int = 0
    break_reasons: list[str] = field(default_factory=list)
    graphs: int = 0  # graphs compiled in the first step
    recompiles: int = 0  # graphs compiled after the first step
    steady_recompiles: int = 0  # graphs compiled after the second step
    error: str | None = None

    @property
    def clean(self) -> bool:
        return self.error is None and self.graph_breaks == 0 and self.steady_recompiles == 0


def prepared(config: dict[str, Any], batch_size: int = 4) -> tuple[Any, Any, dict[str, Any]]:
    """(plan, model, one training batch) of a run config, built as a run builds them."""
    from harness.config import parse_run_config
    from harness.run.build import build
    from harness.run.plan import load_registry, plan

    cfg = parse_run_config(config)
    p = plan(cfg, load_registry(cfg, None))
    built = build(p)
    examples = built.task.examples("train", built.task.train_length)[:batch_size]
    batch = p.fmt.collate(examples, built.task.task_kind)
    batch.pop("examples")
    return p, built.model, batch


def train_steps(p: Any, model: Any, batch: dict[str, Any], steps: int, after_each: Any = None) -> None:
    """``steps`` training steps on ``batch`` (forward, loss, backward, SGD); ``after_each()``
    after each."""
    import torch

    from harness.run.system import masked_stats

    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    model.train()
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        masked_stats(p.fmt.call(model, batch), batch)["loss"].backward()
        opt.step()
        if after_each is not None:
            after_each()


def status(config: dict[str, Any], *, backend: str = "aot_eager", steps: int = 4,
           checkpointing: bool = False) -> Status:
    """Compile the model of ``config`` (its blocks checkpointed with ``checkpointing``:
    ``train.activation_checkpointing``) and count what dynamo did over ``steps`` steps."""
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    from harness.nn.checkpointing import checkpoint_blocks

    p, model, batch = prepared(config)
    if checkpointing:
        checkpoint_blocks(model)
    torch._dynamo.reset()
    counters.clear()
    model.compile(backend=backend)
    out = Status()
    seen: list[int] = []  # graphs compiled so far, after each step

    try:
        train_steps(p, model, batch, steps, after_each=lambda: seen.append(int(counters["stats"]["unique_graphs"])))
    except Exception as exc:  # a plugin that cannot compile: the reason, for the table
        cause = getattr(exc, "inner_exception", None) or exc
        out.error = f"{type(cause).__name__}: {(str(cause).strip().splitlines() or [''])[0][:200]}"
    out.graph_breaks = int(sum(counters["graph_break"].values()))
    out.break_reasons = sorted({str(reason).splitlines()[0][:160] for reason in counters["graph_break"]})
    if seen:
        out.graphs, out.recompiles = seen[0], seen[-1] - seen[0]
        out.steady_recompiles = seen[-1] - seen[min(1, len(seen) - 1)]
    return out


def step_seconds(config: dict[str, Any], *, backend: str | None, steps: int = 10,
                 batch_size: int = 16) -> tuple[float, float]:
    """(seconds of the first step, compilation included; median seconds of the next
    ``steps``) of the model of ``config``, compiled with ``backend`` (None: eager)."""
    import statistics

    import torch._dynamo

    p, model, batch = prepared(config, batch_size)
    torch._dynamo.reset()
    if backend is not None:
        model.compile(backend=backend)
    started = time.perf_counter()
    train_steps(p, model, batch, 1)
    first = time.perf_counter() - started
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        train_steps(p, model, batch, 1)
        times.append(time.perf_counter() - started)
    return first, statistics.median(times)
