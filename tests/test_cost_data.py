"""Training batches sliced from the split collated once on the device are exactly the batches a
per-batch collate of the same examples gives, in every batch format; every epoch visits every
example once, and several processes share an epoch evenly."""

from __future__ import annotations

import random

import pytest
import torch

from harness.data.formats import CLASSIFICATION, LM, SEQ2SEQ, TAGGING
from harness.run.batches import DeviceBatches, row_widths


def _seq(rng: random.Random, low: int, high: int) -> list[int]:
    return [rng.randrange(4, 12) for _ in range(rng.randint(low, high))]


def examples(kind: str, n: int = 40, seed: int = 0) -> list[dict]:
    """Examples of varied lengths (so batches are padded to different widths)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        if kind == "lm":
            tokens = _seq(rng, 3, 12)
            mask = [rng.random() < 0.7 for _ in tokens[1:]] if rng.random() < 0.5 else None
            out.append({"tokens": tokens, **({"loss_mask": mask} if mask else {})})
        elif kind == "seq2seq":
            out.append({"src": _seq(rng, 1, 9), "tgt": _seq(rng, 1, 7)})
        elif kind == "classification":
            out.append({"tokens": _seq(rng, 1, 10), "label": rng.randrange(3)})
        else:
            tokens = _seq(rng, 1, 10)
            out.append({"tokens": tokens, "tags": [rng.randrange(1, 5) for _ in tokens]})
    return out


CASES = [(LM, "lm"), (SEQ2SEQ, "seq2seq"), (LM, "seq2seq"), (CLASSIFICATION, "classification"),
         (TAGGING, "tagging")]


@pytest.mark.parametrize(("fmt", "kind"), CASES, ids=lambda c: str(c))
def test_a_sliced_batch_equals_the_collate_of_its_examples(fmt, kind):
    data = examples(kind)
    batches = DeviceBatches(data, fmt, kind, batch_size=6, seed=1, device=torch.device("cpu"))
    rng = random.Random(2)
    for _ in range(20):
        rows = rng.sample(range(len(data)), rng.randint(1, 8))
        got = batches.batch(torch.tensor(rows))
        want = fmt.collate([data[i] for i in rows], kind)
        want.pop("examples")
        assert set(got) == set(want)
        for key in want:
            assert got[key].dtype == want[key].dtype, key
            assert torch.equal(got[key], want[key]), key


def test_row_widths_end_at_the_last_real_position_even_after_an_inner_pad():
    padding = torch.tensor([[False, True, False, True], [True, True, True, True], [False] * 4])
    assert row_widths(padding).tolist() == [3, 0, 4]


def test_every_epoch_visits_each_example_once_in_a_new_order():
    data = examples("lm", n=23)
    batches = DeviceBatches(data, LM, "lm", batch_size=5, seed=0, device=torch.device("cpu"))
    assert len(batches) == 5
    first, second = (torch.cat(batches.epoch()).tolist() for _ in range(2))
    assert sorted(first) == sorted(second) == list(range(23))
    assert first != second
    assert [b["tokens"].shape[0] for b in batches] == [5, 5, 5, 5, 3]


def test_processes_share_each_epoch_evenly_and_together_cover_it():
    data = examples("tagging", n=21)
    shares = [DeviceBatches(data, TAGGING, "tagging", batch_size=4, seed=7,
                            device=torch.device("cpu"), rank=r, world=2) for r in range(2)]
    assert len(shares[0]) == len(shares[1]) == 3  # 11 rows each (one wraps around)
    rows = [torch.cat(share.epoch()).tolist() for share in shares]
    assert len(rows[0]) == len(rows[1]) == 11
    assert set(rows[0]) | set(rows[1]) == set(range(21))
    assert len(set(rows[0]) & set(rows[1])) == 1  # the one wrapped row
