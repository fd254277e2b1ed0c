"""Models against independent references, in float64 on fresh random inputs.

* ``encoder_decoder`` with ``multi_head`` attention and no positions equals a stack of
  PyTorch's own ``nn.TransformerEncoderLayer`` / ``nn.TransformerDecoderLayer`` carrying the
  same weights (pre- and post-norm), padding included.
* ``rnn_seq2seq`` equals the equations of the papers written out here step by step (GRU
  cells, dot-product attention, maxout readout / input feeding), one unpadded example at a
  time, while the model runs a padded batch.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import harness
from harness.data.vocab import PAD

VOCAB = 11


def padded_sources(lengths: list[int], width: int) -> torch.Tensor:
    src = torch.full((len(lengths), width), PAD)
    for i, n in enumerate(lengths):
        src[i, :n] = torch.randint(4, VOCAB, (n,))
    return src


def copy_attention(ours: nn.Module, theirs: nn.MultiheadAttention) -> None:
    theirs.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
    theirs.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
    theirs.out_proj.weight.copy_(ours.out_proj.weight)
    theirs.out_proj.bias.copy_(ours.out_proj.bias)


def copy_block(ours: nn.Module, theirs: nn.Module, cross: bool) -> None:
    copy_attention(ours.self_attn, theirs.self_attn)
    if cross:
        copy_attention(ours.cross_attn, theirs.multihead_attn)
    theirs.linear1.load_state_dict(ours.ffn.net[0].state_dict())
    theirs.linear2.load_state_dict(ours.ffn.net[3].state_dict())
    their_norms = [theirs.norm1, theirs.norm2] + ([theirs.norm3] if cross else [])
    for mine, their in zip(ours.norms, their_norms, strict=True):
        their.load_state_dict(mine.state_dict())


@pytest.mark.parametrize("norm", ["pre", "post"])
@torch.no_grad()
def test_encoder_decoder_matches_pytorch_transformer_layers(registry, norm):
    torch.manual_seed(1)
    d, heads, ff = 16, 2, 32
    model = harness.create_model(
        "encoder_decoder", vocab_size=VOCAB, max_length=8, batch_format="seq2seq",
        attention="multi_head", position="none", registry=registry, d_model=d, heads=heads,
        ffn_mult=2, encoder_layers=2, decoder_layers=2, norm=norm,
    ).double().eval()
    layer_args = {"d_model": d, "nhead": heads, "dim_feedforward": ff, "dropout": 0.0,
                  "activation": "gelu", "batch_first": True, "norm_first": norm == "pre"}
    encoder = [nn.TransformerEncoderLayer(**layer_args).double().eval() for _ in range(2)]
    decoder = [nn.TransformerDecoderLayer(**layer_args).double().eval() for _ in range(2)]
    for ours, theirs in zip(model.encoder, encoder, strict=True):
        copy_block(ours, theirs, cross=False)
    for ours, theirs in zip(model.decoder, decoder, strict=True):
        copy_block(ours, theirs, cross=True)

    src = padded_sources([7, 4, 6], 7)
    tgt_in = torch.randint(4, VOCAB, (3, 5))
    src_mask = src == PAD
    emb = model.src_embed.weight  # tied: one table for source, target and output
    x = emb[src] * d**0.5  # the paper's embedding scale (section 3.4)
    for layer in encoder:
        x = layer(x, src_key_padding_mask=src_mask)
    if norm == "pre":
        x = F.layer_norm(x, (d,), model.enc_norm.weight, model.enc_norm.bias)
    y = emb[tgt_in] * d**0.5
    causal = nn.Transformer.generate_square_subsequent_mask(5, dtype=torch.float64)
    for layer in decoder:
        y = layer(y, x, tgt_mask=causal, memory_key_padding_mask=src_mask)
    if norm == "pre":
        y = F.layer_norm(y, (d,), model.dec_norm.weight, model.dec_norm.bias)
    expected = y @ emb.T

    actual = model(src, tgt_in, src_padding_mask=src_mask)
    torch.testing.assert_close(actual, expected, rtol=1e-9, atol=1e-9)


# -- rnn_seq2seq -----------------------------------------------------------------------
def gru_cell(x: torch.Tensor, h: torch.Tensor, rnn: nn.GRU, suffix: str) -> torch.Tensor:
    """One GRU step (Cho et al., 2014) with the weights of ``rnn`` (layer 0, ``suffix``)."""
    w_ih, w_hh = getattr(rnn, f"weight_ih_l0{suffix}"), getattr(rnn, f"weight_hh_l0{suffix}")
    b_ih, b_hh = getattr(rnn, f"bias_ih_l0{suffix}"), getattr(rnn, f"bias_hh_l0{suffix}")
    gi, gh = w_ih @ x + b_ih, w_hh @ h + b_hh
    n = h.shape[0]
    reset = torch.sigmoid(gi[:n] + gh[:n])
    update = torch.sigmoid(gi[n: 2 * n] + gh[n: 2 * n])
    candidate = torch.tanh(gi[2 * n:] + reset * gh[2 * n:])
    return (1 - update) * candidate + update * h


def linear(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return layer.weight @ x + layer.bias


def attend(attn: nn.Module, query: torch.Tensor, annotations: torch.Tensor) -> torch.Tensor:
    """Single-head scaled dot-product attention with ``attn``'s four projections."""
    q = linear(attn.q_proj, query)
    keys = annotations @ attn.k_proj.weight.T + attn.k_proj.bias
    values = annotations @ attn.v_proj.weight.T + attn.v_proj.bias
    alpha = torch.softmax(keys @ q / math.sqrt(q.shape[0]), dim=0)
    return linear(attn.out_proj, alpha @ values)


