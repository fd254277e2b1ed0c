"""``t5_bias``: T5's bucketed relative position bias (Raffel et al., 2020).

The offset r = j - i of key j from query i is mapped to one of ``num_buckets`` buckets and
each (bucket, head) pair has one learned scalar, added to the attention score. As in T5,
one bias table is shared by all layers (one scheme instance per model).

Bucketing (T5's ``_relative_position_bucket``):

* bidirectional models give half the buckets to keys after the query (r > 0) and half to
  keys at or before it; causal models use all buckets for n = max(i - j, 0) (keys at or
  before the query; later keys are masked anyway);
* within a half of B buckets, distances n < B/2 get a bucket each; larger distances share
  logarithmically spaced buckets, B/2 + ⌊log(n / (B/2)) / log(max_distance / (B/2)) ·
  (B - B/2)⌋, capped at B - 1: everything at or beyond ``max_distance`` shares the last
  bucket, so the scheme runs at any length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

import torch
from torch import Tensor, nn

from harness.plugin import Ge, IntRange, PositionScheme, PositionSpec, hookimpl, relative_positions


@dataclass
class T5BiasConfig:
    num_buckets: Annotated[int, Ge(4), IntRange(8, 64, log=True)] = 32
    max_distance: Annotated[int, Ge(1), IntRange(16, 1024, log=True)] = 128

    def __post_init__(self) -> None:
        if self.max_distance <= self.num_buckets // 2:
            raise ValueError(
                f"max_distance ({self.max_distance}) must exceed num_buckets // 2 "
                f"({self.num_buckets // 2}): shorter distances already get a bucket each."
            )


def relative_bucket(offset: Any, *, causal: bool, num_buckets: int, max_distance: int) -> Any:
    """T5 bucket ids (LongTensor) of offsets ``offset = key position - query position``."""
    bucket = torch.zeros_like(offset)
    if causal:
        distance = (-offset).clamp(min=0)
    else:
        num_buckets //= 2
        bucket = bucket + (offset > 0).long() * num_buckets
        distance = offset.abs()
    exact = num_buckets // 2
    # log of distance / exact, only meaningful (and only used) for distance >= exact
    ratio = distance.clamp(min=exact).float() / exact
    scale = torch.log(ratio) / math.log(max_distance / exact)
    far = (exact + (scale * (num_buckets - exact)).long()).clamp(max=num_buckets - 1)
    return bucket + torch.where(distance < exact, distance, far)


class T5Bias(PositionScheme):
    """T5 bucketed learned relative bias per head, shared by all layers."""

    def __init__(self, config: T5BiasConfig, *, num_heads: int, causal: bool, **context: Any) -> None:
        super().__init__()
        self.causal, self.num_buckets, self.max_distance = causal, config.num_buckets, config.max_distance
        self.bias = nn.Embedding(config.num_buckets, num_heads)
        nn.init.normal_(self.bias.weight, std=0.02)

    def score_bias(self, q: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        buckets = relative_bucket(
            relative_positions(q_pos, k_pos), causal=self.causal,
            num_buckets=self.num_buckets, max_distance=self.max_distance,
        )
        return self.bias(buckets).permute(2, 0, 1)[None]  # (1, H, Lq, Lk)


@hookimpl
def harness_register_position(register: Any) -> None:
    register(PositionSpec(name="t5_bias", build=T5Bias))
