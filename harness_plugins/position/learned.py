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
from typing import Annotated, Any

import torch
from torch import Tensor, nn

from harness.plugin import FloatRange, Ge, Gt, PositionScheme, PositionSpec, hookimpl


@dataclass
class LearnedConfig:
    init_std: Annotated[float, Gt(0.0), FloatRange(0.02, 1.0, log=True)] = 1.0
    # rows = ceil(table_factor * training max length); >= 1: a row for every trained position
    table_factor: Annotated[float, Ge(1.0)] = 1.0


class LearnedPositions(PositionScheme):
    """Learned absolute embeddings (GPT-2); not applicable past its table."""

    def __init__(self, config: LearnedConfig, *, d_model: int, max_length: int, **context: Any) -> None:
        rows = math.ceil(config.table_factor * max_length)
        super().__init__(max_length=rows)
        self.table = nn.Embedding(rows, d_model)
        nn.init.normal_(self.table.weight, std=config.init_std)

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        if positions.numel() and (torch.compiler.is_compiling() or positions.device.type != "cpu"):
            # checked on the device: reading the largest position would make the host wait
            # (every step on a GPU) and break a compiled graph
            torch._assert_async(positions.max() < self.table.num_embeddings,
                                "learned positions: a position past the table was asked for")
            return x + self.table(positions).to(x.dtype)
        last = int(positions.max()) if positions.numel() else -1
        if last >= self.table.num_embeddings:
            raise ValueError(
                f"learned positions have {self.table.num_embeddings} rows (positions 0.."
                f"{self.table.num_embeddings - 1}) but position {last} was asked for: this "
                f"scheme cannot run past its table. Evaluate at supported lengths only "
                f"(model.supports_length), or set position.params.table_factor > 1."
            )
        return x + self.table(positions).to(x.dtype)


@hookimpl
def harness_register_position(register: Any) -> None:
    register(PositionSpec(name="learned", build=LearnedPositions, extrapolates=False))
