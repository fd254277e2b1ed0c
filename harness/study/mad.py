"""The MAD protocol: a suite file (``kind: mad``) turned into one study per MAD task.

Poli et al., "Mechanistic Design and Scaling of Hybrid Architectures" (2024,
arXiv:2403.17844; athms/mad-lab): six synthetic tasks, each at a baseline setting and at
settings that change one difficulty at a time (``changes``: vocabulary, sequence length,
training set, noise share, tokens to copy), every (architecture, setting) trained at each
point of a learning-rate x weight-decay grid, the best point kept; a task's score is the
mean test accuracy over its settings and the MAD score the mean over tasks.

:data:`TASKS` holds MAD's settings in MAD's own names (``configs/tasks/*.yml`` of mad-lab)
and how each maps to a task plugin's params. :func:`studies` turns a suite into one ordinary
study per task: its candidates are each suite candidate at each setting
(``attention.seq_len-256``: the setting as the candidate's own ``task`` params), tuned by the
``grid`` sampler over ``search`` (MAD's ``lr`` x ``weight_decay`` by default), then each
candidate-setting's best point re-run on the confirmation seeds. The report
(:mod:`harness.report.mad`) scores them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from harness.config import Seed, Strict, format_validation_error
from harness.errors import ConfigError
from harness.study.schema import (
    Candidate,
    ConfirmConfig,
    Name,
    Reference,
    StudySeed,
    parse_study_config,
)

#: MAD's learning rates and weight decays (``make_benchmark_mad_configs`` of mad-lab)
MAD_SEARCH: dict[str, list[float]] = {"lr": [1e-4, 5e-4, 1e-3], "weight_decay": [0.0, 0.1]}
TRAIN_SIZES = [6400, 3200, 1600, 800]


def _recall(mad: dict[str, Any]) -> dict[str, Any]:
    return {"vocab": mad["vocab_size"], "length": mad["seq_len"],
            "noise_vocab": mad.get("noise_vocab_size", 0), "frac_noise": mad.get("frac_noise", 0.0)}


def _fuzzy(mad: dict[str, Any]) -> dict[str, Any]:
    return {"vocab": mad["vocab_size"], "length": mad["seq_len"],
            "key_tokens": mad["k_motif_size"], "value_tokens": mad["v_motif_size"]}


def _copying(mad: dict[str, Any]) -> dict[str, Any]:
    """MAD's sequence is the source, a copy token and one slot per copied token: the source is
    ``seq_len - n - 1`` tokens; MAD's vocabulary counts its blank and copy tokens."""
    n = mad["num_tokens_to_copy"]
    return {"vocab": mad["vocab_size"] - 2, "length": mad["seq_len"] - n - 1, "num_tokens": n}


def _plain(mad: dict[str, Any]) -> dict[str, Any]:
    return {"vocab": mad["vocab_size"], "length": mad["seq_len"]}


@dataclass(frozen=True)
class MadTask:
    """One MAD task: the plugin, MAD's baseline and changes (MAD's names), the mapping."""

    plugin: str
    baseline: dict[str, Any]
    changes: dict[str, list[Any]]
    params: Callable[[dict[str, Any]], dict[str, Any]]
    probes: str  # what it measures, for the report and the docs


