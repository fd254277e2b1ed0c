"""``none`` (NoPE): no positional information at all.

Causal models can still infer positions from the mask (Haviv et al., 2022); bidirectional
ones become permutation-equivariant.
"""

from __future__ import annotations

from typing import Any

from harness.plugin import NoParams, PositionScheme, PositionSpec, hookimpl


class NoPositions(PositionScheme):
    """No positions (NoPE)."""

    def __init__(self, config: NoParams, **context: Any) -> None:
        super().__init__()


@hookimpl
def harness_register_position(register: Any) -> None:
    register(PositionSpec(name="none", build=NoPositions))
