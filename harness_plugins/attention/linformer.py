"""``linformer``: self-attention over keys and values projected to k rows along the sequence.

Wang, Li, Khabsa, Fang, Ma, "Linformer: Self-Attention with Linear Complexity", 2020,
arXiv:2006.04768.

Each head attends to k projected key/value rows instead of the n positions (the paper's
eq. 7)::

    head_i = softmax( Q_i (E_i K_i)ᵀ / √d_k ) · F_i V_i,    E_i, F_i ∈ R^(k x n)

so the score matrix is n x k, not n x n: time and memory O(n·k). E and F are learned
(initialised uniformly in ±1/√k, as the reference does). ``sharing`` chooses the paper's
parameter sharing (its section 4): ``none`` (an E_i and F_i per head), ``headwise`` (one E
and one F shared by the heads of a layer; the default), ``key-value`` (one matrix for both,
E = F, shared by the heads). The paper's ``layerwise`` sharing (one matrix for all layers)
is not offered: each layer is built on its own and owns its parameters.

Fixed length. E and F have one column per position, so the layer is built for a maximum
length: ``max_length``. The build context of an attention variant is only (d_model,
num_heads), so the length is a config parameter: set it to the task's longest input (the
default covers the tiny tasks). A shorter sequence of n positions uses the first n columns
(as the reference does); a longer one is refused (``supports_length``, which the
transformer model asks before evaluating at other lengths, and a clear error in
``forward``). Parameters: 2 · max_length · k per layer (headwise), times the heads for
``none``, half that for ``key-value``.

Padding: padded keys and values are set to zero before the projection, so they contribute
nothing to the k rows (a pad never reaches a real output). Causal use and decoding are
impossible: every projected row mixes all positions, including later ones. The layer is
``bidirectional`` only (encoders: classification and tagging), a cached (incremental)
self-attention call raises, and cross-attention (keys from an encoder's memory of at most
``max_length`` positions) works with or without a cache.

Position hooks: token embeddings only. A rotation of queries and keys by position (RoPE)
would be applied before the keys are mixed across positions, where it no longer encodes
offsets; a score bias needs scores between positions, and the scores here are against
projected rows. Attention weights (``need_weights``): the effective mixing matrix over the
original positions, softmax(Q(EK)ᵀ/√d)·E, zero at padded positions (rows need not sum to
one, entries may be negative); formed for logging only.

Checked against ``lucidrains/linformer`` (``linformer/linformer.py``,
``LinformerSelfAttention``: per-layer E and F of shape (seq_len, k), sliced to the input
length, ``share_kv``) and the paper.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.plugin import (  # a list of names, not logic: other plugins list many of the same
    Attention,
    AttentionCache,
    AttentionConfig,
    AttentionSpec,
    Complexity,
    Ge,
    IntRange,
    Le,
    hookimpl,
    masked_softmax,
    qk_scale,
)

NO_DECODING = (
    "Linformer projects keys and values along the whole sequence (every projected row mixes "
    "all positions, later ones included), so it has no causal form and no decoding cache"
)


@dataclass
class LinformerConfig(AttentionConfig):
    #: the longest sequence the layer accepts (E and F have one column per position)
    max_length: Annotated[int, Ge(1), Le(1 << 20)] = 256
    #: projected length k (rows of E K and F V)
    k: Annotated[int, Ge(1), IntRange(16, 256, log=True)] = 32
    #: parameter sharing of E and F: per head, shared by the heads, or E = F shared
    sharing: Literal["none", "headwise", "key-value"] = "headwise"


class LinformerAttention(Attention):  # same shape as mixers/retnet.py by design: one file per variant
    """Linformer: keys and values projected along the sequence to k rows; O(L·k), bidirectional, fixed maximum length."""

    directions = frozenset({"bidirectional"})
    complexity = Complexity(time="L", memory="L", decode="none", state="none")
    #: E and F act along the sequence: k·d multiply-adds per token, not one per weight (the FLOP check)
    sequence_weights = ("proj_k", "proj_v")
    position_hooks = frozenset({"embedding"})
    why_not = {
        "qk": "Linformer mixes the keys across positions before scoring, so a rotation by "
              "position no longer encodes relative offsets",
        "bias": "Linformer scores queries against k projected rows, not against positions, so "
                "there is no query-key offset to bias",
    }

    def __init__(self, config: LinformerConfig, *, d_model: int, num_heads: int) -> None:
        super().__init__(d_model, num_heads, dropout=config.dropout, bias=config.bias)
        self.max_length, self.k, self.sharing = config.max_length, config.k, config.sharing
        shape = (num_heads, config.max_length, config.k) if config.sharing == "none" else (
            config.max_length, config.k)
        bound = config.k ** -0.5
        self.proj_k = nn.Parameter(torch.empty(shape).uniform_(-bound, bound))
        self.proj_v = (self.proj_k if config.sharing == "key-value"
                       else nn.Parameter(torch.empty(shape).uniform_(-bound, bound)))

    def supports_length(self, length: int) -> bool:
        return length <= self.max_length

    def state_size(self, length: int) -> int:
        """No decoding state: the layer is bidirectional only."""
        return 0

    def extend_cache(self, cache: AttentionCache, k: Tensor, v: Tensor, k_pos: Tensor,
                     key_padding_mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        raise ValueError(f"cached (incremental) self-attention is not possible: {NO_DECODING}.")

    def projections(self, n: int) -> tuple[Tensor, Tensor]:
        """E and F for a sequence of ``n`` positions: (H | 1, n, k)."""
        if n > self.max_length:
            raise ValueError(
                f"linformer was built for sequences of at most max_length={self.max_length} "
                f"positions and got {n}; set attention.params.max_length to at least {n}."
            )
        e, f = self.proj_k[..., :n, :], self.proj_v[..., :n, :]
        return (e, f) if self.sharing == "none" else (e[None], f[None])

    def attend(self, q, k, v, *, q_pos, k_pos, causal, key_padding_mask, bias, need_weights,  # type: ignore[no-untyped-def]
               state=None, cross=False):
        if causal:
            raise ValueError(f"linformer cannot attend causally: {NO_DECODING}.")
        if bias is not None:
            raise ValueError(f"a position scheme with a score bias was passed: {self.why_not['bias']}.")
        e, f = self.projections(k.shape[2])
        if key_padding_mask is not None:
            keep = (~key_padding_mask)[:, None, :, None].to(k.dtype)
            k, v = k * keep, v * keep
        pk = e.transpose(-2, -1).to(k.dtype) @ k  # (B, H, k, d): E K
        pv = f.transpose(-2, -1).to(v.dtype) @ v  # (B, H, k, d_v): F V
        scores = (q * qk_scale(self, q.shape[-1], q.shape[-1] ** -0.5)) @ pk.transpose(-2, -1)
        weights = masked_softmax(scores, None).to(v.dtype)
        dropped = F.dropout(weights, self.dropout, self.training) if self.dropout else weights
        effective = None
        if need_weights:  # padded positions carry zero values: nothing is mixed from them
            effective = weights @ e.transpose(-2, -1).to(v.dtype)
            if key_padding_mask is not None:
                effective = effective.masked_fill(key_padding_mask[:, None, None, :], 0.0)
        return dropped @ pv, effective


@hookimpl
def harness_register_attention(register: Any) -> None:
    register(AttentionSpec(
        name="linformer",
        build=LinformerAttention,
        exempt={
            "permutation_equivariance": "E and F weigh each position with its own column: the projection is "
                           "positional, so permuting the input does not permute the output",
            "row_stochastic": "the weights returned are the effective mixing matrix "
                              "softmax(Q(EK)ᵀ)·E over positions, not a softmax over them",
        },
    ))
