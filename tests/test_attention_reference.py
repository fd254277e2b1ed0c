"""Each attention variant against an independent float64 implementation written here.

The references use plain tensor math on the module's own parameters (read, never its
code): projections, scores, masks built from explicit index comparisons, softmax (or the
linear kernel), the weighted sum and the output projection. Outputs and gradients (inputs
and every parameter) must agree on fresh random inputs, with and without causal and
padding masks, for self- and cross-attention, with and without a position scheme acting
through rotations and score biases. Plus: ``multi_head`` against ``nn.MultiheadAttention``
with copied weights, chunked ``additive`` against unchunked, and the memory claims
(chunked additive, causal linear and sliding window never form the big tensor).
"""

from __future__ import annotations

import math
import zlib

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import harness
from harness.config import parse_run_config
from harness.errors import IncompatibleError
from harness.nn.attention import AttentionCache
from harness.nn.position import PositionScheme
from harness.run.plan import plan

D_MODEL, MODEL_HEADS = 16, 2
F64 = torch.float64


# -- a toy position scheme: rotations and per-head biases, built for MODEL_HEADS ------------
def turn(t: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Rotate planes (i, i + w/2) of the last dim by pos * 0.3^i (any even width)."""
    half = t.shape[-1] // 2
    angle = pos.double()[:, None] * 0.3 ** torch.arange(half, dtype=F64)[None, :]
    cos, sin = angle.cos().to(t.dtype), angle.sin().to(t.dtype)
    a, b = t[..., :half], t[..., half:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


def slopes(heads: int) -> torch.Tensor:
    return 0.5 ** torch.arange(1, heads + 1, dtype=F64)


class Rotating(PositionScheme):
    def rotate(self, q, k, q_pos, k_pos):
        return turn(q, q_pos), turn(k, k_pos)


class RotatingBiased(Rotating):
    def score_bias(self, q, q_pos, k_pos):
        distance = (q_pos[:, None] - k_pos[None, :]).abs().double()
        return -(slopes(MODEL_HEADS)[:, None, None] * distance).to(q.dtype)[None]  # (1, P, Lq, Lk)


# -- the reference ---------------------------------------------------------------------------
def linear_map(x, layer):
    out = x @ layer.weight.double().T
    return out + layer.bias.double() if getattr(layer, "bias", None) is not None else out


def allowed_pairs(lq, lk, batch, causal, kpm, window=None):
    """(B, 1, Lq, Lk) from explicit index comparisons."""
    i = torch.arange(lq)[:, None]
    j = torch.arange(lk)[None, :]
    ok = torch.ones(lq, lk, dtype=torch.bool)
    if causal:
        ok = ok & (j <= i)
    if window is not None:
        ok = ok & ((i - j).abs() < window)
    ok = ok[None, None].expand(batch, 1, lq, lk)
    if kpm is not None:
        ok = ok & ~kpm[:, None, None, :]
    return ok


def by_heads(t, h):
    b, n, w = t.shape
    return t.view(b, n, h, w // h).transpose(1, 2)


def in_model_heads(t, fn):
    """Apply ``fn`` to (B, L, W) regrouped as MODEL_HEADS heads; return (B, L, W)."""
    b, n, w = t.shape
    grouped = t.view(b, n, MODEL_HEADS, w // MODEL_HEADS).transpose(1, 2)
    return fn(grouped).transpose(1, 2).reshape(b, n, w)


def reference(name, m, x, memory=None, *, causal=False, kpm=None, scheme=None):
    """The variant's output and weights in float64, from its parameters only."""
    x = x.double()
    src = x if memory is None else memory.double()
    h, lq, lk, b = m.num_heads, x.shape[1], src.shape[1], x.shape[0]
    if name in ("dot_product", "general"):
        q, k = x, (src if name == "dot_product" else src @ m.k_proj.weight.double().T)
    elif name == "additive":
        q, k = linear_map(x, m.q_proj), src @ m.k_proj.weight.double().T
    else:
        q, k = linear_map(x, m.q_proj), linear_map(src, m.k_proj)
    v = by_heads(linear_map(src, m.v_proj), h)
    q_pos, k_pos = torch.arange(lq), torch.arange(lk)
    if scheme is not None:
        q = in_model_heads(q, lambda t: turn(t, q_pos))
        k = in_model_heads(k, lambda t: turn(t, k_pos))
    q, k = by_heads(q, h), by_heads(k, h)
    window = m.window if (name == "sliding_window" and memory is None) else None
    allowed = allowed_pairs(lq, lk, b, causal, kpm, window)
    if name == "linear":
        kernel = (F.elu(q) + 1) @ (F.elu(k) + 1).transpose(-2, -1)
        kernel = kernel * allowed
        total = kernel.sum(-1, keepdim=True)
        weights = kernel / torch.where(total > 0, total, torch.ones_like(total))
    else:
        if name in ("dot_product", "general"):
            scores = q @ k.transpose(-2, -1)
        elif name == "additive":
            hidden = torch.tanh(q[:, :, :, None, :] + k[:, :, None, :, :])
            scores = torch.einsum("bhija,ha->bhij", hidden, m.score_vector.double())
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if isinstance(scheme, RotatingBiased):
            per_model_head = -slopes(MODEL_HEADS)[:, None, None] * (q_pos[:, None] - k_pos[None, :]).abs()
            if h <= MODEL_HEADS:
                bias = per_model_head.view(h, MODEL_HEADS // h, lq, lk).mean(1)
            else:
                bias = per_model_head.repeat_interleave(h // MODEL_HEADS, dim=0)
            scores = scores + bias[None]
        scores = scores.masked_fill(~allowed, -math.inf)
        weights = torch.exp(scores - scores.amax(-1, keepdim=True).clamp(min=-1e300))
        total = weights.sum(-1, keepdim=True)
        weights = weights / torch.where(total > 0, total, torch.ones_like(total))
    mixed = (weights @ v).transpose(1, 2).reshape(b, lq, -1)
    return linear_map(mixed, m.out_proj), weights


# -- fixtures and helpers --------------------------------------------------------------------
def build(registry, name, **params):
    spec = registry.get("attention", name)
    config = spec.config(**params)
    return spec.build(config, d_model=D_MODEL, num_heads=MODEL_HEADS).double().eval()


VARIANTS = {
    "dot_product": {},
    "general": {},
    "scaled_dot_product": {},
    "scaled_dot_product-4heads-tied": {"heads": 4, "tied_qk": True},
    "multi_head": {},
    "multi_head-tied": {"tied_qk": True},
    "additive": {},
    "additive-2heads-d_att4": {"heads": 2, "d_att": 4},
    "linear": {"chunk": 3},
    "sliding_window": {"window": 3},
    "sliding_window-blocks": {"window": 3, "block": 2},
}
CASES = {  # (cross, causal, padding, scheme)
    "self": (False, False, False, None),
    "self-causal": (False, True, False, None),
    "self-padded": (False, False, True, None),
    "self-causal-padded": (False, True, True, None),
    "self-causal-rotate-bias": (False, True, False, RotatingBiased),
    "self-padded-rotate-bias": (False, False, True, RotatingBiased),
    "cross": (True, False, False, None),
    "cross-padded": (True, False, True, None),
}


def padding(batch, length):
    """Item 0 right-padded, item 1 left-padded (its first queries see no key if causal)."""
    kpm = torch.zeros(batch, length, dtype=torch.bool)
    kpm[0, length - 2:] = True
    kpm[1, :2] = True
    return kpm


def grads(out, inputs, params, seed):
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    return torch.autograd.grad((out * g).sum(), [*inputs, *params], allow_unused=True)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_matches_float64_reference(registry, variant, case):
    name, params = variant.split("-")[0], VARIANTS[variant]
    cross, causal, padded, scheme_cls = CASES[case]
    if name == "linear" and scheme_cls is RotatingBiased:
        scheme_cls = Rotating  # linear declares it cannot take a score bias (tested below)
    torch.manual_seed(zlib.crc32(f"{variant}/{case}".encode()))
    m = build(registry, name, **params)
    x = torch.randn(2, 7, D_MODEL, dtype=F64, requires_grad=True)
    memory = torch.randn(2, 5, D_MODEL, dtype=F64, requires_grad=True) if cross else None
    kpm = padding(2, (memory if cross else x).shape[1]) if padded else None
    scheme = scheme_cls() if scheme_cls else None

    out, weights = m(x, memory, causal=causal, key_padding_mask=kpm, position=scheme, need_weights=True)
    plain, _ = m(x, memory, causal=causal, key_padding_mask=kpm, position=scheme)
    want, want_weights = reference(name, m, x, memory, causal=causal, kpm=kpm, scheme=scheme)

    torch.testing.assert_close(out, want, atol=1e-10, rtol=1e-9)
    torch.testing.assert_close(plain, want, atol=1e-10, rtol=1e-9)  # the fast path
    torch.testing.assert_close(weights, want_weights, atol=1e-10, rtol=1e-9)
    inputs = [x] if memory is None else [x, memory]
    params_ = [p for p in m.parameters()]
    got_g = grads(plain, inputs, params_, seed=1)
    want_g = grads(want, inputs, params_, seed=1)
    labels = ["x", "memory"][: len(inputs)] + [n for n, _ in m.named_parameters()]
    for got, exp, label in zip(got_g, want_g, labels, strict=True):
        assert got is not None and exp is not None, label
        assert torch.isfinite(got).all(), label
        torch.testing.assert_close(got, exp, atol=1e-10, rtol=1e-9, msg=f"gradient of {label}")


# -- multi_head against PyTorch's own module -------------------------------------------------
@pytest.mark.parametrize("cross", [False, True])
def test_multi_head_equals_torch_multihead_attention(registry, cross):
    torch.manual_seed(5)
    spec = registry.get("attention", "multi_head")
    ours = spec.build(spec.config(), d_model=D_MODEL, num_heads=4)
    theirs = torch.nn.MultiheadAttention(D_MODEL, 4, batch_first=True)
    with torch.no_grad():
        w, b = theirs.in_proj_weight, theirs.in_proj_bias
        for i, proj in enumerate((ours.q_proj, ours.k_proj, ours.v_proj)):
            proj.weight.copy_(w[i * D_MODEL: (i + 1) * D_MODEL])
            proj.bias.copy_(b[i * D_MODEL: (i + 1) * D_MODEL])
        ours.out_proj.weight.copy_(theirs.out_proj.weight)
        ours.out_proj.bias.copy_(theirs.out_proj.bias)
    ours.eval(), theirs.eval()
    x = torch.randn(3, 9, D_MODEL)
    memory = torch.randn(3, 6, D_MODEL) if cross else None
    keys = memory if cross else x
    kpm = torch.zeros(3, keys.shape[1], dtype=torch.bool)
    kpm[0, -2:] = True
    causal_mask = None if cross else torch.ones(9, 9, dtype=torch.bool).triu(1)
    got, got_w = ours(x, memory, causal=not cross, key_padding_mask=kpm, need_weights=True)
    fast, _ = ours(x, memory, causal=not cross, key_padding_mask=kpm)
    want, want_w = theirs(x, keys, keys, key_padding_mask=kpm, attn_mask=causal_mask,
                          need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(fast, want, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(got_w, want_w, atol=1e-5, rtol=1e-4)


# -- additive: chunked equals unchunked, and the big tensor is never formed -------------------
class LargestTensor(TorchDispatchMode):
    """Records the largest tensor any operation produces (forward and backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out


def fwd_bwd(m, x, memory=None, causal=False):
    out, _ = m(x, memory, causal=causal)
    inputs = [x] if memory is None else [x, memory]
    return out, grads(out, inputs, list(m.parameters()), seed=3)


@pytest.mark.parametrize("chunk_mb", [0.004, 0.0004], ids=["query-chunks", "query-and-key-chunks"])
def test_chunked_additive_equals_unchunked(registry, chunk_mb):
    torch.manual_seed(6)
    chunked = build(registry, "additive", heads=2, d_att=8, chunk_mb=chunk_mb)
    whole = build(registry, "additive", heads=2, d_att=8, chunk_mb=0)
    whole.load_state_dict(chunked.state_dict())
    x = torch.randn(2, 40, D_MODEL, dtype=F64, requires_grad=True)
    memory = torch.randn(2, 33, D_MODEL, dtype=F64, requires_grad=True)
    for causal, mem in ((True, None), (False, memory)):
        out_c, grads_c = fwd_bwd(chunked, x, mem, causal)
        out_w, grads_w = fwd_bwd(whole, x, mem, causal)
        torch.testing.assert_close(out_c, out_w, atol=1e-12, rtol=1e-12)
        for a, b in zip(grads_c, grads_w, strict=True):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


def test_chunked_additive_never_forms_the_pairs_x_d_att_tensor(registry):
    torch.manual_seed(7)
    length, d_att = 64, 32
    m = build(registry, "additive", d_att=d_att, chunk_mb=0.05).float()  # ~13k floats a chunk
    x = torch.randn(1, length, D_MODEL, requires_grad=True)
    with LargestTensor() as chunked:
        fwd_bwd(m, x, causal=True)
    m.chunk_mb = 0
    with LargestTensor() as naive:
        fwd_bwd(m, x, causal=True)
    assert naive.numel >= length * length * d_att  # the test can tell the two apart
    assert chunked.numel <= max(length * length, 0.05 * 2**20 / 4)


def test_causal_linear_and_sliding_window_stay_below_the_score_matrix(registry):
    torch.manual_seed(8)
    length = 256
    for name, params in (("linear", {"chunk": 16}), ("sliding_window", {"window": 8})):
        m = build(registry, name, **params).float()
        x = torch.randn(1, length, D_MODEL, requires_grad=True)
        with LargestTensor() as largest:
            fwd_bwd(m, x, causal=True)
        assert largest.numel < length * length / 4, name


# -- linear cannot take a score bias: rejected before training, with the reason ------------
def test_linear_with_a_bias_scheme_is_rejected_before_training(registry):
    with pytest.raises(IncompatibleError, match="never forms the score matrix"):
        harness.create_model("transformer", vocab_size=10, attention="linear", position="alibi",
                             registry=registry)
    config = parse_run_config({
        "task": {"name": "copy"},
        "model": {"name": "transformer", "attention": {"name": "linear"},
                  "position": {"name": "t5_bias"}},
    })
    with pytest.raises(IncompatibleError, match="linear.*t5_bias.*never forms the score matrix"):
        plan(config, registry)
    m = build(registry, "linear")
    with pytest.raises(ValueError, match="score bias"):
        m(torch.randn(1, 4, D_MODEL, dtype=F64), position=RotatingBiased())


def test_linear_rotation_pairing_is_accepted(registry):
    model = harness.create_model("transformer", vocab_size=10, attention="linear", position="rope",
                                 registry=registry, d_model=16, heads=2, layers=1)
    assert model(torch.randint(4, 10, (2, 6))).shape == (2, 6, 10)


# -- sliding window: the cache keeps only what the next query can see -------------------------
def test_sliding_window_long_decoding_matches_full_pass_and_cache_stays_small(registry):
    torch.manual_seed(9)
    m = build(registry, "sliding_window", window=4, block=5)  # block edges off the window's
    x = torch.randn(2, 23, D_MODEL, dtype=F64)
    kpm = torch.zeros(2, 23, dtype=torch.bool)
    kpm[1, 20:] = True
    full, _ = m(x, causal=True, key_padding_mask=kpm, position=RotatingBiased())
    want, _ = reference("sliding_window", m, x, causal=True, kpm=kpm, scheme=RotatingBiased())
    torch.testing.assert_close(full, want, atol=1e-10, rtol=1e-9)
    cache = AttentionCache()
    steps = [m(x[:, :6], causal=True, key_padding_mask=kpm[:, :6], position=RotatingBiased(), cache=cache)[0]]
    for t in range(6, 23):
        steps.append(m(x[:, t: t + 1], causal=True, key_padding_mask=kpm[:, t: t + 1],
                       position=RotatingBiased(), cache=cache)[0])
        assert cache.k.shape[2] == 3 and cache.k_pos.tolist() == list(range(t - 2, t + 1))
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-10, rtol=1e-9)


def test_linear_decoding_state_is_constant_size(registry):
    torch.manual_seed(10)
    m = build(registry, "linear")
    x = torch.randn(1, 30, D_MODEL, dtype=F64)
    cache = AttentionCache()
    shapes = set()
    for t in range(30):
        m(x[:, t: t + 1], causal=True, cache=cache)
        assert cache.k is None and cache.v is None
        shapes.add(tuple(tuple(v.shape) for v in cache.state.values()))
    assert len(shapes) == 1 and cache.length == 30


@pytest.mark.parametrize("name", ["multi_head", "scaled_dot_product"])
def test_tied_qk_shares_one_projection(registry, name):
    tied, separate = build(registry, name, tied_qk=True), build(registry, name)
    assert tied.q_proj is tied.k_proj and separate.q_proj is not separate.k_proj
    count = sum(p.numel() for p in tied.parameters())
    assert count == sum(p.numel() for p in separate.parameters()) - D_MODEL * D_MODEL - D_MODEL
    x = torch.randn(1, 6, D_MODEL, dtype=F64)
    q = tied.split_heads(tied.q_proj(x), tied.qk_dim)
    scores = tied.score(q, tied.split_heads(tied.k_proj(x), tied.qk_dim))
    torch.testing.assert_close(scores, scores.transpose(-2, -1))  # no query/key distinction


# -- linear cross-attention decoding: the memory's sums are computed once ---------------------
@pytest.mark.parametrize("dtype", [torch.float32, F64], ids=["float32", "float64"])
def test_linear_cached_cross_attention_sums_the_memory_once(registry, dtype):
    torch.manual_seed(11)
    m = build(registry, "linear").to(dtype)
    x, memory = torch.randn(2, 6, D_MODEL, dtype=dtype), torch.randn(2, 9, D_MODEL, dtype=dtype)
    kpm = padding(2, 9)
    full, _ = m(x, memory, key_padding_mask=kpm)
    want, _ = reference("linear", m, x, memory, kpm=kpm)
    tol = {"atol": 1e-6, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 1e-12, "rtol": 1e-10}
    torch.testing.assert_close(full, want.to(dtype), **tol)  # padding honoured
    calls = {"k_proj": 0, "v_proj": 0}
    for proj in calls:
        getattr(m, proj).register_forward_hook(lambda *_, proj=proj: calls.__setitem__(proj, calls[proj] + 1))
    cache = AttentionCache()
    steps = [m(x[:, :1], memory, key_padding_mask=kpm, cache=cache)[0]]
    garbage = torch.full_like(memory, math.nan)
    for t in range(1, 6):
        # Later steps read neither the memory nor its cached keys/values: make both NaN.
        cache.k, cache.v = torch.full_like(cache.k, math.nan), torch.full_like(cache.v, math.nan)
        steps.append(m(x[:, t: t + 1], garbage, key_padding_mask=kpm, cache=cache)[0])
    assert calls == {"k_proj": 1, "v_proj": 1}
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **tol)


# -- sliding window with score-bias schemes: bias asked per block, same function -------------
BIAS_SCHEMES = {"alibi": {}, "t5_bias": {"num_buckets": 8, "max_distance": 16}, "relative": {"clip": 3}}


def bias_scheme(registry, name, causal):
    spec = registry.get("position", name)
    config = spec.config(**BIAS_SCHEMES[name]) if spec.config else None
    scheme = spec.build(config, d_model=D_MODEL, num_heads=MODEL_HEADS, head_dim=D_MODEL // MODEL_HEADS,
                        max_length=None, causal=causal)
    with torch.no_grad():  # T5's table starts near zero: make its bias matter
        for p in scheme.parameters():
            p.normal_()
    return scheme


def windowed_reference(m, scheme, x, *, causal, kpm):
    """Explicit masked softmax over all L x L pairs, with the scheme's full bias."""
    b, n, _ = x.shape
    q, k, v = (by_heads(linear_map(x, p), m.num_heads) for p in (m.q_proj, m.k_proj, m.v_proj))
    pos = torch.arange(n)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + scheme.score_bias(q, pos, pos)
    allowed = allowed_pairs(n, n, b, causal, kpm, m.window)
    scores = scores.masked_fill(~allowed, -math.inf)
    weights = torch.exp(scores - scores.amax(-1, keepdim=True).clamp(min=-1e300))
    total = weights.sum(-1, keepdim=True)
    weights = weights / torch.where(total > 0, total, torch.ones_like(total))
    return linear_map((weights @ v).transpose(1, 2).reshape(b, n, -1), m.out_proj)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("scheme_name", BIAS_SCHEMES)
def test_sliding_window_with_bias_scheme_equals_full_masked_softmax(registry, scheme_name, causal):
    torch.manual_seed(zlib.crc32(f"window/{scheme_name}/{causal}".encode()))
    m = build(registry, "sliding_window", window=4, block=5)  # block edges off the window's
    scheme = bias_scheme(registry, scheme_name, causal).double()
    x = torch.randn(2, 23, D_MODEL, dtype=F64, requires_grad=True)
    kpm = padding(2, 23)
    out, _ = m(x, causal=causal, key_padding_mask=kpm, position=scheme)
    want = windowed_reference(m, scheme, x, causal=causal, kpm=kpm)
    torch.testing.assert_close(out, want, atol=1e-10, rtol=1e-9)
    logged, _ = m(x, causal=causal, key_padding_mask=kpm, position=scheme, need_weights=True)
    torch.testing.assert_close(logged, want, atol=1e-10, rtol=1e-9)
    named = [*m.named_parameters(), *(("scheme." + n, p) for n, p in scheme.named_parameters())]
    got_g = grads(out, [x], [p for _, p in named], seed=2)
    want_g = grads(want, [x], [p for _, p in named], seed=2)
    for got, exp, label in zip(got_g, want_g, ["x"] + [n for n, _ in named], strict=True):
        assert got is not None and exp is not None, label
        torch.testing.assert_close(got, exp, atol=1e-10, rtol=1e-9, msg=f"gradient of {label}")


@pytest.mark.parametrize("scheme_name", BIAS_SCHEMES)
def test_sliding_window_with_bias_scheme_never_forms_the_full_bias(registry, scheme_name):
    torch.manual_seed(12)
    length, window = 1024, 32
    m = build(registry, "sliding_window", window=window).float()
    scheme = bias_scheme(registry, scheme_name, causal=True)
    x = torch.randn(1, length, D_MODEL, requires_grad=True)

    def fwd_bwd_with_scheme():
        out, _ = m(x, causal=True, position=scheme)
        grads(out, [x], [*m.parameters(), *scheme.parameters()], seed=4)

    with LargestTensor() as windowed:
        fwd_bwd_with_scheme()
    m.bias_by_blocks = False  # the scheme's full (…, L, L) bias, gathered from
    with LargestTensor() as full_bias:
        fwd_bwd_with_scheme()
    assert full_bias.numel >= length * length  # the test can tell the two apart
    assert windowed.numel < length * length / 4, (windowed.numel, full_bias.numel)
