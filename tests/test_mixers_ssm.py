"""The convolutional state-space mixers (S4D, H3, Hyena): each parallel (FFT) form against a
float64 step-by-step reference written here from the paper's equations, decoding token by
token and in chunks against the full pass, causality, the declared decoding state, and one
real training run."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

import harness
from harness.nn.mixer import LayerCache

D_MODEL = 16
HEADS = 4
LENGTH = 11  # not a multiple of the decoding chunk (3)


def build(registry: Any, name: str, d_model: int = D_MODEL, heads: int = HEADS, **params: Any) -> Any:
    torch.manual_seed(0)
    spec = registry.get("mixer", name)
    return spec.build(spec.config(**params), d_model=d_model, num_heads=heads).double()


def inputs(length: int = LENGTH, seed: int = 1) -> torch.Tensor:
    return torch.randn(2, length, D_MODEL, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def conjugate_pairs(ssm: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """All N modes of a diagonal SSM (the stored N/2 and their conjugates): Ā, B̄ (ZOH, B = 1)
    and C, from the layer's raw parameters."""
    half_a = -torch.exp(ssm.log_a_real) + 1j * ssm.a_imag
    half_c = torch.view_as_complex(ssm.c.contiguous())
    a = torch.cat([half_a, half_a.conj()], dim=-1)
    c = torch.cat([half_c, half_c.conj()], dim=-1)
    dt = torch.exp(ssm.log_dt).unsqueeze(-1)
    a_bar = torch.exp(dt * a)
    b_bar = (a_bar - 1) / a  # (ΔA)^-1 (exp(ΔA) - I) ΔB with B = 1
    return a_bar, b_bar, c


def real_output(y: torch.Tensor) -> torch.Tensor:
    assert y.imag.abs().max() < 1e-9, "conjugate pairs must give a real output"
    return y.real


# ----------------------------------------------------------------------------- references


def s4d_reference(layer: Any, x: torch.Tensor) -> torch.Tensor:
    """x_k = Ā x_{k-1} + B̄ u_k, y_k = Re(C x_k) + D u_k per channel (all N modes), then
    GLU(W GELU(y) + b)."""
    a_bar, b_bar, c = conjugate_pairs(layer.ssm)
    b, n, h = x.shape
    state = torch.zeros(b, h, a_bar.shape[-1], dtype=torch.complex128)
    ys = []
    for t in range(n):
        u = x[:, t]
        state = a_bar * state + b_bar * u.unsqueeze(-1)
        ys.append(real_output((c * state).sum(-1)) + layer.skip * u)
    y = torch.stack(ys, dim=1)
    g = 0.5 * y * (1 + torch.erf(y / math.sqrt(2)))
    z = g @ layer.output.weight.T + layer.output.bias
    value, gate = z[..., :h], z[..., h:]
    return value * torch.sigmoid(gate)


def h3_reference(layer: Any, x: torch.Tensor) -> torch.Tensor:
    """The shift SSM (a register of the last N keys), the outer products k̃ vᵀ per head through
    the head's diagonal SSM, q read-out, output projection; one position at a time."""
    b, n, d = x.shape
    heads, hd, big_n = layer.num_heads, layer.head_dim, layer.d_state
    q = x @ layer.q_proj.weight.T + layer.q_proj.bias
    k = x @ layer.k_proj.weight.T + layer.k_proj.bias
    v = x @ layer.v_proj.weight.T + layer.v_proj.bias
    a_bar, b_bar, c = conjugate_pairs(layer.ssm)  # (heads, N)
    register = torch.zeros(b, d, big_n, dtype=x.dtype)  # register[:, :, i] = k_{t-i}
    state = torch.zeros(b, heads, hd, hd, big_n, dtype=torch.complex128)
    outs = []
    for t in range(n):
        register = torch.cat([k[:, t].unsqueeze(-1), register[..., :-1]], dim=-1)
        k_tilde = (layer.shift_c * register).sum(-1) + layer.shift_skip * k[:, t]
        o = torch.zeros(b, heads, hd, dtype=x.dtype)
        for h in range(heads):
            sl = slice(h * hd, (h + 1) * hd)
            kv = k_tilde[:, sl].unsqueeze(-1) * v[:, t, sl].unsqueeze(-2)  # (b, hd, hd)
            state[:, h] = a_bar[h] * state[:, h] + b_bar[h] * kv.unsqueeze(-1)
            s = real_output((c[h] * state[:, h]).sum(-1)) + layer.skip[h] * kv
            o[:, h] = torch.einsum("bi,bij->bj", q[:, t, sl], s)
        outs.append(o.reshape(b, d) @ layer.output.weight.T + layer.output.bias)
    return torch.stack(outs, dim=1)


