"""Test-only model plugins for the cost tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import torch

from harness.plugin import Ge, ModelSpec, hookimpl


class Hold(torch.autograd.Function):
    """Keeps ``held`` alive from the forward pass until the graph is freed (after the
    optimiser step): the whole step."""

    @staticmethod
    def forward(ctx: Any, x: Any, held: Any) -> Any:
        ctx.held = held
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        return grad, None


@dataclass
class BigramConfig:
    d_model: Annotated[int, Ge(1)] = 8
    extra_kib: Annotated[int, Ge(0)] = 0  # an extra tensor held through each training step


class Bigram(torch.nn.Module):
    """Embedding then a linear read-out: 6 * d_model * vocab FLOPs per token in training."""

    seen_autocast: list[Any] = []

    def __init__(self, config: BigramConfig, *, task: Any, attention: Any, position: Any) -> None:
        super().__init__()
        self.extra = config.extra_kib * 1024 // 4
        self.embed = torch.nn.Embedding(task.vocab_size, config.d_model)
        self.out = torch.nn.Linear(config.d_model, task.vocab_size)

    def forward(self, tokens: Any, padding_mask: Any = None) -> Any:
        Bigram.seen_autocast.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu")
                                    else None)
        x = self.embed(tokens)
        if self.extra and self.training:
            x = Hold.apply(x, torch.zeros(self.extra, device=x.device))
        return self.out(x)


class BigramPlugin:
    @hookimpl
    def harness_register_model(self, register: Any) -> None:
        register(ModelSpec(name="bigram", build=Bigram))
