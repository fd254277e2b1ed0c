"""The attention interface: projections, heads, position hooks and decoding cache.

A variant subclasses :class:`Attention` and implements :meth:`Attention.score` (softmax
variants) or overrides :meth:`Attention.attend` (variants that do not form softmax scores,
or that call a fused kernel) and, if its decoding state is not "all keys and values so far",
:meth:`Attention.extend_cache`. Everything else, the same for all variants, lives here:

* query/key/value/output projections, split into heads (``tied_qk`` shares one projection
  for queries and keys; a variant may replace a projection, e.g. by ``nn.Identity``);
* self-attention (``memory=None``) or cross-attention (queries from ``x``, keys and values
  from ``memory``);
* the position hooks: ``rotate`` on queries/keys and ``score_bias`` (self-attention only),
  presented in the head layout the scheme was built for (see ``position_heads``);
* causal and key-padding masks, expressed through absolute positions so a cached decoding
  step masks exactly like a full pass;
* incremental decoding: with an :class:`AttentionCache`, each call appends its keys/values
  and attends over everything so far (cross-attention computes the memory's keys/values
  once).

An ``attend`` override receives the per-head ``q, k, v`` and the keywords ``q_pos, k_pos,
causal, key_padding_mask, bias, need_weights, state, cross`` (see :meth:`Attention.attend`).
Two opt-in class attributes change what it receives (both off by default):

* ``memory_state = True``: during cached cross-attention ``state`` is the cross cache's
  dict, which lives as long as the memory: keep there what depends on the memory only
  (linear attention's sums over it), computed on the first step;
* ``bias_by_blocks = True``: ``bias`` is not the full (…, Lq, Lk) tensor but a function
  ``bias(q, q_pos, k_pos)`` giving the scheme's bias for any queries ``q`` (B, H, lq, D)
  at positions ``q_pos`` (lq,) against keys at ``k_pos`` (lk,), in this layer's heads (or
  None when the scheme adds none): a variant that sees only some keys per query block
  asks for those blocks only (sliding window).

Mask convention: ``key_padding_mask`` is (B, Lk) with ``True`` at padding (ignored keys);
``allowed`` masks are ``True`` where a query may attend to a key. A query that may attend
to no key at all (a padded query under a causal mask, an all-padding sequence) gets a zero
output and zero gradients, never NaN.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

import torch
import torch.nn.functional as F
from annotated_types import Ge, Lt
from torch import Tensor, nn

from harness.nn.documents import by_document, document_ids
from harness.nn.mixer import BIDIRECTIONAL, CAUSAL, Complexity, LayerCache
from harness.nn.parametrization import qk_scale
from harness.nn.position import PositionScheme
from harness.params import FloatRange


@dataclass
class AttentionConfig:
    """Parameters every attention variant shares; a variant's config subclasses this one."""

    #: dropout on attention weights (training only)
    dropout: Annotated[float, Ge(0.0), Lt(1.0), FloatRange(0.0, 0.3)] = 0.0
    #: biases in the query/key/value/output projections
    bias: bool = True


class AttentionCache(LayerCache):
    """Decoding state of one attention layer.

    Softmax variants keep keys, values, their positions and padding; variants with other
    state (running sums, a window) keep it in ``state`` and override
    :meth:`Attention.extend_cache`. ``length`` counts the positions seen so far.
    """

    def __init__(self) -> None:
        super().__init__()
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.k_pos: Tensor | None = None
        self.key_padding_mask: Tensor | None = None

    def tensors(self) -> list[Tensor]:
        return [t for t in (self.k, self.v) if t is not None] + super().tensors()


