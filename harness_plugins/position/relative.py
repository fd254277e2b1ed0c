"""``relative``: clipped relative position representations (Shaw et al., 2018).

Shaw et al. add a learned vector a^K_{clip(j - i, k)} to key j when query i scores it:

    e_ij = q_i · (k_j + a^K_{clip(j-i, k)}) / sqrt(d) = q_i · k_j / sqrt(d) + q_i · a^K_{clip(j-i, k)} / sqrt(d)

so the position term is an additive, query-dependent score bias, which is what this scheme
returns from ``score_bias`` (the attention variant adds it to its own q·k scores). Offsets
further than ``clip`` apart share the end vectors, so it runs at any length.

Choices and differences from the paper, stated:

* keys side only: the paper's value-side term a^V (added to values) is not applied,
  because a score bias cannot reach the values; Shaw et al. report the key term carries
  most of the effect.
* one table of 2·clip + 1 vectors of head width, shared by all heads (as in the paper)
  and by all layers (the harness shares one scheme instance per model, as T5 shares its
  bias; the paper learns one table per layer).
* the bias is divided by sqrt(head_dim), matching scaled dot-product scores; variants that
  do not scale their own scores still receive it scaled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import torch
from torch import Tensor, nn

from harness.plugin import (
    Ge,
    IntRange,
    PositionScheme,
    PositionSpec,
    hookimpl,
    qk_divisor,
    relative_positions,
)


@dataclass
class RelativeConfig:
    # k: largest distinguished offset (offsets -clip..clip are learned)
    clip: Annotated[int, Ge(1), IntRange(2, 64, log=True)] = 16


class ShawRelative(PositionScheme):  # same shape as sinusoidal.py by design: one file per variant
    """Clipped relative key embeddings as a q-dependent bias (Shaw et al., 2018)."""

    def __init__(self, config: RelativeConfig, *, head_dim: int, **context: Any) -> None:
        super().__init__()
        self.clip = config.clip
        # Row r holds a^K for offset r - clip (offsets -clip..clip).
        self.table = nn.Parameter(torch.randn(2 * self.clip + 1, head_dim) * head_dim**-0.5)
        self.qk_dim = head_dim  # q · a / sqrt(d), a query-key scale: 1/d under μP

    def score_bias(self, q: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        # q · a_r for every offset r, then pick r = clip(j - i) for each (i, j).
        per_offset = q @ self.table.to(q.dtype).T / qk_divisor(self, q.shape[-1])  # (B, H, Lq, 2k+1)
        index = relative_positions(q_pos, k_pos).clamp(-self.clip, self.clip) + self.clip
        index = index.expand(*per_offset.shape[:2], -1, -1)  # (B, H, Lq, Lk)
        return per_offset.gather(-1, index)


@hookimpl
def harness_register_position(register: Any) -> None:
    register(PositionSpec(name="relative", build=ShawRelative))
