"""``memorization``: MAD's memorization, a fixed key-value map learned into the weights.

Poli et al., "Mechanistic Design and Scaling of Hybrid Architectures" (2024,
arXiv:2403.17844), the memorization task, as the authors' generator defines it
(``generate_memorization_instance`` and ``generate_kv_map`` in athms/mad-lab):

* the ``vocab`` symbols are an insert symbol ``?`` and ``vocab - 1`` content symbols, the
  first half keys (``k0``, ...) and the rest values (``v0``, ...);
* one map binds keys to values for the whole task: the keys in a shuffled order paired with
  the values in a shuffled order (as many pairs as the shorter list), drawn from the task's
  seed, the same for every split (MAD draws it once from the run's seed);
* an example of ``length`` L tokens is L / 2 pairs ``key ?``: keys drawn uniformly, and at
  each ``?`` the model must output the value the map binds to the key before it. The value
  never appears in the input: it can only come from the weights.

This is a ``tagging`` task (one output per input token, as MAD's targets are aligned with its
inputs): the tag at each ``?`` is the value's token id and only those are scored. Its model
reads left to right (``TaskInfo.extra["causal"]``: MAD's layers are causal), so no output
sees the next key. Evaluation examples are fresh draws of keys under the same map: they
measure how much of the map the training examples put into the weights (with MAD's 256
training examples of 16 keys, every key is seen in training).

``length`` is MAD's ``seq_len``; longer evaluation lengths hold more pairs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from harness.plugin import Example, Ge, IntRange, Task, TaskConfig, TaskSpec, Vocab, hookimpl

INSERT = "?"


@dataclass
class MemorizationConfig(TaskConfig):
    length: Annotated[int, Ge(2), IntRange(8, 1024, log=True)] = 32  # tokens (MAD's seq_len), even
    vocab: Annotated[int, Ge(4), IntRange(16, 16384, log=True)] = 256  # keys, values and the insert symbol
    num_train: Annotated[int, Ge(1)] = 256  # MAD's baseline training set
    num_val: Annotated[int, Ge(1)] = 1_280  # MAD's test set

    def __post_init__(self) -> None:
        super().__post_init__()
        odd = [n for n in (self.length, *self.eval_lengths) if n % 2]
        if odd:
            raise ValueError(f"lengths {odd} are odd: the sequence is 'key ?' pairs; use even lengths.")


class MemorizationTask(Task):
    """MAD memorization: the value of each key at the insert symbol after it, from the weights."""

    task_kind = "tagging"
    model_hints: ClassVar[dict[str, Any]] = {"causal": True}
    config: MemorizationConfig

    def __init__(self, config: MemorizationConfig, *, seed: int) -> None:
        content = config.vocab - 1
        half = content // 2
        symbols = ((INSERT,) + tuple(f"k{i}" for i in range(half))
                   + tuple(f"v{i}" for i in range(content - half)))
        vocab = Vocab(symbols)
        super().__init__(config, seed=seed, vocab=vocab, num_classes=vocab.size)
        first = vocab.first_symbol
        self.insert = first
        keys = list(range(first + 1, first + 1 + half))
        values = list(range(first + 1 + half, first + 1 + content))
        rng = random.Random(seed * 1_000_003 + 4 * 10_007)  # the map: one per task seed, every split
        rng.shuffle(keys)
        rng.shuffle(values)
        self.map = dict(zip(keys, values, strict=False))

    def generate(self, split: str, length: int) -> list[Example]:
        rng = random.Random(self.split_seed(split, length))
        keys = sorted(self.map)
        out = []
        for _ in range(self.split_size(split)):
            drawn = [rng.choice(keys) for _ in range(length // 2)]
            tokens = [t for k in drawn for t in (k, self.insert)]
            tags = [t for k in drawn for t in (0, self.map[k])]
            out.append({"tokens": tokens, "tags": tags, "loss_mask": [t != 0 for t in tags]})
        return out


def reference(task: MemorizationTask, example: Example) -> bool:
    """Pairs ``key ?``; each ``?`` is scored and tagged with one value per key, the same value
    for that key in every example (the task's map is a function of the key alone), and never
    appears among the inputs."""
    tokens, tags, mask = example["tokens"], example["tags"], example["loss_mask"]
    seen = task.__dict__.setdefault("_reference_map", {})  # across the examples checked
    for pos in range(0, len(tokens), 2):
        key, insert = tokens[pos], tokens[pos + 1]
        if insert != task.insert or key == task.insert or mask[pos] or not mask[pos + 1]:
            return False
        value = tags[pos + 1]
        if task.vocab.token(value)[0] != "v" or task.vocab.token(key)[0] != "k" or value in tokens:
            return False
        if seen.setdefault(key, value) != value:
            return False
    return True


@hookimpl
def harness_register_task(register: Any) -> None:
    register(TaskSpec(name="memorization", build=MemorizationTask, reference=reference))
