"""``gated_deltanet``: the delta rule with a data-dependent scalar decay per head (Mamba-2's
gate), so the memory can both overwrite one key's value and forget everything quickly.

Paper: Songlin Yang, Jan Kautz, Ali Hatamizadeh, "Gated Delta Networks: Improving Mamba2
with Delta Rule", ICLR 2025, arXiv:2412.06464.

What it computes, per head (H heads, key width Dk = expand_k · d_model / H, value width
Dv = expand_v · d_model / H), at position t:

    q_t, k_t, v_t = SiLU(ShortConv(x W_Q)), SiLU(ShortConv(x W_K)), SiLU(ShortConv(x W_V))
    q_t, k_t = q_t / ||q_t||, k_t / ||k_t||            (L2 normalisation; q also / sqrt(Dk))
    β_t = sigmoid(x_t W_β),   α_t = exp(-exp(A_log) · softplus(x_t W_α + dt_bias))  (per head)
    S_t = α_t S_{t-1} (I - β_t k_t k_tᵀ) + β_t v_t k_tᵀ,   o_t = S_t q_t   (S: Dv x Dk)
    y_t = (RMSNorm(o_t) ⊙ SiLU(x_t W_G)) W_O             (RMSNorm per head, output gate)

α_t ∈ (0, 1) is Mamba-2's discretised decay: A = exp(A_log) > 0 initialised uniformly in
(0, 16], dt_bias initialised so that softplus(dt_bias) is log-uniform in [0.001, 0.1].
ShortConv: depthwise causal convolution (kernel ``conv_size``, 4 in the paper, no bias).

Training form (:mod:`harness.nn.linear_recurrence`): chunks of C positions; with B_t the
cumulative log-decay in a chunk, the pseudo-values U solve the unit lower-triangular
system (I + A) U = diag(β) (V - diag(e^B) K S_0ᵀ), A_ts = β_t e^(B_t - B_s) k_t·k_s (s < t)
(the WY / UT representation with decay), solved for all chunks at once; outputs and the
next chunk's state are matrix products; all decay factors are exp of non-positive numbers.
Cached decoding: the recurrence (one position) or the chunked form from the cached state.

Reference implementations read and checked against: ``fla-org/flash-linear-attention``
``fla/layers/gated_deltanet.py`` (GatedDeltaNet: key width 0.75·d_model, expand_v 2,
a_proj/b_proj without bias, A_log and dt_bias initialisation, short convolutions of size 4
with SiLU, L2-normalised q and k in the kernel, FusedRMSNormGated output), and
``fla/ops/gated_delta_rule/naive.py`` (naive_recurrent_gated_delta_rule: decay, then the
delta update; naive_chunk_gated_delta_rule: the chunk form) and
``fla/ops/gated_delta_rule/gate.py`` (g = -exp(A_log) · softplus(a + dt_bias)).

Decode O(1) per token; state per layer H·Dk·Dv + (conv_size - 1)·(2·H·Dk + H·Dv).

Position hooks: token embeddings and query/key rotations (the scheme's ``rotate`` on the
L2-normalised q and k, at their absolute positions); no additive score bias (no score
matrix is formed). Causal only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.plugin import Complexity, Ge, Gt, Le, MixerSpec, hookimpl
from harness.plugin import linear_recurrence as lr


@dataclass
class GatedDeltaNetConfig:
    expand_k: Annotated[float, Gt(0), Le(4)] = 0.75  # key width / d_model (paper: 0.75)
    expand_v: Annotated[float, Gt(0), Le(8)] = 1.5  # value width / d_model (paper: 2 x key width)
    conv_size: Annotated[int, Ge(1), Le(16)] = 4  # short convolution kernel (1: no mixing)
    chunk: Annotated[int, Ge(1), Le(4096)] = 32  # positions per chunk in training (speed only)


def inverse_softplus(y: Tensor) -> Tensor:
    return y + torch.log(-torch.expm1(-y))


class GatedDeltaNet(lr.RecurrentMixer):  # same shape as gla.py by design: one file per variant
    """Gated DeltaNet: the delta rule with a data-dependent per-head decay (Mamba-2 gate) and an output gate."""

    fast_path_ops = ("fla.ops.gated_delta_rule.chunk_gated_delta_rule",)  # on CUDA (harness.nn.fast_path)
    complexity = Complexity(time="L", memory="L", decode="1", state="1")
    position_hooks = frozenset({"embedding", "qk"})
    why_not = {"bias": "the gated delta rule never forms the score matrix (it keeps a "
                       "fast-weight memory), so there is no score to add a bias to"}

    def __init__(self, config: GatedDeltaNetConfig, *, d_model: int, num_heads: int) -> None:
        super().__init__(d_model, num_heads)
        self.chunk = config.chunk
        self.dk = lr.head_width(d_model, config.expand_k, num_heads, even=True)
        self.dv = lr.head_width(d_model, config.expand_v, num_heads)
        h = num_heads
        self.inputs = lr.DeltaRuleInputs(d_model, h, self.dk, self.dv, config.conv_size)
        self.a_proj = nn.Linear(d_model, h, bias=False)
        self.A_log = nn.Parameter(torch.empty(h).uniform_(0, 16).clamp_min(1e-4).log())
        dt = torch.exp(torch.rand(h) * (math.log(0.1) - math.log(0.001)) + math.log(0.001))
        self.dt_bias = nn.Parameter(inverse_softplus(dt.clamp_min(1e-4)))
        self.g_proj = nn.Linear(d_model, h * self.dv, bias=False)
        self.norm = nn.RMSNorm(self.dv, eps=1e-5)
        self.out_proj = nn.Linear(h * self.dv, d_model, bias=False)

    def run(self, x: Tensor, positions: Tensor, position: Any, state: dict[str, Any] | None,
            starts: Tensor | None = None) -> Tensor:
        q, k, v, beta = self.inputs(x, positions, position, state, starts)
        a = self.a_proj(x).to(lr.compute_dtype(x)) + self.dt_bias
        log_alpha = (-self.A_log.exp() * F.softplus(a)).transpose(1, 2)
        o = lr.delta_rule(q, k, v, beta, log_alpha, chunk=self.chunk, state=state, starts=starts,
                         kernel=self.kernel)
        gate = F.silu(lr.split_heads(self.g_proj(x), self.num_heads))
        return self.out_proj(lr.merge_heads(self.norm(o) * gate).to(x.dtype))

    def state_size(self, length: int) -> int:
        return self.num_heads * self.dk * self.dv + self.inputs.state_size()


@hookimpl
def harness_register_mixer(register: Any) -> None:
    register(MixerSpec(name="gated_deltanet", build=GatedDeltaNet))
