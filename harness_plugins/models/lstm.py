"""``lstm``: a recurrent language model on a stacked LSTM (Hochreiter & Schmidhuber, 1997).

Embedding -> LSTM layers -> linear head (optionally tied to the embedding). It runs at any
length, decodes incrementally (its cache is the recurrent state), and classifies a sequence
from the state after its last token. Seq2seq tasks reach it as ``src SEP tgt``.
The shared code (and the config: width, layers, dropout, tie_embeddings) is
:class:`harness.plugin.RecurrentLM`; ``gru`` is the same model with a GRU cell.
"""

from __future__ import annotations

from typing import Any

from harness.plugin import ModelSpec, RecurrentLM, hookimpl


class LSTM(RecurrentLM):  # same shape as gru.py by design: one file per variant
    """Recurrent LSTM language model / classifier (layers, width, dropout)."""

    cell = "lstm"


@hookimpl
def harness_register_model(register: Any) -> None:
    register(ModelSpec(name="lstm", build=LSTM, task_kinds=frozenset({"lm", "classification"}),
                       width_param="width", separates_documents=True))
