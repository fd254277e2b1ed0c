"""Reference: a plain pre-norm decoder-only Transformer LM (GPT-2 style), written from
scratch on ``torch.nn`` only (no harness model code).

Separate input embedding (``nn.Embedding``, PyTorch's N(0, 1) init, no scale) and output
head (``nn.Linear``, PyTorch's default init, no bias); sinusoidal positions added to the
embedding (or a learned table); ``nn.MultiheadAttention`` with a causal mask; GELU FFN;
a final LayerNorm. Batches are right-padded and attention is causal, so padding never
reaches a real position and needs no mask.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def sinusoid_table(length: int, dim: int) -> torch.Tensor:
    pos = torch.arange(length, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10_000.0) / dim))
    table = torch.zeros(length, dim)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)
    return table


class Block(nn.Module):
    def __init__(self, d: int, heads: int, d_ff: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ff = nn.Sequential(nn.Linear(d, d_ff), nn.GELU(), nn.Linear(d_ff, d))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.ff(self.ln2(x))


class TransformerLM(nn.Module):
    def __init__(self, vocab: int, *, max_length: int, d_model: int = 64, layers: int = 2,
                 heads: int = 4, ffn_mult: int = 4, position: str = "sinusoidal") -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.learned = position == "learned"
        if self.learned:
            self.pos = nn.Embedding(max_length, d_model)
        else:
            self.register_buffer("pos_table", sinusoid_table(max_length, d_model), persistent=False)
        self.blocks = nn.ModuleList(Block(d_model, heads, ffn_mult * d_model) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, tokens: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        n = tokens.shape[1]
        pos = self.pos.weight[:n] if self.learned else self.pos_table[:n]
        x = self.embed(tokens) + pos
        mask = torch.ones(n, n, dtype=torch.bool, device=tokens.device).triu(1)  # True: blocked
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.norm(x))
