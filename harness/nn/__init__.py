"""The interfaces that attention and position plugins implement, and shared layers.

Importing this package imports torch: plugin modules import it inside their ``build``
functions only.
"""

from harness.nn.attention import Attention, AttentionCache, allowed_mask, masked_softmax
from harness.nn.blocks import FeedForward, ScaledEmbedding, TransformerBlock
from harness.nn.position import PositionScheme

__all__ = [
    "Attention",
    "AttentionCache",
    "FeedForward",
    "PositionScheme",
    "ScaledEmbedding",
    "TransformerBlock",
    "allowed_mask",
    "masked_softmax",
]
