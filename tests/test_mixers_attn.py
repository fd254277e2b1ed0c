"""The efficient-attention variants of the seed texts (Linformer, Performer, Reformer,
Longformer), each against a float64 reference written here from its paper's equations and
reading the layer's own parameters; plus cached decoding, causality, state size and the
memory claims (no L x L intermediate)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from test_attention_reference import LargestTensor  # one home for the memory probe

import harness
from harness.errors import ConfigError, IncompatibleError
from harness.nn.position import PositionScheme

F64 = torch.float64
D, HEADS = 16, 2


def build(registry, name, d_model=D, heads=HEADS, **params):
    spec = registry.get("attention", name)
    return spec.build(spec.config(**params), d_model=d_model, num_heads=heads).double().eval()


def lin(x, layer):
    out = x @ layer.weight.double().T
    return out + layer.bias.double() if layer.bias is not None else out


def split(t, heads=HEADS):
    b, n, _ = t.shape
    return t.view(b, n, heads, -1).transpose(1, 2)


def merge(t):
    b, h, n, d = t.shape
    return t.transpose(1, 2).reshape(b, n, h * d)


def qkv(layer, x):
    return split(lin(x, layer.q_proj)), split(lin(x, layer.k_proj)), split(lin(x, layer.v_proj))


def assert_agrees(out, ref, inputs):
    """Outputs, and gradients with respect to ``inputs``, equal in float64."""
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    g = torch.randn_like(out)
    got = torch.autograd.grad((out * g).sum(), inputs, allow_unused=True)
    want = torch.autograd.grad((ref * g).sum(), inputs, allow_unused=True)
    for a, b in zip(got, want, strict=True):
        if b is not None:
            torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


def assert_weights_give_the_output(layer, x, out, **kw):
    """The weights a full pass logs are row-stochastic and the pass that forms them (the
    explicit path) gives the same output."""
    full, weights = layer(x, need_weights=True, **kw)
    torch.testing.assert_close(full, out, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(weights.sum(-1), torch.ones(*weights.shape[:-1], dtype=F64))


def decode(layer, x, sizes, position=None):
    """Feed x through a cache in pieces of the given sizes; outputs concatenated."""
    cache, outs, s = layer.new_cache(), [], 0
    for n in sizes:
        out, _ = layer(x[:, s: s + n], causal=True, cache=cache, position=position)
        outs.append(out)
        s += n
    assert s == x.shape[1]
    return torch.cat(outs, dim=1), cache


def assert_causal(layer, x, t, position=None):
    base, _ = layer(x, causal=True, position=position)
    changed = x.clone()
    changed[:, t:] = torch.randn_like(changed[:, t:]) * 3
    out, _ = layer(changed, causal=True, position=position)
    torch.testing.assert_close(out[:, :t], base[:, :t], rtol=1e-10, atol=1e-10)
    assert not torch.allclose(out[:, t:], base[:, t:])  # the test can tell


class Rope(PositionScheme):
    """Rotate planes (i, i + d/2) by pos · 0.3^i: a rotation scheme for the hooks."""

    def rotate(self, q, k, q_pos, k_pos):
        return self.turn(q, q_pos), self.turn(k, k_pos)

    @staticmethod
    def turn(t, pos):
        half = t.shape[-1] // 2
        angle = pos.double()[:, None] * 0.3 ** torch.arange(half, dtype=F64)[None, :]
        cos, sin = angle.cos().to(t.dtype), angle.sin().to(t.dtype)
        a, b = t[..., :half], t[..., half:]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


class RopeAlibi(Rope):
    """Rotations plus a per-head linear distance bias (ALiBi-like)."""

    def score_bias(self, q, q_pos, k_pos):
        slopes = 0.5 ** torch.arange(1, HEADS + 1, dtype=F64)
        distance = (q_pos[:, None] - k_pos[None, :]).abs().double()
        return -(slopes[:, None, None] * distance)[None].to(q.dtype)


# == Performer ===================================================================================
def favor_reference(layer, x, causal, kpm=None, position=None):
    """FAVOR+ from the paper: φ(x) = m^-1/2 exp(ωᵀx' - |x'|²/2), x' = x d^-1/4, with the layer's
    ω; out_i = Σ_j φ(q_i)·φ(k_j) v_j / Σ_j φ(q_i)·φ(k_j) over the keys i may see."""
    q, k, v = qkv(layer, x)
    n = x.shape[1]
    if position is not None:
        pos = torch.arange(n)
        q, k = position.rotate(q, k, pos, pos)
    omega = layer.features.double()
    m, d = omega.shape

    def phi(t):
        t = t * d ** -0.25
        return torch.exp(t @ omega.T - (t * t).sum(-1, keepdim=True) / 2) / math.sqrt(m)

    kernel = phi(q) @ phi(k).transpose(-2, -1)
    if causal:
        kernel = kernel * torch.ones(n, n, dtype=F64).tril()
    if kpm is not None:
        kernel = kernel * (~kpm)[:, None, None, :]
    out = (kernel @ v) / kernel.sum(-1, keepdim=True)
    return lin(merge(out), layer.out_proj)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_performer_matches_the_random_feature_formula_in_float64(registry, causal):
    torch.manual_seed(1)
    layer = build(registry, "performer", features=24, chunk=4)
    x = torch.randn(2, 11, D, dtype=F64, requires_grad=True)
    kpm = None
    if not causal:
        kpm = torch.zeros(2, 11, dtype=torch.bool)
        kpm[1, 8:] = True
    out, _ = layer(x, causal=causal, key_padding_mask=kpm, position=Rope())
    ref = favor_reference(layer, x, causal, kpm, Rope())
    assert_agrees(out, ref, [x, *layer.parameters()])


def test_performer_approaches_softmax_attention_as_the_features_grow(registry):
    """The estimator is unbiased: its error shrinks like m^-1/2 (16x the features, about a
    quarter of the error; asserted: less than half) towards exact softmax attention."""
    torch.manual_seed(2)
    q, k, v = (torch.randn(2, 2, 12, 8, dtype=F64) * 0.5 for _ in range(3))
    exact = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8), dim=-1) @ v
    pos = torch.arange(12)
    errors = {}
    for m in (16, 256, 4096):
        rms = []
        for seed in range(4):
            torch.manual_seed(100 + seed)
            layer = build(registry, "performer", d_model=16, heads=2, features=m)
            out, _ = layer.attend(q, k, v, q_pos=pos, k_pos=pos, causal=False, key_padding_mask=None,
                                  bias=None, need_weights=False)
            rms.append((out - exact).pow(2).mean().sqrt())
        errors[m] = float(torch.stack(rms).mean())
    assert errors[256] < errors[16] / 2 and errors[4096] < errors[256] / 2, errors
    assert errors[4096] < 0.01, errors


def test_performer_state_size_is_what_the_cache_keeps(registry):
    layer = build(registry, "performer", features=12)
    _, cache = decode(layer, torch.randn(1, 5, D, dtype=F64), [2, 3])
    assert layer.state_size(5) == cache.numel_per_sequence() == HEADS * (12 * (D // HEADS + 1) + 1)
    assert layer.state_size(500) == layer.state_size(5)  # O(1) in the length


def test_performer_redraws_its_features_in_training_only(registry):
    torch.manual_seed(5)
    layer = build(registry, "performer", features=8, redraw_every=2).train()
    x = torch.randn(1, 4, D, dtype=F64)
    first = layer.features.clone()
    layer(x, causal=True)
    assert torch.equal(layer.features, first)
    layer(x, causal=True)
    assert not torch.equal(layer.features, first)  # the second training call redrew
    drawn = layer.features.clone()
    layer.eval()
    for _ in range(3):
        layer(x, causal=True)
    assert torch.equal(layer.features, drawn)
    # orthogonal blocks: the directions of one block are orthogonal
    unit = F.normalize(drawn, dim=-1)[: D // HEADS]
    torch.testing.assert_close(unit @ unit.T, torch.eye(D // HEADS, dtype=F64), atol=1e-6, rtol=0)


def test_performer_cached_cross_attention_reuses_the_memory_sums(registry):
    torch.manual_seed(6)
    layer = build(registry, "performer", features=16)
    x, memory = torch.randn(2, 4, D, dtype=F64), torch.randn(2, 7, D, dtype=F64)
    kpm = torch.zeros(2, 7, dtype=torch.bool)
    kpm[0, 5:] = True
    full, _ = layer(x, memory, key_padding_mask=kpm)
    cache = layer.new_cache()
    steps = [layer(x[:, t: t + 1], memory, key_padding_mask=kpm, cache=cache)[0] for t in range(4)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-10, atol=1e-10)
    assert set(cache.state) == {"kv", "z", "m"}


# == Linformer ===================================================================================
def linformer_reference(layer, x, kpm, sharing):
    """Eq. 7 of the paper: head_i = softmax(Q_i (E_i K_i)ᵀ / √d) F_i V_i, E, F read from the layer
    (sliced to the sequence); padded keys and values are zero before the projection."""
    q, k, v = qkv(layer, x)
    n = x.shape[1]
    if kpm is not None:
        keep = (~kpm)[:, None, :, None].double()
        k, v = k * keep, v * keep
    heads = []
    for h in range(HEADS):
        if sharing == "none":
            e, f = layer.proj_k[h, :n].double(), layer.proj_v[h, :n].double()
        elif sharing == "headwise":
            e, f = layer.proj_k[:n].double(), layer.proj_v[:n].double()
        else:
            e = f = layer.proj_k[:n].double()
        scores = q[:, h] @ (e.T @ k[:, h]).transpose(-2, -1) / math.sqrt(q.shape[-1])
        heads.append(torch.softmax(scores, dim=-1) @ (f.T @ v[:, h]))
    return lin(merge(torch.stack(heads, dim=1)), layer.out_proj)


@pytest.mark.parametrize("sharing", ["none", "headwise", "key-value"])
def test_linformer_matches_the_paper_in_float64(registry, sharing):
    torch.manual_seed(7)
    layer = build(registry, "linformer", max_length=16, k=5, sharing=sharing)
    x = torch.randn(2, 11, D, dtype=F64)
    kpm = torch.zeros(2, 11, dtype=torch.bool)
    kpm[1, 7:] = True
    out, weights = layer(x, key_padding_mask=kpm, need_weights=True)
    torch.testing.assert_close(out, linformer_reference(layer, x, kpm, sharing), rtol=1e-10, atol=1e-10)
    assert weights.shape == (2, HEADS, 11, 11)
    if sharing == "key-value":
        assert layer.proj_k is layer.proj_v
    # a pad never reaches a real position
    noisy = x.clone()
    noisy[1, 7:] = torch.randn(4, D, dtype=F64) * 5
    out2, _ = layer(noisy, key_padding_mask=kpm)
    torch.testing.assert_close(out2[1, :7], out[1, :7], rtol=1e-12, atol=1e-12)


def test_linformer_is_fixed_length_and_bidirectional_only(registry):
    layer = build(registry, "linformer", max_length=8, k=4)
    assert layer.supports_length(8) and not layer.supports_length(9)
    with pytest.raises(ValueError, match="max_length=8.*set attention.params.max_length to at least 9"):
        layer(torch.randn(1, 9, D, dtype=F64))
    with pytest.raises(ValueError, match="cannot attend causally"):
        layer(torch.randn(1, 4, D, dtype=F64), causal=True)
    with pytest.raises(ValueError, match="no causal form and no decoding cache"):
        layer(torch.randn(1, 4, D, dtype=F64), causal=True, cache=layer.new_cache())
    assert layer.state_size(5) == 0
    spec = registry.get("attention", "linformer")
    assert spec.directions == {"bidirectional"} and "permutation_equivariance" in spec.exempt
    with pytest.raises(ConfigError, match="lm|bidirectional|causal"):
        harness.create_model("transformer", vocab_size=10, attention="linformer", position="none",
                             registry=registry)


def test_linformer_rejects_rotations_and_biases_with_its_reason(registry):
    with pytest.raises(IncompatibleError, match="mixes the keys across positions"):
        harness.create_model("transformer", vocab_size=10, attention="linformer", position="rope",
                             batch_format="classification", num_classes=3, registry=registry)


# == Reformer ====================================================================================
def shared_qk(layer, x):
    qk = split(lin(x, layer.q_proj))
    return qk, qk / qk.norm(dim=-1, keepdim=True), split(lin(x, layer.v_proj))


def test_reformer_with_one_bucket_and_one_chunk_is_exact_shared_qk_attention(registry):
    torch.manual_seed(8)
    layer = build(registry, "reformer", n_buckets=1, n_hashes=2, chunk=16)
    x = torch.randn(2, 9, D, dtype=F64)
    for causal in (True, False):
        out, _ = layer(x, causal=causal)
        q, keys, v = shared_qk(layer, x)
        scores = q @ keys.transpose(-2, -1) / math.sqrt(q.shape[-1])
        eye = torch.eye(9, dtype=torch.bool)
        allowed = ~eye & (torch.ones(9, 9).tril().bool() if causal else True)
        allowed[0, 0] = causal  # causal position 0 has no other key: it attends to itself
        weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
        torch.testing.assert_close(out, lin(merge(weights @ v), layer.out_proj), rtol=1e-9, atol=1e-9)


def lsh_reference(layer, x, causal, chunk):
    """Hash each normalised key per round (argmax of [xR; -xR] with the layer's R); a query
    sees keys of its bucket whose in-bucket chunk (rank // chunk) is its own or the previous
    one (causal: not later), itself only with a score lowered by 1e5; rounds combined by
    softmax over their log-sum-exps. Plain loops."""
    q, keys, v = shared_qk(layer, x)
    b_, h_, n, d = q.shape
    rot = layer.rotations.double()
    out = torch.zeros_like(v)
    for b in range(b_):
        for h in range(h_):
            rounds = []
            for r in range(rot.shape[0]):
                turned = keys[b, h] @ rot[r]
                bucket = torch.cat([turned, -turned], -1).argmax(-1).tolist()
                rank = [sum(bucket[s] == bucket[t] for s in range(t)) for t in range(n)]
                rounds.append((bucket, rank))
            for i in range(n):
                lses, outs = [], []
                for bucket, rank in rounds:
                    js = [j for j in range(n) if bucket[j] == bucket[i]
                          and rank[i] // chunk - 1 <= rank[j] // chunk <= rank[i] // chunk
                          and (j <= i or not causal)]
                    s = torch.stack([q[b, h, i] @ keys[b, h, j] / math.sqrt(d) - 1e5 * (i == j) for j in js])
                    lses.append(torch.logsumexp(s, 0))
                    outs.append(torch.softmax(s, 0) @ v[b, h, js])
                share = torch.softmax(torch.stack(lses), 0)
                out[b, h, i] = (share[:, None] * torch.stack(outs)).sum(0)
    return lin(merge(out), layer.out_proj)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_reformer_matches_a_direct_hashed_and_chunked_reference_in_float64(registry, causal):
    torch.manual_seed(9)
    layer = build(registry, "reformer", n_buckets=4, n_hashes=2, chunk=2)
    x = torch.randn(2, 13, D, dtype=F64)
    out, weights = layer(x, causal=causal)
    torch.testing.assert_close(out, lsh_reference(layer, x, causal, 2), rtol=1e-9, atol=1e-9)
    # the dense form (weights for logging, and decoding) computes the same attention
    assert_weights_give_the_output(layer, x, out, causal=causal)


def test_reformer_in_float32_agrees_with_float64_where_tokens_see_only_themselves(registry):
    """The self score (-1e5) keeps few digits in float32: the weights and the rounds' shares
    must still sum to one (position 0, causal, sees only itself)."""
    torch.manual_seed(17)
    layer = build(registry, "reformer", d_model=32)
    x = torch.randn(2, 9, 32, dtype=F64)
    want, _ = layer(x, causal=True)
    got, _ = layer.float()(x.float(), causal=True)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)


def test_reformer_state_size_is_what_the_cache_keeps(registry):
    layer = build(registry, "reformer", n_buckets=4, n_hashes=3, chunk=2)
    _, cache = decode(layer, torch.randn(2, 9, D, dtype=F64), [4, 1, 4])
    assert layer.state_size(9) == cache.numel_per_sequence()


def test_reformer_padding_never_reaches_a_real_position(registry):
    torch.manual_seed(12)
    layer = build(registry, "reformer", n_buckets=2, n_hashes=2, chunk=3)
    x = torch.randn(2, 10, D, dtype=F64)
    kpm = torch.zeros(2, 10, dtype=torch.bool)
    kpm[0, 6:] = True
    out, _ = layer(x, key_padding_mask=kpm)
    noisy = x.clone()
    noisy[0, 6:] = torch.randn(4, D, dtype=F64)
    out2, _ = layer(noisy, key_padding_mask=kpm)
    torch.testing.assert_close(out2[0, :6], out[0, :6], rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="n_buckets"):
        registry.get("attention", "reformer").config(n_buckets=3)


# == Longformer ==================================================================================
def longformer_reference(layer, x, causal, kpm, window, g, position=None):
    """Dense attention under the Longformer mask built explicitly: a local query sees keys with
    |i - j| < window or j < g (global), one softmax; a global query (i < g) sees every key,
    with the global projections. Causal: nothing later."""
    n = x.shape[1]
    q, k, v = qkv(layer, x)
    pos = torch.arange(n)
    bias = 0.0
    if position is not None:
        q, k = position.rotate(q, k, pos, pos)
        bias = position.score_bias(q, pos, pos)
    i, j = pos[:, None], pos[None, :]
    local = ((i - j).abs() < window) | (j < g)
    everything = torch.ones(n, n, dtype=torch.bool)
    if causal:
        local, everything = local & (j <= i), everything & (j <= i)
    keep = (~kpm)[:, None, None, :] if kpm is not None else True

    def attend(q, k, v, allowed):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + bias
        return torch.softmax(scores.masked_fill(~(allowed & keep), float("-inf")), -1) @ v

    out = attend(q, k, v, local)
    if layer.separate_global:
        q, k, v = (split(lin(x, p)) for p in (layer.query_global, layer.key_global, layer.value_global))
        if position is not None:
            q, k = position.rotate(q, k, pos, pos)
    glob = attend(q, k, v, everything)
    out = torch.where((pos < g)[None, None, :, None], glob, out)
    return lin(merge(out), layer.out_proj)


@pytest.mark.parametrize("separate", [True, False], ids=["global-projections", "shared-projections"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_longformer_matches_dense_attention_under_its_mask_in_float64(registry, causal, separate):
    torch.manual_seed(13)
    layer = build(registry, "longformer", window=3, num_global=2, block=4, separate_global=separate)
    x = torch.randn(2, 13, D, dtype=F64, requires_grad=True)
    kpm = None
    if not causal:
        kpm = torch.zeros(2, 13, dtype=torch.bool)
        kpm[1, 10:] = True
    scheme = RopeAlibi()
    out, _ = layer(x, causal=causal, key_padding_mask=kpm, position=scheme)
    ref = longformer_reference(layer, x, causal, kpm, 3, 2, scheme)
    assert_agrees(out, ref, [x, *layer.parameters()])
    assert_weights_give_the_output(layer, x, out, causal=causal, key_padding_mask=kpm, position=scheme)


@pytest.mark.parametrize("separate", [True, False])
def test_longformer_state_size_is_what_the_cache_keeps(registry, separate):
    layer = build(registry, "longformer", window=4, num_global=3, separate_global=separate)
    for n in (2, 9):
        _, cache = decode(layer, torch.randn(1, n, D, dtype=F64), [1] * n)
        assert layer.state_size(n) == cache.numel_per_sequence()
    assert layer.state_size(900) == layer.state_size(9)  # window + globals, whatever the length


# == decoding (token by token and in chunks, the same as the full pass) and causality =============
DECODING = {
    # large inputs for performer, so that the running key stabiliser moves
    "performer": ({"features": 20, "chunk": 4}, Rope(), 2.0),
    "reformer": ({"n_buckets": 4, "n_hashes": 3, "chunk": 2}, Rope(), 1.0),
    "longformer": ({"window": 3, "num_global": 2, "block": 4}, RopeAlibi(), 1.0),
}


@pytest.mark.parametrize("name", DECODING)
def test_decoding_token_by_token_and_in_chunks_equals_the_full_pass(registry, name):
    params, scheme, scale = DECODING[name]
    torch.manual_seed(len(name))
    layer = build(registry, name, **params)
    x = torch.randn(2, 15, D, dtype=F64) * scale
    full, _ = layer(x, causal=True, position=scheme)
    for sizes in ([1] * 15, [3, 1, 6, 5], [1, 14], [15]):
        steps, cache = decode(layer, x, sizes, scheme)
        torch.testing.assert_close(steps, full, rtol=1e-9, atol=1e-9)
        assert layer.state_size(15) == cache.numel_per_sequence()


@pytest.mark.parametrize("name", DECODING)
def test_is_causal(registry, name):
    params, scheme, scale = DECODING[name]
    torch.manual_seed(len(name) + 1)
    layer = build(registry, name, **params)
    assert_causal(layer, torch.randn(2, 13, D, dtype=F64) * scale, t=6, position=scheme)


# == memory: no L x L intermediate ================================================================
@pytest.mark.parametrize("name,params,causal", [
    ("performer", {"features": 16, "chunk": 16}, True),
    ("performer", {"features": 16}, False),
    ("linformer", {"k": 16}, False),
    ("reformer", {"n_buckets": 8, "chunk": 16}, True),
    ("longformer", {"window": 8, "num_global": 2}, True),
    ("longformer", {"window": 8, "num_global": 2}, False),
])
def test_no_variant_forms_the_score_matrix(registry, name, params, causal):
    """The largest tensor (forward and backward) grows linearly with the length and stays far
    below L x L."""
    largest = {}
    for length in (512, 1024):
        torch.manual_seed(16)
        layer = build(registry, name, max_length=1024, **params) if name == "linformer" else build(
            registry, name, **params)
        layer = layer.float().train()
        x = torch.randn(1, length, D, requires_grad=True)
        with LargestTensor() as seen:
            out, _ = layer(x, causal=causal)
            out.sum().backward()
        largest[length] = seen.numel
    assert largest[1024] <= 2.2 * largest[512], largest
    assert largest[1024] < 1024 * 1024 / 4, largest


# == end to end: a short training run per variant ================================================
def e2e_config(model: dict) -> dict:
    return {
        "task": {"name": "copy", "params": {"length": 5, "vocab": 4, "num_train": 256, "num_val": 64,
                                            "eval_lengths": []}},
        "model": model,
        "train": {"max_steps": 40, "batch_size": 32, "lr": 3e-3, "warmup_steps": 5, "val_every": 20,
                  "progress": False, "seed": 3},
        "tracking": {"experiment": "efficient-attention-e2e"},
    }


E2E = {
    "performer": {"name": "transformer", "params": {"d_model": 32, "layers": 2, "heads": 2},
                  "attention": {"name": "performer", "params": {"features": 32, "redraw_every": 10}},
                  "position": {"name": "rope"}},
    "reformer": {"name": "transformer", "params": {"d_model": 32, "layers": 2, "heads": 2},
                 "attention": {"name": "reformer", "params": {"n_buckets": 2, "chunk": 8}},
                 "position": {"name": "rope"}},
    "longformer": {"name": "transformer", "params": {"d_model": 32, "layers": 2, "heads": 2},
                   "attention": {"name": "longformer", "params": {"window": 4, "num_global": 1}},
                   "position": {"name": "alibi"}},
    # Linformer is bidirectional: the encoder of an encoder-decoder
    "linformer": {"name": "encoder_decoder",
                  "params": {"d_model": 32, "encoder_layers": 1, "decoder_layers": 1, "heads": 2},
                  "attention": {"name": "multi_head"}, "position": {"name": "sinusoidal"},
                  "attention_roles": {"encoder": {"name": "linformer", "params": {"max_length": 16, "k": 8}}}},
}


@pytest.mark.slow
@pytest.mark.parametrize("name", E2E)
def test_each_variant_trains_end_to_end(registry, name):
    from mlflow.tracking import MlflowClient

    from harness.store import tracking

    result = harness.train(e2e_config(E2E[name]), registry=registry)
    assert result.status == "FINISHED"
    assert all(math.isfinite(v) for v in result.metrics.values())
    history = MlflowClient(tracking.tracking_uri()).get_metric_history(result.run_id, "train/loss")
    losses = [h.value for h in sorted(history, key=lambda h: h.step)]
    assert losses[-1] < 0.8 * losses[0], losses
