"""Run configs (pydantic), YAML loading and ``key=value`` overrides, with field-exact errors.

A run config names a task, a model (with its attention and position scheme) and the
training settings; plugin hyper-parameters live in ``params`` blocks and are validated
against the plugin's declared dataclass when the run is built (``harness.run.plan``)::

    task: {name: copy, params: {length: 16}}
    model:
      name: transformer
      params: {d_model: 64, layers: 2, heads: 4}
      attention: {name: multi_head}
      position: {name: sinusoidal}
    train: {max_steps: 1500, batch_size: 64, lr: 3.0e-3}
"""

from __future__ import annotations

import difflib
import os
import re
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import annotated_types
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from harness.errors import WHOLE_CHECKS, ConfigError, pydantic_message, short_repr
from harness.yaml_io import parse_value, read_yaml

__all__ = ["read_yaml"]  # re-exported: the study schema reads its files the same way

#: Seeds as numpy and Lightning accept them.
MAX_SEED = 2**32 - 1
#: Sane upper limits: a value beyond them is a typo (``1e30``), never an intended budget.
MAX_STEPS = 10**9
MAX_BATCH = 2**20
MAX_SECONDS = 366 * 86400
#: ``train.checkpoint_every`` as a time or 'off': ``10min``, ``1.5min``, ``off``.
CHECKPOINT_EVERY = r"^(off|\d+(\.\d+)?min)$"


