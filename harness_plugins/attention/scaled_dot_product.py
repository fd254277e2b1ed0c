"""``scaled_dot_product``: single-head scaled dot-product attention (Vaswani et al., 2017).

softmax(Q Kᵀ / √d_k) V with Q = X W_q, K = X W_k (or the memory), V = X W_v and an output
projection, on the same fused kernels as ``multi_head`` (weights, when requested, from the
explicit scores-softmax-sum path).

Heads: it is the single-head layer, so ``heads`` defaults to 1 (d_k = d_model) and ignores
the model's head count; ``heads = n`` gives the multi-head form. Comparing it with
``multi_head`` asks whether several heads matter at equal width. Position hooks act per
model head (regrouped queries/keys, averaged per-head biases; see
``harness.plugin.Attention``), so it pairs with every position scheme.

``tied_qk`` shares one projection between queries and keys, so a study can ask whether the
query/key distinction matters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from harness.plugin import (  # a list of names, not logic: other plugins list many of the same
    AttentionConfig,
    AttentionSpec,
    Choice,
    FusedDotProductAttention,
    Ge,
    hookimpl,
)


@dataclass
class ScaledDotProductConfig(AttentionConfig):
    tied_qk: Annotated[bool, Choice((False, True))] = False  # one projection for q and k
    heads: Annotated[int, Ge(1)] = 1  # the single-head layer; not the model's head count


class ScaledDotProductAttention(FusedDotProductAttention):
    """Single-head softmax(QKᵀ/√d_k)V on the fused kernels; tied_qk option.

    Scores scaled by 1/√d_k; ``heads`` heads (default one of width d_model).
    """

    def __init__(self, config: ScaledDotProductConfig, *, d_model: int, num_heads: int) -> None:
        super().__init__(d_model, config.heads, dropout=config.dropout, tied_qk=config.tied_qk,
                         bias=config.bias, position_heads=num_heads)


@hookimpl
def harness_register_attention(register: Any) -> None:
    register(AttentionSpec(name="scaled_dot_product", build=ScaledDotProductAttention))
