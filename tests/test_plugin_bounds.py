"""Every built-in plugin's hyper-parameters have hard bounds, bad values end in a clean
config error naming the field, and every module a built-in builds survives pickling.

The built-ins are read from the registry (every spec whose class lives in
``harness_plugins``), so a built-in added later is covered without editing this file.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import annotated_types
import pytest
import torch
from text import flat

import harness
from harness.config import parse_run_config
from harness.errors import ConfigError
from harness.params import declared_params, resolve
from harness.registry.specs import KINDS
from harness.run.build import build_model, build_task, task_info
from harness.run.plan import plan

D_MODEL, HEADS, LENGTH = 16, 2, 5


def builtin_specs(kind: str | None = None) -> list[Any]:
    registry = harness.load_plugins()
    return [s for k in ([kind] if kind else KINDS) for s in registry.specs(k)
            if getattr(s.build, "__module__", "").startswith("harness_plugins.")]


def ids(specs: list[Any]) -> list[str]:
    return [f"{s.kind}.{s.name}" for s in specs]


ALL = builtin_specs()


def test_the_registry_holds_the_built_ins():
    kinds = {s.kind for s in ALL}
    assert {"attention", "position", "model", "task"} <= kinds and len(ALL) >= 30


# -- the class of defect: a numeric hyper-parameter without bounds ---------------------------
def unbounded_numbers(tp: Any) -> bool:
    """Whether a type holds an int or float that no bound constrains (``int``, ``int | None``,
    ``tuple[int, ...]``); ``Annotated[int, Ge(1)]`` inside a container counts as bounded."""
    if tp is bool:
        return False
    if tp in (int, float):
        return True
    if typing.get_origin(tp) is typing.Annotated:
        base, *meta = typing.get_args(tp)
        if any(isinstance(m, annotated_types.BaseMetadata) for m in meta):
            return False
        return unbounded_numbers(base)
    return any(unbounded_numbers(arg) for arg in typing.get_args(tp) if arg is not Ellipsis)


@pytest.mark.parametrize("spec", ALL, ids=ids(ALL))
def test_every_numeric_hyper_parameter_declares_bounds(spec):
    missing = [p.name for p in declared_params(spec.config)
               if (p.numeric and not p.bounds) or (not p.bounds and unbounded_numbers(p.type))]
    assert not missing, f"{spec.kind} '{spec.name}': numeric parameters without bounds: {missing}"


def violations(param: Any) -> list[Any]:
    """A value just outside each bound of a parameter, and inf for floats."""
    is_int = "int" in str(param.type) and "float" not in str(param.type)
    step = 1 if is_int else 0.5
    out: list[Any] = [] if is_int else [math.inf]
    for b in param.bounds:
        if getattr(b, "ge", None) is not None:
            out.append(b.ge - step)
        elif getattr(b, "gt", None) is not None:
            out.append(b.gt)
        elif getattr(b, "le", None) is not None:
            out.append(b.le + step)
        elif getattr(b, "lt", None) is not None:
            out.append(b.lt)
    return out


CASES = [(s, p, v) for s in ALL for p in declared_params(s.config) if p.numeric for v in violations(p)]


@pytest.mark.parametrize(("spec", "param", "value"), CASES,
                         ids=[f"{s.kind}.{s.name}.{p.name}={v}" for s, p, v in CASES])
def test_every_bound_is_enforced_and_names_the_field(spec, param, value):
    where = f"model.{spec.kind}.params"
    with pytest.raises(ConfigError) as err:
        resolve(spec.config, {param.name: value}, where)
    assert f"{where}.{param.name}" in str(err.value)


# -- issue 15's bad inputs, through the path a run takes ---------------------------------------
RUN: dict[str, Any] = {
    "task": {"name": "copy", "params": {"length": 4, "vocab": 4, "num_train": 16, "num_val": 8}},
    "model": {"name": "transformer", "params": {"d_model": 16, "layers": 1, "heads": 2},
              "position": {"name": "rope"}},
    "train": {"max_steps": 1, "batch_size": 8, "progress": False},
}


def set_value(data: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    data = json.loads(json.dumps(data))
    *path, last = dotted.split(".")
    node = data
    for key in path:
        node = node.setdefault(key, {})
    node[last] = value
    return data


BAD = [
    ("model.params.d_model", 0, "model.params.d_model"),
    ("model.params.heads", 0, "model.params.heads"),
    ("task.params.vocab", 0, "task.params.vocab"),
    ("task.params.num_train", 0, "task.params.num_train"),
    ("task.params.num_val", 0, "task.params.num_val"),
    ("task.params.length", 0, "task.params.length"),
    ("model.params.layers", -1, "model.params.layers"),
    ("model.params.ffn_mult", 0, "model.params.ffn_mult"),
    ("model.params.dropout", 1.0, "model.params.dropout"),
    ("model.position.params.base", math.inf, "model.position.params.base"),
    ("model.position.params.base", 1.0, "model.position.params.base"),
    ("task.params.eval_lengths", [-1], "task.params.eval_lengths"),
    ("task.params.eval_lengths", [8, 2], "eval_lengths [2] are shorter than the training length (4)"),
]


@pytest.mark.parametrize(("key", "value", "named"), BAD, ids=[f"{k}={v}" for k, v, _ in BAD])
def test_bad_values_end_in_a_config_error_naming_the_field(registry, key, value, named):
    with pytest.raises(ConfigError) as err:
        p = plan(parse_run_config(set_value(RUN, key, value)), registry)
        task = build_task(p, seed=0)
        build_model(p, task_info(p, task))
    assert named in flat(str(err.value))


def test_the_run_config_used_above_is_valid(registry):
    p = plan(parse_run_config(RUN), registry)
    task = build_task(p, seed=0)
    assert isinstance(build_model(p, task_info(p, task)), torch.nn.Module)


@pytest.mark.parametrize(("setting", "named"), [
    ("model.params.d_model=0", "model.params.d_model"),
    ("task.params.eval_lengths=[-1]", "task.params.eval_lengths"),
    ("model.position.params.base=.inf", "model.position.params.base"),
])
def test_the_cli_refuses_bad_values_with_exit_2_and_no_traceback(tmp_path, setting, named):
    config = tmp_path / "run.json"
    config.write_text(json.dumps(RUN))
    out = subprocess.run([sys.executable, "-m", "harness.cli", "train", str(config), "--set", setting],
                         capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert out.returncode == 2, out.stderr
    assert named in out.stderr and "Traceback" not in out.stderr
    assert not (Path(os.environ["HARNESS_HOME"]) / "mlflow.db").exists()


# -- pickling: every module a built-in builds --------------------------------------------------
def rand(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def round_trip(module: torch.nn.Module) -> torch.nn.Module:
    copy = pickle.loads(pickle.dumps(module))
    assert type(copy) is type(module)
    return copy  # type: ignore[no-any-return]


LAYERS = builtin_specs("attention") + builtin_specs("mixer")


@pytest.mark.parametrize("spec", LAYERS, ids=ids(LAYERS))
def test_attention_and_mixers_pickle_and_compute_the_same(spec):
    layer = spec.build(spec.config(), d_model=D_MODEL, num_heads=HEADS).eval()
    x = rand(2, LENGTH, D_MODEL)
    causal = "causal" in layer.directions
    with torch.no_grad():
        before = layer(x, causal=causal)[0]
        after = round_trip(layer)(x, causal=causal)[0]
    assert torch.equal(before, after)


@pytest.mark.parametrize("spec", builtin_specs("attention"), ids=ids(builtin_specs("attention")))
def test_attention_state_size_is_what_the_cache_keeps(spec):
    if "causal" not in spec.directions:
        pytest.skip(f"{spec.name} runs only {', '.join(sorted(spec.directions))}: no decoding cache")
    params = {"window": 3} if spec.name == "sliding_window" else {}  # a window shorter than the run
    layer = spec.build(spec.config(**params), d_model=D_MODEL, num_heads=HEADS).eval()
    x = rand(2, 6, D_MODEL)
    cache = layer.new_cache()
    assert cache.numel_per_sequence() == layer.state_size(0) == 0
    with torch.no_grad():
        for t in range(x.shape[1]):
            layer(x[:, t: t + 1], causal=True, cache=cache)
            assert cache.numel_per_sequence() == layer.state_size(t + 1), t


POSITIONS = builtin_specs("position")


@pytest.mark.parametrize("spec", POSITIONS, ids=ids(POSITIONS))
def test_position_schemes_pickle_and_compute_the_same(spec):
    scheme = spec.build(spec.config(), d_model=D_MODEL, num_heads=HEADS, head_dim=D_MODEL // HEADS,
                        max_length=LENGTH, causal=True).eval()
    pos = torch.arange(LENGTH)
    x = rand(2, LENGTH, scheme.token_width(D_MODEL))
    q, k = rand(2, HEADS, LENGTH, D_MODEL // HEADS, seed=1), rand(2, HEADS, LENGTH, D_MODEL // HEADS, seed=2)

    def outputs(s: Any) -> list[Any]:
        with torch.no_grad():
            return [s.embed(x, pos), *s.rotate(q, k, pos, pos), s.score_bias(q, pos, pos)]

    before, after = outputs(scheme), outputs(round_trip(scheme))
    for a, b in zip(before, after, strict=True):
        assert (a is None and b is None) or torch.equal(a, b)


MODELS = builtin_specs("model")
VOCAB = 10


@pytest.mark.parametrize("spec", MODELS, ids=ids(MODELS))
def test_models_pickle_and_compute_the_same(registry, spec):
    fmt = "lm" if "lm" in spec.task_kinds else sorted(spec.task_kinds)[0]
    extra = {"attention": "additive"} if spec.uses_attention and not spec.default_attention else {}
    model = harness.create_model(spec.name, vocab_size=VOCAB, max_length=8, batch_format=fmt,
                                 registry=registry, **extra, **{spec.width_param: D_MODEL}).eval()
    src = torch.randint(4, VOCAB, (2, LENGTH), generator=torch.Generator().manual_seed(0))
    args = (src,) if fmt == "lm" else (src, src.flip(1))
    with torch.no_grad():
        before = model(*args)
        after = round_trip(model)(*args)
    assert torch.equal(before, after)
