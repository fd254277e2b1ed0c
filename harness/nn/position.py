"""The position-scheme interface: three hook points, identity by default.

A scheme overrides the hooks it needs (and its spec declares them in ``hooks``):

1. ``embed``       on token embeddings (added or concatenated);
2. ``rotate``      on per-head queries and keys (RoPE and its extensions);
3. ``score_bias``  an additive bias on attention scores (ALiBi, T5, Shaw relative).

One scheme instance is shared by every layer of a model. Hooks 2 and 3 apply to
self-attention only: positions of two different sequences (cross-attention) do not compare.
Positions are absolute indices (1-D ``LongTensor``); with a decoding cache they start at the
cache's length, so incremental decoding sees the same positions as a full pass.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class PositionScheme(nn.Module):
    """Base class; every hook is the identity.

    ``max_length``: the longest sequence the scheme supports (``None`` = any length).
    A model asks ``supports(length)`` before running past its trained length.
    """

    def __init__(self, max_length: int | None = None) -> None:
        super().__init__()
        self.max_length = max_length

    def supports(self, length: int) -> bool:
        return self.max_length is None or length <= self.max_length

    def token_width(self, d_model: int) -> int:
        """Width of the token embedding the model must produce (``d_model`` unless the
        scheme concatenates its own features to reach ``d_model``)."""
        return d_model

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        """Hook 1. ``x``: (B, L, token_width) token embeddings -> (B, L, d_model)."""
        return x

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """Hook 2. ``q``: (B, H, Lq, Dqk), ``k``: (B, H, Lk, Dqk) -> rotated (q, k)."""
        return q, k

    def score_bias(self, q: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        """Hook 3. An additive bias broadcastable to (B, H, Lq, Lk), or ``None``.

        ``q`` (B, H, Lq, Dqk) is given for query-dependent biases (Shaw et al.)."""
        return None


def sinusoids(positions: Tensor, dim: int, base: float = 10_000.0) -> Tensor:
    """(L, dim) float32 table of the Transformer's features for the given positions.

    Column 2i is sin(p / base^(2i/dim)), column 2i+1 is cos(p / base^(2i/dim)). Computed on
    the fly, so any position works. Shared by the schemes that add or concatenate them.
    """
    i = torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32)
    angles = positions.float()[:, None] / base ** (i / dim)[None, :]
    table = torch.zeros(len(positions), dim, device=positions.device)
    table[:, 0::2] = angles.sin()
    table[:, 1::2] = angles.cos()[:, : dim // 2]
    return table


def relative_positions(q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """(Lq, Lk) offsets ``k_pos[j] - q_pos[i]``: negative for keys before the query."""
    return k_pos[None, :] - q_pos[:, None]
