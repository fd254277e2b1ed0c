"""``scalar``: one position value per token, appended to a (d_model - 1)-wide embedding.

The value is ``p / (max_length - 1)``: it runs from 0 at the first position to 1 at the
last position of the longest training input, so every training position lies in [0, 1].
Past the training length it keeps growing linearly (position 2·L reads about 2); it is
never clamped, so extrapolation asks whether the model copes with values it never saw.

Why normalise by the training length rather than by each sequence's own length: a
per-sequence fraction would tell a causal model how long the sequence is (information from
the future), would differ between a full pass and cached decoding, and would count padding
in a padded batch.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from harness.plugin import NoParams, PositionScheme, PositionSpec, hookimpl


class ScalarPosition(PositionScheme):
    """One value p / (L_train - 1) per token, appended to the embedding."""

    def __init__(self, config: NoParams, *, d_model: int, max_length: int, **context: Any) -> None:
        if d_model < 2:
            raise ValueError(f"scalar positions need d_model >= 2 (got {d_model}).")
        super().__init__()
        self.denominator = float(max(max_length - 1, 1))

    def token_width(self, d_model: int) -> int:
        return d_model - 1

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        value = (positions.to(x.dtype) / self.denominator)[None, :, None]
        return torch.cat([x, value.expand(x.shape[0], -1, 1)], dim=-1)


@hookimpl
def harness_register_position(register: Any) -> None:
    register(PositionSpec(name="scalar", build=ScalarPosition))
