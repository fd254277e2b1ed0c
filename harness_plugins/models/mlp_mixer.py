"""``mlp_mixer``: token-mixing MLPs instead of attention (Tolstikhin et al., 2021), as a
sequence model.

Each block mixes across positions (an MLP over the sequence axis, shared by all channels)
and then across channels (a per-position MLP), each a pre-norm residual branch. The
token-mixing weights are position-specific, so the model is **fixed-length**: it is built
for ``task.max_length`` positions, pads shorter inputs internally and refuses longer ones
(``supports_length``); its spec declares ``extrapolates=False``.

Causal language modelling masks the token-mixing weights lower-triangular: hidden unit j
of the token MLP belongs to position j // token_expansion, reads only positions up to its
own and writes only to positions from its own on, so output t never depends on an input
after t. Bidirectional mixing (classification) zeroes padded positions before each token
mix, so padding content never reaches a real position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.plugin import (  # a list of names, not logic: other plugins list many of the same
    PAD,
    Choice,
    FeedForward,
    FloatRange,
    Ge,
    IntRange,
    Lt,
    ModelSpec,
    ScaledEmbedding,
    TaskInfo,
    hookimpl,
)


@dataclass
class MLPMixerConfig:
    d_model: Annotated[int, Ge(1), Choice((32, 64, 128, 256, 512))] = 64
    layers: Annotated[int, Ge(1), IntRange(1, 8)] = 2
    token_expansion: Annotated[int, Ge(1), Choice((1, 2, 4))] = 2  # token-MLP hidden units per position
    ffn_mult: Annotated[int, Ge(1), Choice((2, 4))] = 4  # channel-MLP width = ffn_mult * d_model
    dropout: Annotated[float, Ge(0.0), Lt(1.0), FloatRange(0.0, 0.3)] = 0.0
    # untied by default: untied, char_lm reaches 2.857/2.856/2.868 bpc where tied stays at
    # 2.940/2.946/2.948 (seeds 0-2; recall equal: 0.553 mean both; benchmarks/defaults.md)
    tie_embeddings: Annotated[bool, Choice((True, False))] = False
    causal: bool | None = None  # None: causal for lm tasks, bidirectional for classification


class TokenMixing(nn.Module):
    """An MLP over the sequence axis: (B, N, d) -> (B, N, d), shared by all channels."""

    def __init__(self, length: int, expansion: int, causal: bool) -> None:
        super().__init__()
        hidden = length * expansion
        self.fc_in = nn.Linear(length, hidden)
        self.fc_out = nn.Linear(hidden, length)
        owner = torch.arange(hidden) // expansion  # the position each hidden unit belongs to
        pos = torch.arange(length)
        self.causal = causal
        self.register_buffer("mask_in", owner[:, None] >= pos[None, :], persistent=False)
        self.register_buffer("mask_out", pos[:, None] >= owner[None, :], persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        w_in, w_out = self.fc_in.weight, self.fc_out.weight
        if self.causal:
            w_in, w_out = w_in * self.mask_in, w_out * self.mask_out
        h = F.gelu(F.linear(x.transpose(1, 2), w_in, self.fc_in.bias))
        return F.linear(h, w_out, self.fc_out.bias).transpose(1, 2)


class MixerBlock(nn.Module):
    """A token-mixing then a channel-mixing residual branch, each pre-norm."""

    def __init__(self, cfg: MLPMixerConfig, length: int, causal: bool) -> None:
        super().__init__()
        self.token_norm, self.channel_norm = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.tokens = TokenMixing(length, cfg.token_expansion, causal)
        self.channels = FeedForward(cfg.d_model, cfg.ffn_mult * cfg.d_model, cfg.dropout)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, padding: Tensor) -> Tensor:
        x = x + self.drop(self.tokens(self.token_norm(x).masked_fill(padding[..., None], 0.0)))
        return x + self.drop(self.channels(self.channel_norm(x)))


class MLPMixer(nn.Module):
    """Fixed-length MLP-Mixer: causal (lower-triangular) token mixing for LM."""

    def __init__(self, config: MLPMixerConfig, *, task: TaskInfo, attention: Any = None,
                 position: Any = None) -> None:
        super().__init__()
        cfg = config
        self.classify = task.format == "classification"
        causal = (not self.classify) if cfg.causal is None else cfg.causal
        if task.format == "lm" and not causal:
            raise ValueError(
                "causal: false on an lm task lets every position see the token it must predict "
                "(the next input); keep causal mixing for lm tasks"
            )
        self.length = task.max_length
        self.causal = causal
        self.embed = ScaledEmbedding(task.vocab_size, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(MixerBlock(cfg, self.length, causal) for _ in range(cfg.layers))
        self.final_norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, task.num_classes if self.classify else task.vocab_size,
                              bias=False)
        if cfg.tie_embeddings and not self.classify:
            self.head.weight = self.embed.weight

    def supports_length(self, length: int) -> bool:
        return length <= self.length

    def forward(self, tokens: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        """``tokens`` (B, L) with L <= the built length -> (B, L, V), or (B, C)."""
        batch, length = tokens.shape
        if length > self.length:
            raise ValueError(f"mlp_mixer is fixed-length: built for {self.length} positions, "
                             f"got {length}")
        padding = padding_mask if padding_mask is not None else torch.zeros_like(tokens, dtype=torch.bool)
        tokens = F.pad(tokens, (0, self.length - length), value=PAD)
        padding = F.pad(padding, (0, self.length - length), value=True)
        x = self.drop(self.embed(tokens))
        for block in self.blocks:
            x = block(x, padding)
        x = self.final_norm(x)
        if self.classify:
            keep = (~padding)[..., None].to(x.dtype)
            return self.head((x * keep).sum(1) / keep.sum(1).clamp(min=1))  # type: ignore[no-any-return]
        return self.head(x[:, :length])  # type: ignore[no-any-return]


# the registration every model file has (one file per variant), alike by design
@hookimpl
def harness_register_model(register: Any) -> None:
    register(
        ModelSpec(
            name="mlp_mixer",
            build=MLPMixer,
            task_kinds=frozenset({"lm", "classification"}),
            extrapolates=False,
            width_param="d_model",
        )
    )
