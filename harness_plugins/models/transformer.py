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

For classification tasks the model is an encoder with a pooled classifier: ``pool: mean``
(the mean over non-padding tokens; the default) or ``pool: cls`` (a learned vector prepended
at position 0 and read out, as LRA's ``CLS`` configs), then ``classifier: linear`` (the
default) or ``classifier: mlp`` (Linear -> ReLU -> Linear, width ``ffn_mult * d_model``: LRA's
``classifier_head``). ``two_tower`` (a model-level option; default: what the task asks for,
``TaskInfo.extra["two_tower"]``, which ``lra_retrieval`` sets) reads each input as
``doc1 SEP doc2``, encodes both documents separately with the same weights, pools each to u
and v and classifies ``[u, v, u * v, u - v]`` (LRA's dual encoder with its "NLI"
interaction; its MLP has two hidden layers, ``ffn_mult * d_model`` and half that).
``bidirectional_mixer: true`` lets an encoder use a causal-only mixer (S4D, Mamba, ...): two
copies read each row left to right and right to left, their outputs summed (S4's
bidirectional layers on LRA). For tagging tasks the model is an encoder with one label per
token. Both are bidirectional unless
``causal: true`` (a left-to-right tagger, or a causal-only mixer). ``causal: false`` is
rejected for ``lm`` tasks: their targets are the inputs shifted by one, so a bidirectional
model would read each answer from the next input.

With ``task.params.documents: separate`` (``corpus_lm``) the model keeps the documents of a
window apart (``TaskInfo.document_token``): each block's attention is masked block-diagonally
and each mixer starts afresh at every document (``harness.nn.documents``).

Causal models ignore ``padding_mask``: batches are right-padded, so no real token ever
attends to a pad, and pads are never scored. This keeps the fused causal kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch
from torch import nn

