"""Every model overfits a tiny batch of every task kind it supports.

A model that cannot drive the loss on eight examples to near zero has a wiring bug (a
detached branch, a mask that hides the answer, a head reading the wrong position). The
batches go through the real batch-format path (collate, call); the loop is plain torch.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

import harness
from harness.data.formats import FORMATS, collate
from harness.data.vocab import Vocab

NUM_SYMBOLS = 8
VOCAB = Vocab(tuple(f"s{i}" for i in range(NUM_SYMBOLS)))
LENGTH = 6

SMALL = {
    "transformer": {"d_model": 32, "layers": 2, "heads": 2, "ffn_mult": 2},
    "lstm": {"width": 64, "layers": 1},
    "gru": {"width": 64, "layers": 1},
    "mlp_mixer": {"d_model": 32, "layers": 2, "ffn_mult": 2},
    "encoder_decoder": {"d_model": 32, "encoder_layers": 1, "decoder_layers": 1, "heads": 2,
                        "ffn_mult": 2},
    "rnn_seq2seq": {"embed_dim": 32, "hidden": 64},
}
#: (model, task kind, attention, extra params); "seq2seq" on an lm model is src SEP tgt.
CASES = [
    *[(m, kind, None, {}) for m in ("transformer", "lstm", "gru", "mlp_mixer")
      for kind in ("lm", "seq2seq", "classification")],
    ("transformer", "tagging", None, {}),
    ("encoder_decoder", "seq2seq", None, {"norm": "pre"}),
    ("encoder_decoder", "seq2seq", None, {"norm": "post"}),
    ("rnn_seq2seq", "seq2seq", "multi_head", {"style": "bahdanau"}),
    ("rnn_seq2seq", "seq2seq", "multi_head", {"style": "luong", "cell": "lstm"}),
    ("rnn_seq2seq", "seq2seq", None, {}),
]


def test_cases_cover_every_model_and_kind(registry):
    covered = {(m, k) for m, k, _, _ in CASES}
    for spec in registry.specs("model"):
        kinds = set(spec.task_kinds) | ({"seq2seq"} if "lm" in spec.task_kinds else set())
        for kind in kinds:
            assert (spec.name, kind) in covered, f"no overfit test for {spec.name} on {kind}"


def tiny_examples(kind: str, rng: random.Random) -> list[dict]:
    first = VOCAB.first_symbol
    if kind == "seq2seq":  # reverse
        srcs = [[first + rng.randrange(NUM_SYMBOLS) for _ in range(LENGTH)] for _ in range(8)]
        return [{"src": s, "tgt": s[::-1]} for s in srcs]
    # distinct first tokens make every later token a function of the sequence seen so far
    seqs = [[first + i] + [first + rng.randrange(NUM_SYMBOLS) for _ in range(LENGTH)] for i in range(8)]
    if kind == "classification":
        return [{"tokens": s, "label": rng.randrange(3)} for s in seqs]
    if kind == "tagging":  # arbitrary labels per token: memorised
        return [{"tokens": s, "tags": [rng.randrange(3) for _ in s]} for s in seqs]
    return [{"tokens": s} for s in seqs]


def batch_format(model_kinds: frozenset[str], kind: str) -> str:
    return kind if kind in model_kinds else "lm"


@pytest.mark.parametrize(("name", "kind", "attention", "extra"), CASES,
                         ids=[f"{m}-{k}-{a or 'noattn'}-{'-'.join(map(str, e.values()))}"
                              for m, k, a, e in CASES])
def test_overfits_tiny_batch(registry, name, kind, attention, extra):
    torch.manual_seed(0)
    spec = registry.get("model", name)
    fmt = batch_format(spec.task_kinds, kind)
    examples = tiny_examples(kind, random.Random(1))
    batch = collate(examples, fmt, kind)
    model = harness.create_model(
        name, vocab_size=VOCAB.size, max_length=batch["tokens" if fmt != "seq2seq" else "src"].shape[1],
        batch_format=fmt, num_classes=3 if kind in ("classification", "tagging") else None, attention=attention,
        registry=registry, **{**SMALL[name], **extra},
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    mask, targets = batch["loss_mask"], batch["targets"]
    for _ in range(300):
        logits = FORMATS[fmt].call(model, batch)
        loss = F.cross_entropy(logits[mask], targets[mask])
        acc = (logits.argmax(-1)[mask] == targets[mask]).float().mean().item()
        if acc == 1.0 and loss.item() < 0.05:
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert acc == 1.0 and loss.item() < 0.05, f"{name} on {kind}: loss {loss.item():.3f}, acc {acc:.3f}"
