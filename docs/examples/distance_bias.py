"""``learned_distance``: an additive penalty on the distance between query and key, with a
learned slope per head (ALiBi, Press et al., 2022, with trainable slopes)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated

import torch
from harness.plugin import FloatRange, Gt, PositionScheme, PositionSpec, hookimpl
from torch import Tensor, nn


@dataclass
class DistanceConfig:
    init_slope: Annotated[float, Gt(0), FloatRange(0.01, 1.0, log=True)] = 0.5


class LearnedDistanceBias(PositionScheme):
    """A learned per-head linear penalty on |query position - key position|."""

    def __init__(self, config: DistanceConfig, *, d_model: int, num_heads: int, head_dim: int,
                 max_length: int, causal: bool) -> None:
        super().__init__()  # no max_length: any distance has a penalty
        # ALiBi's geometric slopes, init_slope / 2^h, learned in log space (always positive)
        start = torch.tensor([math.log(config.init_slope) - h * math.log(2) for h in range(num_heads)])
        self.log_slopes = nn.Parameter(start)

    def score_bias(self, q: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """(1, H, Lq, Lk): -slope_h |i - j| for queries at q_pos and keys at k_pos."""
        distance = (q_pos[:, None] - k_pos[None, :]).abs().to(q.dtype)
        return -(self.log_slopes.exp().to(q.dtype)[:, None, None] * distance)[None]


def distance_reference(scheme: LearnedDistanceBias, method: str, *args: Tensor) -> Tensor:
    """float64 from the definition, entry by entry (only ``score_bias`` is implemented)."""
    q, q_pos, k_pos = args
    slopes = [math.exp(s) for s in scheme.log_slopes.tolist()]
    bias = torch.zeros(1, len(slopes), len(q_pos), len(k_pos), dtype=torch.float64)
    for h, slope in enumerate(slopes):
        for i, qp in enumerate(q_pos.tolist()):
            for j, kp in enumerate(k_pos.tolist()):
                bias[0, h, i, j] = -slope * abs(qp - kp)
    return bias


@hookimpl
def harness_register_position(register):
    register(PositionSpec(name="learned_distance", build=LearnedDistanceBias, reference=distance_reference))
