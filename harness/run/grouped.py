"""Several Lightning callbacks seen by Lightning as one.

Lightning calls every callback for every hook of every step (``on_train_batch_start``,
``on_before_backward``, ``on_after_backward``, ``on_before_optimizer_step``,
``on_before_zero_grad``, ``on_train_batch_end``, ...): for each, a profiler context, a
formatted action name and the call, even where the callback does not implement the hook.
With a tiny model that is a measurable share of a step (benchmarks/step_cost.md). A
:class:`Grouped` callback is one callback to Lightning; each hook calls only the members
that implement it, in their order. Members keep no Lightning state (``state_dict``): a
callback whose state a checkpoint holds stays on its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L


def _hooks() -> list[str]:
    return [name for name, value in vars(L.Callback).items()
            if callable(value) and (name.startswith("on_") or name in ("setup", "teardown"))]


class Grouped(L.Callback):
    """``members`` as one callback (see the module)."""

    def __init__(self, members: list[Any]) -> None:
        self.members = members
        # Lightning formats a callback's state_key into a profiler action name for every hook
        # of every step: computed once (the members never change)
        self._state_key = "Grouped[" + ",".join(m.state_key for m in members) + "]"
        for name in _hooks():
            calls = [getattr(m, name) for m in members
                     if getattr(type(m), name, None) is not getattr(L.Callback, name)]
            if calls:
                setattr(self, name, _chain(calls))

    @property
    def state_key(self) -> str:
        return self._state_key


def _chain(calls: list[Callable[..., Any]]) -> Callable[..., None]:
    return calls[0] if len(calls) == 1 else _Chain(calls)


class _Chain:
    """The members' hooks called in turn; a class, not a closure, so that a :class:`Grouped`
    pickles (``strategy: ddp_spawn`` sends the callbacks to its processes)."""

    def __init__(self, calls: list[Callable[..., Any]]) -> None:
        self.calls = calls

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        for call in self.calls:
            call(*args, **kwargs)


def members(callbacks: list[Any]) -> list[Any]:
    """The callbacks with each group's members in its place."""
    return [m for c in callbacks for m in (c.members if isinstance(c, Grouped) else [c])]
