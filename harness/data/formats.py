"""Batch formats: how a task's examples become batches, fixed by the task kind:

``lm``              ``tokens`` (B, L) model input, ``targets`` (B, L) next tokens,
                    ``loss_mask`` (B, L) scored positions, ``padding_mask`` (B, L).
                    Model call: ``model(tokens, padding_mask=...) -> (B, L, V)``.
``seq2seq``         ``src`` (B, S), ``src_padding_mask``, ``tgt_in`` (B, T) (BOS + target
                    shifted right), ``tgt_padding_mask``, ``targets`` (B, T), ``loss_mask``.
                    Model call: ``model(src, tgt_in, src_padding_mask=..., tgt_padding_mask=...)
                    -> (B, T, V)``.
``classification``  ``tokens``, ``padding_mask``, ``targets`` (B,), ``loss_mask`` (B,).
                    Model call: ``model(tokens, padding_mask=...) -> (B, C)``.
``tagging``         ``tokens``, ``padding_mask``, ``targets`` (B, L) one label per input
                    token (aligned, not shifted), ``loss_mask`` (B, L).
                    Model call: ``model(tokens, padding_mask=...) -> (B, L, C)``.

``padding_mask`` is True at padding. Examples are dicts: ``{"tokens": [...], "loss_mask":
[...]}`` (lm; ``loss_mask`` aligned with the targets ``tokens[1:]``, all scored if absent;
an optional ``depth``, the percent of the context before a needle, which a long-context
task's metrics read from the batch's raw ``examples``),
``{"tokens": [...], "tags": [...]}`` (tagging; an optional ``loss_mask`` aligned with
``tokens``),
``{"src": [...], "tgt": [...]}`` (seq2seq; ``tgt`` ends with EOS if the task wants the
model to learn where to stop), ``{"tokens": [...], "label": int}`` (classification).

A model that takes ``lm`` batches also serves ``seq2seq`` tasks: each example becomes
``src SEP tgt`` and only the target is scored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from harness.data.vocab import BOS, PAD, SEP, Example
from harness.errors import IncompatibleError


class BatchFormat:
    """How the examples of a task become batches for a model, and how the model is called.

    One instance per format (:data:`LM`, :data:`SEQ2SEQ`, :data:`CLASSIFICATION`,
    :data:`TAGGING`; by name in :data:`FORMATS`); ``str(fmt)`` is its name, which models see
    as ``TaskInfo.format``. The task kind matters where it differs from the format: a
    ``seq2seq`` task served to an ``lm`` model (``src SEP tgt``).
    """

    name: ClassVar[str] = ""
    #: (input key, padding key) of a teacher-forced input whose tokens are the previous
    #: targets (what scheduled sampling replaces), or None where targets never feed back.
    feedback: ClassVar[tuple[str, str] | None] = None
    #: the batch keys whose tokens the model reads (counted for throughput)
    input_keys: ClassVar[tuple[str, ...]] = ("tokens",)
    #: per padding mask (True at padding), the keys padded to the same width: a batch of
    #: any examples is the whole split's batch sliced to its rows and to each group's
    #: longest row (what :class:`harness.run.batches.DeviceBatches` relies on)
    padding_groups: ClassVar[dict[str, tuple[str, ...]]] = {
        "padding_mask": ("tokens", "padding_mask", "targets", "loss_mask")}

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"<batch format {self.name}>"

    def input_length(self, example: Example, task_kind: str) -> int:
        """How many positions the model sees for one example."""
        return len(example["tokens"])

    def collate(self, examples: Sequence[Example], task_kind: str) -> dict[str, Any]:
        """Pad examples into a batch (right padding); the batch also carries the raw
        ``examples`` (a list), for metrics that decode."""
        batch = self._tensors(examples, task_kind)
        batch["examples"] = list(examples)
        return batch

    def _tensors(self, examples: Sequence[Example], task_kind: str) -> dict[str, Any]:
        raise NotImplementedError

    def call(self, model: Any, batch: dict[str, Any], **kwargs: Any) -> Any:
        """Call a model on a batch of this format."""
        return model(batch["tokens"], padding_mask=batch["padding_mask"], **kwargs)

    def tokens(self, batch: dict[str, Any]) -> int:
        """Input tokens in a batch (padding included: what the model computes over)."""
        return sum(int(batch[k].numel()) for k in self.input_keys)


def _pad(seqs: Sequence[Sequence[int]], value: int = PAD) -> Any:
    import torch

    n = max(len(s) for s in seqs)
    return torch.tensor([list(s) + [value] * (n - len(s)) for s in seqs], dtype=torch.long)


class LanguageModelling(BatchFormat):
    name = "lm"
    feedback = ("tokens", "padding_mask")

    def input_length(self, example: Example, task_kind: str) -> int:
        if task_kind == "seq2seq":
            example = as_lm(example)
        return len(example["tokens"]) - 1

    def _tensors(self, examples: Sequence[Example], task_kind: str) -> dict[str, Any]:
        if task_kind == "seq2seq":
            examples = [as_lm(e) for e in examples]
        seqs = [list(e["tokens"]) for e in examples]
        masks = [list(e.get("loss_mask") or [True] * (len(s) - 1)) for e, s in zip(examples, seqs, strict=True)]
        return {
            "tokens": _pad([s[:-1] for s in seqs]),
            "padding_mask": _pad([[0] * (len(s) - 1) for s in seqs], 1).bool(),
            "targets": _pad([s[1:] for s in seqs]),
            "loss_mask": _pad([[int(m) for m in ms] for ms in masks], 0).bool(),
        }


class SequenceToSequence(BatchFormat):
    name = "seq2seq"
    feedback = ("tgt_in", "tgt_padding_mask")
    input_keys = ("src", "tgt_in")
    padding_groups = {"src_padding_mask": ("src", "src_padding_mask"),
                      "tgt_padding_mask": ("tgt_in", "tgt_padding_mask", "targets", "loss_mask")}

    def input_length(self, example: Example, task_kind: str) -> int:
        return max(len(example["src"]), len(example["tgt"]))

    def _tensors(self, examples: Sequence[Example], task_kind: str) -> dict[str, Any]:
        src = _pad([e["src"] for e in examples])
        tgt = [list(e["tgt"]) for e in examples]
        mask = _pad([[1] * len(t) for t in tgt], 0).bool()
        return {
            "src": src,
            "src_padding_mask": src == PAD,
            "tgt_in": _pad([[BOS] + t[:-1] for t in tgt]),
            "tgt_padding_mask": ~mask,
            "targets": _pad(tgt),
            "loss_mask": mask,
        }

    def call(self, model: Any, batch: dict[str, Any], **kwargs: Any) -> Any:
        return model(batch["src"], batch["tgt_in"], src_padding_mask=batch["src_padding_mask"],
                     tgt_padding_mask=batch["tgt_padding_mask"], **kwargs)


class Classification(BatchFormat):
    name = "classification"
    padding_groups = {"padding_mask": ("tokens", "padding_mask")}  # targets: one per example

    def _tensors(self, examples: Sequence[Example], task_kind: str) -> dict[str, Any]:
        import torch

        tokens = _pad([e["tokens"] for e in examples])
        targets = torch.tensor([int(e["label"]) for e in examples], dtype=torch.long)
        return {
            "tokens": tokens,
            "padding_mask": tokens == PAD,
            "targets": targets,
            "loss_mask": torch.ones_like(targets, dtype=torch.bool),
        }


class Tagging(BatchFormat):
    name = "tagging"

    def _tensors(self, examples: Sequence[Example], task_kind: str) -> dict[str, Any]:
        tokens = _pad([e["tokens"] for e in examples])
        scored = [list(e.get("loss_mask") or [True] * len(e["tokens"])) for e in examples]
        return {
            "tokens": tokens,
            "padding_mask": tokens == PAD,
            "targets": _pad([e["tags"] for e in examples], 0),
            "loss_mask": _pad([[int(m) for m in ms] for ms in scored], 0).bool(),
        }


LM, SEQ2SEQ, CLASSIFICATION, TAGGING = LanguageModelling(), SequenceToSequence(), Classification(), Tagging()
#: Every batch format by name; the task kinds are the same names.
FORMATS: dict[str, BatchFormat] = {f.name: f for f in (LM, SEQ2SEQ, CLASSIFICATION, TAGGING)}


def batch_format(task_kind: str, model_kinds: frozenset[str], model: str, task: str) -> BatchFormat:
    """The batch format a model receives for a task, or an IncompatibleError."""
    if task_kind in model_kinds:
        return FORMATS[task_kind]
    if task_kind == SEQ2SEQ.name and LM.name in model_kinds:
        return LM
    raise IncompatibleError(
        f"model '{model}' cannot train on task '{task}': the task is of kind '{task_kind}' "
        f"and the model supports {', '.join(sorted(model_kinds))}. Pick a model that supports "
        f"'{task_kind}' (see `harness list --kind model --verbose`)."
    )


def as_lm(example: Example) -> Example:
    """A seq2seq example as a decoder-only sequence ``src SEP tgt``; only tgt is scored."""
    src, tgt = list(example["src"]), list(example["tgt"])
    tokens = src + [SEP] + tgt
    return {"tokens": tokens, "loss_mask": [i >= len(src) for i in range(len(tokens) - 1)]}


def collate(examples: Sequence[Example], fmt: BatchFormat | str, task_kind: str) -> dict[str, Any]:
    """Pad examples into a batch of a format (an object or its name); see :class:`BatchFormat`."""
    return (FORMATS[fmt] if isinstance(fmt, str) else fmt).collate(examples, task_kind)
