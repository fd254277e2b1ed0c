"""``lra_image``: Long Range Arena's Image task, CIFAR-10 as 1,024 grey pixels, from your own
copy of CIFAR-10's binary release.

Tay et al., ICLR 2021 (arXiv:2011.04006), section 3.4: each 32x32 colour image becomes one
grey level per pixel (``tf.image.rgb_to_grayscale``: luma 0.2989 R + 0.5870 G + 0.1140 B,
here rounded to a byte), flattened row by row into 1,024 tokens of 256 values, and is
classified into CIFAR-10's 10 classes.

Data: the *binary* release (``cifar-10-binary.tar.gz``) unpacked; ``task.params.data_dir``
names its ``cifar-10-batches-bin`` folder (default: ``data/lra/cifar-10-batches-bin`` in the
project's folder). Nothing is unpickled: the python release is not read. Splits as LRA:
train the first 45,000 training images (``data_batch_1`` .. ``data_batch_5`` in order: LRA's
``train[:90%]``, though tfds may order the images differently), validation the last 5,000,
test the 10,000 of ``test_batch.bin``; ``num_train`` / ``num_val`` take the first of each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from harness.plugin import Choice, Example, Ge, Task, TaskConfig, TaskSpec, Vocab, hookimpl
from harness_plugins.tasks.lra import readers

TRAIN_IMAGES = 45_000  # of CIFAR-10's 50,000; the rest is validation


@dataclass
class LraImageConfig(TaskConfig):
    length: Annotated[int, Ge(1024), Choice((1024,))] = 1024  # pixels: 32 x 32
    num_train: Annotated[int, Ge(1)] = TRAIN_IMAGES
    num_val: Annotated[int, Ge(1)] = 5_000  # validation images (test: up to 10,000)
    data_dir: str = ""  # cifar-10-batches-bin; empty: data/lra/cifar-10-batches-bin in the project's folder

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.length != 1024 or self.eval_lengths not in ((), (1024,)):
            raise ValueError("lra_image has one length, 1024 (32x32 pixels); drop length and eval_lengths.")


class LraImageTask(Task):
    """LRA Image: CIFAR-10 as a sequence of 1,024 grey pixels (your copy, binary release)."""

    task_kind = "classification"
    config: LraImageConfig

    def __init__(self, config: LraImageConfig, *, seed: int) -> None:
        super().__init__(config, seed=seed, vocab=Vocab(tuple(f"g{i}" for i in range(256))), num_classes=10)
        self.root = readers.folder(config.data_dir, "image")
        for name in (*readers.CIFAR_TRAIN_FILES, readers.CIFAR_TEST_FILE):
            readers.require_file("lra_image", "image", self.root / name, "CIFAR-10 (binary version)",
                                 record=readers.CIFAR_RECORD)

    def generate(self, split: str, length: int) -> list[Example]:
        if split == "test":
            images = readers.read_cifar(self.root / readers.CIFAR_TEST_FILE)
        else:
            images = [r for name in readers.CIFAR_TRAIN_FILES for r in readers.read_cifar(self.root / name)]
            cut = min(TRAIN_IMAGES, len(images) * 9 // 10)  # LRA's 90%; smaller files keep the ratio
            images = images[:cut] if split == "train" else images[cut:]
        first = self.vocab.first_symbol
        return [{"tokens": [first + p for p in pixels], "label": label}
                for label, pixels in images[: self.split_size(split)]]


@hookimpl
def harness_register_task(register: Any) -> None:
    register(TaskSpec(name="lra_image", build=LraImageTask, exempt={"seeds_differ": readers.SAME_DATA}))
