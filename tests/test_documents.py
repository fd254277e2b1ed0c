"""Documents kept apart (``corpus_lm``'s ``documents: separate``, ``harness.nn.documents``):
for every causal attention variant, every mixer and the recurrent models, a token's logits do
not change when the previous document changes (float64, tight), read as if its document
were alone, and a cached decode gives the same logits; with documents packed they do change
(so the checks can fail). The option is refused for a model that cannot keep documents apart,
recorded as a run tag, and trains a real corpus_lm run."""

from __future__ import annotations

import json

import pytest
import torch

import harness
from harness.config import ComponentConfig, ModelConfig
from harness.data.prepare import prepare
from harness.data.tasks import TaskInfo
from harness.errors import IncompatibleError
from harness.keys import Tag
from harness.run.build import build_model_from
from harness.run.plan import resolve_model

EOD, VOCAB, LENGTH = 4, 12, 24
#: the previous document ends where the last one starts: rows' last <eod> (other starts before)
STARTS = ((3, 9), (14,))


def _registry():
    return harness.load_plugins()


def _layers() -> list[tuple[str | None, str | None, str]]:
    reg = _registry()
    attention = [s.name for s in reg.specs("attention") if "causal" in (s.directions or ())]
    mixers = [s.name for s in reg.specs("mixer")]
    return ([("attention", n, "transformer") for n in sorted(attention)]
            + [("mixer", n, "transformer") for n in sorted(mixers)]
            + [(None, None, "lstm"), (None, None, "gru")])


LAYERS = _layers()


def build(registry, kind, name, model, *, separate, position="none"):
    params = {"d_model": 16, "heads": 2, "layers": 2} if model == "transformer" else {"width": 16}
    roles = {}
    if kind:  # chunked forms in chunks of 5: documents cross chunks, the last one padded
        fields = registry.get(kind, name).config.__dataclass_fields__
        roles[kind] = ComponentConfig(name=name, params={c: 5 for c in ("chunk", "chunk_size") if c in fields})
    if model == "transformer":
        roles["position"] = ComponentConfig(name=position)
    parts = resolve_model(registry, ModelConfig(name=model, params=params, **roles))
    info = TaskInfo(format="lm", vocab_size=VOCAB, max_length=LENGTH, document_token=EOD if separate else None)
    torch.manual_seed(0)
    return build_model_from(parts, info).double().eval()


def windows(seed=1):
    """Two windows of documents and the same windows with every token before each row's last
    <eod> redrawn (the previous documents changed, the last one not)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(EOD + 1, VOCAB, (2, LENGTH), generator=g)
    for row, starts in enumerate(STARTS):
        tokens[row, list(starts)] = EOD
    other = tokens.clone()
    for row, starts in enumerate(STARTS):
        last = starts[-1]
        other[row, :last] = torch.randint(EOD + 1, VOCAB, (last,), generator=g)
        other[row, [s for s in starts[:-1]]] = EOD
    assert (other != tokens).any(dim=1).all()
    return tokens, other


def after_last(a, b):
    """The largest difference of two outputs over the positions from each row's last <eod>."""
    return max(float((a[row, s[-1]:] - b[row, s[-1]:]).abs().max()) for row, s in enumerate(STARTS))


@pytest.mark.parametrize(("kind", "name", "model"), LAYERS, ids=[n or m for _, n, m in LAYERS])
def test_a_token_never_sees_the_previous_document(registry, kind, name, model):
    tokens, other = windows()
    separate = build(registry, kind, name, model, separate=True)
    packed = build(registry, kind, name, model, separate=False)
    with torch.no_grad():
        kept_apart = after_last(separate(tokens), separate(other))
        spanning = after_last(packed(tokens), packed(other))
        # the last document alone, from its <eod>, gives the same logits: nothing else is masked
        row, last = 1, STARTS[1][-1]
        alone = separate(tokens[row:, last:])[0]
        whole = separate(tokens)[row, last:]
    assert kept_apart < 1e-12, f"{name or model}: the previous document reached the last one"
    assert spanning > 1e-6, f"{name or model}: with documents packed the previous one must matter"
    assert float((alone - whole).abs().max()) < 1e-12, f"{name or model}: a document reads as if alone"


@pytest.mark.parametrize(("kind", "name", "model"), LAYERS, ids=[n or m for _, n, m in LAYERS])
def test_a_cached_decode_forgets_the_previous_document_as_a_full_pass_does(registry, kind, name, model):
    position = "sinusoidal" if model == "transformer" else "none"  # positions run on over documents
    m = build(registry, kind, name, model, separate=True, position=position)
    tokens = windows()[0][:1]
    cache = m.new_cache()
    with torch.no_grad():
        full = m(tokens)
        stepped = torch.cat([m(tokens[:, i:i + 1], cache=cache) for i in range(LENGTH)], dim=1)
    assert float((full - stepped).abs().max()) < 1e-9, f"{name or model}: cached decoding differs"


