"""``additive``: Bahdanau et al. (2015) additive (MLP) attention, memory-bounded.

score(q_i, k_j) = vᵀ tanh(W_q q_i + W_k k_j): a one-hidden-layer MLP of width ``d_att``
(its own attention dimension) scores every query/key pair. ``q_proj`` is W_q (its bias is
the MLP's hidden bias), ``k_proj`` is W_k (no bias: one hidden bias is enough), and
``score_vector`` holds v, one per head. Values and the output use the harness's learned
projections.

Memory. The naive broadcast materialises a (B, H, Lq, Lk, d_att) tensor, d_att times the
score matrix (about 34 GB at B=8, L=4096, d_att=64 in fp32). When that block exceeds
``chunk_mb``, scores are computed in query chunks (and key chunks, if even one query row
is too big) by :class:`BlockedScores`, whose hand-written backward recomputes a chunk's
tanh block instead of keeping it, in two buffers reused by every chunk, so peak memory
grows like Lq x Lk (the scores, softmax and their gradients) plus two chunks. Speed: the
pass is element-wise work with no matrix product to hide in; its bound on a CPU (that work
at the CPU's measured element-wise rates) is in ``benchmarks/additive_bound.md``. The same operations run on the same numbers,
so results and gradients equal the unchunked computation up to float summation order.
The price is one extra forward of the MLP block during backward.

Heads: the classic is single-head, so ``heads`` defaults to 1 and ignores the model's head
count; ``heads = n`` runs n independent MLP scorers (each with its own W_q, W_k rows and
v). Position hooks act per model head: rotations act on W_q q and W_k k before the tanh
(this injects positions but, unlike in a dot product, does not make the score depend on
offsets only) and per-head biases are averaged over the model heads (see
``harness.plugin.Attention``). With the default ``d_att = d_model / heads`` it pairs with every
position scheme; Shaw's query-dependent bias needs heads x d_att = d_model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

import torch
from torch import Tensor, nn

from harness.plugin import Attention, AttentionConfig, AttentionSpec, Ge, hookimpl


@dataclass
class AdditiveConfig(AttentionConfig):
    """``bias``: the hidden bias of the scoring MLP and the value/output projections' biases."""

    heads: Annotated[int, Ge(1)] = 1  # the classic is single-head; not the model's head count
    d_att: Annotated[int | None, Ge(1)] = None  # scoring-MLP width per head; None: d_model // heads
    # largest (B, H, rows, keys, d_att) block computed at once, in MB; 0: never chunk
    chunk_mb: Annotated[float, Ge(0.0)] = 64.0


