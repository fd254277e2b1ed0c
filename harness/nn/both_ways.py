"""A causal-only mixer run both ways, for encoders: one copy reads the sequence left to right,
another right to left, and their outputs are summed (the bidirectional layers S4 and its
successors use on the Long Range Arena; Gu et al., ICLR 2022, arXiv:2111.00396).

Batches are right-padded: the right-to-left copy reads each row's real tokens reversed (row
by row, so padding never comes first), and its outputs are put back in place. Outputs at
padded positions are meaningless; encoders pool over real positions only.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from harness.nn.mixer import BIDIRECTIONAL


def reverse_rows(x: Tensor, key_padding_mask: Tensor | None) -> Tensor:
    """Each row's first n positions reversed (n: its real tokens); the rest left as they are."""
    b, n = x.shape[:2]
    i = torch.arange(n, device=x.device).expand(b, n)
    if key_padding_mask is None:
        return x.flip(1)
    lengths = (~key_padding_mask).sum(1, keepdim=True)
    index = torch.where(i < lengths, lengths - 1 - i, i)
    return x.gather(1, index.unsqueeze(-1).expand_as(x))


class BothWays(nn.Module):
    """``forward`` (left to right) + ``backward`` (right to left), two causal mixers."""

    directions = frozenset({BIDIRECTIONAL})

    def __init__(self, forward: nn.Module, backward: nn.Module) -> None:
        super().__init__()
        self.ahead, self.back = forward, backward

    def forward(self, x: Tensor, *, causal: bool = False, key_padding_mask: Tensor | None = None,
                position: Any = None, cache: Any = None, need_weights: bool = False) -> tuple[Tensor, None]:
        if causal or cache is not None:
            raise ValueError("a mixer run both ways reads the whole sequence: it cannot run causally or decode")
        ahead, _ = self.ahead(x, causal=True, position=position)
        back, _ = self.back(reverse_rows(x, key_padding_mask), causal=True, position=position)
        return ahead + reverse_rows(back, key_padding_mask), None

    def state_size(self, length: int) -> int:
        return int(self.ahead.state_size(length)) + int(self.back.state_size(length))  # type: ignore[operator]
