"""``multi_head``: the Transformer's multi-head attention (Vaswani et al., 2017).

head_h = softmax(Q_h K_hᵀ / √d_k) V_h for each of the model's heads, concatenated and
projected. Runs on PyTorch's fused ``scaled_dot_product_attention`` and keeps its fast
kernels where the position scheme allows:

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
    import torch.nn.functional as F

    from harness.nn.attention import Attention, allowed_mask, scaled, sdpa_mask

    class MultiHeadAttention(Attention):
        def score(self, q: Any, k: Any) -> Any:
            return scaled(q) @ k.transpose(-2, -1)

        def attend(self, q, k, v, *, q_pos, k_pos, causal, key_padding_mask, bias, need_weights,  # type: ignore[no-untyped-def]
                   state=None, cross=False):
            if need_weights:
                return super().attend(
                    q, k, v, q_pos=q_pos, k_pos=k_pos, causal=causal,
                    key_padding_mask=key_padding_mask, bias=bias, need_weights=True,
                )
            dropout = self.dropout if self.training else 0.0
            # Causal attention only runs on self-attention, where equal lengths mean the
            # same positions (a cache makes keys longer than queries).
            if causal and bias is None and key_padding_mask is None and q.shape[2] == k.shape[2]:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout), None
            allowed = allowed_mask(q_pos, k_pos, causal=causal, key_padding_mask=key_padding_mask)
            mask, empty = sdpa_mask(allowed, bias, q.dtype)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
            return (out if empty is None else out.masked_fill(empty, 0.0)), None

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
