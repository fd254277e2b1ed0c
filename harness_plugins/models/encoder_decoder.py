"""``encoder_decoder``: the original Transformer for sequence-to-sequence tasks
(Vaswani et al., 2017).

A bidirectional encoder (self-attention over the source), a causal decoder (masked
self-attention over the target prefix, then cross-attention to the encoder output) and a
linear head. The attention factory is called once per layer and role, for the three roles
this model declares: ``encoder`` (encoder self-attention), ``decoder`` (decoder
self-attention) and ``cross`` (cross-attention). ``model.attention`` serves every role
that ``model.attention_roles`` does not give its own variant, e.g. linear self-attention
with additive cross-attention::

    model:
      name: encoder_decoder
      attention: {name: linear}                 # encoder and decoder self-attention
      attention_roles: {cross: {name: additive}}

The position scheme acts on both stacks, one instance each (the encoder's built
bidirectional, the decoder's causal); cross-attention sees no positions, so only the
self-attention roles are checked against it.

Training is teacher-forced (the batch's ``tgt_in`` is the target shifted right after BOS);
evaluation decodes greedily with a per-layer cache (:meth:`greedy_decode`), or with
:func:`harness.nn.decoding.beam_search`. Causal self-attention ignores ``tgt_padding_mask``:
batches are right-padded, so no real position ever attends to a pad.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import torch
from torch import Tensor, nn

from harness.plugin import (  # a list of names, not logic: other plugins list many of the same
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
    greedy_steps,
    hookimpl,
)


@dataclass
class EncoderDecoderConfig:
    d_model: Annotated[int, Ge(1), Choice((32, 64, 128, 256, 512))] = 64
    encoder_layers: Annotated[int, Ge(1), IntRange(1, 6)] = 2
    decoder_layers: Annotated[int, Ge(1), IntRange(1, 6)] = 2
    heads: Annotated[int, Ge(1), Choice((1, 2, 4, 8))] = 4
    ffn_mult: Annotated[int, Ge(1), Choice((2, 4))] = 4  # FFN width = ffn_mult * d_model
    dropout: Annotated[float, Ge(0.0), Lt(1.0), FloatRange(0.0, 0.3)] = 0.0
    norm: Annotated[str, Choice(("pre", "post"))] = "pre"
    # one matrix for source embedding, target embedding and output (as in Vaswani et al.)
    tie_embeddings: Annotated[bool, Choice((True, False))] = True

    def __post_init__(self) -> None:
        if self.d_model % self.heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by heads ({self.heads})")
        if self.norm not in ("pre", "post"):
            raise ValueError(f"norm must be 'pre' or 'post', got {self.norm!r}")


class EncoderDecoder(nn.Module):
    """Transformer encoder-decoder (Vaswani et al., 2017); any attention x position, per role
    (encoder, decoder, cross)."""

    def __init__(self, config: EncoderDecoderConfig, *, task: TaskInfo, attention: Any,
                 position: Any) -> None:
        super().__init__()
        cfg, d = config, config.d_model
        self.enc_position = self._scheme(position, cfg, task, causal=False)
        self.dec_position = self._scheme(position, cfg, task, causal=True)
        self.src_embed = ScaledEmbedding(task.vocab_size, self.enc_position.token_width(d))
        tgt_width = self.dec_position.token_width(d)
        tie = cfg.tie_embeddings and tgt_width == self.src_embed.embedding_dim
        self.tgt_embed = self.src_embed if tie else ScaledEmbedding(task.vocab_size, tgt_width)
        self.encoder = nn.ModuleList(self._block(attention, cfg, "encoder") for _ in range(cfg.encoder_layers))
        self.decoder = nn.ModuleList(self._block(attention, cfg, "decoder") for _ in range(cfg.decoder_layers))
        self.enc_norm, self.dec_norm = self._final_norm(cfg), self._final_norm(cfg)
        self.drop = nn.Dropout(cfg.dropout)
        self.head = nn.Linear(d, task.vocab_size, bias=False)
        if cfg.tie_embeddings and tgt_width == d:
            self.head.weight = self.tgt_embed.weight

    @staticmethod
    def _scheme(position: Any, cfg: EncoderDecoderConfig, task: TaskInfo, *, causal: bool) -> Any:
        if position is None:
            return PositionScheme()
        d, heads = cfg.d_model, cfg.heads
        return position(d_model=d, num_heads=heads, head_dim=d // heads,
                        max_length=task.max_length, causal=causal)

    @staticmethod
    def _block(attention: Any, cfg: EncoderDecoderConfig, role: str) -> TransformerBlock:
        d, heads = cfg.d_model, cfg.heads
        return TransformerBlock(d, attention(d, heads, role=role), cfg.ffn_mult * d,
                                dropout=cfg.dropout, norm_first=cfg.norm == "pre",
                                cross_attn=attention(d, heads, role="cross")
                                if role == "decoder" else None)

    @staticmethod
    def _final_norm(cfg: EncoderDecoderConfig) -> nn.Module:
        return nn.LayerNorm(cfg.d_model) if cfg.norm == "pre" else nn.Identity()

    def supports_length(self, length: int) -> bool:
        return self.enc_position.supports(length) and self.dec_position.supports(length)

    def encode(self, src: Tensor, src_padding_mask: Tensor | None,
               need_weights: bool = False) -> tuple[Tensor, list[Tensor | None]]:
        """Source (B, S) -> memory (B, S, d_model) and per-layer self-attention maps."""
        positions = torch.arange(src.shape[1], device=src.device)
        x = self.drop(self.enc_position.embed(self.src_embed(src), positions))
        maps = []
        for layer in self.encoder:
            x, weights = layer(x, causal=False, key_padding_mask=src_padding_mask,
                               position=self.enc_position, need_weights=need_weights)
            maps.append(weights["self"])
        return self.enc_norm(x), maps

    def decode(self, tgt_in: Tensor, memory: Tensor, src_padding_mask: Tensor | None, *,
               cache: list[Any] | None = None,
               need_weights: bool = False) -> tuple[Tensor, list[Tensor | None]]:
        """Target prefix (B, T) -> logits (B, T, V) and per-layer self, cross maps.
        With a ``cache`` (from :meth:`new_cache`), ``tgt_in`` continues the cached prefix."""
        offset = cache[0]["self"].length if cache else 0
        positions = torch.arange(offset, offset + tgt_in.shape[1], device=tgt_in.device)
        x = self.drop(self.dec_position.embed(self.tgt_embed(tgt_in), positions))
        maps = []
        for i, layer in enumerate(self.decoder):
            x, weights = layer(x, causal=True, position=self.dec_position, memory=memory,
                               memory_padding_mask=src_padding_mask,
                               cache=cache[i] if cache else None, need_weights=need_weights)
            maps += [weights["self"], weights["cross"]]
        return self.head(self.dec_norm(x)), maps

    def new_cache(self) -> list[Any]:
        return [layer.new_cache() for layer in self.decoder]

    def forward(self, src: Tensor, tgt_in: Tensor, src_padding_mask: Tensor | None = None,
                tgt_padding_mask: Tensor | None = None, *, return_attention: bool = False) -> Any:
        """Teacher-forced logits (B, T, V); with ``return_attention`` also the maps of
        every encoder layer, then the self and cross maps of every decoder layer."""
        memory, enc_maps = self.encode(src, src_padding_mask, return_attention)
        logits, dec_maps = self.decode(tgt_in, memory, src_padding_mask,
                                       need_weights=return_attention)
        return (logits, enc_maps + dec_maps) if return_attention else logits

    @torch.no_grad()
    def greedy_decode(self, src: Tensor, src_padding_mask: Tensor | None, max_len: int) -> Tensor:
        """Free-running greedy outputs (B, max_len): each step feeds back the argmax and
        costs one position (cached keys and values); stops early once every row has
        emitted EOS (the rest is PAD)."""
        memory, _ = self.encode(src, src_padding_mask)
        cache = self.new_cache()

        def next_logits(token: Tensor) -> Tensor:
            logits, _ = self.decode(token[:, None], memory, src_padding_mask, cache=cache)
            return logits[:, -1]

        return greedy_steps(next_logits, src.shape[0], max_len, src.device)


# the registration every model file has (one file per variant), alike by design
@hookimpl
def harness_register_model(register: Any) -> None:
    register(
        ModelSpec(
            name="encoder_decoder",
            build=EncoderDecoder,
            task_kinds=frozenset({"seq2seq"}),
            uses_attention=True,
            attention_roles=("encoder", "decoder", "cross"),
            uses_position=True,
            default_attention="multi_head",
            default_position="sinusoidal",
            width_param="d_model",
        )
    )
