"""The selective state-space mixers, Mamba and Mamba-2, against float64 references written here
from the papers' equations (plain loops over time, reading the layers' parameters): the
parallel (chunked) forms at several chunk sizes, their gradients, decoding token by token and
in chunks, causality, the declared decoding state, bf16 autocast, and one training run."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from mlflow.tracking import MlflowClient

import harness
from harness.errors import IncompatibleError
from harness.store import tracking
from harness_plugins.mixers.mamba import Mamba, MambaConfig, selective_scan
from harness_plugins.mixers.mamba2 import Mamba2, Mamba2Config, ssd

F64 = torch.float64
L = 12
CHUNKS = [1, 4, 5, 16]  # the plain recurrence, a divisor of L, a non-divisor, longer than L


# -- float64 references from the equations -----------------------------------------------------
def causal_conv(x: torch.Tensor, conv: Any) -> torch.Tensor:
    """out[t, c] = bias[c] + Σ_k w[c, k] x[t - (W-1) + k, c], zeros before the start."""
    w = conv.weight[:, 0]
    width = w.shape[1]
    out = torch.zeros_like(x) + (conv.bias if conv.bias is not None else 0)
    for t in range(x.shape[1]):
        for k in range(width):
            s = t - (width - 1) + k
            if s >= 0:
                out[:, t] += w[:, k] * x[:, s]
    return out


def recurrence(u, delta, A, B, C, h):
    """h_t = exp(Δ_t A) h_{t-1} + Δ_t B_t x_t, y_t = C_t h_t, one position at a time.

    u, delta: (b, L, d); A: (d, n); B, C: (b, L, n); h: (b, d, n)."""
    ys = []
    for t in range(u.shape[1]):
        h = torch.exp(delta[:, t, :, None] * A) * h + delta[:, t, :, None] * B[:, t, None, :] * u[:, t, :, None]
        ys.append((h * C[:, t, None, :]).sum(-1))
    return torch.stack(ys, 1), h


def mamba_reference(m: Mamba, x: torch.Tensor) -> torch.Tensor:
    d, n, r = m.d_inner, m.d_state, m.dt_rank
    xz = x @ m.in_proj.weight.T
    xs, z = xz[..., :d], xz[..., d:]
    u = F.silu(causal_conv(xs, m.conv1d))
    proj = u @ m.x_proj.weight.T
    delta = F.softplus(proj[..., :r] @ m.dt_proj.weight.T + m.dt_proj.bias)
    B, C = proj[..., r:r + n], proj[..., r + n:]
    y, _ = recurrence(u, delta, -torch.exp(m.A_log), B, C, torch.zeros(x.shape[0], d, n, dtype=x.dtype))
    return ((y + m.D * u) * F.silu(z)) @ m.out_proj.weight.T


def mamba2_reference(m: Mamba2, x: torch.Tensor) -> torch.Tensor:
    d, H, P, G, N = m.d_inner, m.nheads, m.headdim, m.ngroups, m.d_state
    proj = x @ m.in_proj.weight.T
    z, xbc, dt = proj[..., :d], proj[..., d:d + m.conv_dim], proj[..., d + m.conv_dim:]
    xbc = F.silu(causal_conv(xbc, m.conv1d))
    xs, B, C = xbc[..., :d], xbc[..., d:d + G * N], xbc[..., d + G * N:]
    delta = F.softplus(dt + m.dt_bias)  # (b, L, H)
    A = -torch.exp(m.A_log)
    b = x.shape[0]
    y = torch.zeros(b, x.shape[1], H, P, dtype=x.dtype)
    for head in range(H):  # the Mamba recurrence with A = a_head · I
        g = head // (H // G)
        ch = slice(head * P, (head + 1) * P)
        h = torch.zeros(b, P, N, dtype=x.dtype)
        for t in range(x.shape[1]):
            h = torch.exp(delta[:, t, head] * A[head])[:, None, None] * h \
                + delta[:, t, head, None, None] * xs[:, t, ch, None] * B[:, t, None, g * N:(g + 1) * N]
            y[:, t, head] = (h * C[:, t, None, g * N:(g + 1) * N]).sum(-1) + m.D[head] * xs[:, t, ch]
    gated = y.reshape(b, x.shape[1], d) * F.silu(z)
    groups = gated.view(b, x.shape[1], G, d // G)
    normed = groups / torch.sqrt(groups.pow(2).mean(-1, keepdim=True) + 1e-5)
    return (normed.reshape(b, x.shape[1], d) * m.norm.weight) @ m.out_proj.weight.T


# -- layers ------------------------------------------------------------------------------------
def randomised(layer: torch.nn.Module, seed: int) -> torch.nn.Module:
    """The layer in float64 with D, the norm weight and biases moved off their initial values,
    so that a mistake in any of them shows."""
    g = torch.Generator().manual_seed(seed)
    layer = layer.double()
    with torch.no_grad():
        layer.D.add_(torch.randn(layer.D.shape, generator=g, dtype=F64))
        layer.conv1d.bias.add_(0.3 * torch.randn(layer.conv1d.bias.shape, generator=g, dtype=F64))
        if hasattr(layer, "norm"):
            layer.norm.weight.add_(0.3 * torch.randn(layer.norm.weight.shape, generator=g, dtype=F64))
    return layer


def make(name: str, seed: int = 0, **params: Any) -> Any:
    torch.manual_seed(seed)
    if name == "mamba":
        return randomised(Mamba(MambaConfig(**{"d_state": 4, **params}), d_model=16, num_heads=2), seed)
    return randomised(
        Mamba2(Mamba2Config(**{"d_state": 4, "headdim": 8, "ngroups": 2, **params}), d_model=16, num_heads=2), seed)


REFERENCES = {"mamba": mamba_reference, "mamba2": mamba2_reference}
MIXERS = list(REFERENCES)


def tokens(seed: int, length: int = L) -> torch.Tensor:
    return torch.randn(2, length, 16, generator=torch.Generator().manual_seed(seed), dtype=F64)


# -- 1. the parallel form is the paper's recurrence --------------------------------------------
@pytest.mark.parametrize("chunk", CHUNKS)
def test_mamba_parallel_form_matches_the_paper_recurrence_in_float64(chunk):
    m = make("mamba", seed=chunk, chunk_size=chunk)
    x = tokens(chunk)
    out, _ = m(x)
    torch.testing.assert_close(out, mamba_reference(m, x), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("chunk", CHUNKS)
def test_mamba2_parallel_form_matches_the_paper_recurrence_in_float64(chunk):
    m = make("mamba2", seed=chunk, chunk_size=chunk)
    assert m.nheads == 4 and m.ngroups == 2  # two heads share each group's B and C
    x = tokens(chunk)
    out, _ = m(x)
    torch.testing.assert_close(out, mamba2_reference(m, x), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("parallel", [False, True], ids=["sequential", "parallel"])
@pytest.mark.parametrize("chunk", CHUNKS)
def test_the_chunked_scans_and_their_gradients_carry_a_state_through_strong_decays(chunk, parallel):
    """The scans alone, from a random initial state, with Δ A from ~0 to ~-100 per step (products
    of decays that underflow a cumulative-sum shortcut): outputs, final states and the closed-form
    gradients of Mamba's scan (either algorithm within a chunk) equal the loop's."""
    g = torch.Generator().manual_seed(chunk)
    b, d, n = 2, 3, 4
    u, B, C = (torch.randn(b, L, k, generator=g, dtype=F64) for k in (d, n, n))
    delta = torch.exp(torch.empty(b, L, d, dtype=F64).uniform_(-7, 2, generator=g))
    A = -torch.rand(d, n, generator=g, dtype=F64) * 16
    h0 = torch.randn(b, d, n, generator=g, dtype=F64)
    inputs = [t.requires_grad_() for t in (u, delta, A, B, C, h0)]
    w_y, w_h = torch.randn(b, L, d, generator=g, dtype=F64), torch.randn(b, d, n, generator=g, dtype=F64)
    y_ref, h_ref = recurrence(*inputs)
    y, h = selective_scan(*inputs, chunk, parallel=parallel)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(h, h_ref, rtol=1e-10, atol=1e-12)
    grads = torch.autograd.grad((y * w_y).sum() + (h * w_h).sum(), inputs)
    ref = torch.autograd.grad((y_ref * w_y).sum() + (h_ref * w_h).sum(), inputs)
    for name, got, want in zip(("u", "delta", "A", "B", "C", "h0"), grads, ref, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-11, msg=lambda m, p=name: f"{p}: {m}")

    # SSD: 2 heads of P = 3 in one group, scalar A per head: the recurrence with A = a I
    with torch.no_grad():
        a = A[:2, 0]
        x = torch.randn(b, L, 2, 3, generator=g, dtype=F64)
        dt = delta[..., :2]
        h0 = torch.randn(b, 2, 3, n, generator=g, dtype=F64)
        y, h = ssd(x, dt, a, B.unsqueeze(2), C.unsqueeze(2), h0, chunk)
        for head in range(2):
            y_ref, h_ref = recurrence(x[:, :, head], dt[:, :, head, None].expand(-1, -1, 3),
                                      a[head].expand(3, n), B, C, h0[:, head])
            torch.testing.assert_close(y[:, :, head], y_ref, rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(h[:, head], h_ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", MIXERS)
def test_gradients_through_the_chunked_form_match_the_recurrence(name):
    """Training goes through the chunked scan (recomputed in the backward pass for Mamba); its
    gradients for every parameter equal those of the float64 loop."""
    m = make(name, seed=7, chunk_size=5)
    x = tokens(7).requires_grad_()
    weights = torch.randn(2, L, 16, dtype=F64)
    grads = torch.autograd.grad((m(x)[0] * weights).sum(), [x, *m.parameters()])
    ref = torch.autograd.grad((REFERENCES[name](m, x) * weights).sum(), [x, *m.parameters()])
    for (pname, _), got, want in zip([("x", x), *m.named_parameters()], grads, ref, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-11, msg=lambda s, p=pname: f"{p}: {s}")


# -- 2. decoding -------------------------------------------------------------------------------
def check_decoding_equals_the_full_pass(name: str) -> None:
    m = make(name, seed=3, chunk_size=4)
    x = tokens(3, length=13)
    with torch.no_grad():
        full, _ = m(x)
        for sizes in ([1] * 13, [3, 1, 5, 4], [2, 11]):
            cache, outs, start = m.new_cache(), [], 0
            for size in sizes:
                outs.append(m(x[:, start:start + size], cache=cache)[0])
                start += size
            assert cache.length == 13
            torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-10, atol=1e-12, msg=str(sizes))


def test_mamba_decoding_token_by_token_and_in_chunks_equals_the_full_pass():
    check_decoding_equals_the_full_pass("mamba")


def test_mamba2_decoding_token_by_token_and_in_chunks_equals_the_full_pass():
    check_decoding_equals_the_full_pass("mamba2")


# -- 3. causality ------------------------------------------------------------------------------
def check_causal(name: str) -> None:
    """Changing token t changes no output before t, and does change the output at t."""
    m = make(name, seed=5, chunk_size=4)
    x = tokens(5, length=11)
    with torch.no_grad():
        out, _ = m(x)
        for t in (0, 3, 4, 10):
            changed = x.clone()
            changed[:, t] += 1.0
            new, _ = m(changed)
            torch.testing.assert_close(new[:, :t], out[:, :t], rtol=0, atol=1e-14)
            assert (new[:, t] - out[:, t]).abs().max() > 1e-6


def test_mamba_is_causal():
    check_causal("mamba")


def test_mamba2_is_causal():
    check_causal("mamba2")


# -- 4. the declared state ---------------------------------------------------------------------
def check_state_size(name: str, expected: int) -> None:
    m = make(name, seed=1)
    with torch.no_grad():
        cache = m.new_cache()
        for start in range(0, 9, 3):
            m(tokens(1, length=9)[:, start:start + 3], cache=cache)
    assert cache.numel_per_sequence() == m.state_size(9) == m.state_size(1000) == expected


def test_mamba_state_size_is_what_the_cache_keeps():
    check_state_size("mamba", 32 * (3 + 4))  # E·d = 32: conv state (d_conv - 1 = 3) + SSM state (N = 4)


def test_mamba2_state_size_is_what_the_cache_keeps():
    check_state_size("mamba2", (32 + 2 * 2 * 4) * 3 + 4 * 8 * 4)  # conv over x, B, C + H × P × N


# -- initialisation, precision, configuration --------------------------------------------------
def test_initialisation_follows_the_reference():
    torch.manual_seed(0)
    m = Mamba(MambaConfig(), d_model=64, num_heads=4)
    assert m.dt_rank == 4 and m.d_inner == 128
    torch.testing.assert_close(-torch.exp(m.A_log[5]), -torch.arange(1.0, 17.0))  # S4D-Real
    dt = F.softplus(m.dt_proj.bias)
    assert dt.min() >= 0.001 * 0.999 and dt.max() <= 0.1 * 1.001
    assert m.dt_proj.weight.abs().max() <= 0.5  # uniform in ±dt_rank^-1/2
    m2 = Mamba2(Mamba2Config(), d_model=64, num_heads=4)
    assert (m2.nheads, m2.headdim, m2.d_state) == (4, 32, 64)
    assert torch.exp(m2.A_log).min() >= 1.0 and torch.exp(m2.A_log).max() <= 16.0  # -A ~ U(1, 16)
    dt2 = F.softplus(m2.dt_bias)
    assert dt2.min() >= 0.001 * 0.999 and dt2.max() <= 0.1 * 1.001


@pytest.mark.parametrize("name", MIXERS)
def test_bf16_autocast_keeps_the_scan_in_float32(name):
    m = make(name, seed=2, chunk_size=4).float()
    x = tokens(2).float()
    exact, _ = m(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low, _ = m(x)
        cache = m.new_cache()
        m(x[:, :5], cache=cache)
    assert cache.state["ssm"].dtype == torch.float32
    assert torch.isfinite(low).all()
    torch.testing.assert_close(low.float(), exact, rtol=0.1, atol=0.1)


def test_mamba2_heads_that_do_not_divide_the_width_are_a_clear_error():
    with pytest.raises(ValueError, match=r"headdim \(64\) must divide expand \* d_model"):
        Mamba2(Mamba2Config(headdim=64), d_model=16, num_heads=2)
    with pytest.raises(ValueError, match=r"ngroups \(3\) must divide the number of heads"):
        Mamba2(Mamba2Config(headdim=8, ngroups=3), d_model=16, num_heads=2)


@pytest.mark.parametrize("name", MIXERS)
def test_the_specs_declare_a_causal_linear_time_mixer_with_embedding_positions_only(registry, name):
    spec = registry.get("mixer", name)
    assert spec.directions == {"causal"} and spec.position_hooks == {"embedding"}
    assert spec.complexity.exponent("time") == 1 and spec.complexity.exponent("state") == 0
    assert set(spec.why_not) == {"qk", "bias"}
    with pytest.raises(IncompatibleError, match="no queries and keys to rotate|does not rotate"):
        harness.create_model("transformer", vocab_size=16, max_length=8, d_model=32, mixer=name,
                             position="rope", registry=registry)


# -- 5. end to end -----------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name", MIXERS)
def test_a_pure_mixer_stack_trains_on_associative_recall(registry, name):
    result = harness.train({
        "task": {"name": "associative_recall",
                 "params": {"length": 16, "vocab": 16, "num_kv_pairs": 2, "num_train": 256, "num_val": 64}},
        "model": {"name": "transformer",
                  "params": {"d_model": 32, "layers": 2, "heads": 2, "mlp": "none", "norm_layer": "rmsnorm"},
                  "mixer": {"name": name, "params": {"d_state": 8, "chunk_size": 8}},
                  "position": {"name": "none"}},
        "train": {"max_steps": 30, "batch_size": 32, "lr": 3e-3, "warmup_steps": 3, "val_every": 10,
                  "progress": False, "seed": 1},
        "tracking": {"experiment": "selective-mixers"},
    }, registry=registry)
    assert result.status == "FINISHED"
    assert all(math.isfinite(v) for v in result.metrics.values())
    losses = [h.value for h in sorted(MlflowClient(tracking.tracking_uri()).get_metric_history(
        result.run_id, "train/loss"), key=lambda h: h.step)]
    assert len(losses) >= 3 and losses[-1] < losses[0]
