"""Probing a trained language-model run zero-shot with a long-context task (``harness probe``,
``harness.probe``): a depth x length grid of needle (or variable-tracking, word-list) scores
through the run's own vocabulary, logged to the run.

**Which text.** A run trained on a prepared corpus (``corpus_lm``, or a text-mode RULER task)
is probed in English through that corpus's tokenizer (the task's ``path`` is the run's corpus
folder, its haystack the corpus's own ``test`` text unless ``haystack: random``); its
tokenizer must be the run's. A run trained on a symbol task is probed with that same task
(its own params: the vocabulary must be the run's, symbol for symbol), at other lengths and
depths. Anything else is refused, naming what differs.

**Never cut.** Every example holds its whole context: the probe refuses (exit 2, nothing
scored) a length the model cannot read whole: one past its ``--max-length``, past what the
model declares (``supports_length``), or, for a model that does not extrapolate (learned
positions), past the longest input it trained on. Truncating a long context silently scores
a model on a haystack whose needle was cut away (a RULER run elsewhere scored about 0 so).
Lengths past the training length of a model that extrapolates are run, and said to be.

**Scored** as the task scores validation (teacher-forced answers: a unit counts when every
one of its tokens is the model's argmax, which greedy decoding would write; see
``harness_plugins/tasks/ruler/base.py``). Logged to the run's MLflow run:
``probe/<name>/<metric>_len<L>`` (and ``..._depth<d>_len<L>`` per cell),
``probe/<name>/<metric>_grid``, and the heatmap and the cells as ``probe/<name>/heatmap.png``
and ``probe/<name>/grid.json``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import ConfigError, HarnessError, shorten
from harness.evaluation.probe_checks import SIZED_BY, check_data_size, check_logits_size, check_run

#: What the task's params that only size its data are replaced by in a probe.
SIZING = ("length", "eval_lengths", "num_train", "num_val", "depths")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


@dataclass
class ProbeResult:
    """A probe's numbers: per length the task's metrics (``recall``, ``recall_depth25``, ``acc``,
    ``exact``, ``loss``), and the grid's cells."""

    run: str
    task: str
    name: str
    metric: str
    lengths: list[int]
    depths: list[int]
    by_length: dict[int, dict[str, float]]
    train_length: int
    examples: int  # per length
    params: dict[str, Any] = field(default_factory=dict)  # the task's params as probed
    logged: bool = False
    notes: list[str] = field(default_factory=list)  # what the reader should know (the run's state)

    @property
    def cells(self) -> dict[tuple[int, int], float]:
        return {(n, d): m[f"{self.metric}_depth{d}"] for n, m in self.by_length.items()
                for d in self.depths if f"{self.metric}_depth{d}" in m}

    def metrics(self) -> dict[str, float]:
        """The MLflow metrics of the probe (``probe/<name>/...``)."""
        out = {f"probe/{self.name}/{k}_len{n}": v for n, m in self.by_length.items() for k, v in m.items()}
        mean = self.grid_mean()
        if mean is not None:
            out[f"probe/{self.name}/{self.metric}_grid"] = mean
        return out

    def grid_mean(self) -> float | None:
        values = list(self.cells.values()) or [m[self.metric] for m in self.by_length.values() if self.metric in m]
        return sum(values) / len(values) if values else None

    def longest_held(self, threshold: float) -> int:
        held = 0
        for n in sorted(self.by_length):
            if self.by_length[n].get(self.metric, -math.inf) < threshold:
                break
            held = n
        return held


