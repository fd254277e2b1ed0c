"""The harness's per-step fixed cost: the callbacks Lightning sees each step (grouped:
``harness.run.grouped``), the benchmark comparing the harness with a plain loop and a bare
Lightning Trainer (run at its smallest size: no timing is asserted), and the CUDA-graph
option's refusals where a step cannot be captured."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import lightning as L

from harness.run.distributed import ShareRun, shared_run_id
from harness.run.grouped import Grouped, members

ROOT = Path(__file__).resolve().parents[1]


class Recorder(L.Callback):
    def __init__(self, name: str, calls: list[str]) -> None:
        self.name, self.calls = name, calls

    def on_train_batch_end(self, trainer, module, *args):
        self.calls.append(f"{self.name}.end")


class Starter(Recorder):
    def on_train_batch_start(self, trainer, module, *args):
        self.calls.append(f"{self.name}.start")


def test_a_group_calls_each_hook_only_on_the_members_that_implement_it_in_order():
    calls: list[str] = []
    a, b, c = Starter("a", calls), Recorder("b", calls), Starter("c", calls)
    group = Grouped([a, b, c])
    group.on_train_batch_start(None, None, None, 0)
    group.on_train_batch_end(None, None, None, None, 0)
    group.on_after_backward(None, None)  # no member implements it: the base no-op
    assert calls == ["a.start", "c.start", "a.end", "b.end", "c.end"]
    assert group.on_train_batch_start.__name__ == "call_all" and group.on_before_zero_grad.__self__ is group
    share = ShareRun("abc", None, None)

    class Trainer:
        callbacks = [Recorder("x", calls), Grouped([a, share])]

    assert members(Trainer.callbacks)[1:] == [a, share] and shared_run_id(Trainer) == "abc"