@pytest.mark.parametrize("position", ["rope", "alibi", "t5_bias", "relative", "sinusoidal", "learned"])
def test_every_position_scheme_keeps_documents_apart(registry, position):
    tokens, other = windows()
    m = build(registry, "attention", "multi_head", "transformer", separate=True, position=position)
    with torch.no_grad():
        assert after_last(m(tokens), m(other)) < 1e-12


def test_masked_attention_keeps_the_fused_kernel_equal_to_the_explicit_softmax(registry):
    """The block-diagonal mask through SDPA equals the explicit softmax path (need_weights),
    and the weights give no query a key of another document."""
    m = build(registry, "attention", "multi_head", "transformer", separate=True)
    tokens = windows()[0]
    with torch.no_grad():
        fused = m(tokens)
        logits, maps = m(tokens, return_attention=True)
    assert torch.allclose(fused, logits, atol=1e-12)
    doc = (tokens == EOD).long().cumsum(1)
    across = doc[:, None, :, None] != doc[:, None, None, :]
    assert all(float(w.masked_select(across).abs().max()) == 0.0 for w in maps)


def test_a_model_that_cannot_keep_documents_apart_is_refused_before_training(registry, tmp_path):
    cfg = {"task": {"name": "corpus_lm", "params": {"path": str(tmp_path / "none"), "documents": "separate"}},
           "model": {"name": "mlp_mixer"}}
    from harness.config import RunConfig
    from harness.run.plan import plan

    with pytest.raises(IncompatibleError, match="documents: separate.*mlp_mixer"):
        plan(RunConfig.model_validate(cfg), registry)
    cfg["task"]["params"]["documents"] = "packed"
    plan(RunConfig.model_validate(cfg), registry)  # packed: any lm model


def corpus(tmp_path, docs=200):
    lines = [" ".join(f"w{(i * 7 + j) % 13}" for j in range(3 + i % 9)) for i in range(docs)]
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in lines))
    prepare([src], tmp_path / "corpus", tokenizer="chars", workers=1, progress=False)
    return tmp_path / "corpus"


def test_corpus_lm_documents_changes_the_model_never_the_scored_targets(registry, tmp_path):
    path = corpus(tmp_path)
    packed = harness.create_task("corpus_lm", seed=0, registry=registry, path=str(path), length=16,
                                 eval_tokens=64)
    separate = harness.create_task("corpus_lm", seed=0, registry=registry, path=str(path), length=16,
                                   eval_tokens=64, documents="separate")
    assert packed.document_token is None and separate.document_token == separate.corpus.eod_id == EOD
    assert separate.vocab.symbols[EOD - 4] == "<eod>"
    assert list(separate.examples("val", 16)) == list(packed.examples("val", 16)), "the same text, all scored"
    window = next(separate.train_batches(16, 4, seed=0))
    assert (window == next(packed.train_batches(16, 4, seed=0))).all() and (window == EOD).any()


@pytest.mark.slow
def test_corpus_lm_trains_with_documents_kept_apart_and_says_so(registry, tmp_path):
    from mlflow import MlflowClient

    from harness.store import tracking

    result = harness.train({
        "task": {"name": "corpus_lm", "params": {"path": str(corpus(tmp_path)), "length": 16,
                                                 "eval_tokens": 64, "documents": "separate"}},
        "model": {"name": "transformer", "params": {"d_model": 16, "layers": 1, "heads": 2},
                  "mixer": {"name": "gla"}},
        "train": {"max_steps": 3, "batch_size": 4, "val_every": 3, "warmup_steps": 0,
                  "accelerator": "cpu", "devices": 1, "num_threads": 1, "progress": False,
                  "log_attention": False},
        "tracking": {"experiment": "documents"}}, registry=registry)
    assert result.status == "FINISHED" and result.metrics["train/steps"] == 3
    run = MlflowClient(tracking.tracking_uri()).get_run(result.run_id)
    assert run.data.tags[Tag.DOCUMENTS] == "separate"
    assert run.data.params["task.params.documents"] == "separate"


