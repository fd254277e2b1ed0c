"""Blocked band attention: a sliding window over query blocks, never the L x L matrix.

Queries are cut into blocks of ``block`` rows. Each block reads one contiguous span of keys,
the keys its rows' windows can reach (``block + window - 1`` of them causal, ``block + 2
(window - 1)`` bidirectional), so scores cost L x span. :func:`band` gives the geometry
(which key each span slot reads, which (query, slot) pairs the window allows), and
:func:`keep_last` trims a decoding cache to the window;
:func:`run_blocks` runs the blocks side by side through the fused
``scaled_dot_product_attention`` under that mask; :func:`block_bias` asks a position
scheme for each block's bias against the keys the block reads (``bias_by_blocks``).
A variant may add keys of its own to every block (Longformer's global tokens) by
concatenating them in front of the span, with their own mask and positions.

Used by the ``longformer`` attention; ``sliding_window`` computes the same geometry.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from harness.nn.attention import AttentionCache, sdpa_mask


def band(q_start: int, k_start: int, lq: int, lk: int, *, block: int, window: int, causal: bool,
         device: Any = None) -> tuple[Tensor, Tensor]:
    """The span each query block reads and what the window allows in it.

    Queries are at positions ``q_start .. q_start + lq - 1``, keys at ``k_start .. k_start +
    lk - 1``. Returns ``index`` (n, span): the key index (into the ``lk`` keys, clamped into
    range) that slot s of block i reads; and ``allowed`` (n, block, span): True where row r of
    block i may attend to slot s: the slot lies inside the key sequence, the key is within
    ``window`` positions of the query (``|q - k| < window``) and, if ``causal``, not after it.
    Rows past ``lq`` (the last block's padding) follow the same rule; callers drop them.
    """
    n = -(-lq // block)
    reach = window - 1
    span = block + reach + (0 if causal else reach)
    first = q_start - k_start - reach  # key index that block 0's span starts at
    raw = first + block * torch.arange(n, device=device)[:, None] + torch.arange(span, device=device)
    index = raw.clamp(0, max(lk - 1, 0))
    q = q_start + torch.arange(n * block, device=device).view(n, block, 1)
    lag = q - (k_start + raw)[:, None, :]  # how far each slot's key lies before its query
    allowed = ((raw >= 0) & (raw < lk))[:, None, :] & (lag.abs() < window)
    if causal:
        allowed = allowed & (lag >= 0)
    return index, allowed


def keep_last(cache: AttentionCache, k: Tensor, v: Tensor, k_pos: Tensor,
              key_padding_mask: Tensor | None, keep: int) -> None:
    """Leave only the last ``keep`` keys and values (with their positions and padding) in a
    decoding cache: all that the next query's window can still reach."""
    start = max(0, k.shape[2] - keep)
    cache.k, cache.v = k[:, :, start:].contiguous(), v[:, :, start:].contiguous()
    cache.k_pos = k_pos[start:]
    if key_padding_mask is not None:
        cache.key_padding_mask = key_padding_mask[:, start:]


def gather_blocks(t: Tensor, index: Tensor) -> Tensor:
    """(B, H, L, D) gathered at ``index`` (n, span) -> (B, H, n, span, D)."""
    return t[:, :, index]


def run_blocks(q: Tensor, kb: Tensor, vb: Tensor, allowed: Tensor, bias: Tensor | None,
               dropout: float, scale: float | None = None) -> Tensor:
    """Each query block against its own keys, through the fused kernel.

    ``q`` (B, H, lq, D); ``kb``, ``vb`` (B, H, n, span, D); ``allowed`` (B | 1, 1, n, block,
    span); ``bias`` broadcastable to (B, H, n, block, span) or None. Rows that may attend to
    no key get zeros. ``scale``: the scores' (None: 1/sqrt(D)). Returns (B, H, lq, Dv).
    """
    b, h, lq, _ = q.shape
    n, span = kb.shape[2], kb.shape[3]
    c = allowed.shape[-2]
    mask, empty = sdpa_mask(allowed, bias, q.dtype)
    assert mask is not None and empty is not None
    mask = mask.expand(*mask.shape[:1], h, n, c, span) if mask.dim() == 5 else mask
    mask = mask.reshape(mask.shape[0], h * n, c, span)
    qb = F.pad(q, (0, 0, 0, n * c - lq)).reshape(b, h * n, c, -1)
    out = F.scaled_dot_product_attention(qb, kb.reshape(b, h * n, span, -1),
                                         vb.reshape(b, h * n, span, -1), attn_mask=mask,
                                         dropout_p=dropout, scale=scale)
    empty = empty.expand(empty.shape[0], h, n, c, 1).reshape(-1, h * n, c, 1)
    return out.masked_fill(empty, 0.0).reshape(b, h, n * c, -1)[:, :, :lq]


def block_bias(bias: Any, q: Tensor, q_pos: Tensor, key_pos: Tensor, block: int) -> Tensor | None:
    """The score bias of each block against the keys it reads: (.., n, block, span) or None.

    ``bias`` is the scheme's bias function ``bias(q, q_pos, k_pos)`` (``bias_by_blocks``);
    ``key_pos`` (n, span) holds the position of each block's keys.
    """
    n, span = key_pos.shape
    lq = q.shape[2]
    parts = []
    for i in range(n):
        s = i * block
        part = bias(q[:, :, s: s + block], q_pos[s: s + block], key_pos[i])
        if part is None:
            return None
        rows = min(block, lq - s)
        part = part.expand(*part.shape[:-2], rows, span)
        part = F.pad(part, (0, 0, 0, block - rows))  # the last block's padding rows
        parts.append(part.reshape((1,) * (4 - part.dim()) + tuple(part.shape)))
    return torch.stack(parts, dim=2)
