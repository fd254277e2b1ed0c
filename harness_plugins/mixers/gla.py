"""``gla``: gated linear attention, linear attention with a data-dependent decay per key
dimension.

Paper: Songlin Yang, Bailin Wang, Yikang Shen, Rameswar Panda, Yoon Kim, "Gated Linear
Attention Transformers with Hardware-Efficient Training", ICML 2024, arXiv:2312.06635.

What it computes, per head (H heads, key width Dk = expand_k · d_model / H, value width
Dv = expand_v · d_model / H), at position t:

    q_t = x_t W_Q,   k_t = x_t W_K / sqrt(Dk),   v_t = x_t W_V
    α_t = sigmoid(x_t W_α1 W_α2 + b_α)^(1/τ)           (low rank r; one gate per key dim)
    S_t = diag(α_t) S_{t-1} + k_tᵀ v_t,   o_t = q_t S_t
    r_t = swish(x_t W_r + b_r),   y_t = (r_t ⊙ LN(o_t)) W_O      (LN per head, no affine)

with the paper's r = 16 and τ = 16 (log α_t = logsigmoid(·) / τ: gates close to 1, slow
forgetting). Decay per key dimension makes the parallel form a generalised (not plain)
matrix product; here it is the chunked form with cumulative log-gates: inside a chunk the
weight of key s for query t is Σ_d q_td k_sd exp(B_td - B_sd) with B the cumulative
log-gate (every exponent <= 0, so no overflow however strong the forgetting), between
chunks the state is carried (:mod:`harness.nn.linear_recurrence`). No secondary chunking:
the chunk x chunk x Dk block costs O(L·C·Dk) memory, linear in L; keep ``chunk`` small.

Reference implementations read and checked against: ``fla-org/flash-linear-attention``
``fla/layers/gla.py`` (GatedLinearAttention: expand_k 0.5, expand_v 1, the low-rank gate
with bias, logsigmoid / gate_logit_normalizer 16, q scaled by Dk^-1/2, swish output gate)
and ``fla/ops/gla/naive.py`` (naive_recurrent_gla, the recurrence); the authors'
``berlino/gated_linear_attention`` ``gla.py`` (per-head LayerNorm without affine, output
gate with bias, xavier gain 2^-2.5 on the q, k and gate projections). fla's layer uses an
RMSNorm instead of the LayerNorm.

Cached decoding: the recurrence (one position) or the chunked form from the cached state
(several). Decode O(1) per token; state per layer H·Dk·Dv elements.

Position hooks: token embeddings, and query/key rotations (RoPE: the scheme's ``rotate``
is applied to q and k of every head before the recurrence, at their absolute positions;
GLA's paper uses none). An additive score bias cannot be applied: no score matrix is
formed. Causal only (bidirectional GLA variants exist; not implemented).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import torch.nn.functional as F
from torch import Tensor, nn

from harness.plugin import Complexity, FloatRange, Ge, Gt, Le, MixerSpec, hookimpl, qk_scale
from harness.plugin import linear_recurrence as lr


@dataclass
class GLAConfig:
    expand_k: Annotated[float, Gt(0), Le(4)] = 0.5  # key width / d_model (paper: 0.5)
    expand_v: Annotated[float, Gt(0), Le(4)] = 1.0  # value width / d_model (paper: 1)
    gate_rank: Annotated[int, Ge(1), Le(1024)] = 16  # r of the low-rank gate projection
    gate_temperature: Annotated[float, Ge(1), Le(128), FloatRange(4.0, 32.0, log=True)] = 16.0  # τ
    chunk: Annotated[int, Ge(1), Le(4096)] = 16  # positions per chunk in training (speed only)


class GLA(lr.RecurrentMixer):  # same shape as gated_deltanet.py by design: one file per variant
    """Gated linear attention (GLA): linear attention with a data-dependent forget gate per key dimension."""

    fast_path_ops = ("fla.ops.gla.chunk_gla",)  # on CUDA (harness.nn.fast_path)
    complexity = Complexity(time="L", memory="L", decode="1", state="1")
    position_hooks = frozenset({"embedding", "qk"})
    why_not = {"bias": "gated linear attention never forms the score matrix (its state sums "
                       "gated k·vᵀ), so there is no score to add a bias to"}

    def __init__(self, config: GLAConfig, *, d_model: int, num_heads: int) -> None:
        super().__init__(d_model, num_heads)
        self.chunk, self.temperature = config.chunk, config.gate_temperature
        self.dk = lr.head_width(d_model, config.expand_k, num_heads, even=True)
        self.qk_dim = self.dk  # k / sqrt(Dk): a query-key scale, 1/Dk under μP
        self.dv = lr.head_width(d_model, config.expand_v, num_heads)
        h = num_heads
        self.q_proj = nn.Linear(d_model, h * self.dk, bias=False)
        self.k_proj = nn.Linear(d_model, h * self.dk, bias=False)
        self.v_proj = nn.Linear(d_model, h * self.dv, bias=False)
        self.gate = nn.Sequential(nn.Linear(d_model, config.gate_rank, bias=False),
                                  nn.Linear(config.gate_rank, h * self.dk))
        self.r_proj = nn.Linear(d_model, h * self.dv)
        self.out_proj = nn.Linear(h * self.dv, d_model, bias=False)
        for weight in (self.q_proj.weight, self.k_proj.weight, self.gate[0].weight, self.gate[1].weight):
            nn.init.xavier_uniform_(weight, gain=2**-2.5)

    def run(self, x: Tensor, positions: Tensor, position: Any, state: dict[str, Any] | None,
            starts: Tensor | None = None) -> Tensor:
        h, dtype = self.num_heads, lr.compute_dtype(x)
        q = lr.split_heads(self.q_proj(x), h).to(dtype)
        k = lr.split_heads(self.k_proj(x), h).to(dtype)
        if position is not None:
            q, k = position.rotate(q, k, positions, positions)
        v = lr.split_heads(self.v_proj(x), h).to(dtype)
        log_alpha = F.logsigmoid(lr.split_heads(self.gate(x), h).to(dtype)) / self.temperature
        o = lr.linear_attention(q, k * qk_scale(self, self.dk, self.dk**-0.5), v, log_alpha, chunk=self.chunk, state=state,
                                starts=starts, kernel=self.kernel)
        o = F.layer_norm(o, (self.dv,))
        return self.out_proj(F.silu(self.r_proj(x)) * lr.merge_heads(o).to(x.dtype))

    def state_size(self, length: int) -> int:
        return self.num_heads * self.dk * self.dv


@hookimpl
def harness_register_mixer(register: Any) -> None:
    register(MixerSpec(name="gla", build=GLA))
