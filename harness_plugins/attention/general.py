"""``general``: Luong et al. (2015) "general" (bilinear) attention.

score(h_t, h_s) = h_tᵀ W_a h_s with one learned d x d matrix W_a and no temperature. It is
implemented as an identity on the query side and W_a on the key side (``k_proj``, no bias:
a key-side bias b would add h_tᵀ b, the same for every key, which the softmax ignores), so
W_a = ``k_proj.weight``. Compared with ``scaled_dot_product``
it learns one full-rank bilinear form instead of the factored W_qᵀ W_k, and it is unscaled.
Values and the output keep the harness's learned projections. It runs on PyTorch's fused
attention kernels with ``scale=1`` (``harness.plugin.FusedDotProductAttention``).

Heads: the classic is single-head, so ``heads`` defaults to 1 and ignores the model's head
count; with ``heads = n`` head h scores slice h of the query state against slice h of
W_a h_s (n bilinear forms of shape d/n x d). Position hooks act per model head (regrouped
queries/keys, averaged per-head biases; see ``harness.plugin.Attention``), so it pairs with
every position scheme.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from torch import nn

from harness.plugin import AttentionConfig, AttentionSpec, FusedDotProductAttention, Ge, hookimpl


# The same skeleton as dot_product.py (both are single-head Luong variants); built-ins import
# only harness.plugin, as third-party plugins do, so these few lines are not shared.
@dataclass
class GeneralConfig(AttentionConfig):
    """``bias``: biases in the value and output projections (W_a has none)."""

    heads: Annotated[int, Ge(1)] = 1  # the classic is single-head; not the model's head count


class GeneralAttention(FusedDotProductAttention):  # same shape as dot_product.py by design: one file per variant
    """Luong general attention: bilinear h_tᵀ W_a h_s, unscaled."""

    score_scale = 1.0  # unscaled

    def __init__(self, config: GeneralConfig, *, d_model: int, num_heads: int) -> None:
        super().__init__(d_model, config.heads, dropout=config.dropout, bias=config.bias,
                         position_heads=num_heads)
        self.q_proj = nn.Identity()
        self.k_proj = nn.Linear(d_model, d_model, bias=False)  # W_a


@hookimpl
def harness_register_attention(register: Any) -> None:
    register(AttentionSpec(name="general", build=GeneralAttention))
