"""``h3``: Hungry Hungry Hippos, a shift SSM and a diagonal SSM with multiplicative gates.

Paper: Daniel Y. Fu, Tri Dao, Khaled K. Saab, Armin W. Thomas, Atri Rudra, Christopher Ré,
"Hungry Hungry Hippos: Towards Language Modeling with State Space Models", ICLR 2023,
arXiv:2212.14052. Reference implementation read and checked against: ``HazyResearch/H3``
``src/models/ssm/h3.py`` (``H3.forward`` and ``H3.step``, head layout, D skips),
``src/models/ssm/ss_kernel_shift.py`` (the shift SSM: B = e_1, learned C, ``step``) and
``src/models/ssm/ss_kernel_diag.py`` (the diagonal SSM).

With q, k, v = W_q u, W_k u, W_v u (d_model channels each, split into H heads of d_h =
d_model / H channels; H = the model's ``num_heads``):

    k̃_t   = Σ_{i<N} C^shift_i ⊙ k_{t-i} + D^shift ⊙ k_t     shift SSM: A = shift matrix, B = e_1
    s_t    = SSM_diag(k̃ ⊙ v)_t + D_h (k̃_t ⊙ v_t)            per head h: the d_h x d_h outer
                                                           products k̃_{t,h} v_{t,h}ᵀ, each entry
                                                           through head h's diagonal SSM (S4D)
    o_{t,h} = q_{t,h}ᵀ s_{t,h}                             (a d_h vector per head)
    out_t  = W_o o_t

The shift SSM's state is a shift register of the last N inputs, its output a learned causal
convolution of length N = ``d_state`` (with B = e_1 fixed, as in the reference's
initialisation; a learned B would only re-parameterise the same length-N filter). The
diagonal SSM is :class:`harness.nn.ssm.DiagonalSSM` (S4D, ZOH, N/2 conjugate pairs, one per
head). With d_h = 1 (``heads = d_model``, the reference's default) H3 is
q ⊙ SSM_diag(SSM_shift(k) ⊙ v) channel by channel.

* Parallel form (training): the shift SSM as a depthwise causal convolution of length N
  (O(L N)); the diagonal SSM's kernel by Vandermonde product and the convolution by FFT of
  size 2L (O(L log L)); memory O(d_model d_h L) for the outer products, nothing of size L².
* Recurrent form (decoding, chunks of any length): the shift register keeps the last N-1
  raw keys per channel (the new key completes the window) and the diagonal SSM's state
  keeps d_h x d_h x N/2 complex numbers per head: ``state_size`` = d_model (N-1) +
  d_model d_h N real numbers, constant in L; O(d_model (N + d_h N)) per token.
* Causal only. Position hooks: ``embedding`` only; H3 has queries and keys but never a
  score q·k between positions (they meet only through the SSMs), so neither a rotation nor a
  score bias has anything to act on.
* Dtype: the diagonal SSM (kernel, FFTs, recurrence) runs in float32 (float64 for a float64
  layer); the projections follow the autocast dtype.
* Differences from the reference: ZOH discretisation of the diagonal SSM (the reference's
  extracted kernel defaults to bilinear; the S4 authors note the two make little
  difference); the output channels are laid out head-major (the reference's ``(d h)`` order
  is a fixed permutation absorbed by W_o); A and Δ get the harness optimiser's settings
  rather than the reference's own learning rate without weight decay.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.plugin import (
    Complexity,
    DiagonalSSM,
    DiagonalSSMConfig,
    Mixer,
    MixerSpec,
    causal_fft_conv,
    hookimpl,
    qk_scale,
)

WHY_NOT = {
    "qk": "H3's queries and keys never meet in a score (they interact only through its SSMs), so a rotation has nothing to act on",
    "bias": "H3 forms no attention scores to add a bias to",
}


@dataclass
class H3Config(DiagonalSSMConfig):
    """d_state (N) is both the diagonal SSM's real state size and the shift register's length;
    init (lin | inv), dt_min and dt_max set up the diagonal SSM."""


class H3(Mixer):
    """H3: a shift SSM on the keys, a diagonal SSM on the key-value products, gated by the queries."""

    complexity = Complexity(time="L log L", memory="L", decode="1", state="1")
    why_not = WHY_NOT

    def __init__(self, config: H3Config, *, d_model: int, num_heads: int) -> None:
        super().__init__(d_model, num_heads)
        if d_model % num_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by num_heads ({num_heads})")
        self.head_dim = d_model // num_heads
        # o = qᵀ(Σ k̃ vᵀ) sums q·k̃ over the head's width unscaled: a query-key product whose
        # scale (1) falls as 1/d under μP (found by the coordinate check: H3's output grew)
        self.qk_dim = self.head_dim
        self.d_state = config.d_state
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        bound = 1 / math.sqrt(config.d_state)  # the reference's Conv1d-like init of C^shift
        self.shift_c = nn.Parameter(torch.empty(d_model, config.d_state).uniform_(-bound, bound))
        self.shift_skip = nn.Parameter(torch.randn(d_model))
        self.ssm = DiagonalSSM(num_heads, config)
        self.skip = nn.Parameter(torch.randn(num_heads))
        self.output = nn.Linear(d_model, d_model)

    def _shift(self, keys: Tensor, length: int) -> Tensor:
        """The shift SSM's output for the last ``length`` positions of ``keys`` (B, d, N-1+length),
        whose first N-1 columns are the keys before them (zeros at the start)."""
        weight = self.shift_c.flip(-1).unsqueeze(1).to(keys.dtype)  # lag i -> tap N-1-i
        shifted = F.conv1d(keys, weight, groups=self.d_model)
        return shifted + self.shift_skip.to(keys.dtype).unsqueeze(-1) * keys[..., -length:]

    def _products(self, x: Tensor, past_keys: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q (B, l, H, d_h), the outer products k̃ vᵀ (B, d_h, d_h, H, l), and the last N-1 keys."""
        b, n = x.shape[:2]
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        keys = torch.cat([past_keys.to(k.dtype), k.transpose(1, 2)], dim=-1)
        k_tilde = self._shift(keys, n).view(b, self.num_heads, self.head_dim, n)
        v = v.transpose(1, 2).reshape(b, self.num_heads, self.head_dim, n)
        kv = k_tilde.permute(0, 2, 1, 3).unsqueeze(2) * v.permute(0, 2, 1, 3).unsqueeze(1)
        return q.view(b, n, self.num_heads, self.head_dim), kv, keys[..., keys.shape[-1] - (self.d_state - 1):]

    def _finish(self, q: Tensor, s: Tensor, kv: Tensor) -> Tensor:
        """o_{t,h} = q_{t,h}ᵀ (s + D_h k̃vᵀ); s, kv (B, d_h, d_h, H, l) -> (B, l, d_model)."""
        s = s + self.skip.to(s.dtype).unsqueeze(-1) * kv.to(s.dtype)
        scale = qk_scale(self, self.head_dim, 1.0, fixed=True)
        o = torch.einsum("blhi,bijhl->blhj", (q if scale == 1.0 else q * scale).to(s.dtype), s)
        return self.output(o.reshape(q.shape[0], q.shape[1], self.d_model).to(q.dtype))

    def mix(self, x: Tensor, *, causal: bool, key_padding_mask: Tensor | None, position: Any) -> Tensor:
        start = x.new_zeros(x.shape[0], self.d_model, self.d_state - 1)
        q, kv, _ = self._products(x, start)
        return self._finish(q, causal_fft_conv(kv, self.ssm.kernel(x.shape[1])), kv)

    def step(self, x: Tensor, state: dict[str, Any], *, positions: Tensor, position: Any) -> Tensor:
        if "keys" not in state:
            state["keys"] = x.new_zeros(x.shape[0], self.d_model, self.d_state - 1)
            state["ssm"] = self.ssm.new_state((x.shape[0], self.head_dim, self.head_dim), x.device)
        q, kv, state["keys"] = self._products(x, state["keys"])
        s, state["ssm"] = self.ssm.scan(kv, state["ssm"])
        return self._finish(q, s, kv)

    def state_size(self, length: int) -> int:
        return self.d_model * (self.d_state - 1) + self.d_model * self.head_dim * self.d_state


@hookimpl
def harness_register_mixer(register: Any) -> None:
    register(MixerSpec(name="h3", build=H3))
