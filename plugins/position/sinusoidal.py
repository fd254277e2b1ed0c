"""``sinusoidal``: the Transformer's fixed sinusoids, added to token embeddings.

PE(p, 2i) = sin(p / base^(2i/d)), PE(p, 2i+1) = cos(p / base^(2i/d)) (Vaswani et al., 2017),
computed on the fly for any position (:func:`harness.nn.position.sinusoids`), so it runs at
any length.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any

import harness
from harness.params import FloatRange
from harness.registry import PositionSpec


@dataclass
class SinusoidalConfig:
    base: Annotated[float, FloatRange(100.0, 100_000.0, log=True)] = 10_000.0


def build(config: SinusoidalConfig, *, d_model: int, **_: Any) -> Any:
    return module_class()(d_model, config.base)


@cache
def module_class() -> type:
    from harness.nn.position import PositionScheme, sinusoids

    class Sinusoidal(PositionScheme):
        def __init__(self, d_model: int, base: float) -> None:
            super().__init__()
            self.d_model, self.base = d_model, base

        def embed(self, x: Any, positions: Any) -> Any:
            return x + sinusoids(positions, self.d_model, self.base).to(x.dtype)

    return Sinusoidal


@harness.hookimpl
def harness_register_position(register: Any) -> None:
    register(
        PositionSpec(
            name="sinusoidal",
            build=build,
            config=SinusoidalConfig,
            hooks=frozenset({"embedding"}),
            description="Fixed sinusoids added to token embeddings (Vaswani et al., 2017).",
        )
    )
