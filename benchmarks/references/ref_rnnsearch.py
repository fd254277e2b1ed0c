"""Reference: RNNsearch (Bahdanau, Cho & Bengio, 2015), written out from the paper.

Bidirectional GRU encoder (``hidden / 2`` per direction, packed so padding never enters a
state); s_0 = tanh(W_s [forward final; backward final]); at each step the previous state
s_{i-1} scores every annotation h_j with e_ij = v^T tanh(W_a s_{i-1} + U_a h_j), the context
c_i = sum_j alpha_ij h_j enters the GRU, s_i = GRU([E y_{i-1}; c_i], s_{i-1}), and a maxout
readout of [s_i; E y_{i-1}; c_i] (pairs of units) predicts y_i. One embedding table serves
source and target (one vocabulary). PyTorch's default inits.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

BOS, EOS, PAD = 1, 2, 0


class RNNSearch(nn.Module):
    def __init__(self, vocab: int, *, embed_dim: int = 64, hidden: int = 128) -> None:
        super().__init__()
        e, h = embed_dim, hidden
        self.embed = nn.Embedding(vocab, e)
        self.encoder = nn.GRU(e, h // 2, batch_first=True, bidirectional=True)
        self.init_state = nn.Linear(h, h)
        self.w_a = nn.Linear(h, h)              # query side of the alignment MLP (its bias)
        self.u_a = nn.Linear(h, h, bias=False)  # key side
        self.v_a = nn.Linear(h, 1, bias=False)
        self.cell = nn.GRUCell(e + h, h)
        self.readout = nn.Linear(h + e + h, 2 * e)
        self.head = nn.Linear(e, vocab)

    def encode(self, src: torch.Tensor, src_padding_mask: torch.Tensor | None):
        lengths = (~src_padding_mask).sum(1).clamp(min=1).cpu() if src_padding_mask is not None \
            else torch.full((src.shape[0],), src.shape[1])
        packed = pack_padded_sequence(self.embed(src), lengths, batch_first=True, enforce_sorted=False)
        out, final = self.encoder(packed)
        annotations, _ = pad_packed_sequence(out, batch_first=True, total_length=src.shape[1])
        state = torch.tanh(self.init_state(torch.cat([final[0], final[1]], dim=-1)))
        return annotations, self.u_a(annotations), state

    def step(self, y_prev, state, annotations, keys, mask):
        emb = self.embed(y_prev)
        scores = self.v_a(torch.tanh(self.w_a(state)[:, None] + keys)).squeeze(-1)  # (B, S)
        if mask is not None:
            scores = scores.masked_fill(mask, float("-inf"))
        ctx = (scores.softmax(-1)[..., None] * annotations).sum(1)
        state = self.cell(torch.cat([emb, ctx], -1), state)
        pre = self.readout(torch.cat([state, emb, ctx], -1))
        return self.head(pre.view(*pre.shape[:-1], -1, 2).amax(-1)), state

    def forward(self, src, tgt_in, src_padding_mask=None, tgt_padding_mask=None):
        annotations, keys, state = self.encode(src, src_padding_mask)
        logits = []
        for t in range(tgt_in.shape[1]):
            out, state = self.step(tgt_in[:, t], state, annotations, keys, src_padding_mask)
            logits.append(out)
        return torch.stack(logits, 1)

    @torch.no_grad()
    def greedy_decode(self, src, src_padding_mask, max_len):
        annotations, keys, state = self.encode(src, src_padding_mask)
        token = torch.full((src.shape[0],), BOS, dtype=torch.long, device=src.device)
        out = torch.full((src.shape[0], max_len), PAD, dtype=torch.long, device=src.device)
        done = torch.zeros_like(token, dtype=torch.bool)
        for t in range(max_len):
            logits, state = self.step(token, state, annotations, keys, src_padding_mask)
            token = logits.argmax(-1)
            out[:, t] = token.masked_fill(done, PAD)
            done |= token == EOS
            if bool(done.all()):
                break
        return out
