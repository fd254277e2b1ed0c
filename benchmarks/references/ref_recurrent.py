"""Reference: a plain LSTM / GRU language model: ``nn.Embedding`` -> stacked ``nn.LSTM`` or
``nn.GRU`` -> ``nn.Linear`` head (separate from the embedding). PyTorch's default inits."""

from __future__ import annotations

import torch
from torch import nn


class RNNLM(nn.Module):
    def __init__(self, vocab: int, *, cell: str = "lstm", width: int = 128, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        rnn = nn.LSTM if cell == "lstm" else nn.GRU
        self.rnn = rnn(width, width, num_layers=layers, batch_first=True)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        out, _ = self.rnn(self.embed(tokens))  # right padding: never reaches a real position
        return self.head(out)
