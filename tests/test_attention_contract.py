"""The contract every registered attention variant keeps, checked on each of them.

Variants are read from the registry when tests are collected, so a variant added later
(built-in or third-party) is covered without editing this file. Each is built with its
default hyper-parameters, as a study would first build it.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import harness
from harness.nn.attention import AttentionCache
from harness.nn.position import PositionScheme

D_MODEL, HEADS = 16, 2


def pytest_generate_tests(metafunc):
    if "name" in metafunc.fixturenames:
        metafunc.parametrize("name", harness.load_plugins().names("attention"))


def build(registry, name, dtype=torch.float64, **params):
    spec = registry.get("attention", name)
    return spec.build(spec.config(**params), d_model=D_MODEL, num_heads=HEADS).to(dtype).eval()


def rand(*shape, dtype=torch.float64, seed=0):
    return torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))


class Turning(PositionScheme):
    """Rotates queries/keys by position (any even width)."""

    def rotate(self, q, k, q_pos, k_pos):
        def turn(t, pos):
            half = t.shape[-1] // 2
            angle = pos.to(t.dtype)[:, None] * 0.5 ** torch.arange(half, dtype=t.dtype)[None]
            a, b = t[..., :half], t[..., half:]
            return torch.cat([a * angle.cos() - b * angle.sin(), a * angle.sin() + b * angle.cos()], -1)

        return turn(q, q_pos), turn(k, k_pos)


class TurningBiased(Turning):
    """Also a per-head distance penalty, built for HEADS heads."""

    def score_bias(self, q, q_pos, k_pos):
        slope = torch.tensor([0.5, 0.25], dtype=q.dtype)[:, None, None]
        return -(slope * (q_pos[:, None] - k_pos[None, :]).abs().to(q.dtype))[None]


def exempt(registry, name, check):
    """Skip, with the variant's declared reason, a check its spec exempts it from."""
    reason = registry.get("attention", name).exempt.get(check)
    if reason:
        pytest.skip(f"{name} is exempt from {check}: {reason}")


def causal_if_possible(registry, name):
    """The direction a direction-agnostic check runs in: causal unless the variant is
    bidirectional only (Linformer)."""
    return "causal" in registry.get("attention", name).directions


def needs(registry, name, direction):
    """Skip a check of one direction for a variant that declares it does not run that way."""
    directions = registry.get("attention", name).directions
    if direction not in directions:
        pytest.skip(f"{name} runs only {', '.join(sorted(directions))}")


def scheme_for(registry, name):
    """The richest toy scheme the variant declares it can apply."""
    hooks = registry.get("attention", name).position_hooks
    return TurningBiased() if "bias" in hooks else Turning() if "qk" in hooks else None


# -- shapes -----------------------------------------------------------------------------------
def test_shapes_in_self_and_cross_attention(registry, name):
    m = build(registry, name)
    x, memory = rand(2, 5, D_MODEL), rand(2, 7, D_MODEL, seed=1)
    out, weights = m(x, causal=causal_if_possible(registry, name), need_weights=True)
    assert out.shape == (2, 5, D_MODEL) and weights.shape[::2] == (2, 5) and weights.shape[-1] == 5
    out, weights = m(x, memory, need_weights=True)
    assert out.shape == (2, 5, D_MODEL) and weights.shape[-2:] == (5, 7)
    assert m(x)[1] is None  # weights only on request


# -- causality ---------------------------------------------------------------------------------
@pytest.mark.parametrize("with_position", [False, True])
def test_causal_output_has_exactly_zero_gradient_from_later_inputs(registry, name, with_position):
    needs(registry, name, "causal")
    m = build(registry, name)
    x = rand(2, 7, D_MODEL).requires_grad_()
    out, _ = m(x, causal=True, position=scheme_for(registry, name) if with_position else None)
    for t in range(7):
        (grad,) = torch.autograd.grad(out[:, t].sum(), x, retain_graph=True)
        assert torch.all(grad[:, t + 1:] == 0), f"position {t} reads later inputs"
        assert grad[:, : t + 1].abs().sum() > 0, f"position {t} reads nothing"


