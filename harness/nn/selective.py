"""Pieces shared by the selective state-space mixers (Mamba and Mamba-2, in
``harness_plugins/mixers/mamba.py`` and ``harness_plugins/mixers/mamba2.py``): their common
hyper-parameters, a base class whose parallel and recurrent forms are one computation from
an empty or a cached state, the short causal depthwise convolution that carries its last
inputs across decoding calls, the initialisation of the step size Δ, and the precision
their scans run in.

Both follow the reference implementation, ``state-spaces/mamba``
(``mamba_ssm/modules/mamba_simple.py`` and ``mamba_ssm/modules/mamba2_simple.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

import torch
import torch.nn.functional as F
from annotated_types import Ge, Gt
from torch import Tensor, nn

from harness.nn import documents
from harness.nn.mixer import Mixer
from harness.params import Choice, IntRange


@dataclass
class SelectiveConfig:
    """The hyper-parameters Mamba and Mamba-2 share (each adds its state size and more)."""

    expand: Annotated[int, Ge(1), Choice((1, 2, 4))] = 2  # E: inner channels = E * d_model
    d_conv: Annotated[int, Ge(1), IntRange(2, 4)] = 4  # width of the causal depthwise conv
    dt_min: Annotated[float, Gt(0.0)] = 0.001  # initial Δ is log-uniform in [dt_min, dt_max]
    dt_max: Annotated[float, Gt(0.0)] = 0.1
    conv_bias: bool = True
    bias: bool = False  # biases of in_proj and out_proj
    chunk_size: Annotated[int, Ge(1)] = 64  # positions per chunk of the scan (speed/memory only)

    def __post_init__(self) -> None:
        if self.dt_min > self.dt_max:
            raise ValueError(f"dt_min ({self.dt_min}) must not exceed dt_max ({self.dt_max}).")


class SelectiveMixer(Mixer):
    """A mixer whose parallel form is its recurrent form from an empty state: subclasses
    implement ``run(x, state, starts)``, which continues from ``state`` (empty at a
    sequence's start) and updates it; the state of a full pass is discarded. ``starts`` (a
    full pass only): document starts, where the state is multiplied by 0."""

    resets = True

    def mix(self, x: Tensor, *, causal: bool, key_padding_mask: Tensor | None, position: Any,
            document_starts: Tensor | None = None) -> Tensor:
        return self.run(x, {}, document_starts)

    def step(self, x: Tensor, state: dict[str, Any], *, positions: Tensor, position: Any) -> Tensor:
        return self.run(x, state)

    def run(self, x: Tensor, state: dict[str, Any], starts: Tensor | None = None) -> Tensor:
        raise NotImplementedError


def scan_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a scan runs in: float64 stays float64, anything narrower runs in float32
    (exponentials and long products of decays lose too much in bf16/fp16)."""
    return torch.promote_types(dtype, torch.float32)


def full_precision(device: torch.device) -> torch.autocast:
    """A context that turns autocast off on ``device``, so that the einsums of a scan run in
    the dtype of their (float32) operands rather than being cast down."""
    return torch.autocast(device_type=device.type, enabled=False)


def step_size_bias(n: int, dt_min: float, dt_max: float, floor: float = 1e-4) -> Tensor:
    """The initial bias of Δ (before softplus), as in the reference: Δ drawn log-uniformly in
    [dt_min, dt_max] (clamped below at ``floor``) and passed through the inverse of softplus,
    so that softplus(bias) = Δ at initialisation."""
    log_dt = torch.rand(n) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)
    dt = torch.exp(log_dt).clamp(min=floor)
    return dt + torch.log(-torch.expm1(-dt))


class CausalDepthwiseConv(nn.Conv1d):
    """A depthwise causal convolution of width ``width`` over (B, L, channels).

    ``forward(x, state)`` left-pads ``x`` with ``state``, the last ``width - 1`` inputs of
    the previous call (B, channels, width - 1), or with zeros at the start of a sequence, and
    returns the output and the new state (a copy, not a view of the input). The parameters have the shapes of the reference's
    ``nn.Conv1d(..., groups=channels, padding=width - 1)``.
    """

    def __init__(self, channels: int, width: int, *, bias: bool = True) -> None:
        super().__init__(channels, channels, width, groups=channels, bias=bias)
        self.width = width

    def forward(self, x: Tensor, state: Tensor | None = None,  # type: ignore[override]
                starts: Tensor | None = None) -> tuple[Tensor, Tensor]:
        if starts is not None:  # document starts (a full pass): no lag reaches across one
            out = documents.causal_conv(x, self.weight[:, 0].to(x.dtype), starts)
            if self.bias is not None:
                out = out + self.bias.to(x.dtype)
            keep = F.pad(x.transpose(1, 2), (self.width - 1, 0))
            return out, keep[..., keep.shape[-1] - (self.width - 1):].clone()
        x = x.transpose(1, 2)
        if state is None:
            state = x.new_zeros(x.shape[0], x.shape[1], self.width - 1)
        padded = torch.cat([state.to(x.dtype), x], dim=-1)
        out = F.conv1d(padded, self.weight, self.bias, groups=self.groups)
        return out.transpose(1, 2), padded[..., padded.shape[-1] - (self.width - 1):].clone()
