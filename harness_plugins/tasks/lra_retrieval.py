"""``lra_retrieval``: Long Range Arena's Retrieval task, byte-level ACL Anthology Network
citation pairs, from your own copy of LRA's release.

Tay et al., ICLR 2021 (arXiv:2011.04006), section 3.3: do two papers cite each other (in the
AAN corpus of Radev et al., 2013)? Each document is read as bytes (LRA's
``ByteTextEncoder``), truncated to ``length`` bytes (LRA: 4,000 per document), and the
model compares the two. An example is ``doc1 SEP doc2`` with its label (0 or 1); the task
asks for a two-tower model (``TaskInfo.extra["two_tower"]``), which the ``transformer``
model builds: one encoder reads each document alone, and the classifier sees
``[u, v, u * v, u - v]`` of the two pooled vectors (LRA's dual encoder). A model without
two towers reads the concatenation as one sequence (not LRA's protocol; say
``model.params.two_tower: false`` to mean it).

Data: LRA's release (``lra_release.gz``) unpacked; ``task.params.data_dir`` names its
``lra_release/tsv_data`` folder (default: ``data/lra/lra_release/tsv_data`` in the project's
folder), which holds ``new_aan_pairs.train.tsv``, ``.eval.tsv`` and ``.test.tsv`` (lines of
``label id1 id2 text1 text2``, tab-separated). Splits: train, eval (validation) and test as
released; ``num_train`` / ``num_val`` take the first pairs of each file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from harness.plugin import SEP, Example, Ge, IntRange, Task, TaskConfig, TaskSpec, Vocab, hookimpl
from harness_plugins.tasks.lra import readers


@dataclass
class LraRetrievalConfig(TaskConfig):
    length: Annotated[int, Ge(1), IntRange(256, 4096, log=True)] = 4000  # bytes kept per document
    num_train: Annotated[int, Ge(1)] = 147_086  # the released train file's pairs (all of them)
    num_val: Annotated[int, Ge(1)] = 18_090  # the released eval file's pairs (all of them)
    data_dir: str = ""  # lra_release/tsv_data; empty: data/lra/lra_release/tsv_data in the project's folder


class LraRetrievalTask(Task):
    """LRA Retrieval: do two AAN papers cite each other? (bytes, two towers; your copy)"""

    task_kind = "classification"
    model_hints: ClassVar[dict[str, Any]] = {"two_tower": True}
    config: LraRetrievalConfig

    def __init__(self, config: LraRetrievalConfig, *, seed: int) -> None:
        super().__init__(config, seed=seed, vocab=Vocab(readers.byte_symbols()), num_classes=2)
        self.root = readers.folder(config.data_dir, "retrieval")
        for name in readers.AAN_FILES.values():
            readers.require_file("lra_retrieval", "retrieval", self.root / name, "LRA's AAN document pairs")

    def generate(self, split: str, length: int) -> list[Example]:
        pairs = readers.read_aan(self.root / readers.AAN_FILES[split])
        first = self.vocab.first_symbol
        return [{"tokens": [first + b for b in one[:length]] + [SEP] + [first + b for b in two[:length]],
                 "label": label}
                for label, one, two in pairs[: self.split_size(split)] if one and two]


@hookimpl
def harness_register_task(register: Any) -> None:
    register(TaskSpec(name="lra_retrieval", build=LraRetrievalTask, exempt={"seeds_differ": readers.SAME_DATA}))
