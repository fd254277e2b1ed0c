"""``dot_product``: Luong et al. (2015) "dot" attention, unscaled.

score(h_t, h_s) = h_tᵀ h_s: the query state is compared with each key state directly, with
no learned query/key projections and no 1/√d temperature. This is what separates it from
``general`` (a learned bilinear form) and ``scaled_dot_product`` (projections and 1/√d_k):
at width d the logits grow like d, so the softmax saturates sooner, which is the point of
the comparison. Values and the output keep the harness's learned projections (Luong's
context vector passes through W_c before the output in the same way). It runs on PyTorch's
fused attention kernels with ``scale=1`` (``harness.plugin.FusedDotProductAttention``).

Heads: the classic is single-head, so ``heads`` defaults to 1 and ignores the model's head
count; ``heads = n`` splits the states into n slices of width d/n, each scored against the
same slice of the keys. Position hooks still act per model head: queries/keys are regrouped
into the model's heads for rotations, and per-head score biases are averaged over the
model heads (see ``harness.plugin.Attention``), so it pairs with every position scheme.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from torch import nn

from harness.plugin import AttentionConfig, AttentionSpec, FusedDotProductAttention, Ge, hookimpl


@dataclass
class DotProductConfig(AttentionConfig):
    """``bias``: biases in the value and output projections (queries and keys have none)."""

    heads: Annotated[int, Ge(1)] = 1  # the classic is single-head; not the model's head count


class DotProductAttention(FusedDotProductAttention):  # same shape as general.py by design: one file per variant
    """Luong dot attention: unscaled h_tᵀ h_s, no query/key projections."""

    score_scale = 1.0  # unscaled

    def __init__(self, config: DotProductConfig, *, d_model: int, num_heads: int) -> None:
        super().__init__(d_model, config.heads, dropout=config.dropout, bias=config.bias,
                         position_heads=num_heads)
        self.q_proj = self.k_proj = nn.Identity()  # compare the states themselves


@hookimpl
def harness_register_attention(register: Any) -> None:
    register(AttentionSpec(name="dot_product", build=DotProductAttention))
