"""``none`` (NoPE): no positional information at all.

Causal models can still infer positions from the mask (Haviv et al., 2022); bidirectional
ones become permutation-equivariant.
"""

from __future__ import annotations

from typing import Any

import harness
from harness.registry import PositionSpec


def build(config: Any, **_: Any) -> Any:
    from harness.nn.position import PositionScheme

    return PositionScheme()


@harness.hookimpl
def harness_register_position(register: Any) -> None:
    register(PositionSpec(name="none", build=build, hooks=frozenset(), description="No positions (NoPE)."))
