"""``compression``: MAD's compression, a sequence squeezed through one position and back.

Poli et al., "Mechanistic Design and Scaling of Hybrid Architectures" (2024,
arXiv:2403.17844), the compression task, as the authors' generator and model define it
(``generate_compression_instance`` and the ``AutoEncoder`` backbone in athms/mad-lab):

* the ``vocab`` symbols are a compression symbol ``#`` and ``vocab - 1`` content symbols;
* an example of ``length`` L tokens is L - 1 content symbols drawn uniformly followed by
  ``#``; the target is the example itself, every position scored.

What makes it compression is the model, not the data: the stack reads the sequence left to
right and only its output at the last position (after ``#``) is kept; a small decoder (MAD's:
that vector plus a sinusoidal embedding of each position, through a two-layer MLP) must
write every token back from it. The task asks for that readout with
``TaskInfo.extra["bottleneck"] = "last"``; a model that does not honour it (its module's
``bottleneck`` attribute) is refused before training, since it would copy each token
through its own position. The ``transformer`` model honours it (any mixer or attention).

This is a ``tagging`` task: one output per input token, the tag of each position its own
token. ``length`` is MAD's ``seq_len``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from harness.plugin import Example, Ge, IntRange, Task, TaskConfig, TaskSpec, Vocab, hookimpl

MARK = "#"


@dataclass
class CompressionConfig(TaskConfig):
    length: Annotated[int, Ge(2), IntRange(8, 1024, log=True)] = 32  # tokens (MAD's seq_len)
    vocab: Annotated[int, Ge(2), IntRange(4, 1024, log=True)] = 16  # content symbols and the mark
    num_train: Annotated[int, Ge(1)] = 12_800  # MAD's baseline training set
    num_val: Annotated[int, Ge(1)] = 1_280  # MAD's test set


class CompressionTask(Task):
    """MAD compression: rebuild every token from the model's last position."""

    task_kind = "tagging"
    model_hints: ClassVar[dict[str, Any]] = {"bottleneck": "last", "causal": True}
    config: CompressionConfig

    def __init__(self, config: CompressionConfig, *, seed: int) -> None:
        vocab = Vocab((MARK, *(f"d{i}" for i in range(config.vocab - 1))))
        super().__init__(config, seed=seed, vocab=vocab, num_classes=vocab.size)
        self.mark = vocab.first_symbol
        self.content = range(self.mark + 1, vocab.size)

    def generate(self, split: str, length: int) -> list[Example]:
        rng = random.Random(self.split_seed(split, length))
        out = []
        for _ in range(self.split_size(split)):
            tokens = [*(rng.choice(self.content) for _ in range(length - 1)), self.mark]
            out.append({"tokens": tokens, "tags": list(tokens)})
        return out


def reference(task: CompressionTask, example: Example) -> bool:
    """Content symbols then the mark, once, at the end; each tag is its position's token."""
    tokens = example["tokens"]
    return (tokens[-1] == task.mark and task.mark not in tokens[:-1]
            and all(t in task.content for t in tokens[:-1]) and example["tags"] == tokens)


@hookimpl
def harness_register_task(register: Any) -> None:
    register(TaskSpec(name="compression", build=CompressionTask, reference=reference))
