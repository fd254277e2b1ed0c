"""Attention that never forms the score matrix: keys and values folded into running sums.

Linear attention and Performer compute out_i = φ(q_i)ᵀ Σ_j φ(k_j) v_jᵀ / φ(q_i)ᵀ Σ_j φ(k_j)
with their own feature map φ. What they share lives here: :class:`RunningSumAttention`
(declarations, a decoding cache that keeps no keys, the checks of a call, the keys kept
under padding and key dropout), :func:`ratio_or_zero`, :func:`causal_block` (one block of
the chunked causal prefix sums) and :func:`kernel_weights` (the weights formed
explicitly, for logging). Imports torch and :mod:`harness.nn.attention` only.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from harness.nn.attention import Attention, AttentionCache, allowed_mask
from harness.nn.mixer import Complexity


def ratio_or_zero(num: Tensor, den: Tensor) -> Tensor:
    """num / den, and 0 where no key contributes (den = 0 implies num = 0)."""
    return num / torch.where(den > 0, den, torch.ones_like(den))


def causal_block(qc: Tensor, kc: Tensor, vc: Tensor, kv: Tensor, z: Tensor,
                 later: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """One block of the causal prefix sums: features of queries ``qc`` and keys ``kc``
    (B, H, w, F), values ``vc``, the running sums ``kv`` (B, H, F, Dv) and ``z`` (B, H, F)
    over the keys before the block, ``later`` a (c, c) mask of j > i (c >= w). Returns the
    block's outputs and the sums extended by its keys: the running sums carry everything
    before the block, a w x w lower-triangular product covers the block itself."""
    w = qc.shape[2]
    local = (qc @ kc.transpose(-2, -1)).masked_fill(later[:w, :w], 0.0)
    num = qc @ kv + local @ vc
    den = qc @ z.unsqueeze(-1) + local.sum(dim=-1, keepdim=True)
    return ratio_or_zero(num, den), kv + kc.transpose(-2, -1) @ vc, z + kc.sum(dim=-2)


def kernel_weights(kernel: Tensor, q_pos: Tensor, k_pos: Tensor, causal: bool) -> Tensor:
    """Attention weights from kernel values φ(q_i)·φ(k_j) (B, H, Lq, Lk): masked, normalised
    per query (for logging; forms the full matrix)."""
    allowed = allowed_mask(q_pos, k_pos, causal=causal)
    if allowed is not None:
        kernel = kernel.masked_fill(~allowed, 0.0)
    return ratio_or_zero(kernel, kernel.sum(dim=-1, keepdim=True))


class RunningSumAttention(Attention):
    """Base of variants whose ``attend`` folds keys and values into running sums.

    A variant sets ``label`` (its name in error messages) and ``why_not["bias"]``, and
    implements ``attend``, starting with :meth:`check_call`.
    """

    memory_state = True  # the sums over the memory, kept by the cross cache
    position_hooks = frozenset({"embedding", "qk"})
    # chunked prefix sums: L x chunk work; decoding keeps the running sums only
    complexity = Complexity(time="L", memory="L", decode="1", state="1")
    label: ClassVar[str] = "running-sum attention"

    def extend_cache(self, cache: AttentionCache, k: Tensor, v: Tensor, k_pos: Tensor,
                     key_padding_mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        # Keys and values are folded into the running sums by attend(); keep nothing else.
        cache.length = int(k_pos[-1].item()) + 1
        return k, v, k_pos, key_padding_mask

    def check_call(self, *, bias: Any, need_weights: bool, state: dict[str, Any] | None,
                   cross: bool) -> None:
        """Refuse what running sums cannot do: add a score bias, or return weights during
        cached decoding (the keys are gone)."""
        if bias is not None:
            raise ValueError(f"a position scheme with a score bias was passed: {self.why_not['bias']}.")
        if need_weights and state is not None and not cross:
            raise ValueError(f"{self.label} cannot return weights during cached decoding: the cache "
                             "keeps running sums, not keys. Run a full pass.")

    def kept_keys(self, key_padding_mask: Tensor | None, keys: Tensor, dropping: bool) -> Tensor | None:
        """(B, H, Lk, 1) True where a key counts: not padding and, when ``dropping`` (key
        dropout in training), not dropped; None when every key counts. ``keys``: (B, H, Lk, ·)."""
        keep = None
        if key_padding_mask is not None:
            keep = ~key_padding_mask[:, None, :, None]  # (B, 1, Lk, 1)
        if dropping:
            kept = torch.rand(*keys.shape[:3], 1, device=keys.device) >= self.dropout
            keep = kept if keep is None else keep & kept
        return keep