TASKS: dict[str, MadTask] = {
    "in_context_recall": MadTask(
        "noisy_recall", {"vocab_size": 16, "seq_len": 128, "num_train_examples": 12_800},
        {"vocab_size": [32, 64, 128], "seq_len": [256, 512, 1024], "num_train_examples": TRAIN_SIZES},
        _recall, "recall a value bound to a key earlier in the context"),
    "fuzzy_in_context_recall": MadTask(
        "fuzzy_recall", {"vocab_size": 16, "seq_len": 128, "num_train_examples": 12_800,
                         "k_motif_size": 3, "v_motif_size": 3},
        {"vocab_size": [32, 64, 128], "seq_len": [256, 512, 1024], "num_train_examples": TRAIN_SIZES},
        _fuzzy, "recall when keys and values span several tokens of varying number"),
    "noisy_in_context_recall": MadTask(
        "noisy_recall", {"vocab_size": 32, "noise_vocab_size": 16, "seq_len": 128,
                         "num_train_examples": 12_800, "frac_noise": 0.2},
        {"vocab_size": [48, 80, 144], "seq_len": [256, 512, 1024], "num_train_examples": TRAIN_SIZES,
         "frac_noise": [0.4, 0.6, 0.8]},
        _recall, "recall among irrelevant tokens it must learn to ignore"),
    "selective_copying": MadTask(
        "selective_copy", {"vocab_size": 16, "seq_len": 256, "num_tokens_to_copy": 16,
                           "num_train_examples": 12_800},
        {"vocab_size": [32, 64, 128], "seq_len": [512, 1024], "num_train_examples": TRAIN_SIZES,
         "num_tokens_to_copy": [32, 64, 96]},
        _copying, "copy scattered tokens in order, skipping blanks (content-dependent filtering)"),
    "compression": MadTask(
        "compression", {"vocab_size": 16, "seq_len": 32, "num_train_examples": 12_800},
        {"vocab_size": [32, 64, 128], "seq_len": [64, 128, 256], "num_train_examples": TRAIN_SIZES},
        _plain, "squeeze a whole sequence into the last position's state and rebuild it"),
    "memorization": MadTask(
        "memorization", {"vocab_size": 256, "seq_len": 32, "num_train_examples": 256},
        {"vocab_size": [512, 1024, 2048, 4096, 8192]},
        _plain, "store a fixed key-value map in the weights (no in-context information)"),
}
TaskName = Literal["in_context_recall", "fuzzy_in_context_recall", "noisy_in_context_recall",
                   "selective_copying", "compression", "memorization"]


class TaskOverride(Strict):
    """A suite's change to one MAD task (MAD's names: ``seq_len``, ``vocab_size``, ...)."""

    baseline: dict[str, Any] = Field(default_factory=dict, description="merged over MAD's baseline")
    changes: dict[str, list[Any]] | None = Field(
        None, description="replaces MAD's changes (one setting per value, the rest at baseline)")


class Ordering(Strict):
    """A published claim that one candidate scores above another (``better > worse``)."""

    better: str
    worse: str
    task: TaskName | None = Field(None, description="one task's score; default: the MAD score")
    source: str = Field(min_length=1, description="where the paper says so")


class MadBudget(Strict):
    steps: int = Field(ge=1, le=10**8, description="optimizer steps of every run (MAD: 200 epochs)")
    time_per_run_s: float | None = Field(None, gt=0)


class MadSuite(Strict):
    kind: Literal["mad"] = "mad"
    profile: str | None = None
    name: Name | None = None
    description: str = ""
    candidates: list[Candidate] = Field(min_length=1)
    tasks: list[TaskName] = Field(default_factory=lambda: list(TASKS), min_length=1,  # type: ignore[arg-type]
                                  description="the MAD tasks to run (default: all six)")
    settings: dict[TaskName, TaskOverride] = Field(
        default_factory=dict, description="per task: baseline and changes over MAD's")
    search: dict[str, list[Any]] = Field(default_factory=lambda: copy.deepcopy(MAD_SEARCH),
                                         description="the grid every setting is tuned on")
    train: dict[str, Any] = Field(default_factory=dict, description="fixed training settings")
    budget: MadBudget
    test_examples: int = Field(1_280, ge=1, description="evaluation examples per setting (MAD: 1280)")
    confirm: ConfirmConfig = Field(default_factory=lambda: ConfirmConfig(seeds=3))
    seed: StudySeed = 0
    data_seed: Seed = 0
    plugins: list[str] = Field(default_factory=list)
    reference: Reference | None = Field(None, description="the paper's numbers, shown beside ours")
    orderings: list[Ordering] = Field(default_factory=list,
                                      description="published orderings of candidates the report checks")

    @model_validator(mode="after")
    def _names(self) -> MadSuite:
        names = [c.name for c in self.candidates]
        if len(set(names)) < len(names):
            raise ValueError(f"candidate names must be unique: {', '.join(names)}")
        unknown = sorted({n for o in self.orderings for n in (o.better, o.worse)} - set(names))
        if unknown:
            raise ValueError(f"orderings name candidates the suite lacks: {', '.join(unknown)}")
        for task, override in self.settings.items():
            mad = TASKS[task]
            unknown = sorted(set(override.baseline) - set(mad.baseline))
            if unknown:
                raise ValueError(f"settings.{task}.baseline: unknown {', '.join(unknown)}; MAD's "
                                 f"settings of {task} are {', '.join(mad.baseline)}")
            unknown = sorted(set(override.changes or {}) - set(mad.baseline))
            if unknown:
                raise ValueError(f"settings.{task}.changes: unknown {', '.join(unknown)}; MAD's "
                                 f"settings of {task} are {', '.join(mad.baseline)}")
        return self


