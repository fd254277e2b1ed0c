"""The mixer slot of the transformer: a mixer plugin registered in-process, hybrids by pattern,
the pairing and direction rules, presets, and grouped-query attention's smaller cache."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

import pytest
import torch

import harness
from harness.errors import ConfigError, IncompatibleError
from harness.plugin import Complexity, FloatRange, Gt, Lt, Mixer, MixerSpec, hookimpl

VOCAB = 24


@dataclass
class EmaConfig:
    decay: Annotated[float, Gt(0.0), Lt(1.0), FloatRange(0.5, 0.99)] = 0.9


class EmaMixer(Mixer):
    """Exponential moving average of projected inputs: h_t = a h_{t-1} + (1 - a) W x_t."""

    complexity = Complexity(time="L", memory="L", decode="1", state="1")
    why_not = {"qk": "an EMA has no queries and keys to rotate"}

    def __init__(self, config: EmaConfig, *, d_model: int, num_heads: int) -> None:
        super().__init__(d_model, num_heads)
        self.decay = config.decay
        self.proj = torch.nn.Linear(d_model, d_model)

    def mix(self, x: Any, *, causal: bool, key_padding_mask: Any, position: Any) -> Any:
        state: dict[str, Any] = {}
        return self.step(x, state, positions=torch.arange(x.shape[1]), position=position)

    def step(self, x: Any, state: dict[str, Any], *, positions: Any, position: Any) -> Any:
        u = self.proj(x)
        h = state.get("h", torch.zeros_like(u[:, 0]))
        out = []
        for t in range(u.shape[1]):
            h = self.decay * h + (1 - self.decay) * u[:, t]
            out.append(h)
        state["h"] = h
        return torch.stack(out, dim=1)

    def state_size(self, length: int) -> int:
        return self.d_model


class EmaPlugin:
    @hookimpl
    def harness_register_mixer(self, register: Any) -> None:
        register(MixerSpec(name="ema", build=EmaMixer))


@pytest.fixture(scope="module")
def reg():
    return harness.load_plugins(plugins=[EmaPlugin()])


def model(reg, **kw: Any) -> Any:
    kw.setdefault("d_model", 16)
    kw.setdefault("heads", 2)
    kw.setdefault("layers", 3)
    return harness.create_model("transformer", vocab_size=VOCAB, max_length=12, registry=reg, **kw)


def test_the_mixer_spec_is_derived_from_the_class(reg):
    spec = reg.get("mixer", "ema")
    assert spec.config is EmaConfig
    assert spec.description.startswith("Exponential moving average")
    assert spec.directions == {"causal"} and spec.position_hooks == {"embedding"}
    assert spec.complexity.decode == "1"


def test_a_mixer_fills_every_block_and_a_pattern_makes_a_hybrid(reg):
    pure = model(reg, mixer="ema", position="none")
    assert [type(b.self_attn).__name__ for b in pure.blocks] == ["EmaMixer"] * 3
    hybrid = model(reg, mixer="ema", attention="multi_head", position="none",
                   pattern=["mixer", "attention"])
    kinds = [type(b.self_attn).__name__ for b in hybrid.blocks]
    assert kinds == ["EmaMixer", "MultiHeadAttention", "EmaMixer"]
    with pytest.raises(ConfigError, match="pattern"):
        model(reg, mixer="ema", attention="multi_head", position="none")


def test_cached_decoding_equals_the_full_pass_and_the_state_is_as_declared(reg):
    torch.manual_seed(0)
    m = model(reg, mixer="ema", attention="multi_head", position="none", pattern=["mixer", "attention"]).eval()
    tokens = torch.randint(4, VOCAB, (2, 10))
    with torch.no_grad():
        full = m(tokens)
        cache = m.new_cache()
        steps = torch.cat([m(tokens[:, t:t + 1], cache=cache) for t in range(10)], dim=1)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-4)
    kept = sum(c["self"].numel_per_sequence() for c in cache)
    assert kept == m.state_size(10)  # 2 EMA states of 16 + one KV cache of 10 x 2 x 16


def test_a_mixer_that_cannot_apply_a_scheme_is_rejected_with_its_reason(reg):
    with pytest.raises(IncompatibleError, match="no queries and keys to rotate"):
        model(reg, mixer="ema", position="rope")
    model(reg, mixer="ema", position="sinusoidal")  # an embedding scheme pairs with anything


def test_a_causal_only_mixer_in_a_bidirectional_encoder_says_how_to_fix_it(reg):
    with pytest.raises(ConfigError, match="causal: true"):
        model(reg, mixer="ema", position="none", batch_format="classification", num_classes=3)
    enc = model(reg, mixer="ema", position="none", batch_format="classification", num_classes=3, causal=True)
    assert enc(torch.randint(4, VOCAB, (2, 6))).shape == (2, 3)


def test_the_transformer_pp_preset_fills_in_what_the_config_leaves_unset(reg):
    pp = model(reg, preset="transformer++")
    assert type(pp.blocks[0].ffn).__name__ == "SwiGLU"
    assert type(pp.blocks[0].norms[0]).__name__ == "RMSNorm"
    assert type(pp.position).__name__ == "Rotary"
    own = model(reg, preset="transformer++", mlp="gelu", position="alibi")
    assert type(own.blocks[0].ffn).__name__ == "FeedForward"
    assert type(own.position).__name__ != "Rotary"
    with pytest.raises(ConfigError, match=r"no preset 'transformer\+'\. Did you mean 'transformer\+\+'"):
        model(reg, preset="transformer+")


def grouped_attention_reference(x, wq, wk, wv, wo, heads, kv_heads):
    """float64 grouped-query causal attention from the paper's definition."""
    b, n, d = x.shape
    hd = d // heads
    q = (x @ wq.T).view(b, n, heads, hd)
    k = (x @ wk.T).view(b, n, kv_heads, hd)
    v = (x @ wv.T).view(b, n, kv_heads, hd)
    out = torch.zeros(b, n, heads, hd, dtype=x.dtype)
    group = heads // kv_heads
    for h in range(heads):
        g = h // group
        scores = q[:, :, h] @ k[:, :, g].transpose(1, 2) / math.sqrt(hd)
        scores = scores.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), float("-inf"))
        out[:, :, h] = scores.softmax(-1) @ v[:, :, g]
    return out.reshape(b, n, d) @ wo.T


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_grouped_query_attention_matches_its_definition_and_caches_kv_heads_only(reg, kv_heads):
    torch.manual_seed(kv_heads)
    spec = reg.get("attention", "multi_head")
    layer = spec.build(spec.config(kv_heads=kv_heads, bias=False), d_model=16, num_heads=4).double()
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    out, _ = layer(x, causal=True)
    ref = grouped_attention_reference(x, layer.q_proj.weight, layer.k_proj.weight, layer.v_proj.weight,
                                      layer.out_proj.weight, 4, kv_heads)
    torch.testing.assert_close(out, ref)
    cache = layer.new_cache()
    for t in range(7):
        layer(x[:, t:t + 1], causal=True, cache=cache)
    assert cache.numel_per_sequence() == layer.state_size(7) == 7 * kv_heads * 2 * 4
