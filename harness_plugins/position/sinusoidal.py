"""``sinusoidal``: the Transformer's fixed sinusoids, added to token embeddings.

PE(p, 2i) = sin(p / base^(2i/d)), PE(p, 2i+1) = cos(p / base^(2i/d)) (Vaswani et al., 2017),
computed on the fly for any position (:func:`harness.plugin.sinusoids`), so it runs at
any length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from torch import Tensor

from harness.plugin import FloatRange, Gt, PositionScheme, PositionSpec, hookimpl, sinusoids


@dataclass
class SinusoidalConfig:
    base: Annotated[float, Gt(1.0), FloatRange(100.0, 100_000.0, log=True)] = 10_000.0


class Sinusoidal(PositionScheme):  # same shape as relative.py by design: one file per variant
    """Fixed sinusoids added to token embeddings (Vaswani et al., 2017)."""

    def __init__(self, config: SinusoidalConfig, *, d_model: int, **context: Any) -> None:
        super().__init__()
        self.d_model, self.base = d_model, config.base

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        return x + sinusoids(positions, self.d_model, self.base).to(x.dtype)


@hookimpl
def harness_register_position(register: Any) -> None:
    register(PositionSpec(name="sinusoidal", build=Sinusoidal))
