"""The transformer block that composes an attention variant with a position scheme."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from harness.nn.attention import Attention, AttentionCache
from harness.nn.position import PositionScheme


class ScaledEmbedding(nn.Embedding):
    """Token embedding initialised N(0, 1/width) and multiplied by sqrt(width) on lookup
    (Vaswani et al., 2017, section 3.4).

    Lookups have unit-scale entries, as sinusoidal positions expect, while the weight itself
    has unit-norm rows, so an output head tied to it starts with logits of order 1 (an
    N(0, 1) table tied to the head gives logits of std sqrt(width): an initial loss of
    25-50 instead of ln |V|).
    """

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__(num_embeddings, embedding_dim)
        nn.init.normal_(self.weight, std=embedding_dim**-0.5)
        self.scale = embedding_dim**0.5

    def forward(self, tokens: Tensor) -> Tensor:
        return super().forward(tokens) * self.scale


class FeedForward(nn.Module):
    """Position-wise MLP: Linear -> GELU -> dropout -> Linear."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d_model, d_ff), nn.GELU(), nn.Dropout(dropout), nn.Linear(d_ff, d_model)
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class TransformerBlock(nn.Module):
    """Self-attention (+ optional cross-attention) + feed-forward, each a residual branch.

    ``norm_first``: pre-norm (LayerNorm before each branch, as in GPT-2) or post-norm
    (after the residual sum, as in the original Transformer).
    """

    def __init__(
        self,
        d_model: int,
        self_attn: Attention,
        d_ff: int,
        *,
        dropout: float = 0.0,
        norm_first: bool = True,
        cross_attn: Attention | None = None,
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = self_attn
        self.cross_attn = cross_attn
        self.ffn = FeedForward(d_model, d_ff, dropout)
        self.norms = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(3 if cross_attn else 2))
        self.drop = nn.Dropout(dropout)

    def _residual(self, x: Tensor, norm: nn.Module, fn: Any) -> tuple[Tensor, Any]:
        if self.norm_first:
            out, extra = fn(norm(x))
            return x + self.drop(out), extra
        out, extra = fn(x)
        return norm(x + self.drop(out)), extra

    def forward(
        self,
        x: Tensor,
        *,
        causal: bool,
        key_padding_mask: Tensor | None = None,
        position: PositionScheme | None = None,
        memory: Tensor | None = None,
        memory_padding_mask: Tensor | None = None,
        cache: dict[str, AttentionCache] | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, dict[str, Tensor | None]]:
        """Returns the new hidden states and the attention weights by role
        (``self``, ``cross``) when ``need_weights``."""
        weights: dict[str, Tensor | None] = {}
        x, weights["self"] = self._residual(
            x,
            self.norms[0],
            lambda h: self.self_attn(
                h,
                causal=causal,
                key_padding_mask=key_padding_mask,
                position=position,
                cache=cache["self"] if cache is not None else None,
                need_weights=need_weights,
            ),
        )
        if self.cross_attn is not None:
            assert memory is not None, "a block with cross-attention needs memory"
            cross = self.cross_attn
            x, weights["cross"] = self._residual(
                x,
                self.norms[1],
                lambda h: cross(
                    h,
                    memory,
                    key_padding_mask=memory_padding_mask,
                    cache=cache["cross"] if cache is not None else None,
                    need_weights=need_weights,
                ),
            )
        x, _ = self._residual(x, self.norms[-1], lambda h: (self.ffn(h), None))
        return x, weights

    @staticmethod
    def new_cache() -> dict[str, AttentionCache]:
        return {"self": AttentionCache(), "cross": AttentionCache()}
