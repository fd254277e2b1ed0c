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

``kv_heads`` makes it grouped-query attention (Ainslie et al., 2023, "GQA"): ``kv_heads``
key/value heads, each shared by ``heads / kv_heads`` consecutive query heads; ``kv_heads: 1``
is multi-query attention (Shazeer, 2019). The decoding cache keeps only the ``kv_heads``
heads, so its state is ``heads / kv_heads`` times smaller; 0 (the default) means one
key/value head per query head (plain multi-head attention).
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
class MultiHeadConfig(AttentionConfig):
    tied_qk: Annotated[bool, Choice((False, True))] = False  # one projection for q and k
    kv_heads: Annotated[int, Ge(0)] = 0  # key/value heads (GQA); 0: as many as query heads


class MultiHeadAttention(FusedDotProductAttention):
    """Multi-head scaled dot-product attention on the fused SDPA kernels (GQA/MQA with kv_heads)."""

    def __init__(self, config: MultiHeadConfig, *, d_model: int, num_heads: int) -> None:
        super().__init__(d_model, num_heads, dropout=config.dropout, tied_qk=config.tied_qk,
                         bias=config.bias, kv_heads=config.kv_heads or None)


@hookimpl
def harness_register_attention(register: Any) -> None:
    register(AttentionSpec(name="multi_head", build=MultiHeadAttention))