@dataclass(frozen=True)
class Cell:
    """One setting of a task: the baseline (``axis`` None) or one change from it."""

    name: str  # base, seq_len-256
    axis: str | None
    value: Any
    mad: dict[str, Any]  # the whole setting in MAD's names


def cells(suite: MadSuite, task: str) -> list[Cell]:
    mad = TASKS[task]
    override = suite.settings.get(task, TaskOverride())  # type: ignore[call-overload]
    base = {**mad.baseline, **override.baseline}
    changes = mad.changes if override.changes is None else override.changes
    out = [Cell("base", None, None, base)]
    for axis, values in changes.items():
        for value in values:
            if value != base[axis]:
                out.append(Cell(f"{axis}-{value}", axis, value, {**base, axis: value}))
    return out


def task_params(suite: MadSuite, task: str, cell: Cell) -> dict[str, Any]:
    """A setting as its plugin's params (training and evaluation set sizes included)."""
    return {**TASKS[task].params(cell.mad), "num_train": cell.mad["num_train_examples"],
            "num_val": suite.test_examples}


def cell_candidate(name: str, cell: Cell) -> str:
    return f"{name}.{cell.name}"


def study_data(suite: MadSuite, task: str) -> dict[str, Any]:
    """The study of one task: every candidate at every setting, tuned on the grid."""
    settings = cells(suite, task)
    base = task_params(suite, task, settings[0])
    candidates = []
    for cand in suite.candidates:
        data = cand.model_dump(mode="json", exclude_none=True)
        model = data["model"]
        for role in ("attention", "mixer", "position"):
            if model.get(role):
                model[role]["search_declared"] = False
        model["search_declared"] = False
        for cell in settings:
            own = {k: v for k, v in task_params(suite, task, cell).items() if base.get(k) != v}
            candidates.append({**copy.deepcopy(data), "name": cell_candidate(cand.name, cell),
                               "task": {**data.get("task", {}), **own}})
    points = 1
    for values in suite.search.values():
        points *= len(values)
    return {
        "name": f"{suite.name}.{task}", "profile": suite.profile,
        "description": f"MAD {task} ({TASKS[task].probes}); suite {suite.name}",
        "task": {"name": TASKS[task].plugin, "params": base}, "candidates": candidates,
        "objective": {"metric": "acc"}, "search": suite.search, "sampler": {"name": "grid", "seed": 0},
        "pruner": {"name": "none"}, "train": suite.train,
        "budget": {"trials": points, **suite.budget.model_dump(exclude_none=True)},
        "confirm": {**suite.confirm.model_dump(exclude_none=True),
                    "baseline": cell_candidate(suite.candidates[0].name, settings[0])},
        "seed": suite.seed, "data_seed": suite.data_seed, "plugins": suite.plugins,
        "tracking": {"experiment": suite.name},
    }


def studies(suite: MadSuite) -> dict[str, Any]:
    """Each task's study config (validated as any study file is), by MAD task name."""
    return {task: parse_study_config(study_data(suite, task), f"the MAD suite's {task} study")
            for task in suite.tasks}


def load_suite(path: str, profile: str | None = None, overrides: list[str] | None = None,
               name: str | None = None) -> MadSuite:
    """Read a suite file (``kind: mad``) with one of its profiles and ``--set`` overrides."""
    from pathlib import Path

    from harness.config import apply_overrides, read_yaml
    from harness.study import profiles

    data = read_yaml(path)
    if data.get("kind") != "mad":
        raise ConfigError(f"{path} is not a MAD suite (kind: mad); `harness mad` runs a suite file "
                          f"such as studies/mad.yaml, and `harness study run` runs a study.")
    data, chosen = profiles.apply(data, profile, str(path))
    data = apply_overrides(data, list(overrides or []))
    base = Path(path).resolve().parent
    data["plugins"] = [str((base / p).resolve()) for p in data.get("plugins") or [] if isinstance(p, str)]
    stem = name or data.get("name") or Path(path).stem
    data["name"] = f"{stem}-{chosen}" if chosen and not name else stem
    data["profile"] = chosen
    try:
        return MadSuite.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, str(path), MadSuite, "studies/mad.yaml")) from None
