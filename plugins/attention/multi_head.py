"""``multi_head``: the Transformer's multi-head attention (Vaswani et al., 2017).

Runs on PyTorch's fused ``scaled_dot_product_attention`` and keeps its fast kernels where
the position scheme allows: ``is_causal`` instead of an explicit mask when nothing else is
masked, a float bias only when the scheme adds one. Attention weights (``need_weights``)
come from the explicit path, which computes the same function.
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


def build(config: MultiHeadConfig, *, d_model: int, num_heads: int) -> Any:
    return module_class()(
        d_model, num_heads, dropout=config.dropout, tied_qk=config.tied_qk, bias=config.bias
    )


@cache
def module_class() -> type:
    import torch.nn.functional as F

    from harness.nn.attention import Attention, allowed_mask, scaled

    class MultiHeadAttention(Attention):
        def score(self, q: Any, k: Any) -> Any:
            return scaled(q) @ k.transpose(-2, -1)

        def attend(self, q, k, v, *, q_pos, k_pos, causal, key_padding_mask, bias, need_weights):  # type: ignore[no-untyped-def]
            if need_weights:
                return super().attend(
                    q, k, v, q_pos=q_pos, k_pos=k_pos, causal=causal,
                    key_padding_mask=key_padding_mask, bias=bias, need_weights=True,
                )
            dropout = self.dropout if self.training else 0.0
            aligned = q.shape[2] == k.shape[2] and bool(q_pos[0] == k_pos[0])
            if causal and aligned and bias is None and key_padding_mask is None:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout), None
            mask = allowed_mask(q_pos, k_pos, causal=causal, key_padding_mask=key_padding_mask)
            if bias is not None:
                bias = bias.to(q.dtype)
                mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout), None

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
