"""``sliding_window``: local multi-head attention (Longformer's sliding window; Mistral).

Each query attends only to keys within ``window`` positions: a causal query at position i
sees keys i - window + 1 .. i, a bidirectional one also up to i + window - 1. Scores are
the Transformer's scaled dot products over the model's heads; the position hooks apply as
in ``multi_head``. Stacking L layers gives a receptive field of L x (window - 1).

Cost. Queries are cut into blocks of ``block`` rows; each block gets the span of keys its
window can reach (block + window - 1 causal, block + 2 (window - 1) bidirectional), and all
blocks run side by side as one batch through the fused ``scaled_dot_product_attention``
under a boolean band mask. Time and memory grow like L x (block + window), not L²; no full
score matrix is formed (attention weights, when requested, are the exception: they are
computed in full for logging). A score-bias scheme (ALiBi, T5, Shaw) is asked for its bias
block by block, for each query block's positions against its span of keys only
(``bias_by_blocks``), so the bias costs L x span too, never L x L.

Decoding: the cache keeps only the last ``window - 1`` keys and values (what the next
query can still see), so memory and time per token are O(window).

Cross-attention (queries from a decoder, keys from an encoder) sees the whole memory: the
two sequences' positions do not correspond, so a window over them would mean nothing.
Without a position scheme, permuting a bidirectional input permutes the output only when
the window covers the whole sequence: the window itself is positional.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import torch
import torch.nn.functional as F
from torch import Tensor

from harness.plugin import (  # a list of names, not logic: other plugins list many of the same
    Attention,
    AttentionCache,
    AttentionConfig,
    AttentionSpec,
    Complexity,
    Ge,
    IntRange,
    allowed_mask,
    block_bias,
    hookimpl,
    masked_softmax,
    qk_scale,
    scaled,
    sdpa_mask,
)


@dataclass
class SlidingWindowConfig(AttentionConfig):
    window: Annotated[int, Ge(1), IntRange(4, 512, log=True)] = 64  # keys a query sees (itself included)
    # queries per block (speed only, same result); None: max(window, 16)
    block: Annotated[int | None, Ge(1)] = None


def fused(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, bias: Tensor | None,
          dropout: float, scale: float | None = None) -> Tensor:
    """The fused kernel under a mask; queries that may see no key get zeros."""
    mask, empty = sdpa_mask(allowed, bias, q.dtype)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scale)
    return out if empty is None else out.masked_fill(empty, 0.0)


class SlidingWindowAttention(Attention):
    """Local multi-head attention within a window; O(L·window), O(window) cache."""

    bias_by_blocks = True  # ask the scheme for each block's bias, not the full L x L
    # L x (block + window) work; the cache keeps the last window - 1 keys, whatever L
    complexity = Complexity(time="L", memory="L", decode="1", state="1")

    def __init__(self, config: SlidingWindowConfig, *, d_model: int, num_heads: int) -> None:
        super().__init__(d_model, num_heads, dropout=config.dropout, bias=config.bias)
        self.window, self.block = config.window, config.block or max(config.window, 16)

    def state_size(self, length: int) -> int:
        """The keys and values of the last ``window - 1`` positions (all of them, before)."""
        return min(length, self.window - 1) * self.kv_heads * (self.qk_dim + self.v_dim)

    def score(self, q: Tensor, k: Tensor) -> Tensor:
        return scaled(q, self) @ k.transpose(-2, -1)

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
            return fused(q, k, v, allowed, None, dropout, qk_scale(self, q.shape[-1], None)), None
        return self._banded(q, k, v, q_pos, k_pos, causal, key_padding_mask, bias, dropout), None

    def _banded(self, q, k, v, q_pos, k_pos, causal, key_padding_mask, bias, dropout):  # type: ignore[no-untyped-def]
        """Query blocks of ``self.block`` rows, each with the span of keys its window can
        reach, gathered side by side and run as one batch through the fused kernel."""
        b, h, lq, _ = q.shape
        lk, c, reach = k.shape[2], self.block, self.window - 1
        n = -(-lq // c)  # blocks
        span = c + reach + (0 if causal else reach)
        first = int(q_pos[0]) - int(k_pos[0]) - reach  # key index block 0 starts at
        raw = first + c * torch.arange(n, device=q.device)[:, None] + torch.arange(span, device=q.device)
        valid = (raw >= 0) & (raw < lk)  # (n, span): the span overhangs at both ends
        index = raw.clamp(0, lk - 1)
        rows = torch.arange(n * c, device=q.device).view(n, c)
        diff = (rows[:, :, None] + int(q_pos[0])) - (index[:, None, :] + int(k_pos[0]))
        allowed = valid[:, None, :] & (diff.abs() < self.window) & ((diff >= 0) if causal else True)
        allowed = allowed[None, None]  # (1, 1, n, c, span)
        if key_padding_mask is not None:
            allowed = allowed & ~key_padding_mask[:, index][:, None, :, None, :]
        if bias is not None:
            bias = self._block_bias(bias, q, q_pos, k_pos, index)
        mask, empty = sdpa_mask(allowed, bias, q.dtype)
        assert mask is not None and empty is not None
        mask = mask.expand(mask.shape[0], h, n, c, span).reshape(mask.shape[0], h * n, c, span)
        qb = F.pad(q, (0, 0, 0, n * c - lq)).reshape(b, h * n, c, -1)
        kb, vb = (t[:, :, index].reshape(b, h * n, span, -1) for t in (k, v))
        out = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, dropout_p=dropout,
                                             scale=qk_scale(self, q.shape[-1], None))
        out = out.masked_fill(empty.expand(empty.shape[0], h, n, c, 1).reshape(-1, h * n, c, 1), 0.0)
        return out.reshape(b, h, n * c, -1)[:, :, :lq]

    def _block_bias(self, bias, q, q_pos, k_pos, index):  # type: ignore[no-untyped-def]
        """(.., .., n, c, span): each query block's bias against its own span of keys.

        ``bias`` is the scheme's bias function (``bias_by_blocks``); a tensor (a caller
        that computed the full bias itself) is gathered from instead."""
        n, span = index.shape
        c, lq = self.block, q.shape[2]
        if isinstance(bias, Tensor):
            rows = torch.arange(n * c, device=q.device).view(n, c)
            r = rows.clamp(max=lq - 1) if bias.shape[-2] > 1 else torch.zeros_like(rows)
            col = index if bias.shape[-1] > 1 else torch.zeros_like(index)
            return bias[..., r[:, :, None], col[:, None, :]]
        return block_bias(bias, q, q_pos, k_pos[index], c)

    def _full(self, q, k, v, q_pos, k_pos, causal, key_padding_mask, bias, window):  # type: ignore[no-untyped-def]
        """Every score at once, with the weights (for logging)."""
        scores = self.score(q, k)
        if callable(bias):
            bias = bias(q, q_pos, k_pos)
        if bias is not None:
            scores = scores + bias
        allowed = allowed_mask(q_pos, k_pos, causal=causal, key_padding_mask=key_padding_mask,
                               window=window)
        weights = masked_softmax(scores, allowed).to(v.dtype)
        dropped = F.dropout(weights, self.dropout, self.training) if self.dropout else weights
        return dropped @ v, weights


@hookimpl
def harness_register_attention(register: Any) -> None:
    register(AttentionSpec(name="sliding_window", build=SlidingWindowAttention, exempt={
        "permutation_equivariance": "the window is positional: when it is shorter than the input, "
                                    "permuting the keys changes which of them a query sees",
    }))
