"""``sinusoidal_concat``: the Transformer's sinusoids concatenated to token embeddings.

Instead of adding PE(p) to the token embedding (which mixes content and position in the
same coordinates), the model embeds tokens into ``d_model - k`` dimensions and this scheme
appends ``k`` sinusoid features, PE(p, 2i) = sin(p / base^(2i/k)) and PE(p, 2i+1) =
cos(p / base^(2i/k)): the semantic and positional parts stay in separate coordinates until
the first projection mixes them. ``k`` is ``fraction * d_model`` rounded to an even number
(at least 2). Computed on the fly, so it runs at any length.

Because the token embedding is narrower than ``d_model``, a model cannot tie it to its
output layer (the Transformer unties them automatically).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import torch
from torch import Tensor

from harness.plugin import FloatRange, Gt, Lt, PositionScheme, PositionSpec, hookimpl, sinusoids


@dataclass
class SinusoidalConcatConfig:
    # share of d_model given to position features (the rest carries the token)
    fraction: Annotated[float, Gt(0.0), Lt(1.0), FloatRange(0.125, 0.5)] = 0.25
    base: Annotated[float, Gt(1.0), FloatRange(100.0, 100_000.0, log=True)] = 10_000.0


def position_width(d_model: int, fraction: float) -> int:
    """Width of the appended sinusoid features: ``fraction * d_model`` rounded to even."""
    return max(2, 2 * round(fraction * d_model / 2))


class SinusoidalConcat(PositionScheme):
    """Fixed sinusoids concatenated to (narrower) token embeddings."""

    def __init__(self, config: SinusoidalConcatConfig, *, d_model: int, **context: Any) -> None:
        width = position_width(d_model, config.fraction)
        if width >= d_model:
            raise ValueError(
                f"sinusoidal_concat would use {width} of d_model={d_model} dimensions for "
                f"positions, leaving none for tokens; lower 'fraction' or raise d_model."
            )
        super().__init__()
        self.d_model, self.width, self.base = d_model, width, config.base

    def token_width(self, d_model: int) -> int:
        return d_model - self.width

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        table = sinusoids(positions, self.width, self.base).to(x.dtype)
        return torch.cat([x, table.expand(x.shape[0], -1, -1)], dim=-1)


@hookimpl
def harness_register_position(register: Any) -> None:
    register(PositionSpec(name="sinusoidal_concat", build=SinusoidalConcat))
