"""``text_classification``: classify the texts of your own labelled files.

Records come from ``.jsonl`` / ``.json`` / ``.csv`` / ``.parquet`` files (or folders, or globs):
``text_field`` holds the text, ``label_field`` the label (any string; numbers are read as
their text). Splits, caps, memory and the tokenizer are those of every labelled task
(:mod:`harness.data.labelled`): ``train`` is required; ``val`` and ``test`` are files, or
else cut from ``train`` by a hash of the text (``val_fraction``, ``test_fraction``).

* Labels: the set of labels in the train split, sorted (class ``i`` is the ``i``-th); a label
  in val or test that train never has is an error naming the file and line of its first
  record. Fewer than two labels in train is an error.
* Length: ``length`` is the number of tokens the model reads of each text; longer texts are
  truncated (a warning counts them). An evaluation length n > ``length`` reads the same
  val texts truncated at n tokens instead (does a model trained on short inputs use more
  of a long text?).
* Metrics: ``acc`` (the harness's own) and ``macro_f1``: per class F1 = 2 TP / (2 TP + FP +
  FN), averaged over the classes that occur in the evaluated set's labels or predictions
  (as scikit-learn's ``f1_score(average="macro")``), from per-class counts summed over the
  whole validation set.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from harness.plugin import (
    SPLITS,
    ConfigError,
    Example,
    LabelledConfig,
    LazyExamples,
    Task,
    TaskSpec,
    TokenColumn,
    cached_read,
    empty_split_error,
    encoded,
    hookimpl,
    keep_smallest_hashes,
    key_fraction,
    note_truncated,
    stream_splits,
    tokenizer_for,
    train_texts,
    vocab_of,
    where,
)


@dataclass
class TextClassificationConfig(LabelledConfig):
    text_field: str = field(default="text", metadata={"doc": "the records' field holding the text"})
    label_field: str = field(default="label", metadata={"doc": "the records' field holding the label"})


class TextClassificationTask(Task):
    """Classify the texts of your own labelled files (accuracy and macro-F1)."""

    task_kind = "classification"
    extra_metric_names = ("macro_f1",)  # from metrics_from_statistics
    config: TextClassificationConfig

    def __init__(self, config: TextClassificationConfig, *, seed: int) -> None:
        config.require_train()
        read = cached_read(config, partial(read_classification, config))
        self.tokenizer, self.classes, self.tokens, self.labels = read
        super().__init__(config, seed=seed, vocab=vocab_of(self.tokenizer), num_classes=len(self.classes))

    def split_size(self, split: str) -> int:
        return len(self.labels[split])

    def generate(self, split: str, length: int) -> LazyExamples:
        return LazyExamples(partial(self._example, split, length), self.split_size(split))

    def _example(self, split: str, length: int, i: int) -> Example:
        return {"tokens": self.tokens[split].row(i, length), "label": int(self.labels[split][i])}

    def statistics(self, model: Any, batch: dict[str, Any], fmt: Any, logits: Any) -> dict[str, float]:
        """Per class: true positives, predictions and gold labels (summed over the set)."""
        import torch

        n = len(self.classes)
        pred, gold = logits.argmax(-1), batch["targets"]
        counts = torch.stack([torch.bincount(gold[pred == gold], minlength=n),
                              torch.bincount(pred, minlength=n), torch.bincount(gold, minlength=n)])
        tp, predicted, labelled = counts.tolist()
        out: dict[str, float] = {}
        for c in range(n):
            out[f"tp:{c}"], out[f"pred:{c}"], out[f"gold:{c}"] = tp[c], predicted[c], labelled[c]
        return out

    def metrics_from_statistics(self, totals: dict[str, float]) -> dict[str, float]:
        if not totals:
            return {}
        n = len(self.classes)
        return {"macro_f1": macro_f1([totals[f"tp:{c}"] for c in range(n)],
                                     [totals[f"pred:{c}"] for c in range(n)],
                                     [totals[f"gold:{c}"] for c in range(n)])}


def read_classification(config: TextClassificationConfig) -> tuple[Any, tuple[str, ...], dict[str, TokenColumn], dict[str, array[int]]]:
    """The tokenizer, the classes and per split the token columns and class numbers of the
    records (see the module docstring)."""
    fields = (config.text_field, config.label_field)
    tokenizer = tokenizer_for(config, train_texts(config, fields, config.text_field, fields[:1]))
    keep = config.longest
    tokens = {s: TokenColumn() for s in SPLITS}
    seen: dict[str, int] = {}  # label -> its number in order of appearance
    raw = {s: array("i") for s in SPLITS}  # per record, the number of its label
    keys = {s: array("d") for s in SPLITS}  # hash fractions of the keys
    first_seen: dict[tuple[str, str], str] = {}  # (split, label) -> where it first occurs
    truncated = dict.fromkeys(SPLITS, 0)
    stream = stream_splits(config, fields, config.text_field)
    for split, record, (ids,) in encoded(tokenizer, stream, fields[:1]):
        text, label = record.values[config.text_field], record.values[config.label_field]
        truncated[split] += len(ids) > config.length
        tokens[split].append(ids[:keep])
        raw[split].append(seen.setdefault(label, len(seen)))
        keys[split].append(key_fraction(text))
        first_seen.setdefault((split, label), where(record))
    labels = list(seen)
    classes = tuple(sorted({labels[i] for i in raw["train"]}))
    if len(classes) < 2:
        raise ConfigError(
            f"task.params.train: the training records have {len(classes)} distinct "
            f"label(s) in field '{config.label_field}' ({', '.join(map(repr, classes)) or 'none'}); "
            f"classification needs at least two. Check label_field or the file."
        )
    index = {c: i for i, c in enumerate(classes)}
    for split in ("val", "test"):
        unseen = [labels[i] for i in dict.fromkeys(raw[split]) if labels[i] not in index]
        if unseen:
            lab = unseen[0]
            raise ConfigError(
                f"{first_seen[(split, lab)]}: label {lab!r} (field '{config.label_field}') of a "
                f"{split} record never occurs in the training records, so no model can learn "
                f"it ({len(unseen)} such label(s) in {split}: {', '.join(map(repr, unseen[:5]))}). "
                f"The label set comes from train ({len(classes)}: "
                f"{', '.join(map(repr, classes[:10]))}{' ...' if len(classes) > 10 else ''}); "
                f"fix the label, drop the record, or add training records with it."
            )
    caps = {"train": config.num_train, "val": config.num_val, "test": config.num_val}
    kept: dict[str, TokenColumn] = {}
    labels_of: dict[str, array[int]] = {}
    number = [index.get(label, -1) for label in labels]  # appearance -> class (-1: refused above)
    for split in SPLITS:
        rows = keep_smallest_hashes(keys[split], caps[split])
        kept[split] = tokens[split] if len(rows) == len(tokens[split]) else tokens[split].take(rows)
        labels_of[split] = array("i", (number[raw[split][i]] for i in rows))
    if not len(kept["val"]):
        raise empty_split_error("val", config)
    note_truncated("text_classification", truncated, {s: len(raw[s]) for s in SPLITS}, str(config.length))
    return tokenizer, classes, kept, labels_of


def macro_f1(tp: list[float], predicted: list[float], gold: list[float]) -> float:
    """Mean over classes of 2 TP / (predicted + gold) (= 2 TP / (2 TP + FP + FN)), over the
    classes with a prediction or a gold label; 0 when there are none."""
    scores = [2 * t / (p + g) for t, p, g in zip(tp, predicted, gold, strict=True) if p + g > 0]
    return sum(scores) / len(scores) if scores else 0.0


@hookimpl
def harness_register_task(register: Any) -> None:
    sample = Path(__file__).parent / "data" / "labelled_reviews.jsonl"  # made up: harness_plugins/tasks/data/README.md
    register(TaskSpec(name="text_classification", build=TextClassificationTask, exempt={
        "seeds_differ": "a fixed dataset (your files, split by hash): the task seed changes "
                        "nothing, every seed sees the same records",
    }, check_params={"train": str(sample), "val_fraction": 0.25, "length": 16, "eval_lengths": [32]}))
