"""Reference: a plain MLP-Mixer LM with causal token mixing (Tolstikhin et al., 2021, made
causal by masking the token-mixing weights lower-triangular).

Each block: x + TokenMLP(LN(x)) over the sequence axis, then x + ChannelMLP(LN(x)). The
token MLP has ``expansion`` hidden units per position; a hidden unit owned by position p
reads positions <= p and writes positions >= p, so output t never sees an input after t.
The model is built for a fixed length; shorter inputs are padded at the end (causality
keeps the padding away from real positions). Separate embedding (N(0, 1), no scale) and
head; PyTorch's default inits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class CausalTokenMLP(nn.Module):
    def __init__(self, length: int, expansion: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(length, length * expansion)
        self.w2 = nn.Linear(length * expansion, length)
        causal = torch.ones(length, length).tril()  # [to, from]
        self.register_buffer("m1", causal.repeat_interleave(expansion, dim=0), persistent=False)
        self.register_buffer("m2", causal.repeat_interleave(expansion, dim=1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, L, d)
        h = F.gelu(F.linear(x.transpose(1, 2), self.w1.weight * self.m1, self.w1.bias))
        return F.linear(h, self.w2.weight * self.m2, self.w2.bias).transpose(1, 2)


class MixerBlock(nn.Module):
    def __init__(self, d: int, length: int, expansion: int, d_ff: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.tokens = CausalTokenMLP(length, expansion)
        self.channels = nn.Sequential(nn.Linear(d, d_ff), nn.GELU(), nn.Linear(d_ff, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.tokens(self.ln1(x))
        return x + self.channels(self.ln2(x))


class MixerLM(nn.Module):
    def __init__(self, vocab: int, *, length: int, d_model: int = 64, layers: int = 2,
                 token_expansion: int = 2, ffn_mult: int = 4) -> None:
        super().__init__()
        self.length = length
        self.embed = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList(MixerBlock(d_model, length, token_expansion, ffn_mult * d_model)
                                    for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, tokens: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        n = tokens.shape[1]
        x = self.embed(F.pad(tokens, (0, self.length - n)))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))[:, :n]
