"""``sliding_window``: local multi-head attention (Longformer's sliding window; Mistral).

Each query attends only to keys within ``window`` positions: a causal query at position i
sees keys i - window + 1 .. i, a bidirectional one also up to i + window - 1. Scores are
the Transformer's scaled dot products over the model's heads; the position hooks apply as
in ``multi_head``. Stacking L layers gives a receptive field of L x (window - 1).

Cost. Queries are processed in blocks; each block attends only to the keys its window can
reach, through the fused ``scaled_dot_product_attention`` with a boolean band mask. Time
and memory grow like L x window, not L²; no full score matrix is formed (attention
weights, when requested, are the exception: they are computed in full for logging).

Decoding: the cache keeps only the last ``window - 1`` keys and values (what the next
query can still see), so memory and time per token are O(window).

Cross-attention (queries from a decoder, keys from an encoder) sees the whole memory: the
two sequences' positions do not correspond, so a window over them would mean nothing.
Without a position scheme, permuting a bidirectional input permutes the output only when
the window covers the whole sequence: the window itself is positional.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any

import harness
from harness.params import FloatRange, IntRange
from harness.registry import AttentionSpec


@dataclass
class SlidingWindowConfig:
    window: Annotated[int, IntRange(4, 512, log=True)] = 64  # keys a query sees (itself included)
    dropout: Annotated[float, FloatRange(0.0, 0.3)] = 0.0  # on attention weights
    bias: bool = True  # biases in the projections

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"window ({self.window}) must be >= 1 (a query sees at least itself).")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout ({self.dropout}) must be in [0, 1).")


def build(config: SlidingWindowConfig, *, d_model: int, num_heads: int) -> Any:
    return module_class()(
        d_model, num_heads, window=config.window, dropout=config.dropout, bias=config.bias
    )


@cache
def module_class() -> type:
    import torch
    import torch.nn.functional as F
    from torch import Tensor

    from harness.nn.attention import (
        Attention,
        AttentionCache,
        allowed_mask,
        masked_softmax,
        scaled,
        sdpa_mask,
    )

    def rows_cols(bias: Tensor, rows: slice, cols: slice) -> Tensor:
        """A block of a broadcastable (..., Lq, Lk) bias; broadcast dims stay whole."""
        r = rows if bias.shape[-2] > 1 else slice(None)
        c = cols if bias.shape[-1] > 1 else slice(None)
        return bias[..., r, c]

    def fused(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, bias: Tensor | None,
              dropout: float) -> Tensor:
        """The fused kernel under a mask; queries that may see no key get zeros."""
        mask, empty = sdpa_mask(allowed, bias, q.dtype)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
        return out if empty is None else out.masked_fill(empty, 0.0)

    class SlidingWindowAttention(Attention):
        def __init__(self, d_model: int, num_heads: int, *, window: int, **kwargs: Any) -> None:
            super().__init__(d_model, num_heads, **kwargs)
            self.window = window
            self.block = max(window, 32)  # queries per block

        def score(self, q: Tensor, k: Tensor) -> Tensor:
            return scaled(q) @ k.transpose(-2, -1)

        def extend_cache(self, cache: AttentionCache, k: Tensor, v: Tensor, k_pos: Tensor,
                         key_padding_mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
            k, v, k_pos, key_padding_mask = super().extend_cache(cache, k, v, k_pos, key_padding_mask)
            start = max(0, k.shape[2] - (self.window - 1))  # what the next query can still see
            cache.k, cache.v = k[:, :, start:].contiguous(), v[:, :, start:].contiguous()
            cache.k_pos = k_pos[start:]
            if key_padding_mask is not None:
                cache.key_padding_mask = key_padding_mask[:, start:]
            return k, v, k_pos, key_padding_mask

        def attend(self, q, k, v, *, q_pos, k_pos, causal, key_padding_mask, bias, need_weights,  # type: ignore[no-untyped-def]
                   state=None, cross=False):
            if need_weights:
                window = None if cross else self.window
                return self._full(q, k, v, q_pos, k_pos, causal, key_padding_mask, bias, window)
            dropout = self.dropout if self.training else 0.0
            if cross:
                allowed = allowed_mask(q_pos, k_pos, causal=False, key_padding_mask=key_padding_mask)
                return fused(q, k, v, allowed, None, dropout), None
            q0, k0 = int(q_pos[0]), int(k_pos[0])  # positions are consecutive
            lq, lk, reach = q.shape[2], k.shape[2], self.window - 1
            outs = []
            for s in range(0, lq, self.block):
                rows = slice(s, min(s + self.block, lq))
                first = q0 + rows.start - reach - k0  # earliest key any query here sees
                last = q0 + rows.stop - 1 + (0 if causal else reach) - k0
                cols = slice(max(first, 0), max(min(last + 1, lk), 0))
                allowed = allowed_mask(
                    q_pos[rows], k_pos[cols], causal=causal, window=self.window,
                    key_padding_mask=None if key_padding_mask is None else key_padding_mask[:, cols],
                )
                block_bias = None if bias is None else rows_cols(bias, rows, cols)
                outs.append(fused(q[:, :, rows], k[:, :, cols], v[:, :, cols], allowed, block_bias, dropout))
            return torch.cat(outs, dim=2), None

        def _full(self, q, k, v, q_pos, k_pos, causal, key_padding_mask, bias, window):  # type: ignore[no-untyped-def]
            """Every score at once, with the weights (for logging)."""
            scores = self.score(q, k)
            if bias is not None:
                scores = scores + bias
            allowed = allowed_mask(q_pos, k_pos, causal=causal, key_padding_mask=key_padding_mask,
                                   window=window)
            weights = masked_softmax(scores, allowed).to(v.dtype)
            dropped = F.dropout(weights, self.dropout, self.training) if self.dropout else weights
            return dropped @ v, weights

    return SlidingWindowAttention


@harness.hookimpl
def harness_register_attention(register: Any) -> None:
    register(
        AttentionSpec(
            name="sliding_window",
            build=build,
            config=SlidingWindowConfig,
            description="Local multi-head attention within a window; O(L·window), O(window) cache.",
        )
    )
