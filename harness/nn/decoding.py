"""Greedy and beam-search decoding for evaluation (free-running, no teacher forcing).

Two model protocols:

* ``seq2seq`` models (encoder-decoder, RNN seq2seq) implement
  ``greedy_decode(src, src_padding_mask, max_len) -> LongTensor (B, max_len)``.
* ``lm`` models generate after the prompt ``src SEP``; if they implement ``new_cache()``
  and accept ``cache=`` in ``forward`` (incremental decoding), each new token costs one
  position, otherwise the whole prefix is recomputed per token.

Decoding stops at EOS (which is dropped) or after ``max_len`` tokens.

:func:`beam_search` needs no protocol beyond the batch-format call (``model(src, tgt_in,
...)`` or ``model(tokens)``): it re-runs the model on every live prefix at each step, so
it works for any model at O(max_len^2) cost, meant for evaluation on small sets.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from harness.data.formats import SEQ2SEQ, BatchFormat
from harness.data.vocab import BOS, EOS, PAD, SEP, Example


def _trim(ids: Sequence[int]) -> list[int]:
    out = []
    for t in ids:
        if t == EOS:
            break
        out.append(int(t))
    return out


def greedy(model: Any, examples: Sequence[Example], fmt: BatchFormat | str, max_len: int | None = None) -> list[list[int]]:
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
            if str(fmt) == SEQ2SEQ.name:
                n = max(len(s) for s in srcs)
                src = torch.tensor([s + [PAD] * (n - len(s)) for s in srcs], device=device)
                out = model.greedy_decode(src, src == PAD, max_len)
                return [_trim(row) for row in out.tolist()]
            return [_trim(_lm_greedy(model, s + [SEP], max_len, device)) for s in srcs]
    finally:
        model.train(was_training)


def greedy_steps(next_logits: Callable[[Any], Any], batch: int, max_len: int, device: Any) -> Any:
    """The greedy loop of a seq2seq model's ``greedy_decode``: from BOS, feed back the argmax
    of ``next_logits(tokens (B,)) -> logits (B, V)``; returns (B, max_len) token ids, PAD
    after every row has emitted EOS (the loop stops there)."""
    import torch

    out = torch.full((batch, max_len), PAD, dtype=torch.long, device=device)
    token = torch.full((batch,), BOS, dtype=torch.long, device=device)
    finished = torch.zeros_like(token, dtype=torch.bool)
    for t in range(max_len):
        token = next_logits(token).argmax(-1)
        out[:, t] = token
        finished |= token == EOS
        if bool(finished.all()):
            break
    return out


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


def beam_search(
    model: Any,
    examples: Sequence[Example],
    fmt: BatchFormat | str,
    beam_size: int = 4,
    max_len: int | None = None,
    length_penalty: float = 0.0,
) -> list[list[int]]:
    """Beam-search outputs for seq2seq examples, one example at a time.

    Each step expands every live hypothesis by every token and keeps the ``beam_size``
    best expansions; an expansion that ends in EOS (or reaches ``max_len``) is finished.
    The result is the best finished hypothesis by log-probability divided by the GNMT
    length penalty ((5 + length) / 6) ** ``length_penalty`` (Wu et al., 2016); 0 ranks by
    log-probability alone. ``beam_size=1`` is greedy decoding; a beam as large as the
    number of possible outputs is exact search.
    """
    import torch

    if beam_size < 1:
        raise ValueError(f"beam_size must be at least 1, got {beam_size}")
    device = next(model.parameters()).device
    max_len = max_len or max(len(e["tgt"]) for e in examples)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return [
                _trim(_beam_one(_next_logprobs(model, list(e["src"]), fmt, device), beam_size,
                                max_len, length_penalty, device))
                for e in examples
            ]
    finally:
        model.train(was_training)


def _next_logprobs(model: Any, src: list[int], fmt: BatchFormat | str, device: Any) -> Callable[[Any], Any]:
    """A function from output prefixes (K, t) to next-token log-probabilities (K, V)."""
    import torch

    if str(fmt) == SEQ2SEQ.name:
        source = torch.tensor([src], device=device)

        def step(prefixes: Any) -> Any:
            k = prefixes.shape[0]
            tgt_in = torch.cat([torch.full((k, 1), BOS, device=device), prefixes], dim=1)
            logits = model(source.expand(k, -1), tgt_in,
                           src_padding_mask=torch.zeros_like(source, dtype=torch.bool).expand(k, -1),
                           tgt_padding_mask=torch.zeros_like(tgt_in, dtype=torch.bool))
            return logits[:, -1].log_softmax(-1)

        return step
    prompt = torch.tensor([src + [SEP]], device=device)

    def lm_step(prefixes: Any) -> Any:
        tokens = torch.cat([prompt.expand(prefixes.shape[0], -1), prefixes], dim=1)
        return model(tokens)[:, -1].log_softmax(-1)

    return lm_step


def _beam_one(next_logprobs: Callable[[Any], Any], beam_size: int, max_len: int,
              length_penalty: float, device: Any) -> list[int]:
    import torch

    def rank(score: float, length: int) -> float:
        return score / ((5 + length) / 6) ** length_penalty

    alive: list[list[int]] = [[]]
    scores = torch.zeros(1, device=device)
    finished: list[tuple[float, list[int]]] = []
    for step in range(max_len):
        prefixes = torch.tensor(alive, dtype=torch.long, device=device).view(len(alive), step)
        totals = next_logprobs(prefixes) + scores[:, None]
        vocab = totals.shape[1]
        best, index = totals.flatten().topk(min(beam_size, totals.numel()))
        keep, keep_scores = [], []
        for score, i in zip(best.tolist(), index.tolist(), strict=True):
            hyp = alive[i // vocab] + [i % vocab]
            if i % vocab == EOS or step == max_len - 1:
                finished.append((rank(score, len(hyp)), hyp))
            else:
                keep.append(hyp)
                keep_scores.append(score)
        finished = sorted(finished, key=lambda f: f[0], reverse=True)[:beam_size]
        if not keep:
            break
        # log-probabilities only fall as hypotheses grow: once the best finished one beats
        # every live one, nothing can overtake it
        if length_penalty == 0 and finished and finished[0][0] >= keep_scores[0]:
            break
        alive, scores = keep, totals.new_tensor(keep_scores)
    return finished[0][1] if finished else []


def edit_distance(a: Sequence[Any], b: Sequence[Any]) -> int:
    """Levenshtein distance (insertions, deletions, substitutions all cost 1)."""
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]
