"""The LRA protocol's classifiers in the ``transformer`` model: CLS or mean pooling, LRA's MLP
head, and the two-tower comparison of two documents ([u, v, u*v, u-v])."""

from __future__ import annotations

import pytest
import torch

import harness
from harness.data.tasks import PAD, SEP

VOCAB = 12


def encoder(**params):
    torch.manual_seed(0)
    defaults = {"d_model": 16, "layers": 2, "heads": 2}
    return harness.create_model("transformer", batch_format="classification", num_classes=3, vocab_size=VOCAB,
                                max_length=40, attention="multi_head", position="sinusoidal",
                                **{**defaults, **params}).eval()


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