from harness.plugin import (  # a list of names, not logic: other plugins list many of the same
    PAD,
    SEP,
    BothWays,
    BottleneckReadout,
    Choice,
    FloatRange,
    Ge,
    IntRange,
    LayerCache,
    Lt,
    ModelSpec,
    PositionScheme,
    ScaledEmbedding,
    TaskInfo,
    TransformerBlock,
    documents,
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
    # classification only: pooling, classifier, and the two-tower comparison of two documents
    pool: Literal["mean", "cls"] = "mean"
    classifier: Literal["linear", "mlp"] = "linear"
    two_tower: bool | None = None  # None: as the task asks (TaskInfo.extra["two_tower"])
    # encoders: run a causal-only mixer both ways (two copies, outputs summed), as S4 on LRA
    bidirectional_mixer: bool = False

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
        # a task may ask a tagger to read left to right (MAD's memorization and compression)
        hinted = bool(task.extra.get("causal")) and self.tag
        self.causal = (not encoder or hinted) if cfg.causal is None else cfg.causal
        if cfg.bidirectional_mixer and self.causal:
            raise ValueError("bidirectional_mixer runs a mixer both ways, which an encoder allows and a "
                             "causal model does not; drop it or set causal: false on a classification task")
        self.both_ways = cfg.bidirectional_mixer
        self.document_token = task.document_token  # keep documents apart (harness.nn.documents)
        # unit-scale entries, as a lookup of the (scaled) token embedding gives
        self.cls = nn.Parameter(torch.randn(d)) if self.classify and cfg.pool == "cls" else None
        self.two_tower = self.classify and bool(task.extra.get("two_tower") if cfg.two_tower is None
                                                else cfg.two_tower)
        self.position = (
            position(d_model=d, num_heads=cfg.heads, head_dim=d // cfg.heads,
                     max_length=task.max_length + (self.cls is not None), causal=self.causal)
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
        # compression: every output rebuilt from the last position (harness.nn.bottleneck)
        self.bottleneck = task.extra.get("bottleneck") if self.tag else None
        self.readout = BottleneckReadout(d, cfg.norm_layer) if self.bottleneck else None
        self.head = (classifier_head(cfg, d, out, self.two_tower) if self.classify
                     else nn.Linear(d, out, bias=False))
        if cfg.tie_embeddings and not encoder and self.embed.weight.shape[1] == d:
            self.head.weight = self.embed.weight

    def _layer(self, factory: Any, kind: str, d: int, heads: int) -> nn.Module:
        layer = factory(d, heads)
        if kind == "mixer" and self.both_ways and "bidirectional" not in layer.directions:
            layer = BothWays(layer, factory(d, heads))
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
        caches = [block.new_cache() for block in self.blocks]
        if self.document_token is not None:  # the window's positions (layers restart at documents)
            caches[0]["window"] = LayerCache()
        return caches

    def state_size(self, length: int) -> int:
        """Decoding-state elements per sequence of all blocks after ``length`` positions."""
        return sum(block.state_size(length) for block in self.blocks)

    def forward(self, tokens: Any, padding_mask: Any = None, *, cache: Any = None,
                return_attention: bool = False) -> Any:
        if self.two_tower:  # doc1 and doc2 as one batch of 2B rows through the same encoder
            docs, pads = split_pair(tokens, padding_mask)
            x, maps = self.encode(docs, pads, None, return_attention)
            u, v = self.pool(x, pads).chunk(2, dim=0)
            x = torch.cat([u, v, u * v, u - v], dim=-1)
        else:
            x, maps = self.encode(tokens, padding_mask, cache, return_attention)
            if self.classify:
                x = self.pool(x, padding_mask)
            elif self.readout is not None:
                x = self.readout(x, padding_mask)
        logits = self.head(x)
        return (logits, maps) if return_attention else logits

    def encode(self, tokens: Any, padding_mask: Any, cache: Any, return_attention: bool) -> tuple[Any, list[Any]]:
        """The stack's output (B, L, d) (L + 1 positions with a CLS vector first) and the
        attention maps of its blocks. With ``task.document_token``, documents are kept apart
        (``harness.nn.documents``): a full pass masks or resets at each start; a cached one
        decodes the stretches between starts, forgetting the caches' state at each."""
        if self.document_token is None:
            return self._encode(tokens, padding_mask, cache, return_attention, None)
        starts = tokens == self.document_token
        if not cache:
            return self._encode(tokens, padding_mask, cache, return_attention, starts)
        outs, window = [], cache[0]["window"]  # the model's positions run on over documents
        for a, b in documents.pieces(starts):
            if bool(starts[0, a]) and window.length + a > 0:
                for layer in cache:
                    documents.reset(layer["self"])
            pad = None if padding_mask is None else padding_mask[:, a:b]
            outs.append(self._encode(tokens[:, a:b], pad, cache, False, None, offset=window.length + a)[0])
        window.length += tokens.shape[1]
        return torch.cat(outs, dim=1), [None] * len(self.blocks)

    def _encode(self, tokens: Any, padding_mask: Any, cache: Any, return_attention: bool,
                starts: Any, offset: int | None = None) -> tuple[Any, list[Any]]:
        if offset is None:
            offset = cache[0]["self"].length if cache else 0
        x = self.embed(tokens)
        if self.cls is not None:  # a learned vector at position 0, never padding
            x = torch.cat([self.cls.expand(x.shape[0], 1, -1), x], dim=1)
            if padding_mask is not None:
                padding_mask = torch.cat([torch.zeros_like(padding_mask[:, :1]), padding_mask], dim=1)
        positions = torch.arange(offset, offset + x.shape[1], device=tokens.device)
        x = self.drop(self.position.embed(x, positions))
        kpm = None if self.causal else padding_mask
        maps = []
        for i, block in enumerate(self.blocks):
            x, weights = block(x, causal=self.causal, key_padding_mask=kpm, position=self.position,
                               cache=cache[i] if cache else None, need_weights=return_attention,
                               document_starts=starts)
            maps.append(weights["self"])
        return self.final_norm(x), maps

    def pool(self, x: Any, padding_mask: Any) -> Any:
        """(B, L, d) -> (B, d): the CLS position, or the mean over non-padding positions."""
        if self.cls is not None:
            return x[:, 0]
        keep = (~padding_mask).unsqueeze(-1).float() if padding_mask is not None else torch.ones_like(x[..., :1])
        return (x * keep).sum(1) / keep.sum(1).clamp(min=1)


def classifier_head(cfg: TransformerConfig, d: int, classes: int, two_tower: bool) -> nn.Module:
    """The classifier on the pooled vector (4 d wide for two towers): linear, or LRA's MLP."""
    width = 4 * d if two_tower else d
    if cfg.classifier == "linear":
        return nn.Linear(width, classes, bias=False)
    hidden = cfg.ffn_mult * d
    if two_tower:  # LRA's classifier_head_dual: two hidden layers
        return nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, hidden // 2),
                             nn.ReLU(), nn.Linear(hidden // 2, classes))
    return nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, classes))


def split_pair(tokens: Any, padding_mask: Any) -> tuple[Any, Any]:
    """``doc1 SEP doc2`` rows (right-padded) -> the 2B rows doc1..., doc2... right-padded to one
    width, and their padding mask. Every row must hold a SEP."""
    has_sep = tokens == SEP
    if not bool(has_sep.any(dim=1).all()):
        raise ValueError("two_tower reads each input as doc1 SEP doc2, and a row has no SEP: use "
                         "a task of document pairs (lra_retrieval) or set model.params.two_tower: false")
    b, n = tokens.shape
    lengths = (~padding_mask).sum(1) if padding_mask is not None else torch.full((b,), n, device=tokens.device)
    sep = has_sep.int().argmax(dim=1)  # the first SEP
    first, second = sep, lengths - sep - 1
    width = max(int(first.max()), int(second.max()), 1)
    j = torch.arange(width, device=tokens.device).unsqueeze(0)
    start = torch.cat([torch.zeros_like(sep), sep + 1]).unsqueeze(1)
    keep = j < torch.cat([first, second]).unsqueeze(1)
    rows = torch.cat([tokens, tokens])
    docs = rows.gather(1, (start + j).clamp(max=n - 1)).masked_fill(~keep, PAD)
    return docs, ~keep


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


# the registration every model file has (one file per variant), alike by design
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
            separates_documents=True,
            default_attention="multi_head",
            default_position="sinusoidal",
            width_param="d_model",
            presets={"transformer++": {
                "params": {"norm_layer": "rmsnorm", "mlp": "swiglu", "bias": False},
                "position": {"name": "rope"},
            }},
        )
    )
