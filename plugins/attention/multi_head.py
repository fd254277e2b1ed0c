"""``multi_head``: the Transformer's multi-head attention (Vaswani et al., 2017).

head_h = softmax(Q_h K_hᵀ / √d_k) V_h for each of the model's heads, concatenated and
projected. Runs on PyTorch's fused ``scaled_dot_product_attention`` (the shared
``harness.nn.attention.FusedDotProductAttention``) and keeps its fast kernels where the
position scheme allows:

* causal self-attention with nothing else masked and no score bias: ``is_causal=True``
  (no mask tensor at all);
* otherwise a boolean mask (causal and/or key padding), and a float mask only when the
  scheme adds a score bias (ALiBi, T5, Shaw).

Attention weights (``need_weights``) come from the explicit softmax path, which computes
the same function. ``tied_qk`` shares one projection between queries and keys (then every
head's score matrix is symmetric before position hooks), so a study can ask whether the
query/key distinction matters.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any

import harness
from harness.params import Choice, FloatRange
from harness.registry import AttentionSpec


@dataclass
class MultiHeadConfig:
    dropout: Annotated[float, FloatRange(0.0, 0.3)] = 0.0  # on attention weights
    tied_qk: Annotated[bool, Choice((False, True))] = False  # one projection for q and k
    bias: bool = True  # biases in the projections

    def __post_init__(self) -> None:
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout ({self.dropout}) must be in [0, 1).")


def build(config: MultiHeadConfig, *, d_model: int, num_heads: int) -> Any:
    return module_class()(
        d_model, num_heads, dropout=config.dropout, tied_qk=config.tied_qk, bias=config.bias
    )


@cache
def module_class() -> type:
    from harness.nn.attention import FusedDotProductAttention

    class MultiHeadAttention(FusedDotProductAttention):
        """One head per model head, scores scaled by 1/√d_k (the shared fused path)."""

    return MultiHeadAttention


@harness.hookimpl
def harness_register_attention(register: Any) -> None:
    register(
        AttentionSpec(
            name="multi_head",
            build=build,
            config=MultiHeadConfig,
            description="Multi-head scaled dot-product attention on the fused SDPA kernels.",
        )
    )
