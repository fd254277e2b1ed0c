"""``transformer``: a decoder-only (causal LM) or encoder (bidirectional) stack of residual
blocks, each a sequence mixer and an MLP.

The mixer of each block is the attention variant (``model.attention``), a mixer
(``model.mixer``: Mamba, RetNet, Hyena, ...) or, for a hybrid, either one by layer:
``pattern: [mixer, mixer, attention]`` is cycled over the ``layers`` (a Jamba- or
Zamba-style hybrid with one attention block in three). With only a mixer and no pattern every
block uses it; with only attention, every block uses attention.

Backbone options a fair comparison needs: ``norm`` (pre- or post-norm), ``norm_layer``
(LayerNorm or RMSNorm), ``mlp`` (GELU MLP, SwiGLU, or none: a pure mixer stack, as in
Mamba), ``bias`` (biases in the MLP and the head). The preset ``transformer++`` is the
recipe of LLaMA-style models (Touvron et al., 2023): RoPE, SwiGLU, RMSNorm, no biases.
Any position scheme applies to the token embeddings; its query/key and score hooks reach
the blocks whose layer applies them (every attention variant; mixers declare theirs).

For classification tasks the model is an encoder with mean pooling over non-padding tokens;
for tagging tasks an encoder with one label per token. Both are bidirectional unless
``causal: true`` (a left-to-right tagger, or a causal-only mixer). ``causal: false`` is
rejected for ``lm`` tasks: their targets are the inputs shifted by one, so a bidirectional
model would read each answer from the next input.

Causal models ignore ``padding_mask``: batches are right-padded, so no real token ever
attends to a pad, and pads are never scored. This keeps the fused causal kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch
from torch import nn

from harness.plugin import (
    Choice,
    FloatRange,
    Ge,
    IntRange,
    Lt,
    ModelSpec,
    PositionScheme,
    ScaledEmbedding,
    TaskInfo,
    TransformerBlock,
    hookimpl,
    make_norm,
)

LAYER_KINDS = ("attention", "mixer")


@dataclass
class TransformerConfig:
    d_model: Annotated[int, Ge(1), Choice((32, 64, 128, 256, 512))] = 64
    layers: Annotated[int, Ge(1), IntRange(1, 8)] = 2
    heads: Annotated[int, Ge(1), Choice((1, 2, 4, 8))] = 4
    ffn_mult: Annotated[int, Ge(1), Choice((2, 4))] = 4  # MLP width = ffn_mult * d_model
    dropout: Annotated[float, Ge(0.0), Lt(1.0), FloatRange(0.0, 0.3)] = 0.0
    norm: Annotated[str, Choice(("pre", "post"))] = "pre"
    # backbone recipe: fixed unless a study searches it (search: {mlp: [gelu, swiglu]})
    norm_layer: Literal["layernorm", "rmsnorm"] = "layernorm"
    mlp: Literal["gelu", "swiglu", "none"] = "gelu"
    bias: bool = True  # biases in the MLP
    # untied by default: tied, the model stays near 0.3 on associative_recall where the untied
    # one and a plain-PyTorch reference answer 0.99+ (evidence: benchmarks/defaults.md)
    tie_embeddings: Annotated[bool, Choice((True, False))] = False
    causal: bool | None = None  # None: causal for lm, bidirectional for classification/tagging
    pattern: tuple[str, ...] = ()  # per-layer kinds, cycled: ("mixer", "mixer", "attention")

    def __post_init__(self) -> None:
        if self.d_model % self.heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by heads ({self.heads})")
        unknown = sorted(set(self.pattern) - set(LAYER_KINDS))
        if unknown:
            raise ValueError(f"pattern: unknown layer kinds {unknown}; use {' and '.join(LAYER_KINDS)}")


class Transformer(nn.Module):
    """Decoder-only (causal LM) or encoder Transformer; any attention, mixer or hybrid x position."""

    def __init__(self, config: TransformerConfig, *, task: TaskInfo, attention: Any, position: Any,
                 mixer: Any = None) -> None:
        super().__init__()
        cfg, d = config, config.d_model
        self.classify = task.format == "classification"
        self.tag = task.format == "tagging"
        encoder = self.classify or self.tag
        if task.format == "lm" and cfg.causal is False:
            raise ValueError(
                "causal: false on an lm task lets every position see the token it must predict "
                "(lm targets are the inputs shifted by one); keep causal attention for lm tasks"
            )
        self.causal = (not encoder) if cfg.causal is None else cfg.causal
        self.position = (
            position(d_model=d, num_heads=cfg.heads, head_dim=d // cfg.heads,
                     max_length=task.max_length, causal=self.causal)
            if position is not None else PositionScheme()
        )
        self.embed = ScaledEmbedding(task.vocab_size, self.position.token_width(d))
        self.drop = nn.Dropout(cfg.dropout)
        factories = {"attention": attention, "mixer": mixer}
        kinds = layer_kinds(cfg, attention is not None, mixer is not None)
        self.blocks = nn.ModuleList(
            TransformerBlock(d, self._layer(factories[kind], kind, d, cfg.heads), cfg.ffn_mult * d,
                             dropout=cfg.dropout, norm_first=cfg.norm == "pre", norm=cfg.norm_layer,
                             mlp=cfg.mlp, bias=cfg.bias)
            for kind in kinds
        )
        self.final_norm = (make_norm(cfg.norm_layer, d) if cfg.norm == "pre"
                           else nn.Identity())
        out = task.num_classes if encoder else task.vocab_size
        self.head = nn.Linear(d, out, bias=False)
        if cfg.tie_embeddings and not encoder and self.embed.weight.shape[1] == d:
            self.head.weight = self.embed.weight

    def _layer(self, factory: Any, kind: str, d: int, heads: int) -> nn.Module:
        layer = factory(d, heads)
        direction = "causal" if self.causal else "bidirectional"
        if direction not in layer.directions:
            fix = ("set model.params.causal: true (a causal encoder)" if self.causal is False
                   else "it needs a task with whole-sequence inputs (classification or tagging)")
            raise ValueError(f"the {kind} {type(layer).__name__} runs only "
                             f"{' or '.join(sorted(layer.directions))}, not {direction}; {fix}")
        return layer  # type: ignore[no-any-return]

    def supports_length(self, length: int) -> bool:
        ok = self.position.supports(length)
        return ok and all(getattr(b.self_attn, "supports_length", lambda n: True)(length)
                          for b in self.blocks)

    def new_cache(self) -> list[Any]:
        return [block.new_cache() for block in self.blocks]

    def state_size(self, length: int) -> int:
        """Decoding-state elements per sequence of all blocks after ``length`` positions."""
        return sum(block.state_size(length) for block in self.blocks)

    def forward(self, tokens: Any, padding_mask: Any = None, *, cache: Any = None,
                return_attention: bool = False) -> Any:
        offset = cache[0]["self"].length if cache else 0
        positions = torch.arange(offset, offset + tokens.shape[1], device=tokens.device)
        x = self.drop(self.position.embed(self.embed(tokens), positions))
        kpm = None if self.causal else padding_mask
        maps = []
        for i, block in enumerate(self.blocks):
            x, weights = block(x, causal=self.causal, key_padding_mask=kpm, position=self.position,
                               cache=cache[i] if cache else None, need_weights=return_attention)
            maps.append(weights["self"])
        x = self.final_norm(x)
        if self.classify:
            keep = (~padding_mask).unsqueeze(-1).float() if padding_mask is not None else torch.ones_like(x[..., :1])
            x = (x * keep).sum(1) / keep.sum(1).clamp(min=1)
        logits = self.head(x)
        return (logits, maps) if return_attention else logits


def layer_kinds(cfg: TransformerConfig, has_attention: bool, has_mixer: bool) -> list[str]:
    """The layer kind of each block: the pattern cycled over the layers, else the one given."""
    if cfg.pattern:
        missing = [k for k, ok in (("attention", has_attention), ("mixer", has_mixer))
                   if k in cfg.pattern and not ok]
        if missing:
            raise ValueError(f"pattern names {' and '.join(missing)} but the model has no "
                             f"model.{missing[0]}; add it")
        return [cfg.pattern[i % len(cfg.pattern)] for i in range(cfg.layers)]
    if has_attention and has_mixer:
        raise ValueError("model.attention and model.mixer are both set: say which block uses which "
                         "with model.params.pattern, e.g. [mixer, mixer, attention]")
    return ["mixer" if has_mixer else "attention"] * cfg.layers


@hookimpl
def harness_register_model(register: Any) -> None:
    register(
        ModelSpec(
            name="transformer",
            build=Transformer,
            task_kinds=frozenset({"lm", "classification", "tagging"}),
            uses_attention=True,
            uses_mixer=True,
            uses_position=True,
            default_attention="multi_head",
            default_position="sinusoidal",
            width_param="d_model",
            presets={"transformer++": {
                "params": {"norm_layer": "rmsnorm", "mlp": "swiglu", "bias": False},
                "position": {"name": "rope"},
            }},
        )
    )
