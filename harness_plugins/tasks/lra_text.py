"""``lra_text``: Long Range Arena's Text task, byte-level IMDb sentiment, from your own copy.

Tay et al., ICLR 2021 (arXiv:2011.04006), section 3.2: the IMDb reviews of Maas et al.
(2011), read as UTF-8 bytes (LRA's ``ByteTextEncoder``: one token per byte, no vocabulary to
learn), truncated to ``length`` bytes (LRA: 4,000) and classified positive or negative.

Data: Stanford's release (``aclImdb_v1.tar.gz``) unpacked, ``task.params.data_dir`` naming
its ``aclImdb`` folder (default: ``data/lra/aclImdb`` in the project's folder). Reading
needs nothing else; a missing folder is a clear error saying what to download.

Splits (as LRA, which has no IMDb validation set): train is the 25,000 training reviews, and
validation and test are both the 25,000 test reviews, so validation accuracy *is* test
accuracy (a model selected on it is selected on the test set; LRA's protocol, stated, not
fixed). ``num_train`` and ``num_val`` take the first reviews of each set after one fixed
shuffle (the same for every seed, so seeds differ only in the model's initialisation and
the batch order).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Annotated, Any

from harness.plugin import Example, Ge, IntRange, Task, TaskConfig, TaskSpec, Vocab, hookimpl
from harness_plugins.tasks.lra import readers

SHUFFLE_SEED = 0  # the fixed order of the reviews, independent of the task seed


@dataclass
class LraTextConfig(TaskConfig):
    length: Annotated[int, Ge(1), IntRange(256, 4096, log=True)] = 4000  # bytes kept per review
    num_train: Annotated[int, Ge(1)] = 25_000
    num_val: Annotated[int, Ge(1)] = 25_000
    data_dir: str = ""  # the aclImdb folder; empty: data/lra/aclImdb in the project's folder


class LraTextTask(Task):
    """LRA Text: IMDb sentiment from the review's bytes (your copy of aclImdb)."""

    task_kind = "classification"
    config: LraTextConfig

    def __init__(self, config: LraTextConfig, *, seed: int) -> None:
        super().__init__(config, seed=seed, vocab=Vocab(readers.byte_symbols()), num_classes=2)
        self.root = readers.folder(config.data_dir, "text")
        for split in ("train", "test"):
            for name in ("neg", "pos"):
                if not (self.root / split / name).is_dir():
                    raise readers.missing("lra_text", "text", self.root / split / name,
                                            "IMDb reviews (one .txt file per review)")

    def generate(self, split: str, length: int) -> list[Example]:
        reviews = readers.read_imdb(self.root, "train" if split == "train" else "test")
        random.Random(SHUFFLE_SEED).shuffle(reviews)
        first = self.vocab.first_symbol
        return [{"tokens": [first + b for b in text[:length]], "label": label}
                for text, label in reviews[: self.split_size(split)] if text]


@hookimpl
def harness_register_task(register: Any) -> None:
    register(TaskSpec(name="lra_text", build=LraTextTask, exempt={"seeds_differ": readers.SAME_DATA}))
