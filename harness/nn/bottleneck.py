"""The one-position readout of compression tasks (``TaskInfo.extra["bottleneck"]``).

MAD's compression task (Poli et al. 2024, arXiv:2403.17844; the ``AutoEncoder`` backbone of
athms/mad-lab) squeezes a sequence through one vector and writes it back: a model keeps only
its output at the last real position; for each output position, that vector plus a
sinusoidal embedding of the position goes through a two-layer MLP (norm, linear, GELU,
twice) and a final norm, and the model's head turns it into one token's logits. A model that
honours the task's hint sets ``bottleneck`` on itself to the hint's value (``"last"``), which
the run checks before training.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from harness.nn.blocks import make_norm
from harness.nn.position import sinusoids


class BottleneckReadout(nn.Module):
    """(B, L, d) stack output -> (B, L, d): every position rebuilt from the last real one."""

    def __init__(self, d_model: int, norm: str = "layernorm") -> None:
        super().__init__()
        self.decoder = nn.Sequential(
            make_norm(norm, d_model), nn.Linear(d_model, d_model), nn.GELU(),
            make_norm(norm, d_model), nn.Linear(d_model, d_model), nn.GELU(),
            make_norm(norm, d_model))

    def forward(self, x: torch.Tensor, padding_mask: Any = None) -> torch.Tensor:
        b, length, d = x.shape
        if padding_mask is None:
            last = x[:, -1]
        else:  # right-padded rows: the last position that is not padding
            index = ((~padding_mask).sum(1) - 1).clamp(min=0)
            last = x[torch.arange(b, device=x.device), index]
        positions = sinusoids(torch.arange(length, device=x.device), d).to(x.dtype)
        return self.decoder(last[:, None, :] + positions[None])  # type: ignore[no-any-return]
