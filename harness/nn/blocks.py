"""The residual block shared by the models: a sequence mixer (any attention variant or mixer)
and an MLP, each a residual branch, with the normalisation and MLP a fair comparison needs to
choose (LayerNorm or RMSNorm; GELU MLP, SwiGLU or none; pre- or post-norm)."""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from harness.nn import documents
from harness.nn.attention import Attention
from harness.nn.mixer import LayerCache
from harness.nn.position import PositionScheme

NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "swiglu", "none")


def make_norm(kind: str, width: int) -> nn.Module:
    """LayerNorm (Ba et al., 2016) or RMSNorm (Zhang & Sennrich, 2019: no centring, no bias)."""
    if kind == "layernorm":
        return nn.LayerNorm(width)
    if kind == "rmsnorm":
        return nn.RMSNorm(width)
    raise ValueError(f"unknown normalisation {kind!r}; choose one of {', '.join(NORMS)}")


class ScaledEmbedding(nn.Embedding):
    """Token embedding initialised N(0, 1/width) and multiplied by sqrt(width) on lookup
    (Vaswani et al., 2017, section 3.4).

    Lookups have unit-scale entries, as sinusoidal positions expect, while the weight itself
    has unit-norm rows, so an output head tied to it starts with logits of order 1 (an
    N(0, 1) table tied to the head gives logits of std sqrt(width): an initial loss of
    25-50 instead of ln |V|).
    """

    #: under μP the multiplier is held at its base-width value (harness.nn.parametrization)
    mup_fixed = ("scale",)

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__(num_embeddings, embedding_dim)
        nn.init.normal_(self.weight, std=embedding_dim**-0.5)
        self.scale = embedding_dim**0.5

    def forward(self, tokens: Tensor) -> Tensor:
        return super().forward(tokens) * self.scale


class FeedForward(nn.Module):
    """Position-wise MLP: Linear -> GELU -> dropout -> Linear."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, bias: bool = True) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d_model, d_ff, bias=bias), nn.GELU(), nn.Dropout(dropout),
            nn.Linear(d_ff, d_model, bias=bias),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class SwiGLU(nn.Module):
    """Gated MLP W_2 (SiLU(W_1 x) * W_3 x) (Shazeer, 2020), as in LLaMA.

    ``d_ff`` is the width a GELU MLP would have; the hidden width is 2/3 of it (rounded to a
    multiple of 8), so the three matrices hold about as many parameters as the GELU MLP's two
    and the two MLPs compare at equal size.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, bias: bool = True) -> None:
        super().__init__()
        hidden = max(8, int(round(2 * d_ff / 3 / 8)) * 8)
        self.gate = nn.Linear(d_model, hidden, bias=bias)
        self.up = nn.Linear(d_model, hidden, bias=bias)
        self.down = nn.Linear(hidden, d_model, bias=bias)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(self.drop(F.silu(self.gate(x)) * self.up(x)))  # type: ignore[no-any-return]


def make_mlp(kind: str, d_model: int, d_ff: int, dropout: float, bias: bool = True) -> nn.Module | None:
    """The MLP of a block: ``gelu``, ``swiglu`` or ``none`` (a block of mixing only)."""
    if kind == "gelu":
        return FeedForward(d_model, d_ff, dropout, bias)
    if kind == "swiglu":
        return SwiGLU(d_model, d_ff, dropout, bias)
    if kind == "none":
        return None
    raise ValueError(f"unknown MLP {kind!r}; choose one of {', '.join(MLPS)}")


class TransformerBlock(nn.Module):
    """A sequence mixer (+ optional cross-attention) + an MLP, each a residual branch.

    ``self_attn`` is any attention variant or mixer (both take the same call).
    ``norm_first``: pre-norm (normalisation before each branch, as in GPT-2) or post-norm
    (after the residual sum, as in the original Transformer). ``norm``: ``layernorm`` or
    ``rmsnorm``; ``mlp``: ``gelu``, ``swiglu`` or ``none``; ``bias``: biases in the MLP.
    """

    def __init__(
        self,
        d_model: int,
        self_attn: nn.Module,
        d_ff: int,
        *,
        dropout: float = 0.0,
        norm_first: bool = True,
        cross_attn: Attention | None = None,
        norm: str = "layernorm",
        mlp: str = "gelu",
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = self_attn
        self.cross_attn = cross_attn
        self.ffn = make_mlp(mlp, d_model, d_ff, dropout, bias)
        branches = 1 + (cross_attn is not None) + (self.ffn is not None)
        self.norms = nn.ModuleList(make_norm(norm, d_model) for _ in range(branches))
        self.drop = nn.Dropout(dropout)

    def _residual(self, x: Tensor, norm: nn.Module, fn: Any) -> tuple[Tensor, Any]:
        if self.norm_first:
            out, extra = fn(norm(x))
            return x + self.drop(out), extra
        out, extra = fn(x)
        return norm(x + self.drop(out)), extra

    # keyword-only signature: its likeness to Attention.__init__'s is layout, not logic
    def forward(
        self,
        x: Tensor,
        *,
        causal: bool,
        key_padding_mask: Tensor | None = None,
        position: PositionScheme | None = None,
        memory: Tensor | None = None,
        memory_padding_mask: Tensor | None = None,
        cache: dict[str, LayerCache] | None = None,
        need_weights: bool = False,
        document_starts: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Tensor | None]]:
        """Returns the new hidden states and the attention weights by role
        (``self``, ``cross``) when ``need_weights``. ``document_starts`` (B, L): the sequence
        mixer keeps the documents starting there apart (:mod:`harness.nn.documents`)."""
        weights: dict[str, Tensor | None] = {}
        x, weights["self"] = self._residual(
            x,
            self.norms[0],
            lambda h: documents.mix(
                self.self_attn,
                h,
                document_starts,
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
        if self.ffn is not None:
            ffn = self.ffn
            x, _ = self._residual(x, self.norms[-1], lambda h: (ffn(h), None))
        return x, weights

    def new_cache(self) -> dict[str, LayerCache]:
        cache: dict[str, LayerCache] = {"self": self.self_attn.new_cache()}  # type: ignore[operator]
        if self.cross_attn is not None:
            cache["cross"] = self.cross_attn.new_cache()
        return cache

    def state_size(self, length: int) -> int:
        """Decoding-state elements per sequence of this block's mixer after ``length`` positions."""
        return int(self.self_attn.state_size(length))  # type: ignore[operator]
