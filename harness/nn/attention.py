"""The attention interface: projections, heads, position hooks and decoding cache.

A variant subclasses :class:`Attention` and implements :meth:`Attention.score` (softmax
variants) or overrides :meth:`Attention.attend` (variants that do not form softmax scores,
or that call a fused kernel). Everything else, the same for all variants, lives here:

* query/key/value/output projections, split into heads (``tied_qk`` shares one projection
  for queries and keys);
* self-attention (``memory=None``) or cross-attention (queries from ``x``, keys and values
  from ``memory``);
* the position hooks: ``rotate`` on queries/keys and ``score_bias`` (self-attention only);
* causal and key-padding masks, expressed through absolute positions so a cached decoding
  step masks exactly like a full pass;
* incremental decoding: with an :class:`AttentionCache`, each call appends its keys/values
  and attends over everything so far (cross-attention computes the memory's keys/values
  once).

Mask convention: ``key_padding_mask`` is (B, Lk) with ``True`` at padding (ignored keys);
``allowed`` masks are ``True`` where a query may attend to a key.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.nn.position import PositionScheme


class AttentionCache:
    """Decoding state of one attention layer.

    Softmax variants keep keys, values, their positions and padding; variants with other
    state (running sums, a window) keep it in ``state`` and override
    :meth:`Attention.extend_cache`. ``length`` counts the positions seen so far.
    """

    def __init__(self) -> None:
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.k_pos: Tensor | None = None
        self.key_padding_mask: Tensor | None = None
        self.length = 0
        self.state: dict[str, Any] = {}


def allowed_mask(
    q_pos: Tensor,
    k_pos: Tensor,
    *,
    causal: bool,
    key_padding_mask: Tensor | None = None,
    window: int | None = None,
) -> Tensor | None:
    """Boolean (B|1, 1, Lq, Lk) mask, True where query i may attend to key j; None if all.

    ``causal``: key position <= query position. ``window``: additionally key position >
    query position - window (a query sees itself and the ``window - 1`` keys before it,
    and the ``window - 1`` after it when not causal).
    """
    allowed = None
    if causal or window is not None:
        diff = q_pos[:, None] - k_pos[None, :]  # (Lq, Lk): how far back the key is
        ok = torch.ones_like(diff, dtype=torch.bool)
        if causal:
            ok &= diff >= 0
        if window is not None:
            ok &= diff.abs() < window
        allowed = ok[None, None]
    if key_padding_mask is not None:
        keep = ~key_padding_mask[:, None, None, :]
        allowed = keep if allowed is None else allowed & keep
    return allowed


def masked_softmax(scores: Tensor, allowed: Tensor | None) -> Tensor:
    """Softmax over the last dim; disallowed keys get exactly zero weight.

    A row with no allowed key (only possible at padded queries) gets all-zero weights
    instead of NaN.
    """
    if allowed is None:
        return scores.softmax(dim=-1)
    scores = scores.masked_fill(~allowed, float("-inf"))
    weights = scores.softmax(dim=-1)
    return weights.masked_fill(~allowed.any(dim=-1, keepdim=True), 0.0)


class Attention(nn.Module):
    """Base class of attention variants.

    Args:
        d_model: model width (input and output).
        num_heads: number of heads.
        qk_dim: per-head width of queries and keys (default ``d_model // num_heads``).
        v_dim: per-head width of values (default ``d_model // num_heads``).
        dropout: dropout on attention weights (training only).
        bias: biases in the projections.
        tied_qk: one shared projection for queries and keys.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        qk_dim: int | None = None,
        v_dim: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
        tied_qk: bool = False,
    ) -> None:
        super().__init__()
        if d_model % num_heads and (qk_dim is None or v_dim is None):
            raise ValueError(
                f"d_model ({d_model}) must be divisible by num_heads ({num_heads}); "
                f"choose a head count that divides the width."
            )
        self.d_model = d_model
        self.num_heads = num_heads
        self.qk_dim = qk_dim or d_model // num_heads
        self.v_dim = v_dim or d_model // num_heads
        self.dropout = dropout
        self.tied_qk = tied_qk
        self.q_proj = nn.Linear(d_model, num_heads * self.qk_dim, bias=bias)
        self.k_proj = self.q_proj if tied_qk else nn.Linear(d_model, num_heads * self.qk_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, num_heads * self.v_dim, bias=bias)
        self.out_proj = nn.Linear(num_heads * self.v_dim, d_model, bias=bias)

    # -- shape helpers -------------------------------------------------------------------
    def split_heads(self, x: Tensor, dim: int) -> Tensor:
        b, n, _ = x.shape
        return x.view(b, n, self.num_heads, dim).transpose(1, 2)

    def merge_heads(self, x: Tensor) -> Tensor:
        b, h, n, d = x.shape
        return x.transpose(1, 2).reshape(b, n, h * d)

    # -- the pipeline --------------------------------------------------------------------
    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        causal: bool = False,
        key_padding_mask: Tensor | None = None,
        position: PositionScheme | None = None,
        cache: AttentionCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``x`` (B, Lq, d_model) to itself or to ``memory`` (B, Lk, d_model).

        ``key_padding_mask`` refers to the keys of this call (``x``'s new positions for
        self-attention, ``memory`` for cross-attention). Returns the output (B, Lq, d_model)
        and, if ``need_weights``, the attention weights (B, H, Lq, Lk).
        """
        is_self = memory is None
        offset = cache.length if (cache is not None and is_self) else 0
        q = self.split_heads(self.q_proj(x), self.qk_dim)
        q_pos = torch.arange(offset, offset + x.shape[1], device=x.device)

        if not is_self and cache is not None and cache.k is not None:
            k, v, k_pos = cache.k, cache.v, cache.k_pos
            key_padding_mask = cache.key_padding_mask
            assert v is not None and k_pos is not None
        else:
            src = x if is_self else memory
            assert src is not None
            k = self.split_heads(self.k_proj(src), self.qk_dim)
            v = self.split_heads(self.v_proj(src), self.v_dim)
            k_pos = torch.arange(offset, offset + src.shape[1], device=x.device)

        use_position = position is not None and is_self
        if use_position:
            assert position is not None
            q, k = position.rotate(q, k, q_pos, k_pos)
        if cache is not None:
            if is_self:
                k, v, k_pos, key_padding_mask = self.extend_cache(cache, k, v, k_pos, key_padding_mask)
            elif cache.k is None:
                cache.k, cache.v, cache.k_pos = k, v, k_pos
                cache.key_padding_mask = key_padding_mask
        bias = position.score_bias(q, q_pos, k_pos) if use_position else None  # type: ignore[union-attr]
        out, weights = self.attend(
            q,
            k,
            v,
            q_pos=q_pos,
            k_pos=k_pos,
            causal=causal and is_self,
            key_padding_mask=key_padding_mask,
            bias=bias,
            need_weights=need_weights,
        )
        return self.out_proj(self.merge_heads(out)), weights

    def extend_cache(
        self,
        cache: AttentionCache,
        k: Tensor,
        v: Tensor,
        k_pos: Tensor,
        key_padding_mask: Tensor | None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """Append this step's keys/values to the cache; return everything to attend over."""
        if key_padding_mask is None and cache.key_padding_mask is not None:
            key_padding_mask = torch.zeros(k.shape[0], k.shape[2], dtype=torch.bool, device=k.device)
        if cache.k is not None:
            assert cache.v is not None and cache.k_pos is not None
            k = torch.cat([cache.k, k], dim=2)
            v = torch.cat([cache.v, v], dim=2)
            k_pos = torch.cat([cache.k_pos, k_pos])
            if key_padding_mask is not None:
                prev = cache.key_padding_mask
                if prev is None:
                    prev = torch.zeros(k.shape[0], cache.k.shape[2], dtype=torch.bool, device=k.device)
                key_padding_mask = torch.cat([prev, key_padding_mask], dim=1)
        cache.k, cache.v, cache.k_pos, cache.key_padding_mask = k, v, k_pos, key_padding_mask
        cache.length = int(k_pos[-1].item()) + 1
        return k, v, k_pos, key_padding_mask

    def score(self, q: Tensor, k: Tensor) -> Tensor:
        """Raw attention scores (B, H, Lq, Lk) of a softmax variant."""
        raise NotImplementedError(f"{type(self).__name__} must implement score() or attend()")

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        q_pos: Tensor,
        k_pos: Tensor,
        causal: bool,
        key_padding_mask: Tensor | None,
        bias: Tensor | None,
        need_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """Softmax attention over :meth:`score`: (B, H, Lq, Dv) output and optional weights."""
        scores = self.score(q, k)
        if bias is not None:
            scores = scores + bias
        allowed = allowed_mask(q_pos, k_pos, causal=causal, key_padding_mask=key_padding_mask)
        weights = masked_softmax(scores.float(), allowed).to(v.dtype)
        dropped = F.dropout(weights, self.dropout, self.training) if self.dropout else weights
        return dropped @ v, (weights if need_weights else None)


def scaled(q: Tensor) -> Tensor:
    """Queries scaled by 1/sqrt(d): the Transformer's temperature."""
    return q * (1.0 / math.sqrt(q.shape[-1]))