def probe(run: str | Path, task: str = "needle", *, lengths: Sequence[int], depths: Sequence[int] | None = None,
          params: dict[str, Any] | None = None, num: int = 100, split: str = "test",
          max_length: int | None = None, batch_size: int = 16, name: str | None = None,
          log: bool = True, tracking_uri: str | None = None, trust_plugins: bool = False,
          seed: int = 0) -> ProbeResult:
    """Score a trained run (a run id or an exported folder) on ``task`` at each of ``lengths``
    (and ``depths``, percent) without training it (see the module). Every failure is a
    :class:`~harness.errors.HarnessError` (exit 2 from the command line)."""
    lengths = sorted(set(int(n) for n in lengths))
    if not lengths or lengths[0] < 1:
        raise ConfigError("--lengths: give at least one context length (tokens), e.g. --lengths 256,512.")
    if num < 1 or batch_size < 1:
        raise ConfigError("--num and --batch-size must be at least 1.")
    if split not in ("val", "test"):
        raise ConfigError(f"--split must be val or test, got {split!r}.")
    label = task if name is None else name
    if not NAME.match(label):
        raise ConfigError(f"--name {shorten(label, 40)!r}: 1 to 64 letters, digits, '_', '.', '-', starting "
                          f"with a letter or digit (it names the run's metrics probe/<name>/...).")
    sized = sorted(set(params or {}) & set(SIZING))
    if sized:
        raise ConfigError(f"--set {sized[0]}: a probe sizes its data itself ({SIZED_BY}); use those "
                          f"options instead of --set {', '.join(sized)}.")
    check_data_size(lengths, num)
    from harness.evaluation.runner import run_tracker
    from harness.run.hub import load_any

    logging = log and not Path(str(run)).is_dir()
    tracker = run_tracker(str(run), tracking_uri) if logging else None  # before any work
    notes = check_run(tracker, str(run), label) if tracker is not None else []
    trained = load_any(run, trust_plugins=trust_plugins)
    if trained.info.format != "lm":
        raise HarnessError(f"{run} trained a {trained.task_kind} task in the {trained.info.format} format: "
                           f"a probe scores a language model's continuation (the lm format).")
    own, registry, own_plan = _run_task(trained)
    probe_task = _probe_task(trained, own, registry, task, lengths, depths, params or {}, num, seed)
    _check_context(trained, own_plan, lengths, max_length, run)
    check_logits_size(lengths[-1], min(num, batch_size), trained.info.vocab_size,
                       next(trained.model.parameters()).device)
    by_length = {n: _score(trained.model, probe_task, split, n, batch_size) for n in lengths}
    result = ProbeResult(str(run), task, label, "recall", lengths, list(getattr(probe_task, "depths", ())),
                         by_length, int(trained.info.max_length), num,
                         {k: v for k, v in vars(probe_task.config).items() if k not in ("num_train",)},
                         notes=notes)
    if tracker is not None:
        record(tracker, str(run), result)
        result.logged = True
    return result


def _run_task(trained: Any) -> tuple[Any, Any, Any]:
    """The run's own task (built again from its config; None when its data is not on this
    machine), the registry and the run's plan."""
    from harness.config import parse_run_config
    from harness.run.build import build_task
    from harness.run.plan import load_registry, plan

    data = dict(trained.config)
    data["tracking"] = {k: v for k, v in (data.get("tracking") or {}).items() if k != "uri"}
    cfg = parse_run_config(data, "the trained model's config")
    registry = load_registry(cfg, None)
    p = plan(cfg, registry)
    try:
        task = build_task(p, seed=cfg.train.data_seed)
    except HarnessError:
        task = None  # a corpus that is not here: the probe must be given a path
    return task, registry, p


def _probe_task(trained: Any, own: Any, registry: Any, name: str, lengths: list[int],
                depths: Sequence[int] | None, params: dict[str, Any], num: int, seed: int) -> Any:
    from harness.params import resolve

    try:
        spec = registry.get("task", name)
    except HarnessError as exc:
        raise ConfigError(f"--task: {exc}") from None
    given = dict(params)
    corpus = getattr(own, "corpus", None) if own is not None else None
    tokenizer = getattr(own, "tokenizer", None) if own is not None else None
    run_task = trained.config.get("task", {}).get("name")
    if corpus is not None or "path" in given:
        if corpus is not None:
            given.setdefault("path", str(Path(corpus.root).resolve()))
        given.setdefault("haystack", "corpus")
    elif run_task == name:  # a symbol run probed with its own task: its own vocabulary
        base = {k: v for k, v in (trained.config.get("task", {}).get("params") or {}).items() if k not in SIZING}
        given = {**base, **given}
    else:
        raise ConfigError(
            f"{trained.source} was trained on the symbol task '{run_task}', whose vocabulary "
            f"has no words for '{name}': a probe writes its needles in the run's own vocabulary. "
            f"Probe a run trained on '{name}' itself, or a language model trained on a prepared "
            f"corpus (corpus_lm), whose tokenizer can write them (or pass --set path=FOLDER, a "
            f"corpus prepared with the run's tokenizer).")
    sizing = {"length": lengths[0], "eval_lengths": tuple(lengths), "num_train": 1, "num_val": num}
    if depths is not None:
        sizing["depths"] = tuple(int(d) for d in depths)
    try:
        config = resolve(spec.config, {**given, **sizing}, "--set")
        task = spec.build(config, seed=seed)
    except ConfigError as exc:
        raise ConfigError(f"{exc} ({SIZED_BY})") from None
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"task '{name}' cannot be probed with these settings: {shorten(str(exc), 400)} "
                          f"({SIZED_BY})") from None
    if task.task_kind != "lm" or not hasattr(task, "statistics"):
        raise ConfigError(f"task '{name}' is not a long-context probe (an lm task scoring answers).")
    if task.vocab.size != trained.info.vocab_size or (corpus is None and "path" not in params
                                                      and tuple(task.vocab.symbols) != tuple(trained.vocab.symbols)):
        raise ConfigError(
            f"the probe's vocabulary ({task.vocab.size} ids) is not the run's ({trained.info.vocab_size}): "
            f"its ids would mean other words to the model. Leave the params that set the "
            f"vocabulary (words, keys, values, variables, numbers, path) as the run had them.")
    theirs = getattr(task, "tokenizer", None)
    if tokenizer is not None and theirs is not None and theirs.to_json() != tokenizer.to_json():
        raise ConfigError(f"the tokenizer of path {given.get('path')} is not the run's: prepare the "
                          f"haystack with the run's tokenizer ({tokenizer.name}).")
    return task