def hyena_reference(layer: Any, x: torch.Tensor) -> torch.Tensor:
    """Short causal conv of the N+1 projected streams, then for n = N-1 .. 1 the gate and the
    direct causal convolution y_t = Σ_{s<=t} h_{t-s} w_s + b w_t, with the layer's filters."""
    b, n, d = x.shape
    order, width = layer.order, layer.kernel_size
    u = x @ layer.in_proj.weight.T + layer.in_proj.bias  # (b, n, (N+1) d)
    taps = layer.short.weight[:, 0]  # (channels, width): conv1d cross-correlation
    uc = torch.zeros_like(u)
    for t in range(n):
        uc[:, t] = layer.short.bias + sum(taps[:, width - 1 - j] * u[:, t - j] for j in range(width) if t - j >= 0)
    streams = uc.split(d, dim=-1)
    gates, z = streams[:-1], streams[-1]
    h = layer.filters(n, x.device)  # (N-1, d, n): the filter values the layer generates
    bias = layer.filter_bias.view(order - 1, d)
    for o, gate in enumerate(reversed(gates[1:])):
        w = gate * z
        z = torch.zeros_like(w)
        for t in range(n):
            z[:, t] = sum(h[o][:, t - s] * w[:, s] for s in range(t + 1)) + bias[o] * w[:, t]
    y = gates[0] * z
    return y @ layer.out_proj.weight.T + layer.out_proj.bias


REFERENCES = {"s4d": s4d_reference, "h3": h3_reference, "hyena": hyena_reference}


# ----------------------------------------------------------------------------- the checks


