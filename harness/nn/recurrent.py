"""Recurrent building blocks shared by the recurrent model plugins.

* :class:`RecurrentLM` and its :class:`RecurrentConfig`: the LSTM or GRU language model
  (and sequence classifier) behind the ``lstm`` and ``gru`` plugins, which only name their
  cell; incremental decoding through a :class:`RecurrentCache`;
* :class:`BidirectionalEncoder`: a bidirectional LSTM or GRU over right-padded batches,
  packed so that padding never enters a state (the encoder of RNN seq2seq models).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

import torch
from annotated_types import Ge, Lt
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from harness.data.tasks import TaskInfo
from harness.nn.documents import by_document, pieces
from harness.params import Choice, FloatRange, IntRange

CELLS = ("lstm", "gru")

#: An RNN state: ``h`` (layers, B, H) for a GRU, ``(h, c)`` for an LSTM.
State = Tensor | tuple[Tensor, Tensor]


def make_rnn(
    cell: str, input_size: int, hidden: int, layers: int, dropout: float, bidirectional: bool = False
) -> nn.RNNBase:
    """A batch-first ``nn.LSTM`` or ``nn.GRU``; ``dropout`` acts between stacked layers."""
    if cell not in CELLS:
        raise ValueError(f"unknown recurrent cell {cell!r}; choose one of {', '.join(CELLS)}")
    rnn_class = nn.LSTM if cell == "lstm" else nn.GRU
    return rnn_class(
        input_size, hidden, num_layers=layers, batch_first=True, bidirectional=bidirectional,
        dropout=dropout if layers > 1 else 0.0,
    )


class RecurrentCache:
    """Decoding state of a recurrent model: its state after the ``length`` tokens seen so far."""

    def __init__(self) -> None:
        self.state: State | None = None
        self.length = 0

    def numel_per_sequence(self) -> int:
        """Elements kept per sequence of the batch (``h``, and ``c`` for an LSTM)."""
        if self.state is None:
            return 0
        tensors = self.state if isinstance(self.state, tuple) else (self.state,)
        return sum(t.numel() // t.shape[1] for t in tensors)  # (layers, B, H)


@dataclass
class RecurrentConfig:
    """Hyper-parameters of a recurrent language model (``lstm``, ``gru``)."""

    width: Annotated[int, Ge(1), Choice((32, 64, 128, 256, 512))] = 128  # embedding and state size
    layers: Annotated[int, Ge(1), IntRange(1, 4)] = 2
    # on embeddings, between layers, on outputs
    dropout: Annotated[float, Ge(0.0), Lt(1.0), FloatRange(0.0, 0.5)] = 0.0
    tie_embeddings: Annotated[bool, Choice((True, False))] = True


class RecurrentLM(nn.Module):
    """Embedding -> stacked LSTM/GRU -> linear head; a subclass names its ``cell``.

    For ``lm`` batches the head predicts the next token at every position; for
    classification it reads the state after the last real token. Batches are right-padded
    and the recurrence runs left to right, so padding never reaches a real position and
    ``padding_mask`` is needed only to find the last token. A model plugin: built as
    ``cls(config, task=..., attention=None, position=None)`` (it takes neither).
    """

    #: ``lstm`` or ``gru`` (see :data:`CELLS`)
    cell: ClassVar[str] = ""

    def __init__(self, config: RecurrentConfig, *, task: TaskInfo, attention: Any = None,
                 position: Any = None) -> None:
        super().__init__()
        width = config.width
        num_classes = task.num_classes if task.format == "classification" else None
        self.classify = num_classes is not None
        self.embed = nn.Embedding(task.vocab_size, width)
        self.rnn = make_rnn(self.cell, width, width, config.layers, config.dropout)
        self.drop = nn.Dropout(config.dropout)
        self.head = nn.Linear(width, num_classes if num_classes is not None else task.vocab_size)
        if config.tie_embeddings and not self.classify:
            self.head.weight = self.embed.weight
        self.document_token = task.document_token  # keep documents apart (harness.nn.documents)

    def state_size(self, length: int) -> int:
        """Decoding-state elements per sequence: every layer's hidden state (and cell state
        for an LSTM), whatever the length."""
        rnn = self.rnn
        return rnn.num_layers * rnn.hidden_size * (2 if self.cell == "lstm" else 1)

    def new_cache(self) -> RecurrentCache:
        return RecurrentCache()

    def forward(
        self, tokens: Tensor, padding_mask: Tensor | None = None, *, cache: RecurrentCache | None = None
    ) -> Tensor:
        """``tokens`` (B, L) -> logits (B, L, V), or (B, C) for classification. With a
        ``cache`` the recurrence continues from the cached state and updates it. With
        ``task.document_token`` the state starts afresh at each document (each document runs
        as its own sequence; a cache forgets its state at a start)."""
        x = self.drop(self.embed(tokens))
        starts = None if self.document_token is None else tokens == self.document_token
        if starts is None:
            out, state = self.rnn(x, cache.state if cache is not None else None)
            if cache is not None:
                cache.state = state
        elif cache is None:
            out = by_document(lambda d: self.rnn(d)[0], x, starts)
        else:
            outs = []
            for a, b in pieces(starts):
                if bool(starts[0, a]) and cache.length + a > 0:
                    cache.state = None
                piece, cache.state = self.rnn(x[:, a:b], cache.state)
                outs.append(piece)
            out = torch.cat(outs, dim=1)
        if cache is not None:
            cache.length += tokens.shape[1]
        out = self.drop(out)
        if self.classify:
            if padding_mask is None:
                last = torch.full((tokens.shape[0],), tokens.shape[1] - 1, device=tokens.device)
            else:
                last = (~padding_mask).sum(dim=1).clamp(min=1) - 1
            out = out[torch.arange(tokens.shape[0], device=tokens.device), last]
        return self.head(out)  # type: ignore[no-any-return]


class BidirectionalEncoder(nn.Module):
    """A bidirectional LSTM/GRU over right-padded sequences.

    Returns the annotations (B, S, 2 * hidden), forward and backward states side by side
    (zeros at padding), and the final state of every layer, (layers, B, 2 * hidden) for
    ``h`` (and ``c`` for an LSTM): the forward direction after the last real token, the
    backward direction after the first.
    """

    def __init__(self, cell: str, input_size: int, hidden: int, layers: int, dropout: float) -> None:
        super().__init__()
        self.cell = cell
        self.layers = layers
        self.rnn = make_rnn(cell, input_size, hidden, layers, dropout, bidirectional=True)

    def forward(self, x: Tensor, padding_mask: Tensor | None) -> tuple[Tensor, State]:
        batch, length = x.shape[:2]
        if padding_mask is None:
            lengths = torch.full((batch,), length)
        else:
            lengths = (~padding_mask).sum(dim=1).clamp(min=1).cpu()
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, state = self.rnn(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=length)
        if isinstance(state, tuple):
            return out, (self._merge(state[0]), self._merge(state[1]))
        return out, self._merge(state)

    def _merge(self, s: Tensor) -> Tensor:
        """(layers * 2, B, H) in PyTorch's layer-major order -> (layers, B, 2H)."""
        s = s.view(self.layers, 2, *s.shape[1:])
        return torch.cat([s[:, 0], s[:, 1]], dim=-1)
