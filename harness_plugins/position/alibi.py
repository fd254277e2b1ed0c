"""``alibi``: attention with linear biases (Press et al., 2022).

Head h adds -m_h · |i - j| to the score of query i on key j (for a causal model only
j <= i is ever allowed, so this is the paper's m_h · (j - i); bidirectional models get the
symmetric distance). No parameters, any length.

Slopes are the paper's geometric sequence: for n heads with n a power of two, m_h =
2^(-8h/n), h = 1..n. For other n the paper's recipe: take the 2^⌊log2 n⌋ slopes of the
closest smaller power of two, then the odd-indexed (first, third, ...) slopes of 2·2^⌊log2
n⌋ heads until there are n.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from harness.plugin import NoParams, PositionScheme, PositionSpec, hookimpl, relative_positions


def alibi_slopes(num_heads: int) -> list[float]:
    """The paper's head slopes, in head order."""
    if num_heads < 1:
        raise ValueError(f"ALiBi needs at least one head (got {num_heads}).")

    def power_of_two(n: int) -> list[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    closest = 2 ** math.floor(math.log2(num_heads))
    slopes = power_of_two(closest)
    if closest < num_heads:
        slopes += power_of_two(2 * closest)[0::2][: num_heads - closest]
    return slopes


class ALiBi(PositionScheme):
    """ALiBi: per-head linear distance penalty on scores (Press et al., 2022)."""

    def __init__(self, config: NoParams, *, num_heads: int, **context: Any) -> None:
        super().__init__()
        self.register_buffer("slopes", torch.tensor(alibi_slopes(num_heads)), persistent=False)

    def score_bias(self, q: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        distance = relative_positions(q_pos, k_pos).abs().float()  # (Lq, Lk)
        return -(self.slopes[:, None, None] * distance)[None]  # (1, H, Lq, Lk)


@hookimpl
def harness_register_position(register: Any) -> None:
    register(PositionSpec(name="alibi", build=ALiBi))
