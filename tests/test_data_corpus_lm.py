"""``corpus_lm`` on prepared corpora made here: streamed training windows (no training split is
built), evaluation windows fixed by the seed, bits per byte against an independent float64
computation, errors for windows longer than a split, and a real ``harness.train`` run."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
import torch
from scipy.special import logsumexp

import harness
from harness.data.corpus import open_corpus, window_starts
from harness.data.formats import LM
from harness.data.prepare import prepare
from harness.errors import ConfigError
from harness.run.system import masked_stats, summarize

WORDS = ["alpha", "beta", "gamma", "épsilon", "zeta", "中文", "ωμέγα"]


def corpus(tmp_path, docs=400, tokenizer="chars", name="out", short=False):
    rng = random.Random(0)
    lines = ["ab" if short else " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 30))) + f" {i}"
             for i in range(docs)]
    if short:  # distinct short documents (identical ones would all hash to one split)
        lines = [f"{i}" for i in range(docs)]
    src = tmp_path / f"{name}.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in lines))
    prepare([src], tmp_path / name, tokenizer=tokenizer, workers=1, progress=False)
    return tmp_path / name


def task(registry, path, seed=0, **params):
    return harness.create_task("corpus_lm", seed=seed, registry=registry, path=str(path), **params)


def test_training_windows_stream_from_the_train_split_fresh_every_step(tmp_path, registry):
    t = task(registry, corpus(tmp_path), length=16, eval_tokens=64)
    assert t.streams
    train = open_corpus(tmp_path / "out").split("train")
    stream = t.train_batches(16, 4, seed=3)
    first, second = next(stream), next(stream)
    assert first.shape == second.shape == (4, 17) and first.dtype == np.int64
    expected = window_starts(train.tokens, 16, 4, seed=(0, 3), step=0)
    assert (first == np.stack([train.read(int(s), 17) for s in expected])).all()
    assert not (first == second).all(), "every step draws new windows"
    again = t.train_batches(16, 4, seed=3)
    assert (next(again) == first).all(), "the same seeds give the same stream"
    other = task(registry, tmp_path / "out", seed=1, length=16, eval_tokens=64)
    assert not (next(other.train_batches(16, 4, seed=3)) == first).all(), "the task seed changes the data"


def test_ranks_of_a_run_draw_disjoint_windows(tmp_path, registry):
    t = task(registry, corpus(tmp_path), length=16, eval_tokens=64)
    streams = [t.train_batches(16, 4, seed=0, rank=r, world=3) for r in range(3)]
    for _ in range(5):
        rows = [tuple(row) for s in streams for row in next(s)]
        assert len(rows) == 12 and len(set(rows)) == 12


def test_evaluation_scores_the_same_text_at_every_length_and_for_every_candidate(tmp_path, registry):
    path = corpus(tmp_path)
    a = task(registry, path, length=16, eval_lengths=[32, 48], eval_tokens=96)
    b = task(registry, path, length=16, eval_lengths=[32, 48], eval_tokens=96)
    sliding = task(registry, path, length=16, eval_lengths=[32, 48], eval_tokens=96,
                   eval_protocol="sliding", score_last=8)

    def scored(t, split, n):
        return [tok for e in t.examples(split, n) for tok, m in
                zip(e["tokens"][1:], e.get("loss_mask") or [True] * n, strict=True) if m]

    for split in ("val", "test"):
        assert a.examples(split, 16) == b.examples(split, 16), "fixed by the seed: identical for every candidate"
        texts = [scored(a, split, n) for n in (16, 32, 48)] + [scored(sliding, split, n) for n in (16, 32, 48)]
        assert all(t == texts[0] for t in texts) and len(texts[0]) == 96
        data = open_corpus(path).split(split)
        start = a.eval_start(split)
        assert texts[0] == data.read(start + 1, 96).tolist()
    for e in sliding.examples("val", 48):
        assert len(e["tokens"]) == 49 and sum(e["loss_mask"]) == 8


def test_documents_shorter_than_a_window_are_packed_not_refused(tmp_path, registry):
    t = task(registry, corpus(tmp_path, docs=600, short=True), length=32, eval_tokens=32)
    window = next(t.train_batches(32, 2, seed=0))[0]
    assert (window == t.corpus.eod_id).sum() >= 5, "a window spans several short documents"


@pytest.mark.parametrize(("params", "expected"), [
    ({"length": 50_000, "eval_tokens": 50_000}, "longer than the train split"),
    ({"length": 16, "eval_tokens": 100_000}, "longer than the val split"),
])
def test_windows_longer_than_a_split_are_config_errors(tmp_path, registry, params, expected):
    path = corpus(tmp_path, docs=100)
    with pytest.raises(ConfigError, match=expected):
        task(registry, path, **params)


def test_an_unprepared_path_names_the_prepare_command(tmp_path, registry):
    (tmp_path / "raw").mkdir()
    with pytest.raises(ConfigError, match="harness data prepare"):
        task(registry, tmp_path / "raw")


def test_a_source_is_prepared_on_first_use_and_reused(tmp_path, registry):
    src = tmp_path / "mine.txt"
    src.write_text("\n\n".join(f"paragraph {i} " + "text " * 20 for i in range(300)))
    t = harness.create_task("corpus_lm", registry=registry, source=str(src), tokenizer="bpe:300",
                            path=str(tmp_path / "mine"), length=16, eval_tokens=64)
    assert t.corpus.manifest["tokenizer"]["name"] == "bpe:300"
    stamp = (tmp_path / "mine" / "manifest.json").stat().st_mtime_ns
    harness.create_task("corpus_lm", registry=registry, source=str(src), tokenizer="bpe:300",
                        path=str(tmp_path / "mine"), length=16, eval_tokens=64)
    assert (tmp_path / "mine" / "manifest.json").stat().st_mtime_ns == stamp


def test_bits_per_byte_match_an_independent_float64_computation(tmp_path, registry):
    t = task(registry, corpus(tmp_path, tokenizer="chars"), length=16, eval_tokens=160)
    tok = t.corpus.tokenizer
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(t.vocab.size, 8), torch.nn.Linear(8, t.vocab.size))
    examples = t.examples("val", 16)
    table = torch.as_tensor(t.token_bytes, dtype=torch.float64)
    sums: dict[str, float] = {}
    for i in range(0, len(examples), 4):  # batches, as validation sums them
        batch = LM.collate(examples[i: i + 4], "lm")
        with torch.no_grad():
            stats = masked_stats(model(batch["tokens"]), batch, token_bytes=table)
        for key in ("nll_sum", "tokens", "correct", "exact", "sequences", "bytes"):
            sums[key] = sums.get(key, 0.0) + float(stats[key])
    got = summarize(sums, perplexity=True)["bpb"]
    # independently: float64 log-softmax of the same weights, bytes of the decoded scored text
    emb = model[0].weight.detach().double().numpy()
    w, b = model[1].weight.detach().double().numpy(), model[1].bias.detach().double().numpy()
    nats, targets = 0.0, []
    for e in examples:
        tokens = np.array(e["tokens"])
        logits = emb[tokens[:-1]] @ w.T + b
        nats -= float((logits[np.arange(16), tokens[1:]] - logsumexp(logits, axis=1)).sum())
        targets += tokens[1:].tolist()
    text_bytes = len(tok.decode(targets).encode("utf-8"))
    assert text_bytes > len(targets), "the text has multi-byte characters"
    assert got == pytest.approx(nats / math.log(2) / text_bytes, rel=1e-5)


@pytest.mark.slow
def test_corpus_lm_trains_end_to_end_without_building_a_training_split(tmp_path, registry, monkeypatch):
    from harness_plugins.tasks import corpus_lm

    path = corpus(tmp_path, tokenizer="bpe:320")
    asked = []
    original = corpus_lm.CorpusLMTask.generate
    monkeypatch.setattr(corpus_lm.CorpusLMTask, "generate",
                        lambda self, split, length: asked.append(split) or original(self, split, length))
    result = harness.train({
        "task": {"name": "corpus_lm", "params": {"path": str(path), "length": 16, "eval_lengths": [32],
                                                 "eval_tokens": 96}},
        "model": {"name": "transformer", "params": {"d_model": 32, "layers": 1, "heads": 2}},
        "train": {"max_steps": 4, "batch_size": 8, "val_every": 2, "warmup_steps": 0, "accelerator": "cpu",
                  "devices": 1, "num_threads": 1, "progress": False, "log_attention": False},
        "tracking": {"experiment": "corpus"}}, registry=registry)
    assert result.status == "FINISHED" and result.metrics["train/steps"] == 4
    assert "train" not in asked, "training streamed: no list of training examples was built"
    t = task(registry, path, length=16, eval_lengths=[32], eval_tokens=96)
    tok = t.corpus.tokenizer
    for n in (16, 32):
        targets = [x for e in t.examples("val", n) for x in e["tokens"][1:]]
        loss = result.metrics[f"val/loss_len{n}"]
        byte_count = len(tok.decode(targets).encode("utf-8"))
        assert result.metrics[f"val/bpb_len{n}"] == pytest.approx(loss / math.log(2) * len(targets) / byte_count, rel=1e-4)
        assert result.metrics[f"val/ppl_len{n}"] == pytest.approx(math.exp(loss))
    assert "val/bpb" in result.metrics
