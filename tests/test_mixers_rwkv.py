"""RWKV time mixing: the chunked parallel form against the paper's recurrence written here
(float64, plain loops over time, reading the layer's parameters), decoding token by token and
in chunks, causality, the declared state, O(L) memory, and one training run end to end."""

from __future__ import annotations

import pytest
import torch
from mlflow.tracking import MlflowClient
from test_attention_reference import LargestTensor  # one home for the memory probe

import harness
from harness.store import tracking

F64 = torch.float64
D = 16


def build(registry, name="rwkv", d_model=D, **params):
    spec = registry.get("mixer", name)
    return spec.build(spec.config(**params), d_model=d_model, num_heads=2).double().eval()


def rwkv4_reference(layer, x):
    """Eqs. 11-16 of the paper, one step at a time: token shift with μ, then
    wkv_t = (Σ_{i<t} e^{-(t-1-i)w + k_i} v_i + e^{u + k_t} v_t) / (same with 1),
    o_t = W_o (σ(r_t) ⊙ wkv_t), w = exp(time_decay), u = time_first, x_{-1} = 0."""
    b, n, d = x.shape
    w, u = layer.time_decay.double().exp(), layer.time_first.double()
    lin = {name: getattr(layer, name).weight.double() for name in ("key", "value", "receptance", "output")}
    mu = {name: getattr(layer, f"time_mix_{name}").double() for name in "kvr"}
    out = torch.zeros(b, n, d, dtype=F64)
    for t in range(n):
        prev = x[:, t - 1] if t > 0 else torch.zeros(b, d, dtype=F64)

        def mixed(m, t=t, prev=prev):
            return x[:, t] * m + prev * (1 - m)

        keys, values = [], []
        for i in range(t + 1):
            prev_i = x[:, i - 1] if i > 0 else torch.zeros(b, d, dtype=F64)
            keys.append((x[:, i] * mu["k"] + prev_i * (1 - mu["k"])) @ lin["key"].T)
            values.append((x[:, i] * mu["v"] + prev_i * (1 - mu["v"])) @ lin["value"].T)
        num = torch.exp(u + keys[t]) * values[t]
        den = torch.exp(u + keys[t])
        for i in range(t):
            weight = torch.exp(-(t - 1 - i) * w + keys[i])
            num, den = num + weight * values[i], den + weight
        r = mixed(mu["r"]) @ lin["receptance"].T
        out[:, t] = (torch.sigmoid(r) * num / den) @ lin["output"].T
    return out


def decode(layer, x, sizes):
    cache, outs, s = layer.new_cache(), [], 0
    for n in sizes:
        outs.append(layer(x[:, s: s + n], cache=cache)[0])
        s += n
    return torch.cat(outs, dim=1), cache


def scaled_up(layer):
    """Wider keys so that the running maximum matters (exponents of several tens)."""
    with torch.no_grad():
        layer.key.weight.mul_(8)
        layer.time_first.add_(torch.randn_like(layer.time_first))
    return layer


def test_rwkv_parallel_form_matches_the_paper_recurrence_in_float64(registry):
    torch.manual_seed(1)
    layer = scaled_up(build(registry, chunk=4))
    x = torch.randn(2, 13, D, dtype=F64, requires_grad=True)
    out, _ = layer(x)
    ref = rwkv4_reference(layer, x)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    g = torch.randn_like(out)
    params = [x, layer.time_decay, layer.time_first, layer.time_mix_k, layer.key.weight]
    got = torch.autograd.grad((out * g).sum(), params)
    want = torch.autograd.grad((ref * g).sum(), params)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


