"""Numerics shared by the convolutional state-space mixers (S4D, H3, Hyena).

* :func:`causal_fft_conv`: the causal long convolution ``y_t = Σ_{s<=t} k_{t-s} u_s`` by FFT,
  O(L log L), computed in float32 (float64 stays float64) whatever the autocast dtype.
* :class:`DiagonalSSM`: H independent diagonal state-space models of state size N (S4D; Gu,
  Gupta, Goel, Ré, NeurIPS 2022, arXiv:2206.11893), checked against ``state-spaces/s4``
  ``models/s4/s4d.py`` (``S4DKernel``) and ``src/models/sequence/kernels/ssm.py``
  (``SSMKernelDiag``: ``init_dt``, ``_setup_step``, ``step``)::

      x'(t) = A x(t) + B u(t),  y(t) = C x(t)         A = diag(a_1 .. a_N), complex
      zero-order hold with step Δ:  Ā = exp(ΔA),  B̄ = (ΔA)^-1 (exp(ΔA) - I) ΔB = (exp(ΔA) - 1) / A · B
      recurrence:  x_k = Ā x_{k-1} + B̄ u_k,   y_k = Re(C x_k)
      kernel:      y = K * u  with  K_l = Re(Σ_n C_n B̄_n Ā_n^l)   (a Vandermonde product)

  The N modes come in N/2 complex-conjugate pairs; only one of each pair is stored and the
  real output is twice the real part of its half (``y = 2 Re(C x)``), so a channel keeps N/2
  complex = N real numbers of state. ``a_n = -exp(log_a_real) + i a_imag``: the real part stays
  negative (a stable system) whatever the learned value. Initialisation (the paper's §4):
  ``Re a_n = -1/2``; S4D-Lin ``Im a_n = π n``; S4D-Inv ``Im a_n = N/π (N/(2n+1) - 1)``;
  ``log Δ ~ U[log Δ_min, log Δ_max]`` per channel; ``C ~ CN(0, 1)``. B is fixed to 1, as in the
  reference's ``S4DKernel``: for a diagonal A only the products C_n B_n matter, so learning B
  as well would only duplicate C.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated

import torch
from annotated_types import Ge, Gt, Le, Lt
from torch import Tensor, nn

from harness.params import Choice, FloatRange

DIAGONAL_INITS = ("lin", "inv")


@dataclass
class DiagonalSSMConfig:
    """The hyper-parameters of a diagonal SSM (defaults: the S4D paper's, N scaled to small models)."""

    # N: real state size per channel (N/2 complex-conjugate pairs); even.
    d_state: Annotated[int, Ge(2), Le(1024), Choice((8, 16, 32, 64))] = 16
    init: Annotated[str, Choice(DIAGONAL_INITS)] = "lin"  # S4D-Lin or S4D-Inv imaginary parts
    dt_min: Annotated[float, Gt(0), Lt(1), FloatRange(1e-4, 5e-3, log=True)] = 1e-3
    dt_max: Annotated[float, Gt(0), Le(10), FloatRange(2e-2, 1.0, log=True)] = 1e-1


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half/bfloat16/float32 inputs (FFTs, exponentials and scans run in float32
    under autocast), float64 for float64."""
    return torch.promote_types(dtype, torch.float32)


def causal_fft_conv(u: Tensor, k: Tensor) -> Tensor:
    """``y[..., t] = Σ_{s<=t} k[..., t-s] u[..., s]`` over the last dim, by FFT of size 2L
    (zero padding makes the circular convolution linear, so nothing wraps around: causal).

    ``u`` (..., L); ``k`` (..., L) broadcastable to ``u``. Returns the compute dtype
    (float32, or float64 for float64 inputs)."""
    length = u.shape[-1]
    n = 2 * length
    dtype = compute_dtype(torch.promote_types(u.dtype, k.dtype))
    u_f = torch.fft.rfft(u.to(dtype), n=n)
    k_f = torch.fft.rfft(k.to(dtype), n=n)
    return torch.fft.irfft(u_f * k_f, n=n)[..., :length]


def diagonal_imag_init(kind: str, d_state: int) -> Tensor:
    """Imaginary parts of the N/2 stored eigenvalues: S4D-Lin (π n) or S4D-Inv
    (N/π (N/(2n+1) - 1)), n = 0 .. N/2-1."""
    n = torch.arange(d_state // 2, dtype=torch.float32)
    if kind == "lin":
        return math.pi * n
    if kind == "inv":
        return d_state / math.pi * (d_state / (2 * n + 1) - 1)
    raise ValueError(f"init must be one of {', '.join(DIAGONAL_INITS)}, not {kind!r}")


class DiagonalSSM(nn.Module):
    """``channels`` independent diagonal SSMs (S4D) of real state size ``d_state``: the
    convolution kernel for full sequences, the discretised recurrence for decoding."""

    def __init__(self, channels: int, config: DiagonalSSMConfig) -> None:
        super().__init__()
        d_state, init, dt_min, dt_max = config.d_state, config.init, config.dt_min, config.dt_max
        if d_state < 2 or d_state % 2:
            raise ValueError(f"d_state ({d_state}) must be even and >= 2: the state is N/2 "
                             "complex-conjugate pairs")
        if not 0 < dt_min < dt_max:
            raise ValueError(f"dt_min ({dt_min}) must be below dt_max ({dt_max})")
        half = d_state // 2
        self.channels, self.d_state = channels, d_state
        log_dt = torch.rand(channels) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)
        self.log_dt = nn.Parameter(log_dt)
        self.log_a_real = nn.Parameter(torch.full((channels, half), math.log(0.5)))
        self.a_imag = nn.Parameter(diagonal_imag_init(init, d_state).repeat(channels, 1))
        self.c = nn.Parameter(torch.view_as_real(torch.randn(channels, half, dtype=torch.cfloat)))

    def discretized(self) -> tuple[Tensor, Tensor, Tensor]:
        """(ΔA, B̄, C), each (channels, N/2) complex, in the compute dtype (ZOH, B = 1)."""
        dtype = compute_dtype(self.log_dt.dtype)
        a = torch.complex(-torch.exp(self.log_a_real.to(dtype)), self.a_imag.to(dtype))
        dt_a = a * torch.exp(self.log_dt.to(dtype)).unsqueeze(-1)
        b_bar = torch.expm1(dt_a) / a
        return dt_a, b_bar, torch.view_as_complex(self.c.to(dtype).contiguous())

    def kernel(self, length: int) -> Tensor:
        """K (channels, length): K_l = 2 Re Σ_n C_n B̄_n exp(ΔA_n l) (Vandermonde product)."""
        dt_a, b_bar, c = self.discretized()
        steps = torch.arange(length, device=dt_a.device, dtype=dt_a.real.dtype)
        powers = torch.exp(dt_a.unsqueeze(-1) * steps)  # (channels, N/2, L)
        return 2 * torch.einsum("hn,hnl->hl", c * b_bar, powers).real

    def new_state(self, batch_shape: tuple[int, ...], device: torch.device) -> Tensor:
        """A zero state (*batch_shape, channels, N/2) in its real view (..., 2): N reals per
        channel."""
        dtype = compute_dtype(self.log_dt.dtype)
        return torch.zeros(*batch_shape, self.channels, self.d_state // 2, 2, dtype=dtype, device=device)

    def scan(self, u: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """Run the recurrence over the last dim of ``u`` (..., channels, l) from ``state``
        (..., channels, N/2, 2): x_k = Ā x_{k-1} + B̄ u_k, y_k = 2 Re(C x_k). Returns y
        (..., channels, l) in the compute dtype and the new state. O(1) per position."""
        dt_a, b_bar, c = self.discretized()
        a_bar = torch.exp(dt_a)
        x = torch.view_as_complex(state.contiguous())
        u = u.to(dt_a.real.dtype)
        out = []
        for k in range(u.shape[-1]):
            x = a_bar * x + b_bar * u[..., k, None]
            out.append(2 * (c * x).real.sum(-1))
        return torch.stack(out, dim=-1), torch.view_as_real(x)
