"""``retnet``: multi-scale retention, the token mixer of the Retentive Network.

Paper: Yutao Sun, Li Dong, Shaohan Huang, Shuming Ma, Yuqing Xia, Jilong Xue, Jianyong Wang,
Furu Wei, "Retentive Network: A Successor to Transformer for Large Language Models", 2023,
arXiv:2307.08621.

What it computes, per head h of H (key width Dk = d_model / H, value width
Dv = expand_v · d_model / H), for positions n, m:

    Q = (X W_Q) ⊙ Θ,   K = (X W_K) ⊙ Θ̄ / sqrt(Dk),   V = X W_V
    γ_h = 1 - 2^(-5-h)                                      (fixed, h = 0 .. H-1)
    parallel:   O = (D ⊙ Q Kᵀ) V,   D_nm = γ_h^(n-m) for n >= m, else 0
    recurrent:  S_n = γ_h S_{n-1} + K_nᵀ V_n,   o_n = Q_n S_n
    Y = GroupNorm_H(concat_h o^h),   MSR(X) = (swish(X W_G) ⊙ Y) W_O

Θ is the paper's xPos-style rotation: dimensions (2i, 2i+1) of q and k are turned by the
angle n·θ_i at position n, θ_i = 10000^(-i/(Dk/2 - 1)) (the torchscale table), so Q_n·K_m
depends on n - m only. Of the paper's retention-score normalisations (§3.2), both the
1/sqrt(Dk) scale and the decay normalisation D̃_nm = D_nm / sqrt(Σ_{i<=n} D_ni) (a factor
per position and head, 1/sqrt(Σ_{i=0}^{n} γ_h^i), exact in every form) are applied; the
data-dependent |row-sum| normalisation of QKᵀ is not, since it has no recurrent form. All
three are invariant under the per-head GroupNorm (up to its ε) and serve only to keep
numbers in range, which running the recurrence in float32 does here.

Reference implementations read and checked against: ``microsoft/torchscale``
``torchscale/component/multiscale_retention.py`` (MultiScaleRetention: projections without
bias, k scaled by Dk^-1/2, rotate-every-two Θ, swish gate, xavier gains 2^-2.5 / 2^-1) and
``torchscale/architecture/retnet.py`` (RetNetRelPos: the θ table and
γ = 1 - 2^(-5-arange(H))); ``fla-org/flash-linear-attention`` ``fla/ops/retention/naive.py``
(the decay mask). torchscale's current layer uses an RMSNorm without affine; this follows
the paper's GroupNorm (per-head normalisation with a learned per-channel affine).

Forms here: training uses the chunked form of :mod:`harness.nn.linear_recurrence`
(intra-chunk (D ⊙ QKᵀ)V, inter-chunk recurrent state; ``chunk`` >= L is exactly the
parallel form); cached decoding runs the recurrence (one position) or the chunked form
from the cached state (several). Decode O(1) per token; state per layer H·Dk·Dv elements.

Position hooks: token-embedding schemes only. Retention rotates q and k by its own Θ, so a
scheme's query/key rotation (``qk``) is not applied; an additive score bias cannot be,
since the recurrent form never forms scores. Causal only: a bidirectional retention
(γ^|n-m|, as in vision variants) exists but is not implemented.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.plugin import Complexity, Ge, IntRange, Le, MixerSpec, documents, hookimpl, qk_scale
from harness.plugin import linear_recurrence as lr


@dataclass
class RetNetConfig:
    expand_v: Annotated[int, Ge(1), Le(4), IntRange(1, 2)] = 2  # value width / key width (paper: 2)
    chunk: Annotated[int, Ge(1), Le(4096)] = 64  # positions per chunk in training (speed only)


def retention_decays(num_heads: int) -> list[float]:
    """log γ_h, γ_h = 1 - 2^(-5-h), in float64 precision."""
    return [math.log1p(-(2.0 ** (-5 - h))) for h in range(num_heads)]


class RetNet(lr.RecurrentMixer):  # same shape as attention/linformer.py by design: one file per variant
    """Multi-scale retention (RetNet): fixed per-head decays, xPos-style rotation, GroupNorm and a swish gate."""

    fast_path_ops = ("fla.ops.simple_gla.chunk_simple_gla",)  # on CUDA (harness.nn.fast_path)
    complexity = Complexity(time="L", memory="L", decode="1", state="1")
    position_hooks = frozenset({"embedding"})
    why_not = {
        "qk": "retention rotates queries and keys by its own xPos-style Θ (the paper's "
              "relative position), so a second rotation is not applied",
        "bias": "retention's recurrent and chunked forms never form the score matrix, so "
                "there is no score to add a bias to",
    }

    def __init__(self, config: RetNetConfig, *, d_model: int, num_heads: int) -> None:
        super().__init__(d_model, num_heads)
        self.chunk = config.chunk
        self.dk = lr.head_width(d_model, 1.0, num_heads, even=True)
        self.qk_dim = self.dk  # k / sqrt(Dk): a query-key scale, 1/Dk under μP
        self.dv = lr.head_width(d_model, config.expand_v, num_heads)
        h = num_heads
        self.q_proj = nn.Linear(d_model, h * self.dk, bias=False)
        self.k_proj = nn.Linear(d_model, h * self.dk, bias=False)
        self.v_proj = nn.Linear(d_model, h * self.dv, bias=False)
        self.g_proj = nn.Linear(d_model, h * self.dv, bias=False)
        self.out_proj = nn.Linear(h * self.dv, d_model, bias=False)
        self.group_norm = nn.GroupNorm(h, h * self.dv)
        for proj in (self.q_proj, self.k_proj, self.v_proj, self.g_proj):
            nn.init.xavier_uniform_(proj.weight, gain=2**-2.5)
        nn.init.xavier_uniform_(self.out_proj.weight, gain=2**-1)

    def log_gamma(self, like: Tensor) -> Tensor:
        return torch.tensor(retention_decays(self.num_heads), dtype=like.dtype, device=like.device)

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """Θ: turn dimensions (2i, 2i+1) by positions·θ_i."""
        half = self.dk // 2
        exponent = torch.linspace(0, 1, half, dtype=torch.float64, device=x.device)
        theta = (10_000.0 ** -exponent).to(x.dtype)
        angles = positions.to(x.dtype)[:, None] * theta[None, :]
        cos, sin = angles.cos(), angles.sin()
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)

    def run(self, x: Tensor, positions: Tensor, position: Any, state: dict[str, Any] | None,
            starts: Tensor | None = None) -> Tensor:
        h, dtype = self.num_heads, lr.compute_dtype(x)
        q = self.rotate(lr.split_heads(self.q_proj(x), h).to(dtype), positions)
        k = self.rotate(lr.split_heads(self.k_proj(x), h).to(dtype), positions) * qk_scale(self, self.dk, self.dk**-0.5)
        v = lr.split_heads(self.v_proj(x), h).to(dtype)
        log_gamma = self.log_gamma(q)
        log_decay = log_gamma.view(1, h, 1, 1).expand(x.shape[0], h, x.shape[1], 1)
        o = lr.linear_attention(q, k, v, log_decay, chunk=self.chunk, state=state, starts=starts,
                                kernel=self.kernel, gamma=log_gamma)  # FLA: g_gamma, as its retention layer
        # decay normalisation: 1 / sqrt(Σ_{i=0}^{n} γ^i) = sqrt((1 - γ) / (1 - γ^(n+1))), n
        # counted from the document's start (the rotation above is relative: left as it is)
        n = positions[None, :] if starts is None else documents.places(starts)
        n1 = n.to(dtype)[:, None, :, None] + 1
        scale = (torch.expm1(log_gamma)[:, None, None] / torch.expm1(n1 * log_gamma[:, None, None])).sqrt()
        y = lr.merge_heads(o * scale)
        y = self.group_norm(y.reshape(-1, y.shape[-1])).view_as(y).to(x.dtype)
        return self.out_proj(F.silu(self.g_proj(x)) * y)

    def state_size(self, length: int) -> int:
        return self.num_heads * self.dk * self.dv


@hookimpl
def harness_register_mixer(register: Any) -> None:
    register(MixerSpec(name="retnet", build=RetNet))