def model_limit(trained: Any, p: Any) -> tuple[int | None, str]:
    """The longest input the model reads whole (None: any) and why."""
    model = trained.model
    check = getattr(model, "supports_length", None)
    if check is not None:
        return None, "supports_length"
    fixed = not p.model.spec.extrapolates or (p.position is not None and not p.position.spec.extrapolates)
    if fixed:
        why = (f"its position scheme '{p.position.name}' does not extrapolate" if p.position is not None
               and not p.position.spec.extrapolates else f"model '{p.model.name}' does not extrapolate")
        return int(trained.info.max_length), f"{why} past the {trained.info.max_length} tokens it trained on"
    return None, ""


def _check_context(trained: Any, p: Any, lengths: list[int], max_length: int | None, run: Any) -> None:
    """Refuse any length the model cannot read whole (see the module): no context is cut."""
    limit, why = model_limit(trained, p)
    if max_length is not None:
        if max_length < 1:
            raise ConfigError(f"--max-length must be at least 1, got {max_length}.")
        limit, why = (max_length, f"--max-length is {max_length}") if limit is None or max_length < limit else (limit, why)
    check = getattr(trained.model, "supports_length", None)
    too_long = [n for n in lengths if (limit is not None and n > limit) or (
        check is not None and limit is None and not check(n))]
    if too_long:
        shown = ", ".join(map(str, too_long))
        reason = why if why != "supports_length" else "the model says it cannot run them (supports_length)"
        fits = [n for n in lengths if n not in too_long]
        raise ConfigError(
            f"run {run} cannot read a context of {shown} tokens whole: {reason}. A probe never "
            f"cuts a context (a needle cut away scores 0 for the wrong reason: silent truncation "
            f"is how long-context probes mislead). "
            + (f"Probe the lengths it reads ({', '.join(map(str, fits))}), " if fits else "Probe shorter lengths, ")
            + "or a model that extrapolates.")


def _score(model: Any, task: Any, split: str, length: int, batch_size: int) -> dict[str, float]:
    """The task's metrics at one length (as validation computes them), and acc, exact, loss."""
    import torch
    import torch.nn.functional as F

    from harness.data.formats import LM

    try:
        examples = list(task.examples(split, length))
    except ValueError as exc:  # the task's own check: too short for its needles and question
        raise ConfigError(f"the probe at length {length}: {shorten(str(exc), 400)} (--lengths)") from None
    device = next(model.parameters()).device
    totals: dict[str, float] = {}
    scored = correct = exact = nll = 0.0
    with torch.no_grad():
        for i in range(0, len(examples), batch_size):
            batch = LM.collate(examples[i: i + batch_size], "lm")
            batch = {k: v.to(device) if hasattr(v, "to") else v for k, v in batch.items()}
            logits = LM.call(model, batch).float()
            for k, v in task.statistics(model, batch, LM, logits).items():
                totals[k] = totals.get(k, 0.0) + float(v)
            mask, targets = batch["loss_mask"], batch["targets"]
            right = (logits.argmax(-1) == targets) & mask
            scored += float(mask.sum())
            correct += float(right.sum())
            exact += float((right | ~mask).all(-1).sum())
            loss = F.cross_entropy(logits.transpose(1, 2), targets.masked_fill(~mask, 0), reduction="none")
            nll += float((loss * mask).sum())
    out = dict(task.metrics_from_statistics(totals))
    out.update(acc=correct / max(scored, 1.0), exact=exact / max(len(examples), 1), loss=nll / max(scored, 1.0))
    return out


def record(tracker: Any, run_id: str, result: ProbeResult) -> None:
    """The probe's metrics, heatmap and cells on the run's MLflow run."""
    import tempfile

    from harness.run import grid

    tracker.log_metrics(run_id, result.metrics())
    folder = f"probe/{result.name}"
    tracker.log_dict(run_id, {"task": result.task, "metric": result.metric, "train_length": result.train_length,
                              "examples_per_length": result.examples, "params": result.params,
                              "cells": [{"length": n, "depth": d, "value": v} for (n, d), v in sorted(result.cells.items())],
                              "by_length": {str(n): m for n, m in result.by_length.items()}},
                     f"{folder}/grid.json")
    if result.cells:
        with tempfile.TemporaryDirectory() as tmp:
            path = grid.heatmap(result.cells, Path(tmp) / "heatmap.png", metric=result.metric,
                                title=f"probe {result.name}: {result.metric} by depth and length",
                                train_length=result.train_length)
            if path is not None:
                tracker.log_artifact(run_id, path, folder)