class Strict(BaseModel):
    """The base of every harness schema (run config, study file): unknown fields are errors,
    numbers are strict (a boolean is not a number, ``"3"`` is not an int, ``2.5`` is not an
    int) and floats must be finite. Declare a valid range (``ge``/``gt``/``le``/``lt``) on
    every numeric field; :func:`format_validation_error` shows it in the error."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


def _check_name(value: str) -> str:
    """A name that may become a folder or file name: no separators, no '..', no control
    characters, not hidden."""
    if not value.strip():
        raise ValueError("must not be empty")
    bad = sorted({c for c in value if c in "/\\" or ord(c) < 32 or ord(c) == 127})
    if bad:
        raise ValueError(f"must not contain {', '.join(repr(c) for c in bad)} (it names a folder); "
                         f"use letters, digits, spaces, '_', '-' and '.'")
    if value.startswith(".") or value.startswith(" ") or value.endswith(" "):
        raise ValueError("must not start with '.' or start or end with a space (it names a folder)")
    return value


#: A name that becomes part of a path (an MLflow experiment's artifact folder).
SafeName = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(_check_name)]


def _not_default(value: str) -> str:
    """MLflow's ``Default`` experiment keeps its artifacts in ``mlruns/0`` of the folder its
    store was created in, outside the store (and its location cannot be changed)."""
    if value == "Default":
        raise ValueError("MLflow's Default experiment keeps its artifacts outside the store "
                         "(mlruns/0 of the folder the store was created in); name another one")
    return value


#: The name of an MLflow experiment the harness logs to.
ExperimentName = Annotated[SafeName, AfterValidator(_not_default)]


def _tuple_from_list(value: Any) -> Any:
    """YAML and JSON have no tuples: accept a list where the schema declares a tuple."""
    return tuple(value) if isinstance(value, list) else value


class ComponentConfig(Strict):
    name: str = Field(min_length=1, max_length=200)
    params: dict[str, Any] = Field(default_factory=dict)


Multiplier = Annotated[float, Field(gt=0, le=1e4)]


class MupMultipliers(Strict):
    """μP's hyper-parameters besides the learning rate, tuned at the base width and carried
    unchanged to any width (Yang et al. 2022, Tensor Programs V, section 4 and the GPT-3
    experiments; :mod:`harness.nn.multipliers`). Each 1 (and a random readout) is μP as it
    was before they existed; at the base width with all of them 1 μP is the standard model."""

    output_mult: Multiplier = Field(1.0, description=(
        "alpha_out: the readout's input is multiplied by output_mult x base/width (logits)"))
    attn_mult: Multiplier = Field(1.0, description=(
        "alpha_attn: every query-key scale multiplied by it (models with attention-like scores)"))
    input_mult: Multiplier = Field(1.0, description=(
        "alpha_in: the output of every input layer (token and position embeddings, input "
        "projections) multiplied by it"))
    init_std_mult: Multiplier = Field(1.0, description=(
        "sigma: the initial std of every weight matrix (hidden, readout, input layers) "
        "multiplied by it"))
    zero_readout: bool = Field(False, description="the readout's weights start at zero")


class ModelConfig(ComponentConfig):
    attention: ComponentConfig | None = None
    #: a sequence mixer that is not softmax attention (``{name: mamba}``), for a model that
    #: takes one (``ModelSpec.uses_mixer``); with ``attention`` too, a hybrid (see the model's
    #: ``pattern``). Left out of dumps when unset, so configs without mixers serialise as before.
    mixer: ComponentConfig | None = Field(None, exclude_if=lambda m: m is None)
    position: ComponentConfig | None = None
    #: a named preset of the model (``transformer++``) that fills in what the config leaves unset
    preset: str | None = Field(None, exclude_if=lambda v: v is None)
    # per-role attention variants (``cross: {name: additive}``) of a model that declares
    # roles (``ModelSpec.attention_roles``); a role not listed uses ``attention``. Left out
    # of dumps when empty, so configs without roles serialise as before.
    attention_roles: dict[str, ComponentConfig] = Field(
        default_factory=dict, exclude_if=lambda roles: not roles
    )
    #: how initialisation, per-parameter learning rates and multipliers scale with width
    #: (``harness.nn.parametrization``): ``standard``, or ``mup`` (μP: Yang et al. 2022,
    #: Tensor Programs V). Left out of dumps when standard, so older configs serialise as before.
    parametrization: Literal["standard", "mup"] = Field(
        "standard", exclude_if=lambda v: v == "standard",
        description="standard, or mup: hyper-parameters tuned at model.base hold at any width")
    #: μP's base shape: the model params that grow with width, at the values where μP and the
    #: standard parametrization coincide (``{d_model: 64}``); unset, the model's width_param at
    #: its declared default. The resolved config records it.
    base: dict[str, Annotated[int, Field(ge=1, le=2**20)]] = Field(
        default_factory=dict, exclude_if=lambda b: not b,
        description="mup only: the params that grow with width, at their base values")

    #: μP's base-width multipliers (output, attention, input, initial std, zero readout)
    mup: MupMultipliers | None = Field(
        None, exclude_if=lambda m: m is None,
        description="mup only: multipliers tuned at the base width (output_mult, attn_mult, "
                    "input_mult, init_std_mult, zero_readout)")

    @model_validator(mode="after")
    def _base_needs_mup(self) -> ModelConfig:
        for field, value in (("base", self.base), ("mup", self.mup)):
            if value and self.parametrization != "mup":
                raise ValueError(f"{field} belongs to parametrization: mup (μP); set "
                                 f"parametrization: mup or remove {field}")
        return self


Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]
PRECISIONS = ("auto", "32-true", "32", "16-mixed", "16", "bf16-mixed", "bf16", "16-true",
              "bf16-true", "64-true", "64", "transformer-engine", "transformer-engine-float16")


class TrainConfig(Strict):
    max_steps: int = Field(1000, ge=1, le=MAX_STEPS, description="optimizer steps (the budget)")
    batch_size: int = Field(32, ge=1, le=MAX_BATCH, description=(
        "examples per optimizer step (per device): the batch a budget and the data order count"))
    # -- batches bigger than memory (harness.run.accumulate) --
    batch_tokens: int | None = Field(
        None, ge=1, le=2**40, exclude_if=lambda v: v is None,
        description="the optimizer batch in input tokens (padding included), as scaling papers "
                    "state it: batch_size = this / input tokens per training example, rounded "
                    "(replaces batch_size, as max_flops replaces max_steps)")
    micro_batch_size: int | None = Field(
        None, ge=1, le=MAX_BATCH, exclude_if=lambda v: v is None,
        description="examples per forward and backward pass; below batch_size the gradients of "
                    "ceil(batch_size / micro_batch_size) micro-batches accumulate into one "
                    "optimizer step (same data, steps and budgets; the loss is normalised by the "
                    "scored tokens of the whole batch). Unset: batch_size")
    activation_checkpointing: bool = Field(
        False, exclude_if=lambda v: not v,
        description="recompute each residual block's activations in the backward pass instead of "
                    "keeping them (torch.utils.checkpoint): less memory, about a third more compute")
    lr: float = Field(1e-3, gt=0, le=100)
    weight_decay: float = Field(0.01, ge=0, le=100, description=(
        "0.01 with adamw (decoupled decay); left unset, 0 with adam and sgd, where it is an L2 "
        "term in the gradient (see TrainConfig._weight_decay_per_optimizer)"))
    optimizer: Literal["adamw", "adam", "sgd"] = Field("adamw", description="see harness.run.optim")
    betas: Annotated[
        tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]],
        BeforeValidator(_tuple_from_list),
    ] = Field((0.9, 0.999), description="Adam(W) moment decay rates, each in [0, 1)")
    momentum: float = Field(0.9, ge=0, lt=1, description="SGD momentum")
    schedule: Literal["constant", "cosine", "linear", "inverse_sqrt"] = Field(
        "cosine", description="learning-rate schedule after warm-up (see harness.run.optim)")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="final lr / lr (cosine, linear)")
    warmup_steps: int = Field(100, ge=0, le=MAX_STEPS)
    grad_clip: float | None = Field(1.0, gt=0, le=1e6)
    val_every: int = Field(250, ge=1, le=MAX_STEPS, description="validate every N optimizer steps")
    log_every: int | None = Field(
        None, ge=1, le=MAX_STEPS, exclude_if=lambda v: v is None,
        description="log train/loss and train/acc every N optimizer steps, each point the mean of "
                    "the steps since the previous one (accumulated on the device: harness.run."
                    "trainlog); unset: val_every / 4, at most 50")
    seed: Seed = Field(0, description="model initialisation and data order")
    data_seed: Seed = Field(0, description="task data generation (same data for every candidate)")
    label_smoothing: float = Field(0.0, ge=0, lt=1)
    scheduled_sampling: float = Field(
        0.0, ge=0, le=1,
        description="probability of feeding the model its own argmax prediction instead of the "
                    "gold previous target token (seq2seq and lm formats; see harness.run.system)",
    )
    max_time_s: float | None = Field(None, gt=0, le=MAX_SECONDS, description="wall-clock cap for fitting")
    # Compute budgets (harness.run.flops): the steps follow from them (max_steps is replaced).
    max_flops: float | None = Field(
        None, gt=0, le=1e30, exclude_if=lambda v: v is None,
        description="training FLOPs of the run: max_steps = this / (FLOPs per token counted on one "
                    "step x tokens per step), rounded")
    max_tokens: int | None = Field(
        None, ge=1, le=10**16, exclude_if=lambda v: v is None,
        description="training tokens of the run (input tokens, padding included): max_steps = this "
                    "/ tokens per step, rounded")
    flops_count: Literal["matmul", "all"] = Field(
        "matmul", exclude_if=lambda v: v == "matmul",
        description="what max_flops counts: matrix products (FlopCounterMode), or also the "
                    "element-wise and FFT work it misses (docs/scaling.md: 59-75% more for h3)")
    accelerator: Literal["auto", "cpu", "gpu", "cuda", "mps", "tpu"] = "auto"
    devices: (Annotated[int, Field(ge=-1, le=4096)]
              | Annotated[str, Field(pattern=r"^(auto|-1|\d+|\d+(,\d+)*,?)$")]
              | Annotated[list[Annotated[int, Field(ge=0, le=4096)]], Field(min_length=1)]) = Field(
        "auto", description="a count (-1: all), 'auto', '0,1' or a list of device indices")
    strategy: str = Field("auto", pattern=r"^[A-Za-z0-9_]+$", description=(
        "Lightning's strategy: auto, ddp (one process per device; the command runs again per "
        "rank), ddp_spawn, fsdp (parameters, gradients and optimizer state sharded over the "
        "devices; docs/scaling_out.md), ..."))
    num_nodes: int = Field(1, ge=1, le=4096, exclude_if=lambda v: v == 1, description=(
        "machines the run trains on (devices is per machine): under torchrun or Slurm, the "
        "nodes it was launched on (docs/scaling_out.md)"))
    precision: Annotated[Literal[PRECISIONS], BeforeValidator(  # type: ignore[valid-type]
        lambda v: str(v) if type(v) is int else v)] = Field(
        "auto", description="Lightning precision; auto: bf16-mixed on GPUs that support it, else "
        "32-true (bf16-mixed works on the CPU too)")
    tf32: bool | None = Field(
        None, exclude_if=lambda v: v is None,
        description="TF32 tensor cores for fp32 matrix products on a GPU "
                    "(torch.set_float32_matmul_precision('high')); unset: on with CUDA")
    deterministic: bool | None = Field(
        None, exclude_if=lambda v: v is None,
        description="deterministic algorithms only (torch.use_deterministic_algorithms); unset: on "
                    "on the CPU, where it costs nothing, off on a GPU, where it slows every step")
    compile: bool = Field(False, description="wrap the model in torch.compile (inductor); a model "
                          "that cannot compile fails the run with a message to turn this off")
    cuda_graphs: bool = Field(
        False, exclude_if=lambda v: not v,
        description="capture the model's forward and backward in CUDA graphs (torch.compile's "
                    "'reduce-overhead' mode: one replay instead of a kernel launch per operation, "
                    "for small models on a GPU); a CUDA device and batches of one shape only")
    kernels: Literal["auto", "fla", "reference"] = Field(
        "auto", exclude_if=lambda v: v == "auto",
        description="the mixers' implementation (harness.nn.fast_path): auto, flash-linear-"
                    "attention's kernels on CUDA when installed, else the pure-PyTorch reference; "
                    "fla, the kernels or the run is refused; reference, always the reference")
    num_threads: int | None = Field(None, ge=1, le=4096, description="torch CPU threads (None: torch's "
                                    "default; in a study worker, usable cores ÷ workers on the machine)")
    progress: bool = True
    checkpoint: bool = False
    # -- checkpoints for resuming (harness.run.checkpoint) --
    checkpoint_every: (Annotated[int, Field(ge=1, le=MAX_STEPS)]
                       | Annotated[str, Field(pattern=CHECKPOINT_EVERY)] | None) = Field(
        None, description="save a resumable checkpoint every N optimizer steps, or every so many "
        "minutes ('10min'); 'off' never; unset: off on the CPU, '30min' on other devices")
    checkpoint_keep: int = Field(2, ge=1, le=1000, description="newest checkpoints kept")
    checkpoint_best: bool = Field(True, description="also keep the checkpoint with the best "
                                  "checkpoint_metric (among those saved after a validation)")
    checkpoint_metric: str = Field("val/loss", pattern=r"^val/[A-Za-z0-9_]+$",
                                   description="what 'best' means: a validation metric")
    checkpoint_mode: Literal["min", "max"] = "min"
    save_model: bool = Field(True, description="keep the final weights (harness.load_model, "
                             "harness generate, harness export)")
    log_attention: bool = Field(True, description="log attention maps of a few val examples")

    @field_validator("max_flops")
    @classmethod
    def _plausible_flops(cls, value: float | None) -> float | None:
        """A FLOP budget a year on the fastest known device could not spend is refused
        (:mod:`harness.runtime.bounds`)."""
        from harness.runtime.bounds import flops_problem

        if value is not None and (problem := flops_problem(value)) is not None:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _one_budget(self) -> TrainConfig:
        """max_flops and max_tokens exclude each other; either replaces max_steps with the
        steps it buys (a run's logged config holds both, and re-runs as it ran)."""
        if self.max_flops is not None and self.max_tokens is not None:
            raise ValueError("max_flops and max_tokens both set the number of steps: keep one")
        return self

    @model_validator(mode="after")
    def _weight_decay_per_optimizer(self) -> TrainConfig:
        """``weight_decay`` left unset is AdamW's 0.01 only with AdamW. With Adam and SGD the
        decay is an L2 term added to the gradient, which Adam rescales per parameter (Loshchilov
        & Hutter 2019): AdamW's 0.01 as L2 took the Transformer on associative recall from 0.99
        to 0.006 answer accuracy (benchmarks/defaults.md, *optimizer*), so there it is 0 unless
        set."""
        if "weight_decay" not in self.model_fields_set and self.optimizer != "adamw":
            object.__setattr__(self, "weight_decay", 0.0)
        return self


class TrackingConfig(Strict):
    uri: str | None = Field(None, min_length=1)  # None: $MLFLOW_TRACKING_URI, else the project-local store
    experiment: ExperimentName = "harness"
    run_name: str | None = Field(None, min_length=1, max_length=250)
    tags: dict[Annotated[str, Field(min_length=1, max_length=250)], str] = Field(default_factory=dict)


class RunConfig(Strict):
    task: ComponentConfig
    model: ModelConfig
    train: TrainConfig = Field(default_factory=TrainConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    plugins: list[str] = Field(default_factory=list, description="local plugin .py files")
    kind: Literal["run"] = "run"

    @field_validator("plugins")
    @classmethod
    def _plugins_exist(cls, paths: list[str]) -> list[str]:
        for p in paths:
            if not p.endswith(".py"):
                raise ValueError(f"{_short(p)} is not a .py file")
        return paths


# -- errors that name the field and the fix ----------------------------------------------
def format_loc(loc: tuple[Any, ...]) -> str:
    """``('candidates', 2, 'model', 'name')`` -> ``candidates[2].model.name``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _union_members(tp: Any) -> list[Any] | None:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(tp) if a is not type(None)]
    return None


def _strip(tp: Any) -> tuple[Any, list[Any]]:
    """A type without ``Annotated`` (and its metadata) and without ``| None``."""
    meta: list[Any] = []
    while True:
        if typing.get_origin(tp) is Annotated:
            tp, *more = typing.get_args(tp)
            meta += more
            continue
        members = _union_members(tp)
        if members is not None and len(members) == 1:
            tp = members[0]
            continue
        return tp, meta


def _walk(model: type[BaseModel], loc: tuple[Any, ...]) -> tuple[tuple[Any, ...], Any, list[Any], list[str]]:
    """Follow an error's location through the schema: the location without pydantic's union
    member tags, the type found there, its constraints, and the field names next to it."""
    clean: list[Any] = []
    tp: Any = model
    meta: list[Any] = []
    siblings: list[str] = []
    for part in loc:
        tp, more = _strip(tp)
        meta = list(more)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            clean.append(part)
            siblings = list(tp.model_fields)
            field = tp.model_fields.get(str(part))
            if field is None:
                return tuple(clean), None, [], siblings
            tp, meta = field.annotation, list(field.metadata)
            continue
        if _union_members(tp) is not None:  # a tag naming the union member that failed
            return tuple(clean), None, [], siblings
        origin = typing.get_origin(tp)
        clean.append(part)
        if origin in (list, tuple) and isinstance(part, int):
            args = typing.get_args(tp)
            tp = args[0] if origin is list or (len(args) == 2 and args[1] is Ellipsis) else (
                args[part] if part < len(args) else None)
        elif origin is dict:
            tp = typing.get_args(tp)[1]
        else:
            tp = None
        meta = []
    tp, more = _strip(tp)
    return tuple(clean), tp, meta + more, siblings


def describe_valid(tp: Any, meta: list[Any]) -> str:
    """What a field accepts: 'an integer from 1 to 1048576', 'a finite number > 0', ..."""
    kinds = {int: "an integer", float: "a finite number", bool: "true or false", str: "a string"}
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    what = kinds.get(tp)
    if what is None:
        return ""
    lo = hi = None
    parts = []
    for m in meta:
        for attr, op in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            value = getattr(m, attr, None)
            if value is not None and isinstance(m, annotated_types.BaseMetadata):
                parts.append(f"{op} {value:g}" if isinstance(value, float) else f"{op} {value}")
                lo = value if attr == "ge" else lo
                hi = value if attr == "le" else hi
    if lo is not None and hi is not None and len(parts) == 2:
        return f"{what} from {lo} to {hi}"
    return what + (" " + " and ".join(parts) if parts else "")


def _short(value: Any) -> str:
    return short_repr(value, 60)


def format_validation_error(exc: ValidationError, source: str, model: type[BaseModel] | None = None,
                            fields_doc: str = "the README", prefix: str = "") -> str:
    """One paragraph naming each wrong field (up to five), what was given and what is valid.
    ``prefix``: where ``model`` sits in the user's file (``train.``)."""
    parts: list[str] = []
    seen: set[str] = set()
    errors = exc.errors()
    for err in errors:
        loc, tp, meta, siblings = _walk(model, tuple(err["loc"])) if model else (tuple(err["loc"]), None, [], [])
        where = prefix + format_loc(loc)
        if where in seen:
            continue
        seen.add(where)
        msg = pydantic_message(err | {"loc": ()})  # the value given is added below
        if err["type"] == "extra_forbidden":
            close = difflib.get_close_matches(str(loc[-1]), siblings, n=1) if loc else []
            msg = ("unknown field" + (f" (did you mean '{close[0]}'?)" if close else
                                       f" (check the spelling; see {fields_doc} for the fields)"))
        elif err["type"] == "missing":
            msg = "required field is missing"
        else:
            given = err.get("input")
            if isinstance(given, bool) and tp in (int, float):
                msg = "expects a number, not a boolean"
            if not (isinstance(given, dict) and err["type"] in WHOLE_CHECKS):
                msg += f" (got {_short(given)})"  # a check of a whole block echoes the block
            valid = describe_valid(tp, meta) if err["type"] != "value_error" else ""
            if valid:
                msg += f"; valid: {valid}"
        parts.append(f"{where}: {msg}")
        if len(parts) == 5:
            break
    more = len({format_loc(tuple(e["loc"])) for e in errors}) - len(seen)
    tail = f" (and {more} more)" if more > 0 and len(parts) == 5 else ""
    return f"invalid config in {source}: " + "; ".join(parts) + tail + "."


# -- loading -------------------------------------------------------------------------------
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z_][A-Za-z0-9_-]*)*$")


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides (values parsed as YAML: ``3``, ``[16, 32]``, ``{a: 1}``)."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not _KEY.match(key):
            raise ConfigError(
                f"override {_short(item)} must look like key.path=value (letters, digits, '_' and '-' "
                f"between dots), e.g. train.max_steps=200."
            )
        value = parse_value(raw, f"the value of override {key!r}")
        node = data
        parts = key.split(".")
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override {_short(item)}: '{'.'.join(parts[: i + 1])}' is not a mapping "
                                  f"(it is {_short(child)}).")
            node = child
        node[parts[-1]] = value
    return data


def load_run_config(
    path: str | os.PathLike[str] | None = None,
    overrides: list[str] | None = None,
    base: dict[str, Any] | None = None,
) -> RunConfig:
    data = dict(base or {})
    source = "command-line overrides"
    if path is not None:
        data.update(read_yaml(path))
        source = str(path) + (" and command-line overrides" if overrides else "")
        plugins = data.get("plugins") or []
        if isinstance(plugins, list) and all(isinstance(p, str) for p in plugins):
            base_dir = Path(path).resolve().parent
            data["plugins"] = [str((base_dir / p).resolve()) for p in plugins]
    apply_overrides(data, list(overrides or []))
    return parse_run_config(data, source)


def parse_run_config(data: dict[str, Any], source: str = "config") -> RunConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"invalid config in {source}: a mapping is needed, not {type(data).__name__}.")
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source, RunConfig)) from None
