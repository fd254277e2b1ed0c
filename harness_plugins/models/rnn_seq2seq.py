"""``rnn_seq2seq``: the RNNsearch family of recurrent encoder-decoders.

A bidirectional GRU/LSTM encoder reads the source into annotations [forward; backward]
(``hidden / 2`` per direction, so an annotation is as wide as the decoder state); a
recurrent decoder writes the target one token at a time, attending to the annotations
through any attention plugin used as cross-attention (queries: the decoder state; keys and
values: the annotations themselves, so ``dot_product`` compares state and annotation
directly, as Luong's "dot" does). Two wirings, after the two papers:

``bahdanau``  (Bahdanau et al., 2015; pair with ``additive``) the previous state
              s_{i-1} queries the annotations; the context c_i enters the recurrence,
              s_i = f(s_{i-1}, [E y_{i-1}; c_i]); a maxout readout of [s_i; E y_{i-1}; c_i]
              predicts y_i (eq. 4 of the paper).
``luong``     (Luong et al., 2015; pair with ``dot_product`` or ``general``) the new state
              h_t queries the annotations; h~_t = tanh(W_c [c_t; h_t]) predicts y_t and is
              fed to the next step's input (input feeding).

Without an attention variant the decoder is conditioned on the source only through its
initial state (Cho et al., 2014; Sutskever et al., 2014). In every case the initial
decoder state is tanh(W [forward final; backward final]) of the encoder's top layer.

Training is teacher-forced over ``tgt_in``; :meth:`greedy_decode` feeds back the argmax.
The decoder runs step by step (a Python loop over target positions) in both cases.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import torch
from torch import Tensor, nn

from harness.plugin import (  # a list of names, not logic: other plugins list many of the same
    AttentionCache,
    BidirectionalEncoder,
    Choice,
    FloatRange,
    Ge,
    IntRange,
    Lt,
    ModelSpec,
    TaskInfo,
    greedy_steps,
    hookimpl,
    make_rnn,
)

STYLES = ("bahdanau", "luong")


@dataclass
class RNNSeq2SeqConfig:
    cell: Annotated[str, Choice(("gru", "lstm"))] = "gru"
    style: Annotated[str, Choice(STYLES)] = "bahdanau"  # how attention is wired (see above)
    embed_dim: Annotated[int, Ge(1), Choice((32, 64, 128, 256))] = 64
    # decoder state and annotation width (hidden / 2 per encoder direction: even)
    hidden: Annotated[int, Ge(2), Choice((32, 64, 128, 256, 512))] = 128
    encoder_layers: Annotated[int, Ge(1), IntRange(1, 4)] = 1
    decoder_layers: Annotated[int, Ge(1), IntRange(1, 4)] = 1
    heads: Annotated[int, Ge(1), Choice((1, 2, 4))] = 1  # heads of the attention variant (1 in the papers)
    dropout: Annotated[float, Ge(0.0), Lt(1.0), FloatRange(0.0, 0.5)] = 0.0

    def __post_init__(self) -> None:
        if self.style not in STYLES:
            raise ValueError(f"style must be one of {', '.join(STYLES)}, got {self.style!r}")
        if self.hidden % 2:
            raise ValueError(f"hidden ({self.hidden}) must be even: each encoder direction has hidden / 2")
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")


class RNNSeq2Seq(nn.Module):
    """Bidirectional RNN encoder + RNN decoder with optional attention (RNNsearch: Bahdanau / Luong)."""

    def __init__(self, config: RNNSeq2SeqConfig, *, task: TaskInfo, attention: Any,
                 position: Any = None) -> None:
        super().__init__()
        cfg, vocab_size = config, task.vocab_size
        h, e = cfg.hidden, cfg.embed_dim
        self.cfg = cfg
        self.embed = nn.Embedding(vocab_size, e)  # source and target share the vocabulary
        self.drop = nn.Dropout(cfg.dropout)
        self.encoder = BidirectionalEncoder(cfg.cell, e, h // 2, cfg.encoder_layers, cfg.dropout)
        self.bridge = nn.Linear(h, cfg.decoder_layers * h)
        self.bridge_cell = nn.Linear(h, cfg.decoder_layers * h) if cfg.cell == "lstm" else None
        self.attention = attention(h, cfg.heads) if attention is not None else None
        ctx = h if self.attention is not None else 0
        if cfg.style == "bahdanau":
            self.rnn = make_rnn(cfg.cell, e + ctx, h, cfg.decoder_layers, cfg.dropout)
            self.readout = nn.Linear(h + e + ctx, 2 * e)  # maxout over pairs -> e
            self.head = nn.Linear(e, vocab_size)
        else:
            self.rnn = make_rnn(cfg.cell, e + h, h, cfg.decoder_layers, cfg.dropout)
            self.combine = nn.Linear(ctx + h, h)
            self.head = nn.Linear(h, vocab_size)

    # -- encoder ---------------------------------------------------------------------
    def encode(self, src: Tensor, src_padding_mask: Tensor | None) -> tuple[Tensor | None, Any]:
        """Source -> (annotations (B, S, hidden) or None without attention, initial
        decoder state)."""
        annotations, final = self.encoder(self.drop(self.embed(src)), src_padding_mask)
        top_h = final[0][-1] if isinstance(final, tuple) else final[-1]  # (B, hidden)
        state: Any = self._bridge(self.bridge, top_h)
        if self.bridge_cell is not None:
            state = (state, self._bridge(self.bridge_cell, final[1][-1]))
        return (annotations if self.attention is not None else None), state

    def _bridge(self, layer: nn.Module, top: Tensor) -> Tensor:
        layers = self.cfg.decoder_layers
        return torch.tanh(layer(top)).view(top.shape[0], layers, -1).transpose(0, 1).contiguous()

    # -- decoder ---------------------------------------------------------------------
    def _attend(self, query: Tensor, memory: Tensor | None, mask: Tensor | None,
                cross_cache: Any, need_weights: bool) -> tuple[Tensor, Tensor | None]:
        if self.attention is None or memory is None:
            return query.new_zeros(query.shape[0], 0), None
        ctx, weights = self.attention(query[:, None], memory, key_padding_mask=mask,
                                      cache=cross_cache, need_weights=need_weights)
        return ctx[:, 0], weights

    def step(self, y_prev: Tensor, state: Any, feed: Tensor, memory: Tensor | None,
             mask: Tensor | None, cross_cache: Any,
             need_weights: bool = False) -> tuple[Tensor, Any, Tensor, Tensor | None]:
        """One decoder step from the previous token (B,). Returns logits (B, V), the new
        state, the input-feeding vector (Luong; unused by Bahdanau) and the attention
        weights (B, heads, 1, S) if asked."""
        emb = self.drop(self.embed(y_prev))
        if self.cfg.style == "bahdanau":
            top = state[0][-1] if isinstance(state, tuple) else state[-1]
            ctx, weights = self._attend(top, memory, mask, cross_cache, need_weights)
            out, state = self.rnn(torch.cat([emb, ctx], -1)[:, None], state)
            pre = self.readout(torch.cat([out[:, 0], emb, ctx], -1))
            readout = pre.view(*pre.shape[:-1], -1, 2).amax(-1)
            return self.head(self.drop(readout)), state, feed, weights
        out, state = self.rnn(torch.cat([emb, feed], -1)[:, None], state)
        ctx, weights = self._attend(out[:, 0], memory, mask, cross_cache, need_weights)
        feed = torch.tanh(self.combine(torch.cat([ctx, out[:, 0]], -1)))
        return self.head(self.drop(feed)), state, feed, weights

    def _start(self, src: Tensor, src_padding_mask: Tensor | None) -> tuple[Any, ...]:
        memory, state = self.encode(src, src_padding_mask)
        feed = src.new_zeros(src.shape[0], self.cfg.hidden, dtype=self.embed.weight.dtype)
        return memory, state, feed, AttentionCache()

    def forward(self, src: Tensor, tgt_in: Tensor, src_padding_mask: Tensor | None = None,
                tgt_padding_mask: Tensor | None = None, *, return_attention: bool = False) -> Any:
        """Teacher-forced logits (B, T, V); with ``return_attention`` also the decoder's
        alignment, a one-element list holding (B, heads, T, S) (empty without attention)."""
        memory, state, feed, cross_cache = self._start(src, src_padding_mask)
        logits, maps = [], []
        for t in range(tgt_in.shape[1]):
            step_logits, state, feed, weights = self.step(
                tgt_in[:, t], state, feed, memory, src_padding_mask, cross_cache, return_attention)
            logits.append(step_logits)
            if weights is not None:
                maps.append(weights)
        out = torch.stack(logits, dim=1)
        if not return_attention:
            return out
        return out, ([torch.cat(maps, dim=2)] if maps else [])

    @torch.no_grad()
    def greedy_decode(self, src: Tensor, src_padding_mask: Tensor | None, max_len: int) -> Tensor:
        """Free-running greedy outputs (B, max_len); stops once every row emitted EOS."""
        memory, state, feed, cross_cache = self._start(src, src_padding_mask)

        def next_logits(token: Tensor) -> Tensor:
            nonlocal state, feed
            logits, state, feed, _ = self.step(token, state, feed, memory, src_padding_mask,
                                               cross_cache)
            return logits

        return greedy_steps(next_logits, src.shape[0], max_len, src.device)


# the registration every model file has (one file per variant), alike by design
@hookimpl
def harness_register_model(register: Any) -> None:
    register(
        ModelSpec(
            name="rnn_seq2seq",
            build=RNNSeq2Seq,
            task_kinds=frozenset({"seq2seq"}),
            uses_attention=True,
            attention_required=False,
            uses_position=False,
            width_param="hidden",
        )
    )
