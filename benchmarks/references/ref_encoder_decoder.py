"""Reference: a Transformer encoder-decoder on PyTorch's own ``nn.Transformer`` (pre-norm,
GELU, no dropout; its own Xavier-uniform init), with separate source embedding, target
embedding and output head (``nn.Embedding`` N(0, 1), no scale) and sinusoidal positions
added to both embeddings. Greedy decoding recomputes the decoder over the prefix."""

from __future__ import annotations

import torch
from ref_transformer import sinusoid_table
from torch import nn

BOS, EOS, PAD = 1, 2, 0  # harness.data's special ids (pad, bos, eos, sep)


class Seq2SeqTransformer(nn.Module):
    def __init__(self, vocab: int, *, max_length: int, d_model: int = 64, encoder_layers: int = 2,
                 decoder_layers: int = 2, heads: int = 4, ffn_mult: int = 4) -> None:
        super().__init__()
        self.src_embed = nn.Embedding(vocab, d_model)
        self.tgt_embed = nn.Embedding(vocab, d_model)
        self.register_buffer("pos", sinusoid_table(max_length + 8, d_model), persistent=False)
        self.core = nn.Transformer(d_model, heads, encoder_layers, decoder_layers, ffn_mult * d_model,
                                   dropout=0.0, activation="gelu", batch_first=True, norm_first=True)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def encode(self, src: torch.Tensor, src_padding_mask: torch.Tensor | None) -> torch.Tensor:
        x = self.src_embed(src) + self.pos[: src.shape[1]]
        return self.core.encoder(x, src_key_padding_mask=src_padding_mask)

    def decode(self, tgt_in: torch.Tensor, memory: torch.Tensor,
               src_padding_mask: torch.Tensor | None) -> torch.Tensor:
        n = tgt_in.shape[1]
        y = self.tgt_embed(tgt_in) + self.pos[:n]
        mask = torch.ones(n, n, dtype=torch.bool, device=y.device).triu(1)
        out = self.core.decoder(y, memory, tgt_mask=mask, memory_key_padding_mask=src_padding_mask)
        return self.head(out)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, src_padding_mask: torch.Tensor | None = None,
                tgt_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.decode(tgt_in, self.encode(src, src_padding_mask), src_padding_mask)

    @torch.no_grad()
    def greedy_decode(self, src: torch.Tensor, src_padding_mask: torch.Tensor | None, max_len: int) -> torch.Tensor:
        memory = self.encode(src, src_padding_mask)
        prefix = torch.full((src.shape[0], 1), BOS, dtype=torch.long, device=src.device)
        done = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
        for _ in range(max_len):
            token = self.decode(prefix, memory, src_padding_mask)[:, -1].argmax(-1)
            token = token.masked_fill(done, PAD)
            prefix = torch.cat([prefix, token[:, None]], dim=1)
            done |= token == EOS
            if bool(done.all()):
                break
        out = torch.full((src.shape[0], max_len), PAD, dtype=torch.long, device=src.device)
        out[:, : prefix.shape[1] - 1] = prefix[:, 1:]
        return out
