"""The plain reference training loop and evaluation, shared by every reference run.

Deliberately minimal: AdamW (PyTorch defaults except the learning rate: weight decay 0.01 on
every parameter), a constant learning rate, no warm-up, no schedule, no gradient clipping,
a fixed batch size and number of steps. The loss is the cross-entropy over the task's scored
positions (``batch["loss_mask"]``, exactly the positions the harness scores), averaged over
them. Batches come from ``harness.data.formats.collate`` over the task's own examples, shuffled by a
seeded generator, so a reference run and a harness run see the same data.

Evaluation: the validation split at the training length, in batches of the training batch
size (as the harness validates): loss (mean NLL over scored positions), token accuracy over
scored positions, exact match (every scored position right), bits per character for
perplexity tasks, and the task's own extra metrics (``task.extra_metrics``: greedy PER/WER
on g2p), called exactly as the harness calls them.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from harness.data.formats import collate


def call(model: Any, batch: dict[str, Any], fmt: str) -> torch.Tensor:
    if fmt == "seq2seq":
        return model(batch["src"], batch["tgt_in"], src_padding_mask=batch["src_padding_mask"],
                     tgt_padding_mask=batch["tgt_padding_mask"])
    return model(batch["tokens"], padding_mask=batch["padding_mask"])


def batches(task: Any, fmt: str, batch_size: int, seed: int) -> Iterator[dict[str, Any]]:
    """Endless shuffled training batches (reshuffled every epoch, one seeded generator)."""
    data = task.examples("train", task.train_length)
    gen = torch.Generator().manual_seed(seed)
    loader = DataLoader(data, batch_size=batch_size, shuffle=True, generator=gen,
                        collate_fn=lambda ex: collate(ex, fmt, task.task_kind))
    while True:
        yield from loader


def masked_loss(logits: torch.Tensor, batch: dict[str, Any]) -> torch.Tensor:
    mask = batch["loss_mask"]
    return F.cross_entropy(logits[mask].float(), batch["targets"][mask])


def train(model: torch.nn.Module, task: Any, fmt: str, *, steps: int, batch_size: int, lr: float,
          seed: int) -> dict[str, float]:
    """Train ``model`` in place with the plain loop; return its validation metrics."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    t0 = time.perf_counter()
    it = batches(task, fmt, batch_size, seed)
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        batch = next(it)
        loss = masked_loss(call(model, batch, fmt), batch)
        if not torch.isfinite(loss):
            break  # diverged: reported by the metrics (nan loss)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    metrics = evaluate(model, task, fmt, batch_size) if torch.isfinite(loss) else {"loss": math.nan, "acc": 0.0}
    metrics["seconds"] = time.perf_counter() - t0
    return metrics


@torch.no_grad()
def evaluate(model: torch.nn.Module, task: Any, fmt: str, batch_size: int) -> dict[str, float]:
    was = model.training
    model.eval()
    sums: dict[str, float] = defaultdict(float)
    data = task.examples("val", task.train_length)
    for i in range(0, len(data), batch_size):
        batch = collate(data[i: i + batch_size], fmt, task.task_kind)
        logits = call(model, batch, fmt)
        mask, targets = batch["loss_mask"], batch["targets"]
        sums["nll"] += float(F.cross_entropy(logits[mask].float(), targets[mask], reduction="sum"))
        correct = (logits.argmax(-1) == targets) & mask
        sums["tokens"] += float(mask.sum())
        sums["correct"] += float(correct.sum())
        sums["exact"] += float((correct | ~mask).all(-1).sum())
        sums["sequences"] += mask.shape[0]
        for name, (total, count) in task.extra_metrics(model, batch, fmt).items():
            sums[f"{name}:sum"] += total
            sums[f"{name}:count"] += count
    model.train(was)
    out = {"loss": sums["nll"] / sums["tokens"], "acc": sums["correct"] / sums["tokens"],
           "exact": sums["exact"] / sums["sequences"]}
    if task.report_perplexity:
        out["bpc"] = out["loss"] / math.log(2)
    for key in list(sums):
        if key.endswith(":sum"):
            name = key[: -len(":sum")]
            out[name] = sums[key] / max(sums[f"{name}:count"], 1.0)
    return out


def count(model: torch.nn.Module) -> int:
    """Trainable parameters, each shared tensor once (``parameters()`` deduplicates)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
