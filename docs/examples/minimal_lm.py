"""``minimal_lm``: a decoder-only language model built from the harness's parts, taking any
attention variant and position scheme the run names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import torch
from harness.plugin import (
    Choice,
    Ge,
    IntRange,
    ModelSpec,
    PositionScheme,
    ScaledEmbedding,
    TaskInfo,
    TransformerBlock,
    hookimpl,
)
from torch import Tensor, nn


@dataclass
class MinimalLMConfig:
    d_model: Annotated[int, Ge(1), Choice((32, 64, 128))] = 32
    heads: Annotated[int, Ge(1), Choice((1, 2, 4))] = 2
    layers: Annotated[int, Ge(1), IntRange(1, 4)] = 2

    def __post_init__(self) -> None:
        if self.d_model % self.heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by heads ({self.heads})")


class MinimalLM(nn.Module):
    """Decoder-only Transformer LM: embedding, pre-norm blocks of attention and MLP, linear head."""

    def __init__(self, config: MinimalLMConfig, *, task: TaskInfo, attention: Any, position: Any) -> None:
        super().__init__()
        d, heads = config.d_model, config.heads
        # factories: position(**context) builds the run's scheme, attention(d_model, num_heads) a layer
        self.position = (position(d_model=d, num_heads=heads, head_dim=d // heads,
                                  max_length=task.max_length, causal=True)
                         if position is not None else PositionScheme())
        self.embed = ScaledEmbedding(task.vocab_size, self.position.token_width(d))
        self.blocks = nn.ModuleList(TransformerBlock(d, attention(d, heads), 4 * d)
                                    for _ in range(config.layers))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, task.vocab_size)

    def supports_length(self, length: int) -> bool:
        return self.position.supports(length)

    def new_cache(self) -> list[Any]:
        return [block.new_cache() for block in self.blocks]

    def state_size(self, length: int) -> int:
        return sum(block.state_size(length) for block in self.blocks)

    def forward(self, tokens: Tensor, padding_mask: Tensor | None = None, *, cache: Any = None) -> Tensor:
        """(B, L) token ids -> (B, L, vocab) next-token logits; with ``cache``, continue decoding."""
        offset = cache[0]["self"].length if cache else 0
        positions = torch.arange(offset, offset + tokens.shape[1], device=tokens.device)
        x = self.position.embed(self.embed(tokens), positions)
        for i, block in enumerate(self.blocks):  # causal: right padding never reaches a real token
            x, _ = block(x, causal=True, position=self.position, cache=cache[i] if cache else None)
        return self.head(self.norm(x))


@hookimpl
def harness_register_model(register):
    register(ModelSpec(
        name="minimal_lm", build=MinimalLM, task_kinds=frozenset({"lm"}),
        uses_attention=True, uses_position=True, default_attention="multi_head",
        default_position="rope", width_param="d_model",
    ))
