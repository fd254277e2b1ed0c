"""Plain-PyTorch references for ``harness bench model``: the same shapes as a harness config,
written with PyTorch's own modules and a hand-written training loop (no harness code).

``harness bench model`` trains a config through ``harness.train`` and, next to it, the
reference that :func:`build` makes from the same shapes, with the same optimiser (AdamW,
weight decay on matrices only, gradient clipping, warm-up + schedule as a ``LambdaLR``) and
the same batch size and length, and compares their tokens per second. With the config's
bf16 precision (``bf16`` in the shapes) the forward runs under bf16 autocast, and with
``train.compile`` (``compile``) the model is ``torch.compile``d, as the harness run is.

* ``transformer`` (``multi_head`` attention, sinusoidal or no positions, LayerNorm, GELU
  MLP, pre- or post-norm): token embedding scaled by sqrt(d) + sinusoids,
  ``nn.TransformerEncoderLayer`` x layers with a causal mask, final LayerNorm (pre-norm),
  linear head (tied to the embedding when the config ties them);
* ``lstm`` / ``gru``: ``nn.Embedding`` -> ``nn.LSTM``/``nn.GRU`` -> linear head.

Batches are random tokens of the config's shape, drawn before the loop: the reference pays
no data-loading cost (the harness does; that is part of what is compared). ``trainer`` gives
one step at a time, so the benchmark can interleave reference steps with the harness's.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class TransformerLM(nn.Module):
    """Decoder-only Transformer from ``nn.TransformerEncoderLayer`` (causal mask)."""

    def __init__(self, s: dict[str, Any]) -> None:
        super().__init__()
        d = s["d_model"]
        self.d, self.sinusoidal, self.base = d, s["position"] == "sinusoidal", s["base"]
        self.embed = nn.Embedding(s["vocab"], d)
        nn.init.normal_(self.embed.weight, std=d**-0.5)
        layer = nn.TransformerEncoderLayer(d, s["heads"], s["ffn"], dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=s["norm_first"])
        self.encoder = nn.TransformerEncoder(layer, s["layers"], enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d) if s["norm_first"] else nn.Identity()
        self.head = nn.Linear(d, s["vocab"], bias=False)
        if s["tie"]:
            self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        x = self.embed(tokens) * math.sqrt(self.d)
        if self.sinusoidal:
            pos = torch.arange(n, device=tokens.device, dtype=torch.float32)[:, None]
            freq = self.base ** (-torch.arange(0, self.d, 2, device=tokens.device, dtype=torch.float32) / self.d)
            table = torch.zeros(n, self.d, device=tokens.device)
            table[:, 0::2], table[:, 1::2] = torch.sin(pos * freq), torch.cos(pos * freq)
            x = x + table.to(x.dtype)
        mask = nn.Transformer.generate_square_subsequent_mask(n, device=tokens.device, dtype=x.dtype)
        return self.head(self.norm(self.encoder(x, mask=mask, is_causal=True)))  # type: ignore[no-any-return]


class RecurrentLM(nn.Module):
    """Embedding -> ``nn.LSTM`` or ``nn.GRU`` -> linear head."""

    def __init__(self, s: dict[str, Any]) -> None:
        super().__init__()
        w = s["d_model"]
        self.embed = nn.Embedding(s["vocab"], w)
        rnn = nn.LSTM if s["model"] == "lstm" else nn.GRU
        self.rnn = rnn(w, w, num_layers=s["layers"], batch_first=True)
        self.head = nn.Linear(w, s["vocab"])
        if s["tie"]:
            self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.embed(tokens))[0])  # type: ignore[no-any-return]


def build(shapes: dict[str, Any]) -> nn.Module:
    """The reference model for ``shapes`` (see :func:`harness.bench.model.reference_shapes`)."""
    return TransformerLM(shapes) if shapes["model"] == "transformer" else RecurrentLM(shapes)


def optimiser(model: nn.Module, s: dict[str, Any]) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW, weight decay on matrices other than embeddings, linear warm-up then cosine."""
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    other = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": s["weight_decay"]},
                             {"params": other, "weight_decay": 0.0}], lr=s["lr"], betas=s["betas"])
    warmup, total = s["warmup"], s["steps"]

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return s["min_lr_ratio"] + (1 - s["min_lr_ratio"]) * 0.5 * (1 + math.cos(math.pi * progress))

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def trainer(model: nn.Module, s: dict[str, Any]) -> Any:
    """A function running training step ``i`` (forward, loss, backward, clipping, AdamW,
    schedule) on random batches of the config's shape, drawn up front."""
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(4, s["vocab"], (s["batch"], s["length"] + 1), generator=gen).to(s["device"])
               for _ in range(16)]
    opt, sched = optimiser(model, s)
    model.train()
    forward = torch.compile(model) if s.get("compile") else model  # as the harness run's train.compile
    device_type = torch.device(s["device"]).type

    def step(i: int) -> None:
        batch = batches[i % len(batches)]
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=bool(s.get("bf16"))):
            logits = forward(batch[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if s["grad_clip"]:
            nn.utils.clip_grad_norm_(model.parameters(), s["grad_clip"])
        opt.step()
        sched.step()
        if not math.isfinite(loss.item()):  # the harness checks every step too (and syncs a GPU)
            raise RuntimeError(f"reference loss became {loss.item()} at step {i}")

    return step
