"""Every registered position scheme with every registered attention variant, and the
contracts every scheme keeps inside a real model.

The pairs are read from the registry when the tests are collected, so attention variants
and schemes added later are covered without editing this file. A pairing the plugins
declare impossible must be rejected before anything is built, with the reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated

import pytest
import torch

import harness
from harness.errors import ConfigError, IncompatibleError
from harness.params import FloatRange
from harness.registry.specs import PositionSpec
from harness.run.plan import check_pairing

VOCAB, LENGTH = 12, 8
TINY = {"d_model": 16, "layers": 1, "heads": 2, "ffn_mult": 2}


def pytest_generate_tests(metafunc):
    registry = harness.load_plugins()
    if "pair" in metafunc.fixturenames:
        pairs = [(a, p) for a in registry.names("attention") for p in registry.names("position")]
        metafunc.parametrize("pair", pairs, ids=[f"{a}+{p}" for a, p in pairs])
    if "scheme" in metafunc.fixturenames:
        metafunc.parametrize("scheme", registry.names("position"))


def tiny_model(registry, attention, position, batch_format="lm", **params):
    return harness.create_model(
        "transformer", vocab_size=VOCAB, max_length=LENGTH, batch_format=batch_format,
        num_classes=3 if batch_format == "classification" else None,
        attention=attention, position=position, registry=registry, **{**TINY, **params},
    )


def tokens(batch: int, length: int) -> torch.Tensor:
    return torch.randint(4, VOCAB, (batch, length))


@pytest.mark.parametrize("task_kind", ["lm", "classification"])
def test_pair_trains_a_few_steps_or_is_rejected_with_a_reason(registry, pair, task_kind):
    attention, position = pair
    aspec, pspec = registry.get("attention", attention), registry.get("position", position)
    missing = pspec.hooks - aspec.position_hooks
    if missing:
        with pytest.raises(IncompatibleError) as info:
            check_pairing(aspec, pspec)
        for hook in missing:
            assert hook in str(info.value)
            assert aspec.why_not.get(hook, f"does not apply '{hook}'") in str(info.value)
        with pytest.raises(IncompatibleError):
            tiny_model(registry, attention, position, task_kind)
        return

    if task_kind == "lm" and "causal" not in aspec.directions:  # Linformer: encoders only
        with pytest.raises(ConfigError, match="runs only bidirectional"):
            tiny_model(registry, attention, position, task_kind)
        return
    torch.manual_seed(0)
    model = tiny_model(registry, attention, position, task_kind)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(3):
        x = tokens(4, LENGTH)
        out = model(x)
        if task_kind == "lm":
            loss = torch.nn.functional.cross_entropy(out[:, :-1].reshape(-1, VOCAB), x[:, 1:].reshape(-1))
        else:
            loss = torch.nn.functional.cross_entropy(out, torch.randint(0, 3, (4,)))
        assert torch.isfinite(loss), f"{attention}+{position}: loss {loss}"
        opt.zero_grad()
        loss.backward()
        for name, param in model.position.named_parameters():
            assert param.grad is not None and torch.isfinite(param.grad).all(), name
        opt.step()
    longer = 2 * LENGTH
    with torch.no_grad():
        if model.supports_length(longer):
            assert torch.isfinite(model(tokens(2, longer))).all()
        else:
            with pytest.raises(ValueError):
                model(tokens(2, longer))


# -- contracts of every scheme inside a causal / bidirectional Transformer ---------------------
def test_scheme_declares_exactly_the_hooks_it_implements(registry, scheme):
    """Pairings are checked from the declared hooks, so they must match the code."""
    from harness.nn.position import PositionScheme

    model = tiny_model(registry, "multi_head", scheme)
    cls = type(model.position)
    methods = {"embedding": "embed", "qk": "rotate", "bias": "score_bias"}
    implemented = {hook for hook, m in methods.items() if getattr(cls, m) is not getattr(PositionScheme, m)}
    assert implemented == set(registry.get("position", scheme).hooks)


def test_scheme_leaks_nothing_from_the_future(registry, scheme):
    torch.manual_seed(1)
    model = tiny_model(registry, "multi_head", scheme, layers=2).eval()
    x = tokens(2, LENGTH)
    changed = x.clone()
    changed[:, 5:] = tokens(2, LENGTH - 5)
    with torch.no_grad():
        torch.testing.assert_close(model(x)[:, :5], model(changed)[:, :5])


def test_scheme_cached_decoding_equals_a_full_pass(registry, scheme):
    torch.manual_seed(2)
    model = tiny_model(registry, "multi_head", scheme, layers=2).eval()
    x = tokens(2, LENGTH)
    with torch.no_grad():
        full = model(x)
        cache = model.new_cache()
        steps = [model(x[:, :3], cache=cache)] + [model(x[:, t: t + 1], cache=cache)
                                                 for t in range(3, LENGTH)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-4)


def test_scheme_ignores_padding_in_a_bidirectional_model(registry, scheme):
    torch.manual_seed(3)
    model = tiny_model(registry, "multi_head", scheme, batch_format="classification").eval()
    x = tokens(2, 5)
    padded = torch.cat([x, torch.zeros(2, 3, dtype=torch.long)], dim=1)
    with torch.no_grad():
        plain = model(x, padding_mask=torch.zeros_like(x, dtype=torch.bool))
        with_pads = model(padded, padding_mask=padded == 0)
    torch.testing.assert_close(with_pads, plain, atol=1e-5, rtol=1e-4)


def test_shaw_relative_through_attention_matches_the_papers_score(registry):
    """multi_head + relative equals softmax(q·(k_j + a_clip(j-i)) / sqrt(d)) v in float64."""
    torch.manual_seed(4)
    model = tiny_model(registry, "multi_head", "relative", heads=2)
    attn, scheme = model.blocks[0].self_attn, model.position
    x = torch.randn(1, 6, 16)
    out, _ = attn(x, causal=True, position=scheme)

    def heads(proj):  # (H, L, d) in float64
        return proj(x).double().view(6, 2, 8).transpose(0, 1)

    q, k, v = heads(attn.q_proj), heads(attn.k_proj), heads(attn.v_proj)
    a = scheme.table.double()
    clip = scheme.clip
    scores = torch.empty(2, 6, 6, dtype=torch.float64)
    for i in range(6):
        for j in range(6):
            rel = a[max(-clip, min(clip, j - i)) + clip]
            scores[:, i, j] = (q[:, i] * (k[:, j] + rel)).sum(-1) / math.sqrt(8)
    scores = scores.masked_fill(torch.ones(6, 6).triu(1).bool(), float("-inf"))
    mixed = (scores.softmax(-1) @ v).transpose(0, 1).reshape(1, 6, 16)
    expected = mixed @ attn.out_proj.weight.double().T + attn.out_proj.bias.double()
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-4)


def test_t5_bias_is_one_table_shared_by_all_layers(registry):
    model = tiny_model(registry, "multi_head", "t5_bias", layers=3)
    names = [n for n, _ in model.named_parameters() if n.startswith("position.")]
    assert names == ["position.bias.weight"]


# -- a third-party scheme, registered in-process like any plugin ------------------------------
@dataclass
class LogDistanceConfig:
    strength: Annotated[float, FloatRange(0.1, 2.0)] = 0.5


def build_log_distance(config, *, num_heads, **_):
    from harness.nn.position import PositionScheme, relative_positions

    class LogDistance(PositionScheme):
        """Adds -strength · ln(1 + |i - j|) to every head's scores."""

        def score_bias(self, q, q_pos, k_pos):
            return -config.strength * torch.log1p(relative_positions(q_pos, k_pos).abs().float())

    return LogDistance()


