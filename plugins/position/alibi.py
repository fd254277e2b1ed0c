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
from functools import cache
from typing import Any

import harness
from harness.registry import PositionSpec


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


def build(config: Any, *, num_heads: int, **_: Any) -> Any:
    return module_class()(alibi_slopes(num_heads))


@cache
def module_class() -> type:
    import torch

    from harness.nn.position import PositionScheme, relative_positions

    class ALiBi(PositionScheme):
        def __init__(self, slopes: list[float]) -> None:
            super().__init__()
            self.register_buffer("slopes", torch.tensor(slopes), persistent=False)

        def score_bias(self, q: Any, q_pos: Any, k_pos: Any) -> Any:
            distance = relative_positions(q_pos, k_pos).abs().float()  # (Lq, Lk)
            return -(self.slopes[:, None, None] * distance)[None]  # (1, H, Lq, Lk)

    return ALiBi


@harness.hookimpl
def harness_register_position(register: Any) -> None:
    register(
        PositionSpec(
            name="alibi",
            build=build,
            hooks=frozenset({"bias"}),
            description="ALiBi: per-head linear distance penalty on scores (Press et al., 2022).",
        )
    )
