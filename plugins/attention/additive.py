"""``additive``: Bahdanau et al. (2015) additive (MLP) attention, memory-bounded.

score(q_i, k_j) = vᵀ tanh(W_q q_i + W_k k_j): a one-hidden-layer MLP of width ``d_att``
(its own attention dimension) scores every query/key pair. ``q_proj`` is W_q (its bias is
the MLP's hidden bias), ``k_proj`` is W_k (no bias: one hidden bias is enough), and
``score_vector`` holds v, one per head. Values and the output use the harness's learned
projections.

Memory. The naive broadcast materialises a (B, H, Lq, Lk, d_att) tensor, d_att times the
score matrix (about 34 GB at B=8, L=4096, d_att=64 in fp32). When that block exceeds
``chunk_mb``, scores are computed in query chunks (and key chunks, if even one query row
is too big), each chunk under ``torch.utils.checkpoint``: the backward pass recomputes a
chunk's tanh block instead of keeping it, so peak memory grows like Lq x Lk (the scores,
softmax and their gradients) plus one chunk. The same operations run on the same numbers,
so results and gradients equal the unchunked computation up to float summation order.
The price is one extra forward of the MLP block during backward.

Heads: the classic is single-head, so ``heads`` defaults to 1 and ignores the model's head
count; ``heads = n`` runs n independent MLP scorers (each with its own W_q, W_k rows and
v). Position hooks act per model head: rotations act on W_q q and W_k k before the tanh
(this injects positions but, unlike in a dot product, does not make the score depend on
offsets only) and per-head biases are averaged over the model heads (see
``harness.nn.Attention``). With the default ``d_att = d_model / heads`` it pairs with every
position scheme; Shaw's query-dependent bias needs heads x d_att = d_model.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any

import harness
from harness.params import FloatRange
from harness.registry import AttentionSpec


@dataclass
class AdditiveConfig:
    dropout: Annotated[float, FloatRange(0.0, 0.3)] = 0.0  # on attention weights
    heads: int = 1  # the classic is single-head; not the model's head count
    d_att: int | None = None  # width of the scoring MLP per head; None: d_model // heads
    bias: bool = True  # hidden bias of the scoring MLP and biases of value/output projections
    chunk_mb: float = 64.0  # largest (B, H, rows, keys, d_att) block computed at once; 0: never chunk

    def __post_init__(self) -> None:
        if self.heads < 1:
            raise ValueError(f"heads ({self.heads}) must be >= 1.")
        if self.d_att is not None and self.d_att < 1:
            raise ValueError(f"d_att ({self.d_att}) must be >= 1 (or null for d_model // heads).")
        if self.chunk_mb < 0:
            raise ValueError(f"chunk_mb ({self.chunk_mb}) must be >= 0 (0 disables chunking).")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout ({self.dropout}) must be in [0, 1).")


def build(config: AdditiveConfig, *, d_model: int, num_heads: int) -> Any:
    if d_model % config.heads:
        raise ValueError(f"d_model ({d_model}) must be divisible by heads ({config.heads})")
    return module_class()(
        d_model,
        config.heads,
        d_att=config.d_att or d_model // config.heads,
        chunk_mb=config.chunk_mb,
        dropout=config.dropout,
        bias=config.bias,
        position_heads=num_heads,
    )


@cache
def module_class() -> type:
    import torch
    from torch import Tensor, nn
    from torch.utils.checkpoint import checkpoint

    from harness.nn.attention import Attention

    def mlp_scores(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """vᵀ tanh(q_i + k_j) for a block: q (B, H, r, A), k (B, H, c, A) -> (B, H, r, c)."""
        hidden = torch.tanh(q.unsqueeze(3) + k.unsqueeze(2))  # (B, H, r, c, A)
        return (hidden @ v[None, :, None, :, None]).squeeze(-1)

    def chunked_scores(q: Tensor, k: Tensor, v: Tensor, max_elements: int | None) -> Tensor:
        """``mlp_scores`` over all pairs, at most ``max_elements`` hidden units at a time."""
        b, h, lq, a = q.shape
        lk = k.shape[2]
        if not max_elements or b * h * lq * lk * a <= max_elements:
            return mlp_scores(q, k, v)
        per_row = b * h * lk * a
        rows, cols = (max_elements // per_row, lk) if per_row <= max_elements else (1, max(1, max_elements // (b * h * a)))
        recompute = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        scores = q.new_empty(b, h, lq, lk)
        for r in range(0, lq, rows):
            for c in range(0, lk, cols):
                args = (q[:, :, r: r + rows], k[:, :, c: c + cols], v)
                block = checkpoint(mlp_scores, *args, use_reentrant=False) if recompute else mlp_scores(*args)
                scores[:, :, r: r + rows, c: c + cols] = block
        return scores

    class AdditiveAttention(Attention):
        def __init__(self, d_model: int, num_heads: int, *, d_att: int, chunk_mb: float,
                     bias: bool = True, **kwargs: Any) -> None:
            super().__init__(d_model, num_heads, qk_dim=d_att, bias=bias, **kwargs)
            self.k_proj = nn.Linear(d_model, num_heads * d_att, bias=False)  # W_k
            self.score_vector = nn.Parameter(torch.randn(num_heads, d_att) * d_att**-0.5)  # v
            self.chunk_mb = chunk_mb

        def score(self, q: Tensor, k: Tensor) -> Tensor:
            budget = int(self.chunk_mb * 2**20) // q.element_size() if self.chunk_mb else None
            return chunked_scores(q, k, self.score_vector.to(q.dtype), budget)

    return AdditiveAttention


@harness.hookimpl
def harness_register_attention(register: Any) -> None:
    register(
        AttentionSpec(
            name="additive",
            build=build,
            config=AdditiveConfig,
            description="Bahdanau additive vᵀtanh(W_q q + W_k k), chunked: memory ~ Lq x Lk.",
        )
    )