class LogDistancePlugin:
    @harness.hookimpl
    def harness_register_position(self, register):
        register(PositionSpec(name="log_distance", build=build_log_distance,
                              config=LogDistanceConfig, hooks=frozenset({"bias"})))


def test_an_in_process_scheme_reaches_the_scores_of_any_attention():
    registry = harness.load_plugins(plugins=[LogDistancePlugin()])
    spec = registry.get("position", "log_distance")
    assert spec.distribution == "in-process"
    for attention in registry.names("attention"):
        if "bias" not in registry.get("attention", attention).position_hooks:
            with pytest.raises(IncompatibleError, match="log_distance"):
                tiny_model(registry, attention, "log_distance")
    torch.manual_seed(5)
    model = tiny_model(registry, "multi_head", "log_distance", position_params={"strength": 1.5})
    x = tokens(1, 6)
    _, maps = model(x, return_attention=True)
    attn = model.blocks[0].self_attn
    h = model.blocks[0].norms[0](model.embed(x)).double()
    q = (h @ attn.q_proj.weight.double().T + attn.q_proj.bias.double()).view(6, 2, 8).transpose(0, 1)
    k = (h @ attn.k_proj.weight.double().T + attn.k_proj.bias.double()).view(6, 2, 8).transpose(0, 1)
    i = torch.arange(6, dtype=torch.float64)
    bias = -1.5 * torch.log1p((i[:, None] - i[None, :]).abs())
    scores = q @ k.transpose(-2, -1) / math.sqrt(8) + bias
    scores = scores.masked_fill(torch.ones(6, 6).triu(1).bool(), float("-inf"))
    torch.testing.assert_close(maps[0][0].double(), scores.softmax(-1), atol=1e-5, rtol=1e-4)
