"""The linear-attention mixers with decay / delta rule (retnet, gla, deltanet, gated_deltanet).

Each layer's chunked training form is checked in float64 against its paper's recurrence,
written here as a plain loop over time from the layer's own parameters (independent of
harness.nn.linear_recurrence), at chunk sizes 1, a divisor of L, a non-divisor and one
larger than L (the fully parallel form). Cached decoding (one token at a time and in
chunks) must equal the full pass, outputs must not depend on later tokens, the declared
state size must be what the cache keeps, and one tiny real training run per family must
finish with a falling loss.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from mlflow.tracking import MlflowClient

import harness
from harness.errors import IncompatibleError
from harness.nn.linear_recurrence import chunked_delta_rule, chunked_linear_attention
from harness.store import tracking

NAMES = ("retnet", "gla", "deltanet", "gated_deltanet")
D_MODEL, HEADS, LENGTH = 16, 2, 12
CHUNKS = (1, 4, 5, 16)  # 1, a divisor of LENGTH, a non-divisor, longer than LENGTH


def build(registry: Any, name: str, **params: Any) -> Any:
    spec = registry.get("mixer", name)
    torch.manual_seed(0)
    layer = spec.build(spec.config(**params), d_model=D_MODEL, num_heads=HEADS).double()
    with torch.no_grad():  # move the gates and biases away from their initial values
        for p in layer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return layer


def inputs(length: int = LENGTH, seed: int = 1) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.randn(2, length, D_MODEL, dtype=torch.float64)


def heads(x: torch.Tensor, weight: torch.Tensor, h: int) -> torch.Tensor:
    """x Wᵀ split into heads: (B, L, H, D)."""
    return (x @ weight.T).view(x.shape[0], x.shape[1], h, -1)


def rms_norm(o: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return o / torch.sqrt(o.pow(2).mean(-1, keepdim=True) + eps) * weight


# ---------------------------------------------------------------- references (float64 loops)

def retnet_reference(layer: Any, x: torch.Tensor) -> torch.Tensor:
    """Retention, recurrent form: S_n = γ S_{n-1} + K_nᵀ V_n, o_n = Q_n S_n (paper eq. 6),
    Θ as complex rotations e^{inθ}, the decay normalisation 1/sqrt(Σ_{i<=n} γ^i), GroupNorm
    per head, swish gate."""
    b, n, _ = x.shape
    h, dk, dv = layer.num_heads, layer.dk, layer.dv
    q, k, v = (heads(x, p.weight, h) for p in (layer.q_proj, layer.k_proj, layer.v_proj))
    k = k / math.sqrt(dk)
    half = dk // 2
    theta = torch.tensor([10_000.0 ** -(i / (half - 1)) if half > 1 else 1.0 for i in range(half)],
                         dtype=torch.float64)

    def turn(z: torch.Tensor, pos: int) -> torch.Tensor:
        c = torch.view_as_complex(z.reshape(*z.shape[:-1], half, 2).contiguous())
        return torch.view_as_real(c * torch.exp(1j * pos * theta)).flatten(-2)

    out = torch.zeros(b, n, h, dv, dtype=torch.float64)
    for head in range(h):
        gamma = 1.0 - 2.0 ** (-5 - head)
        s = torch.zeros(b, dk, dv, dtype=torch.float64)
        for t in range(n):
            s = gamma * s + turn(k[:, t, head], t)[:, :, None] * v[:, t, head, None, :]
            o = torch.einsum("bd,bde->be", turn(q[:, t, head], t), s)
            out[:, t, head] = o / math.sqrt(sum(gamma**i for i in range(t + 1)))
    gn = layer.group_norm
    mean, var = out.mean(-1, keepdim=True), out.var(-1, unbiased=False, keepdim=True)
    y = ((out - mean) / torch.sqrt(var + gn.eps)).reshape(b, n, h * dv) * gn.weight + gn.bias
    return (F.silu(x @ layer.g_proj.weight.T) * y) @ layer.out_proj.weight.T


def gla_reference(layer: Any, x: torch.Tensor) -> torch.Tensor:
    """GLA: α_t = sigmoid(x W_α1 W_α2 + b)^(1/τ), S_t = diag(α_t) S_{t-1} + k_tᵀ v_t,
    o_t = q_t S_t; LayerNorm per head (no affine), swish output gate with bias."""
    b, n, _ = x.shape
    h, dk = layer.num_heads, layer.dk
    q, k, v = (heads(x, p.weight, h) for p in (layer.q_proj, layer.k_proj, layer.v_proj))
    low, up = layer.gate
    alpha = torch.sigmoid((x @ low.weight.T) @ up.weight.T + up.bias) ** (1.0 / layer.temperature)
    alpha = alpha.view(b, n, h, dk)
    s = torch.zeros(b, h, dk, layer.dv, dtype=torch.float64)
    out = []
    for t in range(n):
        s = alpha[:, t, :, :, None] * s + (k[:, t] / math.sqrt(dk))[..., None] * v[:, t, :, None, :]
        out.append(torch.einsum("bhd,bhde->bhe", q[:, t], s))
    o = torch.stack(out, 1)
    o = (o - o.mean(-1, keepdim=True)) / torch.sqrt(o.var(-1, unbiased=False, keepdim=True) + 1e-5)
    r = F.silu(x @ layer.r_proj.weight.T + layer.r_proj.bias)
    return (r * o.reshape(b, n, -1)) @ layer.out_proj.weight.T


def delta_inputs(layer: Any, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """q, k, v, β of the delta-rule layers: projection, causal depthwise convolution written
    as a sum over the last K inputs, SiLU, L2-normalised q and k, q / sqrt(Dk)."""
    inp = layer.inputs
    b, n, _ = x.shape
    h = layer.num_heads
    u = x @ inp.qkv_proj.weight.T
    w = inp.conv.conv.weight[:, 0]  # (channels, K): output t reads inputs t-K+1 .. t
    size = w.shape[1]
    c = torch.stack([sum(w[:, size - 1 - j] * u[:, t - j] for j in range(size) if t - j >= 0)
                     for t in range(n)], 1)
    c = F.silu(c)
    wq, wk = h * layer.dk, h * layer.dk
    q, k, v = c[..., :wq], c[..., wq:wq + wk], c[..., wq + wk:]
    q, k, v = (t.view(b, n, h, -1) for t in (q, k, v))
    q = q / q.norm(dim=-1, keepdim=True) / math.sqrt(layer.dk)
    k = k / k.norm(dim=-1, keepdim=True)
    beta = torch.sigmoid(x @ inp.b_proj.weight.T)
    return q, k, v, beta


def delta_loop(q: Any, k: Any, v: Any, beta: Any, alpha: Any) -> torch.Tensor:
    """S_t = α_t S_{t-1} (I - β_t k_t k_tᵀ) + β_t v_t k_tᵀ, o_t = S_t q_t, with S (Dv x Dk)."""
    b, n, h, dk = q.shape
    s = torch.zeros(b, h, v.shape[-1], dk, dtype=torch.float64)
    eye = torch.eye(dk, dtype=torch.float64)
    out = []
    for t in range(n):
        kt, bt, at = k[:, t], beta[:, t, :, None, None], alpha[:, t, :, None, None]
        s = at * s @ (eye - bt * kt[..., :, None] * kt[..., None, :]) + bt * v[:, t, ..., None] * kt[..., None, :]
        out.append((s @ q[:, t, ..., None])[..., 0])
    return torch.stack(out, 1)


def deltanet_reference(layer: Any, x: torch.Tensor) -> torch.Tensor:
    q, k, v, beta = delta_inputs(layer, x)
    o = delta_loop(q, k, v, beta, torch.ones_like(beta))
    o = rms_norm(o, layer.norm.weight, layer.norm.eps)
    return o.reshape(x.shape[0], x.shape[1], -1) @ layer.out_proj.weight.T


def gated_deltanet_reference(layer: Any, x: torch.Tensor) -> torch.Tensor:
    q, k, v, beta = delta_inputs(layer, x)
    alpha = torch.exp(-layer.A_log.exp() * F.softplus(x @ layer.a_proj.weight.T + layer.dt_bias))
    o = delta_loop(q, k, v, beta, alpha)
    gate = F.silu(heads(x, layer.g_proj.weight, layer.num_heads))
    o = rms_norm(o, layer.norm.weight, layer.norm.eps) * gate
    return o.reshape(x.shape[0], x.shape[1], -1) @ layer.out_proj.weight.T


REFERENCES = {"retnet": retnet_reference, "gla": gla_reference, "deltanet": deltanet_reference,
              "gated_deltanet": gated_deltanet_reference}


# ---------------------------------------------------------------- the four contracts, each mixer

@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("name", NAMES)
def test_parallel_form_matches_the_paper_recurrence_in_float64(registry, name, chunk):
    layer = build(registry, name, chunk=chunk)
    x = inputs()
    out, _ = layer(x)
    torch.testing.assert_close(out, REFERENCES[name](layer, x), rtol=1e-9, atol=1e-10)


def feed(layer: Any, x: torch.Tensor, sizes: list[int], position: Any = None) -> tuple[torch.Tensor, Any]:
    cache = layer.new_cache()
    outs, start = [], 0
    for size in sizes:
        outs.append(layer(x[:, start:start + size], cache=cache, position=position)[0])
        start += size
    return torch.cat(outs, 1), cache


@pytest.mark.parametrize("name", NAMES)
def test_decoding_token_by_token_and_in_chunks_equals_the_full_pass(registry, name):
    layer = build(registry, name, chunk=4)
    x = inputs(11)
    full, _ = layer(x)
    for sizes in ([1] * 11, [3, 1, 5, 2], [11]):
        steps, cache = feed(layer, x, sizes)
        torch.testing.assert_close(steps, full, rtol=1e-9, atol=1e-10)
        assert cache.length == 11


@pytest.mark.parametrize("name", ["gla", "deltanet", "gated_deltanet"])
def test_a_scheme_rotation_applies_at_absolute_positions_in_every_form(registry, name):
    spec = registry.get("position", "rope")
    layer = build(registry, name, chunk=4)
    rope = spec.build(spec.config(), d_model=D_MODEL, num_heads=HEADS, head_dim=layer.dk,
                      max_length=64, causal=True)
    x = inputs(9)
    plain, _ = layer(x)
    full, _ = layer(x, position=rope)
    assert not torch.allclose(full, plain), "the rotation changed nothing"
    steps, _ = feed(layer, x, [2, 1, 1, 5], position=rope)
    torch.testing.assert_close(steps, full, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name", NAMES)
def test_is_causal(registry, name):
    layer = build(registry, name, chunk=4)
    x = inputs()
    t = 6
    changed = x.clone()
    changed[:, t] += torch.randn_like(changed[:, t])
    before, after = layer(x)[0], layer(changed)[0]
    torch.testing.assert_close(after[:, :t], before[:, :t], rtol=0, atol=1e-12)
    assert (after[:, t] - before[:, t]).abs().max() > 1e-4


@pytest.mark.parametrize("name", NAMES)
def test_state_size_is_what_the_cache_keeps(registry, name):
    layer = build(registry, name)
    x = inputs(7)
    for sizes in ([1], [2, 5], [1] * 7):
        _, cache = feed(layer, x, sizes)
        assert cache.numel_per_sequence() == layer.state_size(cache.length)
    assert layer.state_size(7) == layer.state_size(70_000)  # constant in the length


def test_declared_state_sizes_are_the_paper_formulas(registry):
    h = HEADS
    ret, gla, delta, gated = (build(registry, n) for n in NAMES)
    assert (ret.dk, ret.dv) == (D_MODEL // h, 2 * D_MODEL // h)
    assert ret.state_size(1) == h * ret.dk * ret.dv
    assert (gla.dk, gla.dv) == (D_MODEL // (2 * h), D_MODEL // h)
    assert gla.state_size(1) == h * gla.dk * gla.dv
    assert delta.state_size(1) == h * 8 * 8 + 3 * 3 * D_MODEL  # H Dk Dv + (K-1)(2 H Dk + H Dv)
    assert (gated.dk, gated.dv) == (6, 12)  # 0.75 d / H, 1.5 d / H
    assert gated.state_size(1) == h * 6 * 12 + 3 * (2 * h * 6 + h * 12)


# ---------------------------------------------------------------- the shared numerics

def linear_attention_loop(q: Any, k: Any, v: Any, g: Any) -> torch.Tensor:
    s = torch.zeros(*q.shape[:2], q.shape[-1], v.shape[-1], dtype=q.dtype)
    out = []
    for t in range(q.shape[2]):
        s = g[:, :, t, :, None].exp() * s + k[:, :, t, :, None] * v[:, :, t, None, :]
        out.append(torch.einsum("bhd,bhde->bhe", q[:, :, t], s))
    return torch.stack(out, 2)


@pytest.mark.parametrize("chunk", CHUNKS)
def test_chunked_forms_stay_exact_under_strong_decay_and_carry_a_given_state(chunk):
    torch.manual_seed(2)
    b, h, n, dk, dv = 1, 2, LENGTH, 4, 3
    q, k = torch.randn(b, h, n, dk, dtype=torch.float64), torch.randn(b, h, n, dk, dtype=torch.float64)
    v = torch.randn(b, h, n, dv, dtype=torch.float64)
    g = -40.0 * torch.rand(b, h, n, dk, dtype=torch.float64)  # e^{-40·C} would overflow a naive form
    s0 = torch.randn(b, h, dk, dv, dtype=torch.float64)
    out, final = chunked_linear_attention(q.float(), k.float(), v.float(), g.float(), chunk=chunk,
                                          state=s0.float())
    ref = linear_attention_loop(q, k, v, g)
    assert torch.isfinite(out).all() and torch.isfinite(final).all()
    # from a state: the state's contribution decays through the same gates
    with_state = ref + torch.einsum("bhtd,bhde->bhte", q * g.cumsum(2).exp(), s0)
    torch.testing.assert_close(out.double(), with_state, rtol=1e-4, atol=1e-5)
    kn = F.normalize(k, dim=-1)
    beta, gs = torch.rand(b, h, n, dtype=torch.float64), -30.0 * torch.rand(b, h, n, dtype=torch.float64)
    out, _ = chunked_delta_rule(q, kn, v, beta, gs, chunk=chunk)
    loop = delta_loop(q.transpose(1, 2), kn.transpose(1, 2), v.transpose(1, 2), beta.transpose(1, 2),
                      gs.exp().transpose(1, 2))
    torch.testing.assert_close(out.transpose(1, 2), loop, rtol=1e-9, atol=1e-10)


def test_bf16_autocast_runs_the_recurrence_in_float32(registry):
    spec = registry.get("mixer", "gated_deltanet")
    layer = spec.build(spec.config(), d_model=D_MODEL, num_heads=HEADS)
    x = inputs().float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = layer(x)
        cache = layer.new_cache()
        layer(x[:, :3], cache=cache)
    assert torch.isfinite(out).all()
    assert cache.state["S"].dtype == torch.float32
    torch.testing.assert_close(out.float(), layer(x)[0], rtol=0.05, atol=0.05)


# ---------------------------------------------------------------- declarations and pairing

def test_the_specs_declare_direction_cost_and_position_hooks(registry):
    for name in NAMES:
        spec = registry.get("mixer", name)
        assert spec.directions == {"causal"}
        assert (spec.complexity.time, spec.complexity.memory, spec.complexity.decode,
                spec.complexity.state) == ("L", "L", "1", "1")
        assert "bias" in spec.why_not
        assert spec.description
    assert registry.get("mixer", "retnet").position_hooks == {"embedding"}
    assert all(registry.get("mixer", n).position_hooks == {"embedding", "qk"} for n in NAMES[1:])


def test_a_score_bias_is_rejected_with_the_mixers_reason(registry):
    def model(mixer: str, position: str) -> Any:
        return harness.create_model("transformer", vocab_size=12, max_length=16, d_model=16, heads=2,
                                    layers=1, mixer=mixer, position=position, registry=registry)

    with pytest.raises(IncompatibleError, match="never forms the score matrix"):
        model("gla", "alibi")
    with pytest.raises(IncompatibleError, match="its own xPos-style"):
        model("retnet", "rope")
    model("deltanet", "rope")


# ---------------------------------------------------------------- end to end

@pytest.mark.slow
def test_a_gated_deltanet_transformer_trains_on_associative_recall(registry):
    cfg = {
        "task": {"name": "associative_recall",
                 "params": {"length": 16, "num_kv_pairs": 2, "vocab": 16, "num_train": 256,
                            "num_val": 32, "eval_lengths": []}},
        "model": {"name": "transformer", "params": {"d_model": 32, "layers": 2, "heads": 2},
                  "mixer": {"name": "gated_deltanet", "params": {"chunk": 8}},
                  "position": {"name": "none"}},
        "train": {"max_steps": 30, "batch_size": 32, "lr": 3e-3, "warmup_steps": 3, "val_every": 10,
                  "accelerator": "cpu", "devices": 1, "num_threads": 1, "progress": False,
                  "log_attention": False, "seed": 0},
        "tracking": {"experiment": "mixers-linear"},
    }
    result = harness.train(cfg, registry=registry)
    assert result.status == "FINISHED"
    assert all(math.isfinite(v) for v in result.metrics.values())
    history = MlflowClient(tracking.tracking_uri()).get_metric_history(result.run_id, "train/loss")
    losses = [h.value for h in sorted(history, key=lambda h: h.step)]
    assert len(losses) >= 3 and all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0]
