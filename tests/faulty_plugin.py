"""Mixers that fail on purpose (tests/test_faults*.py load this file as a local plugin):

``boom``  raises ``ZeroDivisionError`` in its forward pass after ``fail_after`` calls;
``hog``   asks the allocator for an impossible tensor in its forward pass (a real allocation
          that raises: ``RuntimeError``/``torch.OutOfMemoryError`` from PyTorch's allocator);
``quits`` raises, while it is built, what its ``how`` names: ``SystemExit(5)``,
          ``KeyboardInterrupt`` or a bare ``BaseException`` (none of them an ``Exception``).

Every instance is kept in ``LIVE`` (a WeakSet), so a test can check that a failed run's
model was released.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Annotated, Any

import torch

from harness.plugin import Choice, Ge, IntRange, Mixer, MixerSpec, hookimpl

LIVE: weakref.WeakSet[Any] = weakref.WeakSet()


@dataclass
class BoomConfig:
    fail_after: Annotated[int, Ge(0), IntRange(0, 4)] = 0


class BoomMixer(Mixer):
    """A linear map that divides by zero after a few forward passes."""

    why_not = {"qk": "no queries or keys"}

    def __init__(self, config: BoomConfig, *, d_model: int, num_heads: int) -> None:
        super().__init__(d_model, num_heads)
        self.proj = torch.nn.Linear(d_model, d_model)
        self.fail_after, self.calls = config.fail_after, 0
        LIVE.add(self)

    def mix(self, x: Any, *, causal: bool, key_padding_mask: Any, position: Any) -> Any:
        self.calls += 1
        scale = 1.0
        if self.calls > self.fail_after:
            scale = 1 / (self.calls - self.calls)  # the plugin's own bug: ZeroDivisionError
        return self.proj(x) * scale

    def step(self, x: Any, state: dict[str, Any], *, positions: Any, position: Any) -> Any:
        return self.proj(x)

    def state_size(self, length: int) -> int:
        return 0


@dataclass
class HogConfig:
    ballast_mb: Annotated[int, Ge(0)] = 8  # real memory the model holds (released on failure)


class HogMixer(Mixer):
    """A linear map whose forward pass asks for an exabyte."""

    why_not = {"qk": "no queries or keys"}

    def __init__(self, config: HogConfig, *, d_model: int, num_heads: int) -> None:
        super().__init__(d_model, num_heads)
        self.proj = torch.nn.Linear(d_model, d_model)
        self.register_buffer("ballast", torch.ones(config.ballast_mb * 2**18), persistent=False)
        LIVE.add(self)

    def mix(self, x: Any, *, causal: bool, key_padding_mask: Any, position: Any) -> Any:
        impossible = torch.empty(2**60, dtype=torch.uint8, device=x.device)  # raises
        return self.proj(x) + impossible[0]

    def step(self, x: Any, state: dict[str, Any], *, positions: Any, position: Any) -> Any:
        return self.proj(x)

    def state_size(self, length: int) -> int:
        return 0


@dataclass
class QuitsConfig:
    how: Annotated[str, Choice(("exit", "interrupt", "base"))] = "exit"


class QuitsMixer(BoomMixer):
    """A mixer whose constructor leaves by a non-``Exception``."""

    def __init__(self, config: QuitsConfig, *, d_model: int, num_heads: int) -> None:
        if config.how == "exit":
            raise SystemExit(5)
        if config.how == "interrupt":
            raise KeyboardInterrupt
        raise BaseException("the plugin gave up")


@hookimpl
def harness_register_mixer(register: Any) -> None:
    register(MixerSpec(name="boom", build=BoomMixer))
    register(MixerSpec(name="hog", build=HogMixer))
    register(MixerSpec(name="quits", build=QuitsMixer))
