"""``learned``: absolute position embeddings, one learned vector per index, added (GPT-2).

The table has ``ceil(table_factor * max_length)`` rows, where ``max_length`` is the longest
input the model sees at the training length. What happens past the trained length is
explicit, never a silent index error or a silent clamp:

* ``supports(n)`` is False for ``n`` beyond the table, so the harness reports longer
  evaluation lengths as not applicable (run tag ``harness.not_applicable_lengths``) instead
  of running them; the spec declares ``extrapolates=False``.
* Calling the model directly on a longer input raises ``ValueError`` naming the table size
  and the position asked for.
* With ``table_factor > 1`` the rows past the training length exist, so those lengths are
  evaluated, but no training input reaches them: they keep their random initialisation
  and receive no gradient. Evaluating there measures exactly that, which is the point of
  the option.

Rows are initialised N(0, init_std²); the default 1.0 matches the N(0, 1) initialisation
of the token embedding they are added to (PyTorch's ``nn.Embedding`` default).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any

import harness
from harness.params import FloatRange
from harness.registry import PositionSpec


@dataclass
class LearnedConfig:
    init_std: Annotated[float, FloatRange(0.02, 1.0, log=True)] = 1.0
    table_factor: float = 1.0  # rows = ceil(table_factor * training max length)

    def __post_init__(self) -> None:
        if self.table_factor < 1.0:
            raise ValueError(
                f"table_factor ({self.table_factor}) must be >= 1: the table needs a row for "
                f"every position seen in training."
            )
        if self.init_std <= 0:
            raise ValueError(f"init_std ({self.init_std}) must be positive.")


def build(config: LearnedConfig, *, d_model: int, max_length: int, **_: Any) -> Any:
    rows = math.ceil(config.table_factor * max_length)
    return module_class()(d_model, rows, config.init_std)


@cache
def module_class() -> type:
    from torch import nn

    from harness.nn.position import PositionScheme

    class LearnedPositions(PositionScheme):
        def __init__(self, d_model: int, rows: int, init_std: float) -> None:
            super().__init__(max_length=rows)
            self.table = nn.Embedding(rows, d_model)
            nn.init.normal_(self.table.weight, std=init_std)

        def embed(self, x: Any, positions: Any) -> Any:
            last = int(positions.max()) if positions.numel() else -1
            if last >= self.table.num_embeddings:
                raise ValueError(
                    f"learned positions have {self.table.num_embeddings} rows (positions 0.."
                    f"{self.table.num_embeddings - 1}) but position {last} was asked for: this "
                    f"scheme cannot run past its table. Evaluate at supported lengths only "
                    f"(model.supports_length), or set position.params.table_factor > 1."
                )
            return x + self.table(positions).to(x.dtype)

    return LearnedPositions


@harness.hookimpl
def harness_register_position(register: Any) -> None:
    register(
        PositionSpec(
            name="learned",
            build=build,
            config=LearnedConfig,
            hooks=frozenset({"embedding"}),
            extrapolates=False,
            description="Learned absolute embeddings (GPT-2); not applicable past its table.",
        )
    )