def reference_logits(model: nn.Module, src: list[int], tgt_in: list[int], style: str) -> torch.Tensor:
    emb = model.embed.weight
    rnn = model.encoder.rnn
    half = rnn.hidden_size
    forward, backward = [], []
    h = torch.zeros(half, dtype=torch.float64)
    for tok in src:
        h = gru_cell(emb[tok], h, rnn, "")
        forward.append(h)
    h = torch.zeros(half, dtype=torch.float64)
    for tok in reversed(src):
        h = gru_cell(emb[tok], h, rnn, "_reverse")
        backward.insert(0, h)
    annotations = torch.stack([torch.cat([f, b]) for f, b in zip(forward, backward, strict=True)])
    state = torch.tanh(linear(model.bridge, torch.cat([forward[-1], backward[0]])))
    feed = torch.zeros_like(state)
    out = []
    for tok in tgt_in:
        y = emb[tok]
        if style == "bahdanau":
            context = attend(model.attention, state, annotations)  # queried by s_{i-1}
            state = gru_cell(torch.cat([y, context]), state, model.rnn, "")
            pre = linear(model.readout, torch.cat([state, y, context]))
            out.append(linear(model.head, torch.maximum(pre[0::2], pre[1::2])))
        else:
            state = gru_cell(torch.cat([y, feed]), state, model.rnn, "")
            context = attend(model.attention, state, annotations)  # queried by h_t
            feed = torch.tanh(linear(model.combine, torch.cat([context, state])))
            out.append(linear(model.head, feed))
    return torch.stack(out)


@pytest.mark.parametrize("style", ["bahdanau", "luong"])
@torch.no_grad()
def test_rnn_seq2seq_matches_the_paper_equations(registry, style):
    torch.manual_seed(2)
    model = harness.create_model(
        "rnn_seq2seq", vocab_size=VOCAB, max_length=8, batch_format="seq2seq",
        attention="multi_head", registry=registry, cell="gru", style=style, embed_dim=6,
        hidden=8, heads=1,
    ).double().eval()
    src = padded_sources([6, 3, 5], 6)
    tgt_in = torch.randint(4, VOCAB, (3, 4))
    actual = model(src, tgt_in, src_padding_mask=src == PAD)
    for i in range(3):
        tokens = [t for t in src[i].tolist() if t != PAD]
        expected = reference_logits(model, tokens, tgt_in[i].tolist(), style)
        torch.testing.assert_close(actual[i], expected, rtol=1e-9, atol=1e-9)
