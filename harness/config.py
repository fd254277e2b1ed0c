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

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from harness.errors import ConfigError


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ComponentConfig(Strict):
    name: str
    params: dict[str, Any] = Field(default_factory=dict)


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


class TrainConfig(Strict):
    max_steps: int = Field(1000, ge=1, description="optimizer steps (the budget)")
    batch_size: int = Field(32, ge=1)
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    optimizer: Literal["adamw", "adam", "sgd"] = Field("adamw", description="see harness.run.optim")
    betas: tuple[float, float] = Field((0.9, 0.999), description="Adam(W) moment decay rates")
    momentum: float = Field(0.9, ge=0, lt=1, description="SGD momentum")
    schedule: Literal["constant", "cosine", "linear", "inverse_sqrt"] = Field(
        "cosine", description="learning-rate schedule after warm-up (see harness.run.optim)")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="final lr / lr (cosine, linear)")
    warmup_steps: int = Field(100, ge=0)
    grad_clip: float | None = Field(1.0, gt=0)
    val_every: int = Field(250, ge=1, description="validate every N optimizer steps")
    seed: int = Field(0, description="model initialisation and data order")
    data_seed: int = Field(0, description="task data generation (same data for every candidate)")
    label_smoothing: float = Field(0.0, ge=0, lt=1)
    scheduled_sampling: float = Field(
        0.0, ge=0, le=1,
        description="probability of feeding the model its own argmax prediction instead of the "
                    "gold previous target token (seq2seq and lm formats; see harness.run.system)",
    )
    max_time_s: float | None = Field(None, gt=0, description="wall-clock cap for fitting")
    accelerator: str = "auto"
    devices: int | str | list[int] = "auto"
    strategy: str = "auto"
    precision: str = Field("auto", description="Lightning precision; auto: bf16-mixed on GPUs "
                           "that support it, else 32-true (bf16-mixed works on the CPU too)")
    compile: bool = Field(False, description="wrap the model in torch.compile (inductor); a model "
                          "that cannot compile fails the run with a message to turn this off")
    num_threads: int | None = Field(None, ge=1, description="torch CPU threads (None: torch's default; "
                                       "in a study worker, usable cores ÷ workers on the machine)")
    progress: bool = True
    checkpoint: bool = False
    log_attention: bool = Field(True, description="log attention maps of a few val examples")


    @field_validator("betas")
    @classmethod
    def _betas(cls, betas: tuple[float, float]) -> tuple[float, float]:
        if not all(0 <= b < 1 for b in betas):
            raise ValueError(f"each beta must lie in [0, 1), got {betas}")
        return betas


class TrackingConfig(Strict):
    uri: str | None = None  # None: $MLFLOW_TRACKING_URI, else the project-local store
    experiment: str = "harness"
    run_name: str | None = None
    tags: dict[str, str] = Field(default_factory=dict)


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
                raise ValueError(f"{p!r} is not a .py file")
        return paths


def format_validation_error(exc: ValidationError, source: str) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling; see the README for the fields)"
        elif err["type"] == "missing":
            msg = "required field is missing"
        parts.append(f"{loc}: {msg}")
    more = f" (and {len(exc.errors()) - 5} more)" if len(exc.errors()) > 5 else ""
    return f"invalid config in {source}: " + "; ".join(parts) + more + "."


def read_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist. Pass the path of a YAML file.")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{p} is not valid YAML{where}: {getattr(exc, 'problem', exc)}.") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p} must contain a mapping at the top level, not {type(data).__name__}.")
    return data


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides (values parsed as YAML scalars)."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(
                f"override {item!r} must look like key.path=value, e.g. train.max_steps=200."
            )
        key, raw = item.split("=", 1)
        value = yaml.safe_load(raw) if raw else None
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: '{part}' is not a mapping.")
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
        source = str(path)
        base_dir = Path(path).resolve().parent
        data["plugins"] = [str((base_dir / p).resolve()) for p in data.get("plugins") or []]
    apply_overrides(data, list(overrides or []))
    return parse_run_config(data, source)


def parse_run_config(data: dict[str, Any], source: str = "config") -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source)) from None
