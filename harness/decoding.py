"""Greedy decoding for evaluation (free-running, no teacher forcing).

Two model protocols:

* ``seq2seq`` models (encoder-decoder, RNN seq2seq) implement
  ``greedy_decode(src, src_padding_mask, max_len) -> LongTensor (B, max_len)``.
* ``lm`` models generate after the prompt ``src SEP``; if they implement ``new_cache()``
  and accept ``cache=`` in ``forward`` (incremental decoding), each new token costs one
  position, otherwise the whole prefix is recomputed per token.

Decoding stops at EOS (which is dropped) or after ``max_len`` tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.data import EOS, PAD, SEP, Example


def _trim(ids: Sequence[int]) -> list[int]:
    out = []
    for t in ids:
        if t == EOS:
            break
        out.append(int(t))
    return out


def greedy(model: Any, examples: Sequence[Example], fmt: str, max_len: int | None = None) -> list[list[int]]:
    """Greedy outputs for seq2seq examples (``{"src": ..., "tgt": ...}``); ``max_len``
    defaults to the longest target."""
    import torch

    device = next(model.parameters()).device
    max_len = max_len or max(len(e["tgt"]) for e in examples)
    srcs = [list(e["src"]) for e in examples]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            if fmt == "seq2seq":
                n = max(len(s) for s in srcs)
                src = torch.tensor([s + [PAD] * (n - len(s)) for s in srcs], device=device)
                out = model.greedy_decode(src, src == PAD, max_len)
                return [_trim(row) for row in out.tolist()]
            return [_trim(_lm_greedy(model, s + [SEP], max_len, device)) for s in srcs]
    finally:
        model.train(was_training)


def _lm_greedy(model: Any, prompt: list[int], max_len: int, device: Any) -> list[int]:
    import torch

    tokens = torch.tensor([prompt], device=device)
    out: list[int] = []
    if hasattr(model, "new_cache"):
        cache = model.new_cache()
        logits = model(tokens, cache=cache)
        for _ in range(max_len):
            nxt = int(logits[0, -1].argmax())
            out.append(nxt)
            if nxt == EOS:
                break
            logits = model(torch.tensor([[nxt]], device=device), cache=cache)
        return out
    for _ in range(max_len):
        nxt = int(model(tokens)[0, -1].argmax())
        out.append(nxt)
        if nxt == EOS:
            break
        tokens = torch.cat([tokens, torch.tensor([[nxt]], device=device)], dim=1)
    return out


def edit_distance(a: Sequence[Any], b: Sequence[Any]) -> int:
    """Levenshtein distance (insertions, deletions, substitutions all cost 1)."""
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]
