"""Tagging: targets aligned with the inputs, trained by the encoder transformer.

The probe task labels each token 1 if the same symbol occurs again *later* in the sequence.
A bidirectional encoder can learn it exactly; a causal tagger cannot see the future, so its
accuracy is bounded by the Bayes rate computed here in closed form. The pair shows the
format really scores aligned per-token labels and that ``causal`` means what it says.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass
from typing import Any

import pytest
import torch

import harness
from harness.data.formats import collate
from harness.data.tasks import Task, TaskConfig
from harness.data.vocab import PAD, Vocab
from harness.registry import loader

SYMBOLS, LENGTH = 6, 8


@dataclass
class RepeatsLaterConfig(TaskConfig):
    length: int = LENGTH
    num_train: int = 2000
    num_val: int = 300


class RepeatsLater(Task):
    task_kind = "tagging"

    def __init__(self, config: RepeatsLaterConfig, *, seed: int) -> None:
        super().__init__(config, seed=seed, vocab=Vocab(tuple("abcdef")), num_classes=2)

    def generate(self, split: str, length: int) -> list[dict[str, Any]]:
        rng = random.Random(self.split_seed(split, length))
        out = []
        for _ in range(self.split_size(split)):
            toks = [self.vocab.first_symbol + rng.randrange(SYMBOLS) for _ in range(length)]
            out.append({"tokens": toks, "tags": [int(t in toks[i + 1:]) for i, t in enumerate(toks)]})
        return out


class Plugin:
    @harness.hookimpl
    def harness_register_task(self, register: Any) -> None:
        register(harness.TaskSpec(name="repeats_later", task_kind="tagging", config=RepeatsLaterConfig,
                                  build=lambda cfg, seed: RepeatsLater(cfg, seed=seed)))


def bayes_rate_without_future(length: int, symbols: int) -> float:
    """Best accuracy of a tagger that sees only positions <= i: it can only guess the prior
    P(symbol recurs among the remaining length-1-i positions) = 1 - (1 - 1/symbols)^(rest)."""
    total = 0.0
    for i in range(length):
        p = 1 - (1 - 1 / symbols) ** (length - 1 - i)
        total += max(p, 1 - p)
    return total / length


def test_collate_aligns_tags_with_tokens():
    examples = [{"tokens": [4, 5, 4], "tags": [1, 0, 0]}, {"tokens": [6, 7], "tags": [0, 0]}]
    batch = collate(examples, "tagging", "tagging")
    assert batch["tokens"].tolist() == [[4, 5, 4], [6, 7, PAD]]
    assert batch["targets"].tolist() == [[1, 0, 0], [0, 0, 0]]
    assert batch["loss_mask"].tolist() == [[True, True, True], [True, True, False]]
    assert batch["padding_mask"].tolist() == [[False, False, False], [False, False, True]]


def test_tagging_model_outputs_one_label_distribution_per_token(registry):
    model = harness.create_model("transformer", vocab_size=10, max_length=8, batch_format="tagging",
                                 num_classes=3, registry=registry, d_model=32, heads=2, layers=1)
    assert model(torch.randint(4, 10, (2, 8))).shape == (2, 8, 3)


CONFIG: dict[str, Any] = {
    "task": {"name": "repeats_later"},
    "model": {"name": "transformer", "params": {"d_model": 64, "layers": 2, "heads": 4},
              "position": {"name": "learned"}},
    "train": {"max_steps": 400, "batch_size": 64, "lr": 3e-3, "warmup_steps": 20, "val_every": 200,
              "progress": False, "log_attention": False},
}


@pytest.mark.slow
def test_bidirectional_tagger_learns_what_a_causal_one_cannot():
    reg = loader.load(plugins=[Plugin()])
    bidirectional = harness.train(copy.deepcopy(CONFIG), registry=reg)
    causal_cfg = copy.deepcopy(CONFIG)
    causal_cfg["model"]["params"]["causal"] = True
    causal = harness.train(causal_cfg, registry=reg)
    ceiling = bayes_rate_without_future(LENGTH, SYMBOLS)
    assert bidirectional.metrics["val/acc"] >= 0.97
    assert causal.metrics["val/acc"] <= ceiling + 0.03  # finite-sample slack on 2,400 tags
    assert bidirectional.metrics["val/acc"] > ceiling + 0.1