def mlp_scores(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """vᵀ tanh(q_i + k_j) for a block: q (B, H, r, A), k (B, H, c, A) -> (B, H, r, c)."""
    hidden = torch.tanh(q.unsqueeze(3) + k.unsqueeze(2))  # (B, H, r, c, A)
    return (hidden @ v[None, :, None, :, None]).squeeze(-1)


def _blocks(lq: int, lk: int, rows: int, cols: int) -> list[tuple[slice, slice]]:
    return [(slice(r, r + rows), slice(c, c + cols)) for r in range(0, lq, rows) for c in range(0, lk, cols)]


def _hidden(q: Tensor, k: Tensor, out: Tensor) -> Tensor:
    """tanh(q_i + k_j) for a block, written into (a view of) a reused buffer."""
    shape = (*q.shape[:3], k.shape[2], q.shape[3])
    hidden = out[: math.prod(shape)].view(shape)
    torch.add(q.unsqueeze(3), k.unsqueeze(2), out=hidden)
    return hidden.tanh_()


class BlockedScores(torch.autograd.Function):
    """vᵀ tanh(q_i + k_j) block by block, with hand-written backward: each block's hidden
    units are recomputed into one reused buffer (never stored), and its gradient is formed in
    a second one, so the pass streams the element-wise kernels it must run (add, tanh, the
    v-weighted sum; in backward add, tanh, grad ⊗ v, tanh's derivative, the sums for dq, dk
    and dv) over cache-sized blocks without allocating per block. Same numbers as autograd
    through ``mlp_scores`` up to summation order (tests/test_attention_reference.py)."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, rows: int, cols: int) -> Tensor:
        b, h, lq, a = q.shape
        lk = k.shape[2]
        scores = q.new_empty(b, h, lq, lk)
        buf = q.new_empty(b * h * min(rows, lq) * min(cols, lk) * a)
        for r, c in _blocks(lq, lk, rows, cols):
            hidden = _hidden(q[:, :, r], k[:, :, c], buf)
            scores[:, :, r, c] = (hidden @ v[None, :, None, :, None]).squeeze(-1)
        ctx.save_for_backward(q, k, v)
        ctx.rows, ctx.cols = rows, cols
        return scores

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, Tensor, None, None]:
        q, k, v = ctx.saved_tensors
        b, h, lq, a = q.shape
        lk = k.shape[2]
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros(b, h, a, dtype=v.dtype, device=v.device)
        size = b * h * min(ctx.rows, lq) * min(ctx.cols, lk) * a
        buf, gbuf = q.new_empty(size), q.new_empty(size)
        vb = v[None, :, None, None, :]
        for r, c in _blocks(lq, lk, ctx.rows, ctx.cols):
            hidden = _hidden(q[:, :, r], k[:, :, c], buf)
            g_s = grad[:, :, r, c]  # (B, H, r, c)
            dv += (g_s.flatten(2).unsqueeze(2) @ hidden.flatten(2, 3)).squeeze(2)  # Σ_ij g_ij h_ij
            g = gbuf[: hidden.numel()].view_as(hidden)
            torch.mul(g_s.unsqueeze(-1), vb, out=g)  # ∂/∂hidden
            torch.ops.aten.tanh_backward.grad_input(g, hidden, grad_input=g)  # x (1 - h²)
            dq[:, :, r] += g.sum(3)
            dk[:, :, c] += g.sum(2)
        return dq, dk, dv.sum(0), None, None


def chunked_scores(q: Tensor, k: Tensor, v: Tensor, max_elements: int | None) -> Tensor:
    """``mlp_scores`` over all pairs, at most ``max_elements`` hidden units at a time."""
    b, h, lq, a = q.shape
    lk = k.shape[2]
    whole = b * h * lq * lk * a <= (max_elements or 0)
    if not max_elements or (whole and not (torch.is_grad_enabled() and q.requires_grad | k.requires_grad)):
        return mlp_scores(q, k, v)
    per_row = b * h * lk * a
    rows, cols = (max_elements // per_row, lk) if per_row <= max_elements else (1, max(1, max_elements // (b * h * a)))
    return BlockedScores.apply(q, k, v, rows, cols)  # type: ignore[no-any-return]


class AdditiveAttention(Attention):
    """Bahdanau additive vᵀtanh(W_q q + W_k k), chunked: memory ~ Lq x Lk."""

    def __init__(self, config: AdditiveConfig, *, d_model: int, num_heads: int) -> None:
        heads = config.heads
        if d_model % heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by heads ({heads})")
        d_att = config.d_att or d_model // heads
        super().__init__(d_model, heads, qk_dim=d_att, dropout=config.dropout, bias=config.bias,
                         position_heads=num_heads)
        self.k_proj = nn.Linear(d_model, heads * d_att, bias=False)  # W_k
        self.score_vector = nn.Parameter(torch.randn(heads, d_att) * d_att**-0.5)  # v
        self.chunk_mb = config.chunk_mb

    def score(self, q: Tensor, k: Tensor) -> Tensor:
        budget = int(self.chunk_mb * 2**20) // q.element_size() if self.chunk_mb else None
        return chunked_scores(q, k, self.score_vector.to(q.dtype), budget)


@hookimpl
def harness_register_attention(register: Any) -> None:
    register(AttentionSpec(name="additive", build=AdditiveAttention))
