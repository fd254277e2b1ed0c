"""The optimiser and learning-rate schedule of a run: part of the recipe, configurable, searchable
in a study like any other training setting, and logged with the run's config.

Optimisers (``train.optimizer``): ``adamw`` (decoupled weight decay, Loshchilov & Hutter 2019),
``adam`` (weight decay as an L2 term in the gradient, Kingma & Ba 2015), ``sgd`` (heavy-ball
momentum ``train.momentum``); fused on the CPU and GPUs (:func:`use_fused`). Weight decay never
applies to biases, norms' gains, embeddings, or parameters a module marks
``param._no_weight_decay = True`` (the convention of the Mamba and S4 reference code for
state-space parameters such as A and Δ).

Schedules (``train.schedule``), each a factor of ``train.lr`` at optimizer step ``s`` after a
linear warm-up over the first ``W = train.warmup_steps`` steps (factor (s + 1) / W), with
``p = (s - W) / (T - W)`` the progress through the remaining ``T - W`` of ``T = max_steps``
steps and ``r = train.min_lr_ratio`` the final factor:

* ``constant``      1
* ``cosine``        r + (1 - r) (1 + cos(pi p)) / 2           (Loshchilov & Hutter 2017)
* ``linear``        1 - (1 - r) p
* ``inverse_sqrt``  sqrt(W / (s + 1)), or 1 / sqrt(s + 1) without warm-up (Vaswani et al. 2017)
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

OPTIMIZERS = ("adamw", "adam", "sgd")
SCHEDULES = ("constant", "cosine", "linear", "inverse_sqrt")


def lr_factor(step: int, *, schedule: str, warmup: int, total: int, min_ratio: float) -> float:
    """The learning-rate factor at optimizer step ``step`` (0-based); see the module docs."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    if schedule == "inverse_sqrt":
        return math.sqrt(warmup / (step + 1)) if warmup else 1.0 / math.sqrt(step + 1)
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if schedule == "cosine":
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    if schedule == "linear":
        return 1.0 - (1 - min_ratio) * progress
    raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")


def decays(name: str, param: Any) -> bool:
    """Whether weight decay applies: matrices only, not embeddings, norms' gains or parameters
    marked ``_no_weight_decay``."""
    if getattr(param, "_no_weight_decay", False):
        return False
    return param.dim() >= 2 and "embed" not in name and "norm" not in name


#: Devices where torch has fused Adam(W) and SGD kernels (one kernel for every parameter's
#: update; on the CPU about 5x faster than the per-parameter loop at a tiny model's size:
#: benchmarks/step_cost.md).
FUSED_DEVICES = ("cuda", "cpu")


def use_fused(params: list[Any]) -> bool:
    """Whether the optimiser runs fused: when every parameter is a floating-point tensor on a
    device of :data:`FUSED_DEVICES` (the arithmetic is the per-parameter loop's)."""
    return bool(params) and all(p.device.type in FUSED_DEVICES and p.is_floating_point() for p in params)


def mup_groups(groups: list[dict[str, Any]], cfg: Any) -> list[dict[str, Any]]:
    """μP's groups for a model given μP (each parameter has an ``infshape``,
    :mod:`harness.nn.widths`): each group split by role and width multiplier m. Adam(W): a
    hidden matrix's lr / m (weight decay x m, so AdamW's decay per step, lr x wd, is the same
    at every width); every other lr as given. SGD: a hidden matrix's lr / (m_in / m_out), a
    vector's (and the readout's) lr x m (decay / m)."""
    from harness.nn.widths import mu_groups

    return mu_groups([{**g, "lr": cfg.lr} for g in groups], cfg.optimizer)


def make_optimizer(model: Any, cfg: Any) -> tuple[Any, Any]:
    """The optimiser and the per-step LambdaLR scheduler a :class:`TrainConfig` asks for."""
    import torch

    decay: list[Any] = []
    no_decay: list[Any] = []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (decay if decays(name, p) else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    fused = {"fused": True} if use_fused(decay + no_decay) else {}
    opt: Any
    if any(hasattr(p, "infshape") for p in decay + no_decay):
        groups = mup_groups(groups, cfg)
    if cfg.optimizer == "adamw":
        opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, **fused)
    elif cfg.optimizer == "adam":
        opt = torch.optim.Adam(groups, lr=cfg.lr, betas=cfg.betas, **fused)
    elif cfg.optimizer == "sgd":
        opt = torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, **fused)
    else:
        raise ValueError(f"unknown optimizer {cfg.optimizer!r}; choose one of {', '.join(OPTIMIZERS)}")
    factor = partial(lr_factor, schedule=cfg.schedule, warmup=cfg.warmup_steps, total=cfg.max_steps,
                     min_ratio=cfg.min_lr_ratio)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)