@pytest.mark.parametrize("params", [{}, {"init": "inv", "d_state": 8}], ids=["lin", "inv"])
def test_s4d_parallel_form_matches_the_paper_recurrence_in_float64(registry, params):
    layer = build(registry, "s4d", **params)
    x = inputs()
    out, _ = layer(x)
    torch.testing.assert_close(out, s4d_reference(layer, x), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("heads", [HEADS, D_MODEL], ids=["head_dim_4", "head_dim_1"])
def test_h3_parallel_form_matches_the_paper_recurrence_in_float64(registry, heads):
    layer = build(registry, "h3", heads=heads, d_state=6)
    x = inputs()
    out, _ = layer(x)
    torch.testing.assert_close(out, h3_reference(layer, x), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("order", [2, 3])
def test_hyena_parallel_form_matches_the_direct_causal_convolution_in_float64(registry, order):
    layer = build(registry, "hyena", order=order, filter_width=16, time_scale=16)
    x = inputs()
    out, _ = layer(x)
    torch.testing.assert_close(out, hyena_reference(layer, x), rtol=1e-10, atol=1e-10)


def test_hyena_filters_are_the_windowed_ffn_of_the_positional_encoding(registry):
    """h_t = FFN(t/T, cos(2π f t/T), -sin(2π f t/T)) · exp(-|δ| t/T), at any lag (no table)."""
    layer = build(registry, "hyena", pos_dim=5, filter_width=8, filter_layers=1, time_scale=7)
    t = torch.arange(40, dtype=torch.float64).unsqueeze(-1) / 7
    f = torch.tensor([1e-4, 1.0], dtype=torch.float64)
    pe = torch.cat([t, torch.cos(2 * math.pi * f * t), -torch.sin(2 * math.pi * f * t)], dim=-1)
    lin1, sine, lin2, _, out = layer.filter.ffn
    hidden = torch.sin(sine.freq * (pe @ lin1.weight.T + lin1.bias))
    hidden = torch.sin(sine.freq * (hidden @ lin2.weight.T + lin2.bias))
    target = math.log(1e-2)
    deltas = torch.linspace(target / 1.5, target / 0.3, D_MODEL, dtype=torch.float64)
    expected = (hidden @ out.weight.T) * torch.exp(-t * deltas.abs())
    cpu = torch.device("cpu")
    torch.testing.assert_close(layer.filters(40, cpu)[0], expected.T)
    torch.testing.assert_close(layer.filters(9, cpu)[0], expected.T[:, :9])  # the same function of t


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_decoding_token_by_token_and_in_chunks_equals_the_full_pass(registry, name):
    layer = build(registry, name).eval()
    x = inputs()
    full, _ = layer(x)
    for chunk in (1, 3):
        cache = LayerCache()
        with torch.no_grad():  # Hyena keeps its generated filters for the decoding
            parts = [layer(x[:, t:t + chunk], cache=cache)[0] for t in range(0, LENGTH, chunk)]
        torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-10, atol=1e-10)
        assert cache.length == LENGTH


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_decoding_records_gradients_like_the_full_pass(registry, name):
    layer = build(registry, name)
    x = inputs(6)
    cache = LayerCache()
    steps = torch.cat([layer(x[:, t:t + 2], cache=cache)[0] for t in range(0, 6, 2)], dim=1)
    grads = torch.autograd.grad(steps.sum(), list(layer.parameters()), allow_unused=True)
    full = torch.autograd.grad(layer(x)[0].sum(), list(layer.parameters()), allow_unused=True)
    for g, f in zip(grads, full, strict=True):
        if f is not None:
            torch.testing.assert_close(g, f, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_the_mixers_are_causal(registry, name):
    layer = build(registry, name)
    x = inputs()
    out, _ = layer(x)
    for t in (0, 4, LENGTH - 1):
        changed = x.clone()
        changed[:, t] += torch.randn(2, D_MODEL, dtype=torch.float64)
        other, _ = layer(changed)
        torch.testing.assert_close(other[:, :t], out[:, :t], rtol=0, atol=1e-12)
        assert (other[:, t] - out[:, t]).abs().max() > 1e-6
    prefix, _ = layer(x[:, :5])  # a prefix's outputs do not depend on what follows it
    torch.testing.assert_close(prefix, out[:, :5], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_state_size_is_what_the_cache_keeps(registry, name):
    layer = build(registry, name)
    sizes = {}
    for length in (1, 7):
        cache = LayerCache()
        with torch.no_grad():
            for t in range(length):
                layer(inputs(length)[:, t:t + 1], cache=cache)
        assert cache.numel_per_sequence() == layer.state_size(length)
        sizes[length] = layer.state_size(length)
    constant = layer.complexity.state == "1"
    assert (sizes[1] == sizes[7]) is constant


def test_the_declared_state_sizes_follow_the_papers(registry):
    n = 16
    assert build(registry, "s4d", d_state=n).state_size(100) == D_MODEL * n  # N/2 complex per channel
    h3 = build(registry, "h3", d_state=n)  # shift register (N-1 keys) + d_h x d_h x N per head
    assert h3.state_size(100) == D_MODEL * (n - 1) + HEADS * (D_MODEL // HEADS) ** 2 * n
    hyena = build(registry, "hyena", order=3, short_conv=4)  # short-conv tail + 2 histories
    assert hyena.state_size(100) == 4 * D_MODEL * 3 + 2 * D_MODEL * 100


def test_hyena_runs_past_its_time_scale_and_decodes_there(registry):
    layer = build(registry, "hyena", time_scale=4).eval()
    x = inputs(LENGTH)
    full, _ = layer(x)
    assert torch.isfinite(full).all()
    cache = LayerCache()
    with torch.no_grad():
        layer(x[:, :5], cache=cache)
        layer.train()  # a mode switch drops the generated filters; decoding goes on exactly
        layer.eval()
        rest = torch.cat([layer(x[:, t:t + 1], cache=cache)[0] for t in range(5, LENGTH)], dim=1)
    torch.testing.assert_close(rest, full[:, 5:], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_bfloat16_autocast_runs_the_long_convolutions_in_float32(registry, name):
    spec = registry.get("mixer", name)
    torch.manual_seed(0)
    layer = spec.build(spec.config(), d_model=D_MODEL, num_heads=HEADS)
    x = inputs().float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = layer(x)
    reference, _ = layer(x)
    assert torch.isfinite(out).all()
    scale = reference.abs().max()
    assert (out.float() - reference).abs().max() < 0.1 * scale


def test_bad_params_are_rejected_with_the_field_named(registry):
    from harness.errors import ConfigError

    with pytest.raises(ConfigError, match="d_state"):
        harness.create_model("transformer", vocab_size=8, max_length=8, d_model=16, heads=2,
                             mixer="s4d", mixer_params={"d_state": 7}, position="none",
                             registry=registry)
    with pytest.raises(ConfigError, match="pos_dim"):
        harness.create_model("transformer", vocab_size=8, max_length=8, d_model=16, heads=2,
                             mixer="hyena", mixer_params={"pos_dim": 4}, position="none",
                             registry=registry)


def test_the_mixers_are_listed_with_their_declarations(registry):
    for name in REFERENCES:
        spec = registry.get("mixer", name)
        assert spec.directions == {"causal"} and spec.position_hooks == {"embedding"}
        assert spec.complexity.time == "L log L"
        assert set(spec.why_not) == {"qk", "bias"}
    assert registry.get("mixer", "hyena").complexity.state == "L"


@pytest.mark.slow
def test_an_ssm_transformer_learns_associative_recall(registry):
    from mlflow.tracking import MlflowClient

    from harness.store import tracking

    task = {"name": "associative_recall",
            "params": {"length": 16, "num_kv_pairs": 2, "vocab": 12, "num_train": 256, "num_val": 32,
                       "eval_lengths": [24]}}
    model = {"name": "transformer", "params": {"d_model": 32, "layers": 2, "heads": 4},
             "mixer": {"name": "h3"}, "position": {"name": "none"}}
    train = {"max_steps": 60, "batch_size": 32, "lr": 1e-2, "warmup_steps": 3, "val_every": 60,
             "progress": False, "seed": 0, "accelerator": "cpu", "devices": 1, "num_threads": 1}
    result = harness.train({"task": task, "model": model, "train": train,
                            "tracking": {"experiment": "ssm"}}, registry=registry)
    assert result.status == "FINISHED"
    assert all(math.isfinite(v) for v in result.metrics.values())
    losses = [m.value for m in MlflowClient(tracking.tracking_uri()).get_metric_history(result.run_id, "train/loss")]
    assert len(losses) >= 3 and all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.9 * losses[0], losses  # untied (the default) it starts near chance


def test_causal_fft_conv_is_the_direct_sum():
    from harness.nn.ssm import causal_fft_conv

    g = torch.Generator().manual_seed(3)
    u = torch.randn(2, 3, 9, dtype=torch.float64, generator=g)
    k = torch.randn(3, 9, dtype=torch.float64, generator=g)
    direct = torch.stack([sum(k[:, t - s] * u[..., s] for s in range(t + 1)) for t in range(9)], dim=-1)
    torch.testing.assert_close(causal_fft_conv(u, k), direct)
    assert causal_fft_conv(u.to(torch.bfloat16), k.float()).dtype == torch.float32
    assert causal_fft_conv(u, k).dtype == torch.float64
