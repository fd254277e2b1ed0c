"""Generated splits kept for the process: a study worker runs many trials of one task with
the same data seed, and drawing LRA's splits is slow in Python (ListOps' 100,000 trees take
about a minute, Pathfinder's 180,000 images about 13 minutes), so each worker draws a split
once. Keyed by the task's class, its whole config, its seed, the split and the length; the
last :data:`KEEP` splits are kept. The examples are shared, never copied: nothing may
change them (the harness never does)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

KEEP = 4
_SPLITS: OrderedDict[tuple[Any, ...], list[dict[str, Any]]] = OrderedDict()


def split(task: Any, name: str, length: int, draw: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """``draw()``'s examples, or the ones drawn before for the same task, seed, split, length."""
    key = (type(task).__qualname__, repr(task.config), task.seed, name, length)
    if key in _SPLITS:
        _SPLITS.move_to_end(key)
        return _SPLITS[key]
    examples = draw()
    _SPLITS[key] = examples
    while len(_SPLITS) > KEEP:
        _SPLITS.popitem(last=False)
    return examples