def test_rwkv_state_size_is_what_the_cache_keeps(registry):
    for name, size in (("rwkv", 4 * D), ("rwkv6", D * (1 + D // 2))):  # 2 heads of D/2
        layer = build(registry, name)
        for n in (1, 7):
            _, cache = decode(layer, torch.randn(2, n, D, dtype=F64), [n])
            assert layer.state_size(n) == cache.numel_per_sequence() == size
    spec = registry.get("mixer", "rwkv")
    assert spec.directions == {"causal"} and spec.complexity.state == "1"


def test_rwkv_runs_in_float32_under_bf16_autocast_and_stays_linear_in_memory(registry):
    torch.manual_seed(4)
    layer = build(registry, chunk=8).float().train()
    length = 256
    x = torch.randn(1, length, D, requires_grad=True)

    with LargestTensor() as largest:
        layer(x)[0].sum().backward()
    assert largest.numel < length * length / 4
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = layer(x)
    assert torch.isfinite(out).all()
    ref, _ = layer(x)
    assert (out.float() - ref).abs().max() < 0.1 * ref.abs().max()


def prepared(registry, name):
    """A layer whose exponentials and data-dependent parts are exercised."""
    if name == "rwkv":
        return scaled_up(build(registry, "rwkv", chunk=4))
    return randomised(build(registry, "rwkv6", chunk=4, mix_rank=8, decay_rank=16))


@pytest.mark.parametrize("name", ["rwkv", "rwkv6"])
def test_decoding_token_by_token_and_in_chunks_equals_the_full_pass(registry, name):
    torch.manual_seed(2)
    layer = prepared(registry, name)
    x = torch.randn(2, 15, D, dtype=F64)
    full, _ = layer(x)
    for sizes in ([1] * 15, [3, 1, 6, 5], [15]):
        steps, cache = decode(layer, x, sizes)
        torch.testing.assert_close(steps, full, rtol=1e-10, atol=1e-10)
        assert layer.state_size(15) == cache.numel_per_sequence()


@pytest.mark.parametrize("name", ["rwkv", "rwkv6"])
def test_is_causal(registry, name):
    torch.manual_seed(3)
    layer = prepared(registry, name)
    x = torch.randn(2, 13, D, dtype=F64)
    base, _ = layer(x)
    changed = x.clone()
    changed[:, 6:] = torch.randn(2, 7, D, dtype=F64)
    out, _ = layer(changed)
    torch.testing.assert_close(out[:, :6], base[:, :6], rtol=1e-12, atol=1e-12)
    assert not torch.allclose(out[:, 6:], base[:, 6:])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rwkv", "rwkv6"])
def test_rwkv_trains_end_to_end_in_a_transformer(registry, name):
    result = harness.train({
        "task": {"name": "copy", "params": {"length": 5, "vocab": 4, "num_train": 256, "num_val": 64,
                                            "eval_lengths": []}},
        "model": {"name": "transformer", "params": {"d_model": 32, "layers": 2, "heads": 2},
                  "mixer": {"name": name}, "position": {"name": "none"}},
        "train": {"max_steps": 40, "batch_size": 32, "lr": 3e-3, "warmup_steps": 5, "val_every": 20,
                  "progress": False, "seed": 3},
        "tracking": {"experiment": "rwkv-e2e"},
    }, registry=registry)
    assert result.status == "FINISHED"
    assert all(torch.isfinite(torch.tensor(v)) for v in result.metrics.values())
    history = MlflowClient(tracking.tracking_uri()).get_metric_history(result.run_id, "train/loss")
    losses = [h.value for h in sorted(history, key=lambda h: h.step)]
    assert losses[-1] < 0.8 * losses[0]


# == RWKV-6 (Finch) ================================================================================
def randomised(layer):
    """Every parameter random (the reference's zero-initialised low-rank maps included), so the
    data-dependent shift and decay are exercised."""
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
        layer.time_decay.add_(-0.5)
    return layer


def rwkv6_reference(layer, x):
    """Section 4.2 of the Finch paper, one token at a time: ddlerp with the low-rank map, the
    data-dependent decay w_t = exp(-exp(d_t)), per head y_t = r_t (diag(u) k_tᵀ v_t + S_{t-1}),
    S_t = diag(w_t) S_{t-1} + k_tᵀ v_t, GroupNorm per head, SiLU gate, output projection."""
    b, n, d = x.shape
    h, hs = layer.num_heads, layer.head_size
    p = {name: t.double() for name, t in layer.named_parameters()}
    W = {name: p[f"{name}.weight"] for name in ("receptance", "key", "value", "gate", "output")}
    rank = p["time_maa_w1"].shape[1] // 5
    s = [torch.zeros(b, hs, hs, dtype=F64) for _ in range(h)]
    outs = []
    for t in range(n):
        xt = x[:, t]
        dx = (x[:, t - 1] if t else torch.zeros_like(xt)) - xt
        low = torch.tanh((xt + dx * p["time_maa_x"]) @ p["time_maa_w1"])
        mixed = []
        for j in range(5):  # w, k, v, r, g
            m = low[:, j * rank:(j + 1) * rank] @ p["time_maa_w2"][j]
            mixed.append(xt + dx * (p["time_maa"][j] + m))
        xw, xk, xv, xr, xg = mixed
        w = torch.exp(-torch.exp(p["time_decay"] + torch.tanh(xw @ p["time_decay_w1"]) @ p["time_decay_w2"]))
        r, k, v = (z @ W[name].T for z, name in ((xr, "receptance"), (xk, "key"), (xv, "value")))
        g = torch.nn.functional.silu(xg @ W["gate"].T)
        ys = []
        for head in range(h):
            sl = slice(head * hs, (head + 1) * hs)
            kv = k[:, sl, None] * v[:, None, sl]  # k_tᵀ v_t
            u = p["time_faaaa"][head]
            ys.append((r[:, sl, None] * (u[:, None] * kv + s[head])).sum(1))
            s[head] = w[:, sl, None] * s[head] + kv
        y = torch.stack(ys, dim=1)
        y = (y - y.mean(-1, keepdim=True)) / torch.sqrt(y.var(-1, unbiased=False, keepdim=True) + layer.ln_x.eps)
        y = y.reshape(b, d) * p["ln_x.weight"] + p["ln_x.bias"]
        outs.append((y * g) @ W["output"].T)
    return torch.stack(outs, dim=1)


def test_rwkv6_parallel_form_matches_the_paper_recurrence_in_float64(registry):
    torch.manual_seed(5)
    layer = randomised(build(registry, "rwkv6", chunk=4, mix_rank=8, decay_rank=16))
    x = torch.randn(2, 13, D, dtype=F64, requires_grad=True)
    out, _ = layer(x)
    ref = rwkv6_reference(layer, x)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    g = torch.randn_like(out)
    params = [x, *layer.parameters()]
    for a, b in zip(torch.autograd.grad((out * g).sum(), params), torch.autograd.grad((ref * g).sum(), params),
                    strict=True):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


def test_rwkv6_stays_linear_in_memory_and_finite_under_bf16_autocast(registry):
    torch.manual_seed(8)
    layer = build(registry, "rwkv6", chunk=8).float().train()
    largest = {}
    for length in (256, 512):
        x = torch.randn(1, length, D, requires_grad=True)
        with LargestTensor() as seen:
            layer(x)[0].sum().backward()
        largest[length] = seen.numel
    assert largest[512] <= 2.2 * largest[256] and largest[512] < 512 * 512 / 4, largest
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = layer(x)
    assert torch.isfinite(out).all()