# -- padding -----------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["bidirectional", "causal", "cross"])
def test_changing_padded_keys_changes_nothing_at_real_positions(registry, name, mode):
    needs(registry, name, "bidirectional" if mode == "cross" else mode)
    m = build(registry, name)
    x, memory = rand(2, 6, D_MODEL), rand(2, 8, D_MODEL, seed=1)
    keys = memory if mode == "cross" else x
    kpm = torch.zeros(2, keys.shape[1], dtype=torch.bool)
    kpm[0, -3:] = True
    kpm[1, -1:] = True
    changed = keys.clone()
    changed[kpm] = rand(int(kpm.sum()), D_MODEL, seed=2) * 10
    causal = mode == "causal"
    position = None if mode == "cross" else scheme_for(registry, name)

    def run(keys_):
        if mode == "cross":
            return m(x, keys_, key_padding_mask=kpm)[0]
        return m(keys_, causal=causal, key_padding_mask=kpm, position=position)[0]

    before, after = run(keys), run(changed)
    real = slice(None) if mode == "cross" else ~kpm
    torch.testing.assert_close(after[real], before[real], atol=1e-12, rtol=1e-12)
    assert not torch.allclose(run(keys + 0.1)[real], before[real])  # real keys do matter


# -- symmetry ----------------------------------------------------------------------------------
def test_permuting_the_input_permutes_the_output_without_positions(registry, name):
    exempt(registry, name, "permutation_equivariance")
    m = build(registry, name)  # default windows cover these lengths
    x = rand(2, 9, D_MODEL)
    kpm = torch.zeros(2, 9, dtype=torch.bool)
    kpm[1, 6:] = True
    perm = torch.randperm(9, generator=torch.Generator().manual_seed(3))
    out, _ = m(x, key_padding_mask=kpm)
    permuted, _ = m(x[:, perm], key_padding_mask=kpm[:, perm])
    torch.testing.assert_close(permuted, out[:, perm], atol=1e-12, rtol=1e-10)
    memory = rand(2, 5, D_MODEL, seed=4)
    out, _ = m(x, memory)
    permuted, _ = m(x, memory[:, torch.tensor([3, 0, 4, 1, 2])])  # cross: keys are a set
    torch.testing.assert_close(permuted, out, atol=1e-12, rtol=1e-10)


# -- incremental decoding ----------------------------------------------------------------------
def test_cached_self_attention_decoding_equals_the_full_pass(registry, name):
    exempt(registry, name, "cache_equals_full_pass")
    needs(registry, name, "causal")
    m = build(registry, name)
    position = scheme_for(registry, name)
    x = rand(2, 11, D_MODEL)
    full, _ = m(x, causal=True, position=position)
    cache = AttentionCache()
    steps = [m(x[:, :4], causal=True, position=position, cache=cache)[0]]
    steps += [m(x[:, t: t + 1], causal=True, position=position, cache=cache)[0] for t in range(4, 9)]
    steps += [m(x[:, 9:], causal=True, position=position, cache=cache)[0]]  # a chunk of two
    assert cache.length == 11
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-12, rtol=1e-10)


def test_cached_cross_attention_decoding_equals_the_full_pass(registry, name):
    m = build(registry, name)
    x, memory = rand(2, 6, D_MODEL), rand(2, 9, D_MODEL, seed=1)
    kpm = torch.zeros(2, 9, dtype=torch.bool)
    kpm[0, 7:] = True
    full, _ = m(x, memory, key_padding_mask=kpm)
    cache = AttentionCache()
    steps = [m(x[:, t: t + 1], memory, key_padding_mask=kpm, cache=cache)[0] for t in range(6)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-12, rtol=1e-10)


