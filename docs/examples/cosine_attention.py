"""``cosine``: attention over the cosine similarity of queries and keys, times a learned
scale per head (Henry et al., 2020, "Query-Key Normalization for Transformers")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import torch
import torch.nn.functional as F
from harness.plugin import Attention, AttentionConfig, AttentionSpec, FloatRange, Gt, hookimpl
from torch import Tensor, nn


@dataclass
class CosineConfig(AttentionConfig):  # dropout and bias come with the base config
    init_scale: Annotated[float, Gt(0), FloatRange(1.0, 30.0, log=True)] = 10.0


class CosineAttention(Attention):
    """Cosine-similarity attention with a learned scale per head."""

    def __init__(self, config: CosineConfig, *, d_model: int, num_heads: int) -> None:
        super().__init__(d_model, num_heads, dropout=config.dropout, bias=config.bias)
        self.scale = nn.Parameter(torch.full((num_heads, 1, 1), config.init_scale))

    def score(self, q: Tensor, k: Tensor) -> Tensor:
        """(B, H, Lq, D) queries and (B, H, Lk, D) keys -> (B, H, Lq, Lk) scores."""
        return self.scale * F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)


def cosine_reference(layer: CosineAttention, x: Tensor, *, causal: bool) -> Tensor:
    """float64 from the definition, head by head: softmax(g_h cos(q_i, k_j)) v_j."""
    def project(linear: nn.Linear) -> Tensor:  # (B, L, H, D)
        out = x @ linear.weight.T + (linear.bias if linear.bias is not None else 0.0)
        return out.unflatten(-1, (layer.num_heads, -1))

    q, k, v = project(layer.q_proj), project(layer.k_proj), project(layer.v_proj)
    n = x.shape[1]
    heads = []
    for h in range(layer.num_heads):
        qh, kh = q[:, :, h], k[:, :, h]
        cos = (qh @ kh.transpose(1, 2)) / (qh.norm(dim=-1)[:, :, None] * kh.norm(dim=-1)[:, None, :])
        scores = layer.scale[h, 0, 0] * cos
        if causal:
            scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        heads.append(scores.softmax(dim=-1) @ v[:, :, h])
    merged = torch.cat(heads, dim=-1)
    return merged @ layer.out_proj.weight.T + (layer.out_proj.bias if layer.out_proj.bias is not None else 0.0)


@hookimpl
def harness_register_attention(register):
    register(AttentionSpec(name="cosine", build=CosineAttention, reference=cosine_reference))
