"""Checks of tasks (:class:`TaskChecks`).

The task is built from its config with the class's ``params``; where the config has
``num_train`` / ``num_val`` and ``params`` does not set them, the kit shrinks them to
``sizes`` (64 and 16) so generating is quick. Examples checked: the train split at the
training length and the val split at every evaluation length.

``reference`` of a task spec: ``reference(task, example) -> bool``, True when the example
is right (its answer follows from its input), decided independently of ``generate``; it
is called on every checked example.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from harness.data.formats import FORMATS, LM, SEQ2SEQ
from harness.data.vocab import PAD
from harness.errors import MissingDataError
from harness.testing.core import Checks, NotApplicable

#: the keys an example of each task kind has, and the optional ones
KEYS: dict[str, tuple[set[str], set[str]]] = {
    "lm": ({"tokens"}, {"loss_mask", "depth"}),
    "seq2seq": ({"src", "tgt"}, set()),
    "classification": ({"tokens", "label"}, set()),
    "tagging": ({"tokens", "tags"}, {"loss_mask"}),
}


class TaskChecks(Checks):
    """The conformance checks of a task (:class:`harness.data.tasks.Task`)."""

    kind = "task"
    sizes: ClassVar[dict[str, int]] = {"num_train": 64, "num_val": 16}

    # -- helpers ----------------------------------------------------------------------
    def build(self, seed: int | None = None) -> Any:
        """A new task built with ``seed`` or, without one, the class's task (built once: the
        checks that only read examples share it)."""
        if seed is None:
            shared = type(self).__dict__.get("_kit_task")
            if shared is None:
                shared = self.build(self.seed)
                type.__setattr__(type(self), "_kit_task", shared)
            return shared
        given = {**self.component().check_params, **self.params}
        small = {k: v for k, v in self.sizes.items() if k in self.config_fields() and k not in given}
        try:
            return self.component().build(self.config(**small), seed=seed)
        except MissingDataError as exc:  # the user's own copy of a dataset is not here
            raise NotApplicable(f"its data is not on this machine ({exc})") from None

    def splits(self, task: Any) -> Iterator[tuple[str, int, list[dict[str, Any]]]]:
        """(split, length, examples): train at the training length, val at every evaluation length."""
        yield "train", task.train_length, list(task.examples("train", task.train_length))
        for n in task.eval_lengths:
            yield "val", n, list(task.examples("val", n))

    def all_examples(self, task: Any) -> Iterator[tuple[str, dict[str, Any]]]:
        for split, n, examples in self.splits(task):
            for i, e in enumerate(examples):
                yield f"{split} example {i} at length {n}", e

    # -- checks -----------------------------------------------------------------------
    def check_example_format(self) -> None:
        """Every example has its task kind's keys with lists of ints (see harness.data.formats)."""
        spec, task = self.component(), self.build()
        assert task.task_kind == spec.task_kind, (
            f"the spec says task kind {spec.task_kind!r}, the built task {task.task_kind!r}")
        required, optional = KEYS[task.task_kind]
        for where, e in self.all_examples(task):
            keys = set(e)
            assert required <= keys <= required | optional, (
                f"{where} has keys {sorted(keys)}; a {task.task_kind} example has {sorted(required)}"
                + (f" (and optionally {sorted(optional)})" if optional else ""))
            for key in ("tokens", "src", "tgt", "tags"):
                if key in e:
                    assert len(e[key]) > 0 and all(isinstance(t, int) for t in e[key]), (
                        f"{where}: '{key}' must be a non-empty list of ints")
            if task.task_kind == "lm":
                assert len(e["tokens"]) >= 2, f"{where}: an lm example needs at least 2 tokens"
            if "tags" in e:
                assert len(e["tags"]) == len(e["tokens"]), f"{where}: one tag per token"
            if "depth" in e:
                assert isinstance(e["depth"], int) and 0 <= e["depth"] <= 100, (
                    f"{where}: 'depth' must be an int percent from 0 to 100, got {e['depth']!r}")
            if "loss_mask" in e:
                expected = len(e["tokens"]) - (task.task_kind == "lm")
                assert len(e["loss_mask"]) == expected, (
                    f"{where}: loss_mask has {len(e['loss_mask'])} entries, expected {expected}")

    def check_vocabulary(self) -> None:
        """Token ids lie in [0, vocab.size) and are never PAD; labels and tags in [0, num_classes)."""
        task = self.build()
        size = task.vocab.size
        assert len(set(task.vocab.symbols)) == len(task.vocab.symbols), "the vocabulary repeats symbols"
        needs_classes = task.task_kind in ("classification", "tagging")
        if needs_classes:
            assert task.num_classes and task.num_classes > 0, f"a {task.task_kind} task must set num_classes"
        for where, e in self.all_examples(task):
            for key in ("tokens", "src", "tgt"):
                bad = [t for t in e.get(key, ()) if not 0 < t < size]
                assert not bad, (f"{where}: '{key}' has ids {sorted(set(bad))[:5]} outside 1 .. {size - 1} "
                                 f"(the vocabulary has {size} ids; 0 is PAD)")
            labels = list(e.get("tags", ())) + ([e["label"]] if "label" in e else [])
            bad = [c for c in labels if not 0 <= c < (task.num_classes or 0)]
            assert not bad, f"{where}: classes {sorted(set(bad))[:5]} outside 0 .. {(task.num_classes or 0) - 1}"

    def check_determinism(self) -> None:
        """The same seed gives the same examples."""
        a, b = self.build(seed=3), self.build(seed=3)
        for (split, n, x), (_, _, y) in zip(self.splits(a), self.splits(b), strict=True):
            assert x == y, f"two tasks with seed 3 give different {split} examples at length {n}"

    def check_seeds_differ(self) -> None:
        """Another seed gives other training examples."""
        a, b = self.build(seed=3), self.build(seed=4)
        n = a.train_length
        assert a.examples("train", n) != b.examples("train", n), "seeds 3 and 4 give the same training examples"

    def check_splits_differ(self) -> None:
        """Train and val examples differ."""
        task = self.build()
        n = task.train_length
        train, val = list(task.examples("train", n)), list(task.examples("val", n))
        assert train and val, f"empty split at length {n}: train {len(train)}, val {len(val)} examples"
        assert train[: len(val)] != val[: len(train)], "the val split repeats the train split"

    def check_eval_lengths(self) -> None:
        """Every evaluation length gives examples; longer lengths give inputs at least as long."""
        task = self.build()
        fmt = FORMATS[task.task_kind]
        longest = []
        for n in task.eval_lengths:
            examples = task.examples("val", n)
            assert len(examples) > 0, f"no val examples at evaluation length {n}"
            longest.append(max(fmt.input_length(e, task.task_kind) for e in examples))
        assert longest == sorted(longest), (
            f"longest inputs {longest} at evaluation lengths {list(task.eval_lengths)} do not grow with the length")

    def check_collate(self) -> None:
        """Batches collate in the task's format (and as lm, for seq2seq); loss masks skip padding."""
        task = self.build()
        formats = [FORMATS[task.task_kind]] + ([LM] if task.task_kind == SEQ2SEQ.name else [])
        for fmt in formats:
            for _, n, examples in self.splits(task):
                chunk = examples[:8]
                batch = fmt.collate(chunk, task.task_kind)
                where = f"{fmt} batch at length {n}"
                mask, targets = batch["loss_mask"], batch["targets"]
                assert mask.shape == targets.shape, f"{where}: loss_mask {tuple(mask.shape)} vs targets {tuple(targets.shape)}"
                assert mask.any(), f"{where}: the loss mask scores nothing"
                key, pad_key = ("tgt_in", "tgt_padding_mask") if fmt is SEQ2SEQ else ("tokens", "padding_mask")
                if mask.dim() == 2:
                    assert not (mask & batch[pad_key]).any(), f"{where}: the loss mask scores padding"
                real = (~batch[pad_key]).sum(1).tolist() if fmt is not SEQ2SEQ else None
                if real is not None:
                    lengths = [fmt.input_length(e, task.task_kind) for e in chunk]
                    assert real == lengths, f"{where}: real positions {real}, input lengths {lengths}"
                    assert (batch[key][batch[pad_key]] == PAD).all(), f"{where}: padding is not PAD"

    def check_loss_mask(self) -> None:
        """Every example scores at least one position."""
        task = self.build()
        fmt = FORMATS[task.task_kind]
        for where, e in self.all_examples(task):
            assert fmt.collate([e], task.task_kind)["loss_mask"].any(), f"{where} scores no position"

    def check_reference(self) -> None:
        """Every example satisfies the spec's independent ``reference(task, example)``."""
        reference = self.component().reference
        if reference is None:
            raise NotApplicable("no reference declared (the spec's reference=)")
        task = self.build()
        for where, e in self.all_examples(task):
            assert reference(task, e), f"{where} is wrong according to the reference: {e}"

    def pickle_subject(self) -> Any:
        return self.build(self.seed)

    def compare_pickled(self, original: Any, restored: Any) -> None:
        n = original.train_length
        assert restored.examples("val", n) == original.examples("val", n), "the unpickled task gives other examples"
