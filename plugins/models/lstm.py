"""``lstm``: a recurrent language model on a stacked LSTM (Hochreiter & Schmidhuber, 1997).

Embedding -> LSTM layers -> linear head (optionally tied to the embedding). It runs at any
length, decodes incrementally (its cache is the recurrent state), and classifies a sequence
from the state after its last token. Seq2seq tasks reach it as ``src SEP tgt``.
The shared code is :class:`harness.nn.recurrent.RecurrentLM`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any

import harness
from harness.params import Choice, FloatRange, IntRange
from harness.registry import ModelSpec


@dataclass
class LstmConfig:
    width: Annotated[int, Choice((32, 64, 128, 256, 512))] = 128  # embedding and state size
    layers: Annotated[int, IntRange(1, 4)] = 2
    dropout: Annotated[float, FloatRange(0.0, 0.5)] = 0.0  # on embeddings, between layers, on outputs
    tie_embeddings: Annotated[bool, Choice((True, False))] = True

    def __post_init__(self) -> None:
        if self.width < 1 or self.layers < 1:
            raise ValueError(f"width and layers must be positive, got {self.width} and {self.layers}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {self.dropout}")


def build(config: LstmConfig, *, task: Any, attention: Any = None, position: Any = None) -> Any:
    return module_class()(
        "lstm", vocab_size=task.vocab_size, width=config.width, layers=config.layers,
        dropout=config.dropout, tie_embeddings=config.tie_embeddings,
        num_classes=task.num_classes if task.format == "classification" else None,
    )


@cache
def module_class() -> type:
    from harness.nn.recurrent import RecurrentLM

    return RecurrentLM


@harness.hookimpl
def harness_register_model(register: Any) -> None:
    register(
        ModelSpec(
            name="lstm",
            build=build,
            config=LstmConfig,
            task_kinds=frozenset({"lm", "classification"}),
            width_param="width",
            description="Recurrent LSTM language model / classifier (layers, width, dropout).",
        )
    )
