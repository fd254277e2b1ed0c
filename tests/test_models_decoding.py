"""Decoding (greedy, beam search, edit distance) and scheduled sampling.

Beam search is checked against exhaustive search: with a beam as wide as the number of
possible outputs it must return the sequence a brute-force scoring of every output (by
the model's own teacher-forced log-probabilities) ranks first.
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch

import harness
from harness.data.formats import FORMATS, as_lm, collate
from harness.data.vocab import BOS, EOS, PAD, SEP
from harness.nn.decoding import beam_search, edit_distance, greedy
from harness.run.system import scheduled_sampling

VOCAB = 6  # four specials and two symbols: small enough to enumerate every output
MAX_LEN = 3


def model_for(registry, name: str, fmt: str):
    torch.manual_seed(3)
    params = {
        "encoder_decoder": {"d_model": 16, "heads": 2, "encoder_layers": 1, "decoder_layers": 1},
        "rnn_seq2seq": {"embed_dim": 8, "hidden": 16},
        "transformer": {"d_model": 16, "heads": 2, "layers": 1},
        "lstm": {"width": 16, "layers": 1},
    }[name]
    attention = "multi_head" if name == "rnn_seq2seq" else None
    model = harness.create_model(name, vocab_size=VOCAB, max_length=8, batch_format=fmt,
                                 attention=attention, registry=registry, **params).double()
    with torch.no_grad():  # sharpen the untrained distributions so decoders disagree
        for p in model.parameters():
            p.mul_(3.0)
    return model.eval()


def sequence_score(model, src: list[int], out: tuple[int, ...], fmt: str) -> float:
    """log p(out | src) by teacher forcing."""
    with torch.no_grad():
        if fmt == "seq2seq":
            logits = model(torch.tensor([src]), torch.tensor([[BOS, *out[:-1]]]))[0]
        else:
            prompt = [*src, SEP]
            logits = model(torch.tensor([prompt + list(out[:-1])]))[0, len(prompt) - 1:]
    logp = logits.log_softmax(-1)
    return float(sum(logp[i, t] for i, t in enumerate(out)))


def all_outputs(max_len: int) -> list[tuple[int, ...]]:
    """Every output a decoder can produce: ends at its first EOS or at max_len."""
    out = []
    for n in range(1, max_len + 1):
        for body in itertools.product([t for t in range(VOCAB) if t != EOS], repeat=n - 1):
            out.append((*body, EOS))
            if n == max_len:
                out.extend((*body, t) for t in range(VOCAB) if t != EOS)
    return out


def strip_eos(seq: tuple[int, ...]) -> list[int]:
    return list(seq[:-1]) if seq and seq[-1] == EOS else list(seq)


CASES = [("encoder_decoder", "seq2seq"), ("rnn_seq2seq", "seq2seq"),
         ("transformer", "lm"), ("lstm", "lm")]


@pytest.mark.parametrize(("name", "fmt"), CASES)
@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_exhaustive_beam_equals_brute_force_search(registry, name, fmt, length_penalty):
    model = model_for(registry, name, fmt)
    candidates = all_outputs(MAX_LEN)
    rng = random.Random(0)
    examples = [{"src": [rng.choice([4, 5]) for _ in range(4)], "tgt": [4] * MAX_LEN} for _ in range(3)]
    decoded = beam_search(model, examples, fmt, beam_size=len(candidates), max_len=MAX_LEN,
                          length_penalty=length_penalty)
    for example, got in zip(examples, decoded, strict=True):
        def rank(out, src=example["src"]):
            return sequence_score(model, src, out, fmt) / ((5 + len(out)) / 6) ** length_penalty

        best = max(candidates, key=rank)
        assert got == strip_eos(best)


class PrefixTable(torch.nn.Module):
    """A seq2seq "model" whose next-token distribution is a fixed random function of
    (source, output prefix): a case where greedy decoding is often not optimal."""

    def __init__(self) -> None:
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(()))  # decoders look up the device here

    def forward(self, src, tgt_in, src_padding_mask=None, tgt_padding_mask=None):
        rows = []
        for s, t in zip(src.tolist(), tgt_in.tolist(), strict=True):
            seeds = [hash((tuple(s), tuple(t[: i + 1]))) % 2**31 for i in range(len(t))]
            rows.append(torch.stack([
                torch.randn(VOCAB, generator=torch.Generator().manual_seed(k), dtype=torch.float64)
                for k in seeds
            ]))
        return torch.stack(rows) + self.anchor

    def greedy_decode(self, src, src_padding_mask, max_len):
        out = torch.full((src.shape[0], 0), PAD, dtype=torch.long)
        for _ in range(max_len):
            tgt_in = torch.cat([torch.full((src.shape[0], 1), BOS), out], dim=1)
            out = torch.cat([out, self(src, tgt_in)[:, -1:].argmax(-1)], dim=1)
        return out


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_exhaustive_beam_finds_what_greedy_misses(length_penalty):
    model = PrefixTable()
    candidates = all_outputs(MAX_LEN)
    examples = [{"src": [4 + i % 2, 5, i], "tgt": [4] * MAX_LEN} for i in range(12)]
    decoded = beam_search(model, examples, "seq2seq", beam_size=len(candidates),
                          length_penalty=length_penalty)
    for example, got in zip(examples, decoded, strict=True):
        def rank(out, src=example["src"]):
            return sequence_score(model, src, out, "seq2seq") / ((5 + len(out)) / 6) ** length_penalty

        assert got == strip_eos(max(candidates, key=rank))
    misses = sum(g != b for g, b in zip(greedy(model, examples, "seq2seq"), decoded, strict=True))
    assert misses >= 3, "the table should make greedy decoding miss the best output"


@pytest.mark.parametrize(("name", "fmt"), CASES)
def test_beam_of_one_is_greedy(registry, name, fmt):
    model = model_for(registry, name, fmt)
    rng = random.Random(1)
    examples = [{"src": [rng.choice([4, 5]) for _ in range(rng.randint(2, 5))], "tgt": [4] * 5}
                for _ in range(4)]
    assert beam_search(model, examples, fmt, beam_size=1) == greedy(model, examples, fmt)


def test_wider_beams_never_score_worse_than_greedy_on_small_outputs(registry):
    model = model_for(registry, "rnn_seq2seq", "seq2seq")
    examples = [{"src": [4, 5, 5, 4], "tgt": [4] * MAX_LEN}, {"src": [5, 5], "tgt": [4] * MAX_LEN}]
    narrow = greedy(model, examples, "seq2seq")
    wide = beam_search(model, examples, "seq2seq", beam_size=len(all_outputs(MAX_LEN)))
    for ex, g, w in zip(examples, narrow, wide, strict=True):
        def score(out, src=ex["src"]):
            full = tuple(out) + ((EOS,) if len(out) < MAX_LEN else ())
            return sequence_score(model, src, full, "seq2seq")

        assert score(w) >= score(g) - 1e-12


@pytest.mark.parametrize("name", ["transformer", "lstm"])
def test_lm_greedy_with_cache_equals_greedy_without(registry, name):
    model = model_for(registry, name, "lm")

    class NoCache(torch.nn.Module):  # the same model, seen without its incremental protocol
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, tokens, padding_mask=None):
            return self.inner(tokens, padding_mask)

    examples = [{"src": [4, 5, 4], "tgt": [4] * 6}, {"src": [5], "tgt": [4] * 6}]
    assert greedy(model, examples, "lm") == greedy(NoCache(model), examples, "lm")


def test_edit_distance_matches_a_recursive_definition():
    def reference(a, b):
        if not a or not b:
            return len(a) + len(b)
        return min(reference(a[1:], b) + 1, reference(a, b[1:]) + 1,
                   reference(a[1:], b[1:]) + (a[0] != b[0]))

    rng = random.Random(5)
    for _ in range(40):
        a = [rng.randrange(3) for _ in range(rng.randint(0, 5))]
        b = [rng.randrange(3) for _ in range(rng.randint(0, 5))]
        assert edit_distance(a, b) == reference(a, b)


# -- scheduled sampling ----------------------------------------------------------------
def reverse_batch(fmt: str, count: int = 4, seed: int = 0) -> dict:
    rng = random.Random(seed)
    examples = []
    for _ in range(count):
        src = [4 + rng.randrange(6) for _ in range(rng.randint(2, 6))]
        examples.append({"src": src, "tgt": src[::-1]})
    return collate(examples, fmt, "seq2seq")


@pytest.mark.parametrize("fmt", ["seq2seq", "lm"])
def test_scheduled_sampling_replaces_only_gold_target_inputs(fmt):
    torch.manual_seed(0)
    batch = reverse_batch(fmt)
    key, padding = ("tgt_in", "tgt_padding_mask") if fmt == "seq2seq" else ("tokens", "padding_mask")
    inputs = batch[key]
    logits = torch.randn(*inputs.shape, 10)
    predictions = logits.argmax(-1)

    assert torch.equal(scheduled_sampling(batch, logits, FORMATS[fmt], 0.0)[key], inputs)
    mixed = scheduled_sampling(batch, logits, FORMATS[fmt], 1.0)
    for b in range(inputs.shape[0]):
        for t in range(inputs.shape[1]):
            # input t is the gold target t - 1 where that target is scored and t is no pad
            gold_target = t > 0 and bool(batch["loss_mask"][b, t - 1]) and not batch[padding][b, t]
            want = predictions[b, t - 1] if gold_target else inputs[b, t]
            assert mixed[key][b, t] == want
    assert torch.equal(mixed["targets"], batch["targets"])
    assert torch.equal(batch[key], inputs), "the input batch was modified in place"
    if fmt == "lm":  # the source and SEP stay gold: only the target side is replaced
        for b, example in enumerate(mixed["examples"]):
            n = len(as_lm(example)["tokens"]) - len(example["tgt"])
            assert torch.equal(mixed[key][b, :n], inputs[b, :n])
    else:
        assert torch.all(mixed[key][:, 0] == BOS)
        assert torch.all(mixed[key][batch["tgt_padding_mask"]] == PAD)


def test_scheduled_sampling_rate_is_the_configured_probability():
    torch.manual_seed(1)
    batch = reverse_batch("seq2seq", count=400, seed=1)
    logits = torch.randn(*batch["tgt_in"].shape, 12)
    logits[..., :4] = -1e9  # predictions never equal a special token
    eligible = batch["loss_mask"][:, :-1] & ~batch["tgt_padding_mask"][:, 1:]
    replaced = scheduled_sampling(batch, logits, FORMATS["seq2seq"], 0.3)["tgt_in"][:, 1:] != batch["tgt_in"][:, 1:]
    predicted_same = logits[:, :-1].argmax(-1) == batch["tgt_in"][:, 1:]
    rate = (replaced & eligible).sum() / (eligible & ~predicted_same).sum()
    assert abs(float(rate) - 0.3) < 0.03
    assert not (replaced & ~eligible).any()