def test_a_study_refuses_candidates_that_see_documents_differently(registry, tmp_path):
    from harness.errors import ConfigError
    from harness.study.schema import parse_study_config
    from harness.study.space import validate

    model = {"name": "transformer", "params": {"layers": 1, "heads": 2, "d_model": 16}}
    data = {"name": "docs", "task": {"name": "corpus_lm", "params": {
                "path": str(corpus(tmp_path)), "length": 16, "eval_tokens": 64}},
            "candidates": [{"name": "a", "model": model},
                           {"name": "b", "model": model, "task": {"documents": "separate"}}],
            "objective": {"metric": "loss"}, "train": {"num_threads": 1},
            "budget": {"trials": 1, "steps": 4}}
    with pytest.raises(ConfigError, match=r"candidates\[1\]\.task: documents differs"):
        validate(parse_study_config(data), registry)
    data["candidates"][1]["task"] = {"eval_tokens": 64}  # agreeing params are fine
    validate(parse_study_config(data), registry)


NATIVE = [(kind, name) for kind, name, _ in LAYERS if kind is not None]


@pytest.mark.parametrize(("kind", "name"), NATIVE, ids=[n for _, n in NATIVE])
def test_a_native_mask_or_reset_has_the_gradients_of_one_document_per_row(registry, kind, name, monkeypatch):
    """Layers that mask (attention) or reset (linear recurrences, selective scans) natively
    against the same layer run one document per row (``documents.by_document``, exact for any
    causal layer): outputs and every parameter's gradient, float64."""
    from harness.nn.attention import Attention
    from harness.nn.mixer import Mixer

    layer = registry.get(kind, name).build
    native = (issubclass(layer, Mixer) and layer.resets) or (
        issubclass(layer, Attention) and harness.nn.attention.masks_documents(layer))
    if not native:
        pytest.skip(f"{name} runs one document per row already")
    m = build(registry, kind, name, "transformer", separate=True, position="alibi" if kind == "attention" else "none")
    tokens = windows()[0]

    def grads():
        m.zero_grad()
        out = m(tokens)
        out.square().mean().backward()
        return out.detach(), {k: p.grad.clone() for k, p in m.named_parameters() if p.grad is not None}

    out, got = grads()
    monkeypatch.setattr(layer, "resets" if issubclass(layer, Mixer) else "masks_documents", False)
    ref, expected = grads()
    assert float((out - ref).abs().max()) < 1e-12, float((out - ref).abs().max())
    assert got.keys() == expected.keys()
    for k in got:
        assert torch.allclose(got[k], expected[k], rtol=1e-9, atol=1e-12), k


def test_a_study_report_states_how_documents_were_seen():
    """The protocol paragraph names the study record's documents (written when the study is
    created), and says nothing for a task without documents."""
    from types import SimpleNamespace

    from harness.report.collect import protocol
    from harness.study.schema import parse_study_config

    cfg = parse_study_config({
        "name": "docs", "task": {"name": "corpus_lm", "params": {"length": 16}},
        "candidates": [{"name": "a", "model": {"name": "transformer"}}],
        "objective": {"metric": "loss"}, "budget": {"trials": 1, "steps": 4}})
    texts = {}
    for documents in ("packed", "separate", None):
        record = {"train_length": 16, "eval_lengths": [16], "documents": documents}
        texts[documents] = protocol(SimpleNamespace(config=cfg, record=record, name="docs")).task
    assert "documents packed" in texts["packed"] and "kept apart" in texts["separate"]
    assert "documents" not in texts[None].replace("corpus_lm", "")


def test_a_hybrid_keeps_documents_apart_in_every_block(registry):
    """A mixer-and-attention hybrid (``pattern``): each block keeps documents apart its own way."""
    tokens, other = windows()
    logits = {}
    for separate in (True, False):
        parts = resolve_model(registry, ModelConfig(
            name="transformer", params={"d_model": 16, "heads": 2, "layers": 3, "pattern": ["mixer", "attention"]},
            attention=ComponentConfig(name="multi_head"), mixer=ComponentConfig(name="s4d"),
            position=ComponentConfig(name="sinusoidal")))
        info = TaskInfo(format="lm", vocab_size=VOCAB, max_length=LENGTH, document_token=EOD if separate else None)
        torch.manual_seed(0)
        m = build_model_from(parts, info).double().eval()
        with torch.no_grad():
            logits[separate] = after_last(m(tokens), m(other))
    assert logits[True] < 1e-12 and logits[False] > 1e-6


@pytest.mark.slow
def test_the_cost_benchmark_runs_at_its_smallest_size(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "documents.md"
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "documents_cpu.py"), "--layers", "gla,s4d",
                           "--length", "16", "--mean-doc", "4", "--min-time", "0", "--out", str(out)],
                          cwd=tmp_path, env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = out.read_text()
    assert "| gla | native reset |" in table and "| s4d | one document per row |" in table
