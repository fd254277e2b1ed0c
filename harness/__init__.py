"""attention-harness: compare attention variants, position schemes, token mixers and baselines
fairly.

This module is the public API for users (cheap to import: torch, lightning and mlflow load
only when a function needs them)::

    import harness
    harness.list_plugins("attention")
    model = harness.create_model("transformer", attention="multi_head", position="rope",
                                 vocab_size=32, max_length=128, d_model=64)
    task = harness.create_task("copy", length=16)
    harness.prepare_corpus(["texts/"], "corpora/mine", tokenizer="bpe:8192")  # your corpus
    grid = harness.probe(run_id, "needle", lengths=[256, 512])  # a long-context probe
    result = harness.train("run.yaml")      # or a dict / harness.config.RunConfig
    runs = harness.study_runs("quickstart")        # pandas DataFrame, one row per run
    summary = harness.study_summary("quickstart")  # the report's numbers

Plugin authors import everything they need from :mod:`harness.plugin`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from harness.errors import ConfigError
from harness.registry.hookspecs import hookimpl
from harness.registry.specs import AttentionSpec, ModelSpec, PositionSpec, Registry, Spec, TaskSpec

if TYPE_CHECKING:
    from harness.data.tasks import Task
    from harness.run.pipeline import RunResult


def load_plugins(*files: str | os.PathLike[str], plugins: Any = (), **kwargs: Any) -> Registry:
    """Load every plugin (entry points, local ``files``, in-process ``plugins``)."""
    from harness.registry import loader

    return loader.load(files, plugins=plugins, **kwargs)


def list_plugins(kind: str | None = None, *, registry: Registry | None = None) -> list[Spec]:
    """Registered specs, optionally of one kind (attention, position, model, task)."""
    reg = registry or load_plugins()
    return [s for s in reg if kind is None or s.kind == kind]


def create_task(name: str, *, seed: int = 0, registry: Registry | None = None, **params: Any) -> Task:
    """Build a task by name: ``create_task("copy", length=32)``."""
    from harness.params import resolve

    spec = (registry or load_plugins()).get("task", name)
    return spec.build(resolve(spec.config, params, f"task '{name}' params"), seed=seed)  # type: ignore[no-any-return]


def create_model(
    name: str,
    *,
    vocab_size: int,
    max_length: int = 512,
    batch_format: str = "lm",
    num_classes: int | None = None,
    attention: str | None = None,
    position: str | None = None,
    mixer: str | None = None,
    attention_params: dict[str, Any] | None = None,
    position_params: dict[str, Any] | None = None,
    mixer_params: dict[str, Any] | None = None,
    preset: str | None = None,
    attention_roles: dict[str, str | dict[str, Any]] | None = None,
    registry: Registry | None = None,
    **params: Any,
) -> Any:
    """Build a model (a plain ``nn.Module``) by name, with its attention variant or mixer
    (or both, for a hybrid) and its position scheme.

    ``batch_format`` is the batch format the model will receive (``lm``, ``seq2seq``,
    ``classification`` or ``tagging``); ``max_length`` the longest input it will see in
    training; ``preset`` a named preset of the model (``transformer++``).
    ``attention_roles`` gives roles the model declares their own variant, by name or as
    ``{"name": ..., "params": {...}}``: ``attention_roles={"cross": "additive"}``.
    """
    from pydantic import ValidationError

    from harness.config import ComponentConfig, ModelConfig, format_validation_error
    from harness.data.tasks import TaskInfo
    from harness.run.build import build_model_from
    from harness.run.plan import resolve_model

    def component(kind_name: str | None, kind_params: dict[str, Any] | None) -> Any:
        return ComponentConfig(name=kind_name, params=kind_params or {}) if kind_name else None

    roles = {r: {"name": v} if isinstance(v, str) else v for r, v in (attention_roles or {}).items()}
    try:
        cfg = ModelConfig(
            name=name,
            params=params,
            attention=component(attention, attention_params),
            position=component(position, position_params),
            mixer=component(mixer, mixer_params),
            preset=preset,
            attention_roles=roles,  # type: ignore[arg-type]  # validated into ComponentConfigs
        )
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, "create_model arguments")) from None
    parts = resolve_model(registry or load_plugins(), cfg)
    info = TaskInfo(format=batch_format, vocab_size=vocab_size, max_length=max_length, num_classes=num_classes)
    return build_model_from(parts, info)


def train(config: Any = None, *, verbose: bool | None = None, **kwargs: Any) -> RunResult:
    """Train one run from a config (path, dict or RunConfig); see :func:`harness.run.pipeline.train`.
    ``resume=RUN_ID`` continues a stopped run from its last checkpoint (config optional).

    As quiet as ``harness train``: MLflow's and Lightning's INFO lines, tips and internal
    warnings are kept off for the call; ``verbose=True`` (or ``HARNESS_VERBOSE=1``) lets
    them through."""
    from harness.run.pipeline import train as _train
    from harness.runtime.noise import quieted

    with quieted(verbose):
        return _train(config, **kwargs)


def load_model(ref: str | os.PathLike[str], *, trust_plugins: bool = False) -> tuple[Any, dict[str, Any]]:
    """The trained module (in eval mode) and its resolved config, from a run id (its final
    weights in the store, else its newest checkpoint) or a folder written by ``harness
    export`` (or in the Hugging Face Hub layout, ``harness export --format hf``); see
    :mod:`harness.run.trained`. A folder whose ``model.json`` names plugin files loads only with
    ``trust_plugins=True`` (their code is imported and run). Every failure is a
    :class:`harness.errors.HarnessError`."""
    from harness.run.hub import load_any

    trained = load_any(os.fspath(ref), trust_plugins=trust_plugins)
    return trained.model, trained.config


def study_runs(study: str, storage: str | None = None, tracking_uri: str | None = None, *,
               verbose: bool | None = None) -> Any:
    """A study's runs as a pandas DataFrame, one row per run (candidate, phase, trial, seed,
    status, objective, costs, ``params.*``, ``metrics.*``); see
    :func:`harness.report.notebook.study_runs`. ``storage``: the study's Optuna storage URL
    (default: the one in ``$HARNESS_HOME``)."""
    from harness.report.notebook import study_runs as _runs
    from harness.runtime.noise import quieted

    with quieted(verbose):
        return _runs(study, storage, tracking_uri)


def study_summary(study: str, storage: str | None = None, tracking_uri: str | None = None, *,
                  verbose: bool | None = None) -> dict[str, Any]:
    """The numbers of a study's report (ranks, best group, intervals, comparisons, front) as a
    dict; see :func:`harness.report.notebook.study_summary`."""
    from harness.report.notebook import study_summary as _summary
    from harness.runtime.noise import quieted

    with quieted(verbose):
        return _summary(study, storage, tracking_uri)


def probe(run: str | os.PathLike[str], task: str = "needle", *, lengths: Any, verbose: bool | None = None,
          **options: Any) -> Any:
    """``harness probe`` from Python: score a trained language-model run zero-shot on a
    long-context task over a grid of context lengths and needle depths, through its own
    vocabulary, and log each cell to the run: ``probe(run_id, "needle", lengths=[256, 512],
    depths=[0, 50, 100])``. A length the model cannot read whole is refused (a
    :class:`~harness.errors.ConfigError`), never cut. Options and the result:
    :func:`harness.evaluation.probe.probe` (docs/long_context.md)."""
    from harness.evaluation.probe import probe as _probe
    from harness.runtime.noise import quieted

    with quieted(verbose):
        return _probe(os.fspath(run) if isinstance(run, os.PathLike) else run, task, lengths=lengths, **options)


def prepare_corpus(sources: Any, out: Any, **options: Any) -> Any:
    """``harness data prepare`` from Python: ``prepare_corpus(["texts/"], "corpora/mine",
    tokenizer="bpe:8192")``; options and the result: :func:`harness.data.prepare.prepare`."""
    from harness.data.prepare import prepare

    return prepare(sources, out, **options)


__all__ = [
    "AttentionSpec",
    "ModelSpec",
    "PositionSpec",
    "TaskSpec",
    "create_model",
    "create_task",
    "hookimpl",
    "list_plugins",
    "load_model",
    "load_plugins",
    "prepare_corpus",
    "probe",
    "study_runs",
    "study_summary",
    "train",
]
