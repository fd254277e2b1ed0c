"""``linear``: kernelised linear attention (Katharopoulos et al., 2020).

Replace exp(q·k) by a feature-map kernel φ(q)·φ(k) with φ(x) = elu(x) + 1 (positive, so
every weight is positive and the normaliser never vanishes). Then

    out_i = φ(q_i)ᵀ Σ_j φ(k_j) v_jᵀ  /  φ(q_i)ᵀ Σ_j φ(k_j)

and the sums over keys are computed once, never the Lq x Lk score matrix: time and memory
grow linearly with the length.

* Bidirectional (and cross-attention): one sum over all keys; padded keys get φ(k) = 0, so
  they drop out of numerator and normaliser alike.
* Causal: the sums are prefix sums S_i = Σ_{j<=i} φ(k_j) v_jᵀ, z_i = Σ_{j<=i} φ(k_j). They
  are computed in blocks of ``chunk`` positions: the running sums carry everything before
  a block, a small chunk x chunk lower-triangular product covers the block itself (the
  standard chunked form; ``chunk = 1`` is the plain recurrence). Same sums, matrix
  products instead of a Python loop over positions.
* Decoding: the cache holds only the running sums (``state["kv"]``, ``state["z"]``), O(1)
  memory and time per token. Cross-attention computes the sums over the (padded) memory
  once, on the first cached step, and keeps them in the cross cache's state: each later
  step costs O(1) in the source length (the memory's keys are never read again).

Position hooks: rotations (RoPE) act on queries and keys before φ. An additive score bias
(ALiBi, T5, Shaw) cannot be applied, because no score is ever formed; the spec declares
this and such pairings are rejected before training.

Dropout: there are no weights to drop, so ``dropout`` drops whole keys per head (their
φ(k) is zeroed) during training: the linear analogue of attention dropout, renormalised by
the same normaliser. Weights (``need_weights``) are formed explicitly for logging only,
φ(q_i)·φ(k_j) / Σ_j', and are unavailable during cached decoding (the keys are gone).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import torch
import torch.nn.functional as F
from torch import Tensor

from harness.plugin import (  # a list of names, not logic: other plugins list many of the same
    AttentionConfig,
    AttentionSpec,
    Ge,
    RunningSumAttention,
    hookimpl,
    kernel_weights,
    ratio_or_zero,
)

WHY_NOT_BIAS = (
    "linear attention never forms the score matrix (it sums φ(k)vᵀ over keys), so there "
    "is no score to add a bias to"
)


@dataclass
class LinearConfig(AttentionConfig):
    """``dropout`` drops whole keys per head (there are no weights to drop)."""

    # block length of the causal prefix sums (speed only, same result); None: 2 x head width in [16, 128]
    chunk: Annotated[int | None, Ge(1)] = None


def feature(x: Tensor) -> Tensor:
    return F.elu(x) + 1.0


def global_sums(fq: Tensor, fk: Tensor, v: Tensor, state: dict[str, Any] | None) -> Tensor:
    """Every query sees every key (plus the cached sums, when decoding)."""
    kv, z = fk.transpose(-2, -1) @ v, fk.sum(dim=-2)
    if state is not None:
        if "kv" in state:
            kv, z = kv + state["kv"], z + state["z"]
        state["kv"], state["z"] = kv, z
    return ratio_or_zero(fq @ kv, fq @ z.unsqueeze(-1))


def prefix_sums(fq: Tensor, fk: Tensor, v: Tensor, state: dict[str, Any] | None, chunk: int) -> Tensor:
    """Query i sees keys j <= i: within a block of ``chunk`` positions a lower triangle of
    φ(q)·φ(k) products, across blocks the sums of every earlier block (an exclusive prefix sum
    over the blocks' sums), plus the cached sums when decoding. All blocks at once, in batched
    matrix products: no loop over positions or blocks, and no sum is ever kept per position.

    Values carry a column of ones, so one product gives the numerator (Σ φ(k) vᵀ) and the
    normaliser (Σ φ(k)) together."""
    b, h, n, d = fq.shape
    dv = v.shape[-1]
    chunk = min(chunk, n)
    pad = (-n) % chunk
    blocks = (n + pad) // chunk
    v1 = torch.cat([v, v.new_ones(b, h, n, 1)], dim=-1)
    if pad:  # zero keys add nothing; the padded queries' rows are dropped
        fq, fk, v1 = (F.pad(t, (0, 0, 0, pad)) for t in (fq, fk, v1))
    q = fq.reshape(b * h * blocks, chunk, d)
    k = fk.reshape(b * h * blocks, chunk, d)
    v1 = v1.reshape(b * h * blocks, chunk, dv + 1)
    local = torch.bmm(q, k.transpose(1, 2)).tril()  # within a block: keys at or before the query
    sums = torch.bmm(k.transpose(1, 2), v1).view(b, h, blocks, d, dv + 1)  # each block's Σ φ(k)[v, 1]ᵀ
    before = F.pad(sums[:, :, :-1], (0, 0, 0, 0, 1, 0)).cumsum(dim=2)  # every earlier block's
    if state and "kv" in state:
        before = before + torch.cat([state["kv"], state["z"].unsqueeze(-1)], dim=-1).unsqueeze(2)
    out = torch.baddbmm(torch.bmm(q, before.reshape(b * h * blocks, d, dv + 1)), local, v1)
    out = out.view(b, h, blocks * chunk, dv + 1)[:, :, :n]
    if state is not None:
        total = before[:, :, -1] + sums[:, :, -1]
        state["kv"], state["z"] = total[..., :dv], total[..., dv]
    return ratio_or_zero(out[..., :dv], out[..., dv:])


class LinearAttention(RunningSumAttention):  # same shape as performer.py by design: one file per variant
    """Linear attention, φ = elu + 1; causal via prefix sums, O(1) decoding."""

    label = "linear attention"
    why_not = {"bias": WHY_NOT_BIAS}

    def __init__(self, config: LinearConfig, *, d_model: int, num_heads: int) -> None:
        super().__init__(d_model, num_heads, dropout=config.dropout, bias=config.bias)
        self.chunk = config.chunk or min(128, max(16, 2 * self.qk_dim))

    def state_size(self, length: int) -> int:
        """The running sums, whatever the length: Σ φ(k) vᵀ (H x Dk x Dv) and Σ φ(k) (H x Dk)."""
        if length <= 0:
            return 0
        return self.num_heads * self.qk_dim * (self.v_dim + 1)

    def attend(self, q, k, v, *, q_pos, k_pos, causal, key_padding_mask, bias, need_weights,  # type: ignore[no-untyped-def]
               state=None, cross=False):
        self.check_call(bias=bias, need_weights=need_weights, state=state, cross=cross)
        dropping = self.training and bool(self.dropout)
        fq = feature(q)
        # Cached cross-attention: the sums over the memory, computed on the first step.
        # (Not under key dropout, which draws new keys to drop at every call.)
        memo = state if (cross and state is not None and not dropping) else None
        if memo is not None and "kv" in memo and not need_weights:
            return ratio_or_zero(fq @ memo["kv"], fq @ memo["z"].unsqueeze(-1)), None
        fk = feature(k)
        keep = self.kept_keys(key_padding_mask, fk, dropping)
        if keep is not None:
            fk = fk * keep.to(fk.dtype)
        if causal:
            if q.shape[2] != k.shape[2]:
                raise ValueError("causal linear attention needs one key per query position.")
            out = prefix_sums(fq, fk, v, state, self.chunk)
        elif memo is not None:
            if "kv" not in memo:
                memo["kv"], memo["z"] = fk.transpose(-2, -1) @ v, fk.sum(dim=-2)
            out = ratio_or_zero(fq @ memo["kv"], fq @ memo["z"].unsqueeze(-1))
        else:
            out = global_sums(fq, fk, v, None if cross else state)
        weights = kernel_weights(fq @ fk.transpose(-2, -1), q_pos, k_pos, causal) if need_weights else None
        return out, weights


@hookimpl
def harness_register_attention(register: Any) -> None:
    register(AttentionSpec(name="linear", build=LinearAttention))
