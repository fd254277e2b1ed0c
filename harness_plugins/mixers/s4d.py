"""``s4d``: the diagonal structured state-space model S4D.

Paper: Albert Gu, Ankit Gupta, Karan Goel, Christopher Ré, "On the Parameterization and
Initialization of Diagonal State Space Models", NeurIPS 2022, arXiv:2206.11893.
Reference implementation read and checked against: ``state-spaces/s4``
``models/s4/s4d.py`` (``S4DKernel``, ``S4D``: kernel, FFT convolution, D skip, GELU, 1x1
conv + GLU) and ``src/models/sequence/kernels/ssm.py`` (``SSMKernelDiag``: ZOH
discretisation, S4D-Lin/Inv initialisation, ``_setup_step``/``step`` for the recurrence).

Every channel h = 1..H (H = d_model) of the input u is its own single-input SSM with a
complex diagonal A of N = ``d_state`` modes in N/2 conjugate pairs (real output), a learned
step Δ_h (as log Δ), B = 1, learned C and a skip D_h:

    x_k = Ā x_{k-1} + B̄ u_k,    y_k = Re(C x_k) + D u_k,     Ā = exp(ΔA),  B̄ = (exp(ΔA) - 1)/A
    out = GLU(W · GELU(y) + b)                                (position-wise, mixes channels)

(the numerics are :class:`harness.nn.ssm.DiagonalSSM`, shared with H3).

* Parallel form (training): the kernel K_l = Re(Σ_n C_n B̄_n Ā_n^l), l < L, is a Vandermonde
  product (H x N/2 x L), and y = K * u + D u is a causal FFT convolution of size 2L:
  O(H N L + H L log L) time, O(H N L) memory, nothing of size L².
* Recurrent form (decoding, chunks of any length): the recurrence above token by token,
  O(H N) per token. The state is x: H channels x N/2 complex = H·N real numbers per
  sequence, whatever the length (``state_size``).
* Causal only (the reference's bidirectional variant, a second kernel run backwards, is not
  implemented here).
* Position hooks: ``embedding`` only (applied by the model to the token embeddings). S4D
  forms no queries, keys or scores, so it has no ``qk`` or ``bias`` hook; order comes from the
  convolution itself.
* Dtype: the kernel, exponentials, FFTs and the recurrence run in float32 (float64 for a
  float64 layer) under any autocast; the output projection follows the autocast dtype.
* Differences from the reference: none in the computation; the reference trains A and Δ
  with their own learning rate (0.001) and no weight decay, the harness optimiser treats
  them like every other matrix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import torch
from torch import Tensor, nn

from harness.plugin import (
    Complexity,
    DiagonalSSM,
    DiagonalSSMConfig,
    FloatRange,
    Ge,
    Lt,
    Mixer,
    MixerSpec,
    causal_fft_conv,
    hookimpl,
)

WHY_NOT = {
    "qk": "S4D forms no queries or keys to rotate (it convolves each channel with an SSM kernel)",
    "bias": "S4D forms no attention scores to add a bias to",
}


@dataclass
class S4DConfig(DiagonalSSMConfig):  # d_state (N), init (lin | inv), dt_min, dt_max
    dropout: Annotated[float, Ge(0), Lt(1), FloatRange(0.0, 0.3)] = 0.0  # after the GELU


class S4D(Mixer):
    """S4D: a complex diagonal state-space model per channel, convolution kernel for training, recurrence for decoding."""

    complexity = Complexity(time="L log L", memory="L", decode="1", state="1")
    #: the kernel is generated once per position, then applied by FFT (the FLOP check)
    sequence_weights = ("ssm",)
    why_not = WHY_NOT

    def __init__(self, config: S4DConfig, *, d_model: int, num_heads: int) -> None:
        super().__init__(d_model, num_heads)
        self.ssm = DiagonalSSM(d_model, config)
        self.skip = nn.Parameter(torch.randn(d_model))  # D
        self.activation = nn.GELU()
        self.dropout = nn.Dropout(config.dropout)
        self.output = nn.Linear(d_model, 2 * d_model)  # followed by GLU

    def _finish(self, y: Tensor, x: Tensor) -> Tensor:
        """y (B, H, l) SSM output in the compute dtype -> (B, l, d_model)."""
        y = y + self.skip.to(y.dtype).unsqueeze(-1) * x.transpose(1, 2).to(y.dtype)
        y = self.dropout(self.activation(y.transpose(1, 2).to(x.dtype)))
        return nn.functional.glu(self.output(y), dim=-1)

    def mix(self, x: Tensor, *, causal: bool, key_padding_mask: Tensor | None, position: Any) -> Tensor:
        u = x.transpose(1, 2)  # (B, H, L)
        return self._finish(causal_fft_conv(u, self.ssm.kernel(x.shape[1])), x)

    def step(self, x: Tensor, state: dict[str, Any], *, positions: Tensor, position: Any) -> Tensor:
        if "x" not in state:
            state["x"] = self.ssm.new_state((x.shape[0],), x.device)
        y, state["x"] = self.ssm.scan(x.transpose(1, 2), state["x"])
        return self._finish(y, x)

    def state_size(self, length: int) -> int:
        return self.d_model * self.ssm.d_state


@hookimpl
def harness_register_mixer(register: Any) -> None:
    register(MixerSpec(name="s4d", build=S4D))
