"""The LRA protocol's classifiers in the ``transformer`` model: CLS or mean pooling, LRA's MLP
head, and the two-tower comparison of two documents ([u, v, u*v, u-v])."""

from __future__ import annotations

import pytest
import torch

import harness
from harness.data.vocab import PAD, SEP
from harness.errors import ConfigError

VOCAB = 12


def encoder(**params):
    torch.manual_seed(0)
    defaults = {"d_model": 16, "layers": 2, "heads": 2, "attention": "multi_head", "position": "sinusoidal"}
    return harness.create_model("transformer", batch_format="classification", num_classes=3, vocab_size=VOCAB,
                                max_length=40, **{**defaults, **params}).eval()


def padded(rows):
    width = max(len(r) for r in rows)
    tokens = torch.tensor([r + [PAD] * (width - len(r)) for r in rows])
    return tokens, tokens == PAD


@pytest.mark.parametrize("pool", ["mean", "cls"])
def test_the_pooled_classifier_ignores_padding(pool):
    model = encoder(pool=pool, classifier="mlp")
    rows = [[5, 6, 7, 8], [9, 4, 5]]
    tokens, pad = padded(rows)
    longer, longer_pad = padded([r + [PAD] * 3 for r in rows])
    with torch.no_grad():
        assert torch.allclose(model(tokens, padding_mask=pad), model(longer, padding_mask=longer_pad), atol=1e-5)


def test_cls_pooling_reads_a_learned_vector_at_position_zero_and_lras_mlp_head():
    model = encoder(pool="cls", classifier="mlp", ffn_mult=2)
    assert model.cls is not None and model.cls.shape == (16,)
    head = [m for m in model.head if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in head] == [(16, 32), (32, 3)]
    tokens, pad = padded([[5, 6, 7]])
    with torch.no_grad():
        x, _ = model.encode(tokens, pad, None, False)
        assert x.shape[1] == 4  # CLS + 3 tokens
        assert torch.allclose(model(tokens, padding_mask=pad), model.head(x[:, 0]), atol=1e-6)
        model.cls.add_(torch.randn(16))  # the readout depends on the learned vector
        assert not torch.allclose(model(tokens, padding_mask=pad), model.head(x[:, 0]), atol=1e-3)


@pytest.mark.parametrize("pool", ["mean", "cls"])
def test_two_towers_encode_each_document_alone_and_compare_them(pool):
    model = encoder(pool=pool, two_tower=True, classifier="mlp")
    docs = [([5, 6, 7], [8, 9]), ([4], [5, 6, 7, 8, 9, 10]), ([6, 6, 6, 6, 6], [7])]
    tokens, pad = padded([a + [SEP] + b for a, b in docs])
    with torch.no_grad():
        got = model(tokens, padding_mask=pad)
        for row, (a, b) in enumerate(docs):  # the reference: each document alone, unpadded
            u, v = (model.pool(model.encode(torch.tensor([d]), torch.zeros(1, len(d), dtype=torch.bool),
                                            None, False)[0], torch.zeros(1, len(d), dtype=torch.bool))
                    for d in (a, b))
            want = model.head(torch.cat([u, v, u * v, u - v], dim=-1))
            assert torch.allclose(got[row], want[0], atol=1e-5), row
    dims = [(m.in_features, m.out_features) for m in model.head if isinstance(m, torch.nn.Linear)]
    assert dims == [(64, 64), (64, 32), (32, 3)]  # LRA's dual head: 4d -> mlp -> mlp/2 -> classes


def test_two_towers_refuse_rows_without_a_separator():
    model = encoder(two_tower=True)
    tokens, pad = padded([[5, 6, SEP, 7], [5, 6, 7]])
    with pytest.raises(ValueError, match="no SEP"):
        model(tokens, padding_mask=pad)


def test_two_towers_follow_the_task_unless_the_model_says_otherwise():
    from harness.config import ComponentConfig, ModelConfig
    from harness.data.tasks import TaskInfo
    from harness.run.build import build_model_from
    from harness.run.plan import resolve_model

    info = TaskInfo(format="classification", vocab_size=VOCAB, max_length=20, num_classes=2,
                    extra={"two_tower": True})
    registry = harness.load_plugins()

    def build(**params):
        cfg = ModelConfig(name="transformer", params={"d_model": 16, "heads": 2, **params},
                          attention=ComponentConfig(name="multi_head"))
        return build_model_from(resolve_model(registry, cfg), info)

    assert build().two_tower and not build(two_tower=False).two_tower
    assert not build_model_from(resolve_model(registry, ModelConfig(name="transformer")),
                                TaskInfo(format="classification", vocab_size=VOCAB, max_length=20,
                                         num_classes=2)).two_tower


def test_reverse_rows_reverses_each_rows_real_tokens_only():
    from harness.nn.both_ways import reverse_rows

    x = torch.arange(10.0).reshape(2, 5, 1)
    pad = torch.tensor([[False, False, False, True, True], [False] * 5])
    got = reverse_rows(x, pad)[..., 0].tolist()
    assert got == [[2.0, 1.0, 0.0, 3.0, 4.0], [9.0, 8.0, 7.0, 6.0, 5.0]]
    assert torch.equal(reverse_rows(reverse_rows(x, pad), pad), x)


@pytest.mark.parametrize("mixer", ["s4d", "mamba"])
def test_a_causal_mixer_runs_both_ways_in_an_encoder(mixer):
    from harness.nn.both_ways import BothWays

    model = encoder(mixer=mixer, attention=None, position="none", bidirectional_mixer=True)
    layer = model.blocks[0].self_attn
    assert isinstance(layer, BothWays)
    torch.manual_seed(1)
    rows = [torch.randn(4, 16), torch.randn(6, 16)]
    x = torch.zeros(2, 6, 16)
    pad = torch.ones(2, 6, dtype=torch.bool)
    for i, r in enumerate(rows):
        x[i, : len(r)], pad[i, : len(r)] = r, False
    with torch.no_grad():
        out, _ = layer(x, causal=False, key_padding_mask=pad)
        for i, r in enumerate(rows):  # the reference: each row alone, unpadded, flipped by hand
            ahead, _ = layer.ahead(r[None], causal=True)
            back, _ = layer.back(r.flip(0)[None], causal=True)
            assert torch.allclose(out[i, : len(r)], (ahead + back.flip(1))[0], atol=1e-5)
        x2 = x.clone()
        x2[1, 5] += 1.0  # the last token reaches the first position (the backward copy)
        assert not torch.allclose(layer(x2, causal=False, key_padding_mask=pad)[0][1, 0], out[1, 0])
    with pytest.raises(ConfigError, match="bidirectional_mixer"):
        encoder(mixer=mixer, attention=None, position="none", bidirectional_mixer=True, causal=True)
