"""Using a trained run: ``harness generate``, ``harness.load_model`` and ``harness export``.

A tiny Transformer trained to 100% exact match on ``copy`` (decoder-only: ``src SEP tgt``)
must reproduce every validation source when decoding greedily from the prompt; cached
generation (the KV cache) must choose the same tokens as full recomputation, greedy and
sampled (the property every architecture holds in ``tests/test_decoding_cache.py``); the
exported folder must load without the store into identical weights; and each bad input is
one paragraph with exit code 2 and nothing overwritten.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from copy_model import COPY, train_copy
from text import flat

import harness
from harness.cli.main import main
from harness.errors import ConfigError, HarnessError
from harness.run import trained as t
from harness.run.pipeline import train

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def copy_run(tmp_path_factory):
    """(run id, tracking URI, store) of a model trained to 100% on copy."""
    root = tmp_path_factory.mktemp("generate")
    return (*train_copy(root), root)


@pytest.fixture
def home(copy_run, monkeypatch):
    monkeypatch.setenv("HARNESS_HOME", str(copy_run[2] / "home"))
    return copy_run


@pytest.mark.slow
def test_greedy_generation_reproduces_the_input_on_copy(home, capsys):
    run_id = home[0]
    model = t.load(run_id)
    task = harness.create_task("copy", **COPY["task"]["params"])
    examples = task.examples("val", 4)
    for ex in examples:  # copy's targets end without EOS: ask for as many tokens as the source
        assert t.generate(model, list(ex["src"]), max_new_tokens=len(ex["src"])) == list(ex["tgt"])
    src = examples[0]["src"]
    text = model.vocab.decode(src)
    assert main(["generate", run_id, "--prompt", text, "--max-new-tokens", str(len(src))]) == 0
    assert capsys.readouterr().out.strip() == text


@pytest.mark.slow
def test_cached_generation_equals_full_recomputation_greedy_and_sampled(home):
    model = t.load(home[0])
    prompt = t.encode(model.vocab, "s1 s3 s0 s2")
    for kwargs in ({}, {"temperature": 1.5, "seed": 7}, {"temperature": 1.0, "top_k": 3, "seed": 1},
                   {"temperature": 2.0, "top_p": 0.9, "seed": 2}):
        cached = t.generate(model, prompt, max_new_tokens=6, **kwargs)
        full = t.generate(model, prompt, max_new_tokens=6, use_cache=False, **kwargs)
        assert cached == full, kwargs
    # the same seed draws the same tokens; top_k=1 and a tiny top_p are greedy
    hot = {"temperature": 3.0, "max_new_tokens": 6}
    assert t.generate(model, prompt, seed=5, **hot) == t.generate(model, prompt, seed=5, **hot)
    greedy = t.generate(model, prompt, max_new_tokens=6)
    assert t.generate(model, prompt, top_k=1, seed=3, **hot) == greedy
    assert t.generate(model, prompt, top_p=1e-6, seed=3, **hot) == greedy


def test_next_token_sampling_follows_the_filtered_distribution():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    gen = torch.Generator().manual_seed(0)
    draws = [t.next_token(logits, 1.0, None, 0.7, gen) for _ in range(4000)]
    # top_p=0.7 keeps tokens 0 and 1 (0.5 < 0.7, 0.8 >= 0.7), renormalised to 5/8 and 3/8
    assert set(draws) == {0, 1}
    assert abs(draws.count(0) / 4000 - 0.625) < 0.03
    draws = [t.next_token(logits, 1.0, 3, None, gen) for _ in range(4000)]
    assert set(draws) == {0, 1, 2} and abs(draws.count(2) / 4000 - 0.15 / 0.95) < 0.03
    assert t.next_token(logits, 0.0, None, None, gen) == 0


@pytest.mark.slow
def test_export_loads_without_the_store_and_never_overwrites(home, tmp_path, monkeypatch, capsys):
    run_id = home[0]
    out = tmp_path / "exported"
    assert main(["export", run_id, "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["model.json", "model.safetensors"]
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / "empty"))  # no store at all
    model, config = harness.load_model(out)
    monkeypatch.setenv("HARNESS_HOME", str(home[2] / "home"))
    original, _ = harness.load_model(run_id)
    assert config["model"]["name"] == "transformer" and not model.training
    for (name, a), (_, b) in zip(original.state_dict().items(), model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    before = (out / "model.safetensors").stat().st_mtime_ns
    capsys.readouterr()
    assert main(["export", run_id, "--out", str(out)]) == 2
    assert "already exists" in flat(capsys.readouterr().err)
    assert (out / "model.safetensors").stat().st_mtime_ns == before


@pytest.mark.slow
def test_generate_refuses_bad_input(home, tmp_path, capsys):
    run_id, uri = home[0], home[1]
    assert main(["generate", run_id, "--prompt", "s1 zz"]) == 2
    err = flat(capsys.readouterr().err)
    assert "'zz' is not in the run's vocabulary" in err and "s0" in err
    assert main(["generate", run_id, "--prompt", "s1", "--temperature", "-1"]) == 2
    assert main(["generate", run_id, "--prompt", "s1", "--top-p", "0"]) == 2
    assert main(["generate", "0123456789abcdef", "--prompt", "s1"]) == 2
    assert "no trained weights" in flat(capsys.readouterr().err)
    parity = train({"task": {"name": "parity", "params": {"length": 4, "num_train": 16, "num_val": 4}},
                    "model": {"name": "transformer", "params": {"d_model": 8, "layers": 1, "heads": 2}},
                    "train": {"max_steps": 2, "batch_size": 8, "progress": False, "num_threads": 1},
                    "plugins": [str(ROOT / "docs/examples/parity_task.py")], "tracking": {"uri": uri}})
    capsys.readouterr()
    assert main(["generate", parity.run_id, "--prompt", "0 1"]) == 2
    assert "generate needs a language-model or encoder-decoder run" in flat(capsys.readouterr().err)


def test_encode_checks_the_prompt():
    vocab = harness.create_task("copy", vocab=3).vocab
    assert t.encode(vocab, "s0 s2") == [vocab.first_symbol, vocab.first_symbol + 2]
    with pytest.raises(ConfigError, match="is empty"):
        t.encode(vocab, "  ")
    with pytest.raises(HarnessError, match="no exported model"):
        t.load(Path(__file__).parent)