# -- weights -----------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["causal", "bidirectional", "cross"])
def test_weights_are_a_distribution_over_allowed_keys(registry, name, mode):
    exempt(registry, name, "row_stochastic")
    needs(registry, name, "bidirectional" if mode == "cross" else mode)
    m = build(registry, name)
    x, memory = rand(2, 6, D_MODEL), rand(2, 8, D_MODEL, seed=1)
    keys = memory if mode == "cross" else x
    kpm = torch.zeros(2, keys.shape[1], dtype=torch.bool)
    kpm[1, -2:] = True
    mem = memory if mode == "cross" else None
    _, weights = m(x, mem, causal=mode == "causal", key_padding_mask=kpm, need_weights=True)
    lq, lk = x.shape[1], keys.shape[1]
    allowed = ~kpm[:, None, None, :].expand(2, 1, lq, lk)
    if mode == "causal":
        allowed = allowed & torch.ones(lq, lk, dtype=torch.bool).tril()
    assert torch.all(weights >= 0) and torch.all(weights[~allowed.expand_as(weights)] == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones_like(weights.sum(-1)), atol=1e-12, rtol=0)


# -- dtype, determinism, length ---------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_dtype_is_preserved(registry, name, dtype):
    m = build(registry, name, dtype=dtype)
    x = rand(2, 5, D_MODEL, dtype=dtype)
    out, weights = m(x, causal=causal_if_possible(registry, name), position=scheme_for(registry, name),
                     need_weights=True)
    assert out.dtype == dtype and weights.dtype == dtype
    assert m(x, rand(2, 3, D_MODEL, dtype=dtype))[0].dtype == dtype
    assert torch.isfinite(out.float()).all()


def test_deterministic(registry, name):
    m = build(registry, name, dtype=torch.float32)
    x = rand(2, 7, D_MODEL, dtype=torch.float32)
    causal = causal_if_possible(registry, name)
    a, _ = m(x, causal=causal)
    b, _ = m(x, causal=causal)
    assert torch.equal(a, b)
    torch.manual_seed(0)
    again = build(registry, name, dtype=torch.float32)
    torch.manual_seed(0)
    twin = build(registry, name, dtype=torch.float32)
    assert all(torch.equal(p, q) for p, q in zip(again.parameters(), twin.parameters(), strict=True))


def test_runs_far_past_the_training_length_in_a_model(registry, name):
    needs(registry, name, "causal")  # a causal LM with a cache
    exempt(registry, name, "cache_equals_full_pass")
    torch.manual_seed(0)
    model = harness.create_model("transformer", vocab_size=12, max_length=8, attention=name,
                                 position="rope", registry=registry, d_model=16, heads=2, layers=2)
    model.eval()
    tokens = torch.randint(4, 12, (2, 96))
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache()
        steps = [model(tokens[:, :80], cache=cache)] + [model(tokens[:, t: t + 1], cache=cache)
                                                          for t in range(80, 96)]
    assert torch.isfinite(full).all()
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-4, rtol=1e-4)


# -- dropout -----------------------------------------------------------------------------------
def test_dropout_is_a_hyper_parameter_off_by_default(registry, name):
    spec = registry.get("attention", name)
    fields = {f.name: f.default for f in dataclasses.fields(spec.config)}
    assert fields.get("dropout") == 0.0
    plain = build(registry, name, dtype=torch.float32)
    dropped = build(registry, name, dtype=torch.float32, dropout=0.5)
    dropped.load_state_dict(plain.state_dict())
    x = rand(2, 12, D_MODEL, dtype=torch.float32)
    causal = causal_if_possible(registry, name)
    torch.testing.assert_close(dropped(x, causal=causal)[0], plain(x, causal=causal)[0])  # eval: off
    dropped.train()
    torch.manual_seed(0)
    assert not torch.allclose(dropped(x, causal=causal)[0], plain(x, causal=causal)[0])
