"""``gru``: a recurrent language model on a stacked GRU (Cho et al., 2014).

Embedding -> GRU layers -> linear head (optionally tied to the embedding). It runs at any
length, decodes incrementally (its cache is the recurrent state), and classifies a sequence
from the state after its last token. Seq2seq tasks reach it as ``src SEP tgt``.
The shared code (and the config: width, layers, dropout, tie_embeddings) is
:class:`harness.plugin.RecurrentLM`; ``lstm`` is the same model with an LSTM cell.
"""

from __future__ import annotations

from typing import Any

from harness.plugin import ModelSpec, RecurrentLM, hookimpl


class GRU(RecurrentLM):  # same shape as lstm.py by design: one file per variant
    """Recurrent GRU language model / classifier (layers, width, dropout)."""

    cell = "gru"


@hookimpl
def harness_register_model(register: Any) -> None:
    register(ModelSpec(name="gru", build=GRU, task_kinds=frozenset({"lm", "classification"}),
                       width_param="width", separates_documents=True))
