"""``deltanet``: linear attention with the delta rule (a fast-weight memory that overwrites
the value stored under a key instead of adding to it).

Papers: Imanol Schlag, Kazuki Irie, Jürgen Schmidhuber, "Linear Transformers Are Secretly
Fast Weight Programmers", ICML 2021, arXiv:2102.11174 (the delta rule); Songlin Yang,
Bailin Wang, Yu Zhang, Yikang Shen, Yoon Kim, "Parallelizing Linear Transformers with the
Delta Rule over Sequence Length", NeurIPS 2024, arXiv:2406.06484 (the chunkwise-parallel
algorithm and the layer used here).

What it computes, per head (H heads, key width Dk = expand_k · d_model / H, value width
Dv = expand_v · d_model / H), at position t:

    q_t, k_t, v_t = SiLU(ShortConv(x W_Q)), SiLU(ShortConv(x W_K)), SiLU(ShortConv(x W_V))
    q_t, k_t = q_t / ||q_t||, k_t / ||k_t||            (L2 normalisation; q also / sqrt(Dk))
    β_t = sigmoid(x_t W_β)                              (one per head)
    S_t = S_{t-1} - β_t (S_{t-1} k_t - v_t) k_tᵀ         (S: Dv x Dk, the paper's layout)
        = S_{t-1} (I - β_t k_t k_tᵀ) + β_t v_t k_tᵀ,     o_t = S_t q_t
    y_t = RMSNorm(o_t) W_O                               (RMSNorm per head)

ShortConv is a depthwise causal convolution over time (kernel ``conv_size``, 4 in the
paper, no bias), part of the paper's DeltaNet layer.

Training form (:mod:`harness.nn.linear_recurrence`): chunks of C positions; inside a chunk
the product of the generalised Householder transitions (I - β k kᵀ) is kept in the WY / UT
representation: the pseudo-values U solve a unit lower-triangular C x C system
(I + A) U = diag(β) (V - K S_0ᵀ), A_ts = β_t k_t·k_s (s < t), solved for all chunks at once;
outputs and the next chunk's state are matrix products. Only the state passes from chunk to
chunk. Cached decoding: the recurrence (one position) or the chunked form from the cached
state (several).

Reference implementations read and checked against: ``fla-org/flash-linear-attention``
``fla/layers/delta_net.py`` (DeltaNet: expand_k = expand_v = 1, short convolutions of
size 4 with SiLU on q, k, v, L2-normalised q and k, β = sigmoid(b_proj(x)) without bias,
per-head RMSNorm, no output gate by default) and ``fla/ops/delta_rule/naive.py``
(delta_rule_recurrence, the loop; delta_rule_chunkwise, the UT transform; q scaled by
Dk^-1/2).

Decode O(1) per token; state per layer H·Dk·Dv (the fast weights) + (conv_size - 1)·(2·H·Dk
+ H·Dv) (the convolutions' last inputs).

Position hooks: token embeddings, and query/key rotations (the scheme's ``rotate`` on the
L2-normalised q and k of every head, at their absolute positions; a rotation keeps the
norm). An additive score bias cannot be applied: no score matrix is formed. Causal only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from torch import Tensor, nn

from harness.plugin import Complexity, Ge, Gt, Le, MixerSpec, hookimpl
from harness.plugin import linear_recurrence as lr

WHY_NOT_BIAS = ("the delta rule never forms the score matrix (it keeps a fast-weight "
                "memory), so there is no score to add a bias to")


@dataclass
class DeltaNetConfig:
    expand_k: Annotated[float, Gt(0), Le(4)] = 1.0  # key width / d_model (paper: 1)
    expand_v: Annotated[float, Gt(0), Le(4)] = 1.0  # value width / d_model (paper: 1)
    conv_size: Annotated[int, Ge(1), Le(16)] = 4  # short convolution kernel (1: no mixing)
    chunk: Annotated[int, Ge(1), Le(4096)] = 32  # positions per chunk in training (speed only)


class DeltaNet(lr.RecurrentMixer):
    """DeltaNet: linear attention whose fast-weight state is updated by the delta rule (chunked WY form)."""

    fast_path_ops = ("fla.ops.delta_rule.chunk_delta_rule",  # bf16; float32: the fused recurrent one
                     "fla.ops.delta_rule.fused_recurrent_delta_rule")  # on CUDA (harness.nn.fast_path)
    complexity = Complexity(time="L", memory="L", decode="1", state="1")
    position_hooks = frozenset({"embedding", "qk"})
    why_not = {"bias": WHY_NOT_BIAS}

    def __init__(self, config: DeltaNetConfig, *, d_model: int, num_heads: int) -> None:
        super().__init__(d_model, num_heads)
        self.chunk = config.chunk
        self.dk = lr.head_width(d_model, config.expand_k, num_heads, even=True)
        self.dv = lr.head_width(d_model, config.expand_v, num_heads)
        self.inputs = lr.DeltaRuleInputs(d_model, num_heads, self.dk, self.dv, config.conv_size)
        self.norm = nn.RMSNorm(self.dv, eps=1e-5)
        self.out_proj = nn.Linear(num_heads * self.dv, d_model, bias=False)

    def run(self, x: Tensor, positions: Tensor, position: Any, state: dict[str, Any] | None,
            starts: Tensor | None = None) -> Tensor:
        q, k, v, beta = self.inputs(x, positions, position, state, starts)
        o = lr.delta_rule(q, k, v, beta, None, chunk=self.chunk, state=state, starts=starts,
                         kernel=self.kernel)
        return self.out_proj(lr.merge_heads(self.norm(o)).to(x.dtype))

    def state_size(self, length: int) -> int:
        return self.num_heads * self.dk * self.dv + self.inputs.state_size()


@hookimpl
def harness_register_mixer(register: Any) -> None:
    register(MixerSpec(name="deltanet", build=DeltaNet))
