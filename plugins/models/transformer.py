"""``transformer``: a decoder-only (causal LM) or encoder (bidirectional) Transformer.

Any attention variant and any position scheme; depth, width, heads, FFN size, dropout,
tied embeddings and pre- vs post-norm are hyper-parameters. For classification tasks the
model is an encoder with mean pooling over non-padding tokens; for tagging tasks an encoder
with one label per token. Both are bidirectional unless ``causal: true`` (a left-to-right
tagger).

``causal: false`` is rejected for ``lm`` tasks: their targets are the inputs shifted by
one, so a bidirectional model would read each answer from the next input. Tagging tasks
have targets aligned with the inputs, which is what per-token labelling needs.

Causal models ignore ``padding_mask``: batches are right-padded, so no real token ever
attends to a pad, and pads are never scored. This keeps the fused causal kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any

import harness
from harness.params import Choice, FloatRange, IntRange
from harness.registry import ModelSpec


@dataclass
class TransformerConfig:
    d_model: Annotated[int, Choice((32, 64, 128, 256, 512))] = 64
    layers: Annotated[int, IntRange(1, 8)] = 2
    heads: Annotated[int, Choice((1, 2, 4, 8))] = 4
    ffn_mult: Annotated[int, Choice((2, 4))] = 4  # FFN width = ffn_mult * d_model
    dropout: Annotated[float, FloatRange(0.0, 0.3)] = 0.0
    norm: Annotated[str, Choice(("pre", "post"))] = "pre"
    tie_embeddings: Annotated[bool, Choice((True, False))] = True
    causal: bool | None = None  # None: causal for lm, bidirectional for classification/tagging

    def __post_init__(self) -> None:
        if self.d_model % self.heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by heads ({self.heads})")


def build(config: TransformerConfig, *, task: Any, attention: Any, position: Any) -> Any:
    if task.format == "lm" and config.causal is False:
        raise ValueError(
            "causal: false on an lm task lets every position see the token it must predict "
            "(lm targets are the inputs shifted by one); keep causal attention for lm tasks"
        )
    return module_class()(config, task, attention, position)


@cache
def module_class() -> type:
    import torch
    from torch import nn

    from harness.nn import PositionScheme, ScaledEmbedding, TransformerBlock

    class Transformer(nn.Module):
        def __init__(self, cfg: TransformerConfig, task: Any, attention: Any, position: Any) -> None:
            super().__init__()
            d = cfg.d_model
            self.classify = task.format == "classification"
            self.tag = task.format == "tagging"
            encoder = self.classify or self.tag
            self.causal = (not encoder) if cfg.causal is None else cfg.causal
            self.position = (
                position(d_model=d, num_heads=cfg.heads, head_dim=d // cfg.heads,
                         max_length=task.max_length, causal=self.causal)
                if position is not None else PositionScheme()
            )
            self.embed = ScaledEmbedding(task.vocab_size, self.position.token_width(d))
            self.drop = nn.Dropout(cfg.dropout)
            self.blocks = nn.ModuleList(
                TransformerBlock(d, attention(d, cfg.heads), cfg.ffn_mult * d,
                                 dropout=cfg.dropout, norm_first=cfg.norm == "pre")
                for _ in range(cfg.layers)
            )
            self.final_norm = nn.LayerNorm(d) if cfg.norm == "pre" else nn.Identity()
            out = task.num_classes if encoder else task.vocab_size
            self.head = nn.Linear(d, out, bias=False)
            if cfg.tie_embeddings and not encoder and self.embed.weight.shape[1] == d:
                self.head.weight = self.embed.weight

        def supports_length(self, length: int) -> bool:
            return self.position.supports(length)

        def new_cache(self) -> list[Any]:
            return [block.new_cache() for block in self.blocks]

        def forward(self, tokens: Any, padding_mask: Any = None, *, cache: Any = None,
                    return_attention: bool = False) -> Any:
            offset = cache[0]["self"].length if cache else 0
            positions = torch.arange(offset, offset + tokens.shape[1], device=tokens.device)
            x = self.drop(self.position.embed(self.embed(tokens), positions))
            kpm = None if self.causal else padding_mask
            maps = []
            for i, block in enumerate(self.blocks):
                x, weights = block(x, causal=self.causal, key_padding_mask=kpm, position=self.position,
                                   cache=cache[i] if cache else None, need_weights=return_attention)
                maps.append(weights["self"])
            x = self.final_norm(x)
            if self.classify:
                keep = (~padding_mask).unsqueeze(-1).float() if padding_mask is not None else torch.ones_like(x[..., :1])
                x = (x * keep).sum(1) / keep.sum(1).clamp(min=1)
            logits = self.head(x)
            return (logits, maps) if return_attention else logits

    return Transformer


@harness.hookimpl
def harness_register_model(register: Any) -> None:
    register(
        ModelSpec(
            name="transformer",
            build=build,
            config=TransformerConfig,
            task_kinds=frozenset({"lm", "classification", "tagging"}),
            uses_attention=True,
            uses_position=True,
            default_attention="multi_head",
            default_position="sinusoidal",
            width_param="d_model",
            description="Decoder-only (causal LM) or encoder Transformer; any attention x position.",
        )
    )