def allowed_mask(
    q_pos: Tensor,
    k_pos: Tensor,
    *,
    causal: bool,
    key_padding_mask: Tensor | None = None,
    window: int | None = None,
    segments: Tensor | None = None,
) -> Tensor | None:
    """Boolean (B|1, 1, Lq, Lk) mask, True where query i may attend to key j; None if all.

    ``causal``: key position <= query position. ``window``: additionally key position >
    query position - window (a query sees itself and the ``window - 1`` keys before it,
    and the ``window - 1`` after it when not causal). ``segments``: (B, L) document ids of
    self-attention's positions (:func:`harness.nn.documents.document_ids`): additionally the
    key's document is the query's (block-diagonal).
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
    if segments is not None:
        same = segments[:, None, :, None] == segments[:, None, None, :]
        allowed = same if allowed is None else allowed & same
    return allowed


def masked_softmax(scores: Tensor, allowed: Tensor | None) -> Tensor:
    """Softmax over the last dim, in at least float32; disallowed keys get exactly zero.

    A row with no allowed key gets all-zero weights (and zero gradients) instead of NaN:
    it is normalised over every key and then zeroed, so no ``-inf - -inf`` is ever formed.
    """
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
    if allowed is None:
        return scores.softmax(dim=-1)
    any_allowed = allowed.any(dim=-1, keepdim=True)
    weights = scores.masked_fill(~(allowed | ~any_allowed), float("-inf")).softmax(dim=-1)
    return weights.masked_fill(~any_allowed, 0.0)


def sdpa_mask(
    allowed: Tensor | None, bias: Tensor | None, dtype: torch.dtype
) -> tuple[Tensor | None, Tensor | None]:
    """The ``attn_mask`` for ``F.scaled_dot_product_attention`` and the empty query rows.

    The mask is boolean when there is no bias (the kernels' cheaper form), otherwise the
    bias with ``-inf`` at disallowed keys. Rows that allow no key are opened to every key
    (so the kernel never divides by zero) and returned as ``empty`` (B|1, 1, Lq, 1): zero
    the kernel's output there.
    """
    empty = None
    if allowed is not None:
        empty = ~allowed.any(dim=-1, keepdim=True)
        allowed = allowed | empty
    if bias is None:
        return allowed, empty
    bias = bias.to(dtype)
    if allowed is None:
        return bias, None
    return bias.masked_fill(~allowed, float("-inf")), empty


def scaled(q: Tensor, layer: Any = None) -> Tensor:
    """Queries scaled by 1/sqrt(d): the Transformer's temperature (under μP, ``layer``'s
    1/d: :func:`harness.nn.parametrization.qk_scale`)."""
    return q * qk_scale(layer, q.shape[-1], 1.0 / math.sqrt(q.shape[-1]))


def _overrides(position: Any, hook: str) -> bool:
    """Whether a scheme implements ``hook`` (the base class's hooks are the identity)."""
    return getattr(type(position), hook, None) is not getattr(PositionScheme, hook)


class Attention(nn.Module):
    """Base class of attention variants.

    Args:
        d_model: model width (input and output).
        num_heads: number of heads this layer runs.
        qk_dim: per-head width of queries and keys (default ``d_model // num_heads``).
        v_dim: per-head width of values (default ``d_model // num_heads``).
        dropout: dropout on attention weights (training only).
        bias: biases in the projections.
        tied_qk: one shared projection for queries and keys.
        position_heads: the head count the model built its position scheme for (default
            ``num_heads``). A variant that runs a different number of heads (the
            single-head classics) receives the position hooks in that layout: queries and
            keys are regrouped into ``position_heads`` heads for ``rotate`` and
            ``score_bias`` (same numbers, cut differently), and the per-head biases are
            averaged over the scheme heads that make up each of this layer's heads (or
            shared, when this layer has more heads).
    """

    memory_state: bool = False  # attend() gets the cross cache's state (see module docs)
    bias_by_blocks: bool = False  # attend() gets the bias as a function (see module docs)
    #: What every sequence mixer declares (see :mod:`harness.nn.mixer`). Softmax attention
    #: runs either way, costs L^2 time and (with fused kernels) L memory, and its decoding
    #: state is the key/value cache, which grows with L.
    directions: ClassVar[frozenset[str]] = frozenset({CAUSAL, BIDIRECTIONAL})
    complexity: ClassVar[Complexity] = Complexity(time="L^2", memory="L", decode="L", state="L")
    #: the position hooks a variant applies (all three: the pipeline below applies them)
    position_hooks: ClassVar[frozenset[str]] = frozenset({"embedding", "qk", "bias"})
    #: for each hook a variant cannot apply, the reason (shown when a pairing is rejected)
    why_not: ClassVar[dict[str, str]] = {}
    #: whether ``attend`` takes ``segments`` (documents' ids, see :func:`allowed_mask`) and
    #: masks across documents; None: derived (True where ``attend`` is
    #: :class:`FusedDotProductAttention`'s: dot-product scores, whose position hooks see only
    #: distances, so a mask over the window's positions equals each document read from its
    #: position 0). A variant that does not is run one document at a time
    #: (:mod:`harness.nn.documents`) when documents are kept apart.
    masks_documents: ClassVar[bool | None] = None

    # keyword-only signature: its likeness to TransformerBlock.forward's is layout, not logic
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
        position_heads: int | None = None,
        kv_heads: int | None = None,
    ) -> None:
        super().__init__()
        if num_heads < 1:
            raise ValueError(f"num_heads ({num_heads}) must be >= 1.")
        kv_heads = kv_heads or num_heads
        if kv_heads < 1 or num_heads % kv_heads:
            raise ValueError(
                f"kv_heads ({kv_heads}) must divide num_heads ({num_heads}): each key/value head "
                f"serves num_heads / kv_heads query heads (1: multi-query attention)."
            )
        if tied_qk and kv_heads != num_heads:
            raise ValueError("tied_qk shares the query projection with the keys: it needs kv_heads = num_heads.")
        if d_model % num_heads and (qk_dim is None or v_dim is None):
            raise ValueError(
                f"d_model ({d_model}) must be divisible by num_heads ({num_heads}); "
                f"choose a head count that divides the width."
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout ({dropout}) must be in [0, 1).")
        self.d_model = d_model
        self.num_heads = num_heads
        self.kv_heads = kv_heads
        self.position_heads = position_heads or num_heads
        self.qk_dim = qk_dim or d_model // num_heads
        self.v_dim = v_dim or d_model // num_heads
        self.dropout = dropout
        self.tied_qk = tied_qk
        self.q_proj: nn.Module = nn.Linear(d_model, num_heads * self.qk_dim, bias=bias)
        self.k_proj: nn.Module = (
            self.q_proj if tied_qk else nn.Linear(d_model, kv_heads * self.qk_dim, bias=bias)
        )
        self.v_proj = nn.Linear(d_model, kv_heads * self.v_dim, bias=bias)
        self.out_proj = nn.Linear(num_heads * self.v_dim, d_model, bias=bias)

    # -- shape helpers -------------------------------------------------------------------
    def split_heads(self, x: Tensor, dim: int, heads: int | None = None) -> Tensor:
        b, n, _ = x.shape
        return x.reshape(b, n, heads or self.num_heads, dim).transpose(1, 2)  # identity projections pass views

    def expand_kv(self, t: Tensor) -> Tensor:
        """(B, kv_heads, L, D) -> (B, num_heads, L, D): each key/value head serves a group of
        consecutive query heads (grouped-query attention; the identity when kv_heads = heads)."""
        if self.kv_heads == self.num_heads:
            return t
        return t.repeat_interleave(self.num_heads // self.kv_heads, dim=1)

    def new_cache(self) -> AttentionCache:
        return AttentionCache()

    def state_size(self, length: int) -> int:
        """Elements the decoding cache keeps per sequence after ``length`` positions: the keys
        and values of every position (kv_heads of them). Variants with other state override."""
        return length * self.kv_heads * (self.qk_dim + self.v_dim)

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
        document_starts: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``x`` (B, Lq, d_model) to itself or to ``memory`` (B, Lk, d_model).

        ``key_padding_mask`` refers to the keys of this call (``x``'s new positions for
        self-attention, ``memory`` for cross-attention). ``document_starts`` (B, L; a full
        self-attention pass): keep the documents that start there apart
        (:mod:`harness.nn.documents`). Returns the output (B, Lq, d_model) and, if
        ``need_weights``, the attention weights (B, H, Lq, Lk).
        """
        if document_starts is not None and not (memory is None and cache is None):
            raise ValueError("document_starts applies to a full self-attention pass (no memory, no cache)")
        segments = None
        if document_starts is not None and not masks_documents(type(self)):
            return by_document(lambda d: self(d, causal=causal, position=position)[0], x,
                               document_starts), None
        if document_starts is not None:
            segments = document_ids(document_starts)
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
            k = self.split_heads(self.k_proj(src), self.qk_dim, self.kv_heads)
            v = self.split_heads(self.v_proj(src), self.v_dim, self.kv_heads)
            k_pos = torch.arange(offset, offset + src.shape[1], device=x.device)

        use_position = position is not None and is_self
        if use_position:
            assert position is not None
            q, k = self.position_rotate(position, q, k, q_pos, k_pos)
        if cache is not None:
            if is_self:
                k, v, k_pos, key_padding_mask = self.extend_cache(cache, k, v, k_pos, key_padding_mask)
            elif cache.k is None:
                cache.k, cache.v, cache.k_pos = k, v, k_pos
                cache.key_padding_mask = key_padding_mask
        k, v = self.expand_kv(k), self.expand_kv(v)
        bias: Any = None
        if use_position and self.bias_by_blocks:
            if _overrides(position, "score_bias"):
                bias = functools.partial(self.position_bias, position)
        elif use_position:
            bias = self.position_bias(position, q, q_pos, k_pos)
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
            state=cache.state if (cache is not None and (is_self or self.memory_state)) else None,
            cross=not is_self,
            **({} if segments is None else {"segments": segments}),
        )
        return self.out_proj(self.merge_heads(out)), weights

    # -- position hooks in the scheme's head layout ----------------------------------------
    def _to_position_heads(self, t: Tensor) -> Tensor:
        """(B, H, L, D) -> (B, position_heads, L, H*D / position_heads): same numbers."""
        b, h, n, d = t.shape
        p = self.position_heads
        if (h * d) % p:
            raise ValueError(
                f"{type(self).__name__}: {h} head(s) of width {d} cannot be regrouped into the "
                f"{p} heads the position scheme was built for ({h * d} is not divisible by {p}). "
                f"Choose a width (heads x per-head dim) divisible by the model's head count."
            )
        return t.transpose(1, 2).reshape(b, n, p, h * d // p).transpose(1, 2)

    def _from_position_heads(self, t: Tensor, d: int) -> Tensor:
        b, _, n, _ = t.shape
        return t.transpose(1, 2).reshape(b, n, self.num_heads, d).transpose(1, 2)

    def position_rotate(
        self, position: PositionScheme, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Apply the scheme's ``rotate`` hook (a no-op for schemes that do not rotate)."""
        if not _overrides(position, "rotate"):
            return q, k
        if self.position_heads == self.num_heads:
            return position.rotate(q, k, q_pos, k_pos)
        rq, rk = position.rotate(self._to_position_heads(q), self._to_position_heads(k), q_pos, k_pos)
        return self._from_position_heads(rq, q.shape[-1]), self._from_position_heads(rk, k.shape[-1])

    def position_bias(self, position: Any, q: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        """The scheme's additive score bias for this layer's heads, or None."""
        if not _overrides(position, "score_bias"):
            return None
        if self.position_heads == self.num_heads:
            return position.score_bias(q, q_pos, k_pos)  # type: ignore[no-any-return]
        bias = position.score_bias(self._to_position_heads(q), q_pos, k_pos)
        if bias is None or bias.dim() < 3 or bias.shape[-3] == 1:
            return bias  # type: ignore[no-any-return]
        bias = bias if bias.dim() == 4 else bias[None]
        h, p = self.num_heads, bias.shape[1]
        if p % h == 0:
            return bias.unflatten(1, (h, p // h)).mean(dim=2)  # type: ignore[no-any-return]
        if h % p == 0:
            return bias.repeat_interleave(h // p, dim=1)  # type: ignore[no-any-return]
        raise ValueError(
            f"{type(self).__name__} runs {h} heads; the position scheme's bias has {p}. "
            f"One head count must divide the other."
        )

    # -- what variants implement -----------------------------------------------------------
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
        state: dict[str, Any] | None = None,
        cross: bool = False,
        segments: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Softmax attention over :meth:`score`: (B, H, Lq, Dv) output and optional weights.

        ``state`` is the decoding cache's ``state`` dict during cached self-attention (and
        cached cross-attention for a variant with ``memory_state``; None otherwise): a
        variant that carries running sums reads and updates it here. ``bias`` is a function
        of (q, q_pos, k_pos) instead of a tensor for a variant with ``bias_by_blocks``.
        ``cross``: keys come from another sequence (their positions do not compare with
        the queries'), for variants whose masks depend on distances. ``segments``: (B, L)
        document ids of a full self-attention pass, given only to variants that declare
        ``masks_documents``: no query attends outside its document.
        """
        scores = self.score(q, k)
        if bias is not None:
            scores = scores + bias
        allowed = allowed_mask(q_pos, k_pos, causal=causal, key_padding_mask=key_padding_mask,
                               segments=segments)
        weights = masked_softmax(scores, allowed).to(v.dtype)
        dropped = F.dropout(weights, self.dropout, self.training) if self.dropout else weights
        return dropped @ v, (weights if need_weights else None)


class FusedDotProductAttention(Attention):
    """Softmax attention over dot-product scores, on PyTorch's fused kernels.

    score(q, k) = scale · q·k, with ``score_scale`` None for the Transformer's 1/√d_k or a
    fixed factor (1.0: unscaled). ``F.scaled_dot_product_attention`` runs it and keeps its
    fast kernels where the position scheme allows: ``is_causal`` instead of a mask when
    nothing else is masked and no bias is added, a boolean mask for padding, a float mask
    only with a score bias. Weights (``need_weights``) come from the explicit path of
    :class:`Attention`, which computes the same function.
    """

    score_scale: float | None = None

    def score(self, q: Tensor, k: Tensor) -> Tensor:
        fixed = self.score_scale is not None
        scale = qk_scale(self, q.shape[-1], self.score_scale if fixed else 1.0 / math.sqrt(q.shape[-1]),
                         fixed=fixed)
        return (q * scale) @ k.transpose(-2, -1)

    # the signature of Attention.attend, spelled out again: an override of the protocol
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
        state: dict[str, Any] | None = None,
        cross: bool = False,
        segments: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        if need_weights:
            return super().attend(
                q, k, v, q_pos=q_pos, k_pos=k_pos, causal=causal,
                key_padding_mask=key_padding_mask, bias=bias, need_weights=True, segments=segments,
            )
        dropout = self.dropout if self.training else 0.0
        scale = qk_scale(self, q.shape[-1], self.score_scale, fixed=self.score_scale is not None)
        # Causal attention only runs on self-attention, where equal lengths mean the same
        # positions (a cache makes keys longer than queries).
        if (causal and bias is None and key_padding_mask is None and segments is None
                and q.shape[2] == k.shape[2]):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout, scale=scale)
            return out, None
        allowed = allowed_mask(q_pos, k_pos, causal=causal, key_padding_mask=key_padding_mask,
                               segments=segments)
        mask, empty = sdpa_mask(allowed, bias, q.dtype)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scale)
        return (out if empty is None else out.masked_fill(empty, 0.0)), None


def masks_documents(cls: type[Attention]) -> bool:
    """Whether a variant masks across documents itself (see ``Attention.masks_documents``)."""
    declared = cls.masks_documents
    if declared is not None:
        return declared
    return cls.attend is FusedDotProductAttention.attend
