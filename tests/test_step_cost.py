"""The harness's per-step fixed cost: the callbacks Lightning sees each step (grouped:
``harness.run.grouped``), the benchmark comparing the harness with a plain loop and a bare
Lightning Trainer (run at its smallest size: no timing is asserted), and the CUDA-graph
option's refusals where a step cannot be captured."""

from __future__ import annotations

import collections
import pickle
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from mlflow.tracking import MlflowClient
from text import one_paragraph

from harness.cli.main import main
from harness.config import TrainConfig, parse_run_config
from harness.errors import HarnessError
from harness.run import system
from harness.run.build import build
from harness.run.distributed import ShareRun, shared_run_id
from harness.run.fit import CaptureCheck, CaptureFailed, capture_problem
from harness.run.grouped import Grouped, members
from harness.run.plan import load_registry, plan
from harness.run.system import HarnessDataModule

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
    assert group.on_before_zero_grad.__self__ is group  # not implemented by any member: Lightning's own
    again = pickle.loads(pickle.dumps(group))  # ddp_spawn sends the callbacks to its processes
    again.on_train_batch_start(None, None, None, 0)
    again.on_train_batch_end(None, None, None, None, 0)
    assert [m.name for m in again.members] == ["a", "b", "c"]
    assert again.members[0].calls[5:] == ["a.start", "c.start", "a.end", "b.end", "c.end"]
    share = ShareRun("abc", None, None)

    class Trainer:
        callbacks = [Recorder("x", calls), Grouped([a, share])]

    assert members(Trainer.callbacks)[1:] == [a, share] and shared_run_id(Trainer) == "abc"


@pytest.mark.slow
def test_the_step_cost_benchmark_runs_at_its_smallest_size(tmp_path):
    """Three systems, their rates and ratios, the flush cost and the fixed cost in the record
    (nothing about speed is asserted: that is the committed record's business)."""
    out = tmp_path / "step_cost.md"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "step_cost.py"), "--shape", "tiny", "--steps", "8",
                           "--warmup", "2", "--repeats", "1", "--log-every", "3", "--out", str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = out.read_text()
    assert "### tiny:" in text and "Machine:" in text and "python benchmarks/step_cost.py --shape tiny" in text
    row = next(line for line in text.splitlines() if line.startswith("| 1 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    rates = [float(c.split()[0]) for c in cells[1:4]]
    assert all(r > 0 for r in rates) and cells[6] == "3"  # steps/s of each system; the window asked for
    assert float(cells[4].split()[0]) == pytest.approx(rates[0] / rates[1], abs=2e-3)
    assert "harness / lightning =" in text and "harness / plain =" in text


def test_cuda_graphs_on_the_cpu_is_refused_naming_the_field_before_anything_is_recorded(tmp_path, monkeypatch,
                                                                                         capsys):
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / "home"))
    store = tmp_path / "m.db"
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({
        "task": {"name": "copy", "params": {"length": 4, "vocab": 4, "num_train": 16, "num_val": 4}},
        "model": {"name": "transformer", "params": {"d_model": 16, "layers": 1, "heads": 2}},
        "train": {"max_steps": 2, "accelerator": "cpu", "cuda_graphs": True, "progress": False},
        "tracking": {"uri": f"sqlite:///{store}"}}))
    assert main(["train", str(path)]) == 2
    err = one_paragraph(capsys.readouterr().err)
    assert "train.cuda_graphs" in err and "trains on the cpu" in err and "Set train.cuda_graphs: false" in err
    assert not store.exists() or not MlflowClient(f"sqlite:///{store}").search_runs(
        [e.experiment_id for e in MlflowClient(f"sqlite:///{store}").search_experiments()])


def test_cuda_graphs_refuses_fsdp_and_batches_that_change_shape(monkeypatch):
    problem = capture_problem(TrainConfig(cuda_graphs=True, strategy="fsdp"), "cuda")
    assert problem is not None and "FSDP" in problem and "train.cuda_graphs: false" in problem
    assert capture_problem(TrainConfig(cuda_graphs=True), "cuda") is None
    cfg = parse_run_config({"task": {"name": "copy", "params": {"length": 4, "vocab": 4, "num_train": 16}},
                            "model": {"name": "transformer", "params": {"d_model": 16, "layers": 1, "heads": 2}}})
    p = plan(cfg, load_registry(cfg, None))
    task = build(p).task
    assert HarnessDataModule(task, p.fmt, 4, 0, one_shape=True).train_dataloader() is not None  # on the device
    monkeypatch.setattr(system, "fits_on_device", lambda *a: False)  # a split too large for the device
    assert HarnessDataModule(task, p.fmt, 4, 0).train_dataloader() is not None  # padded per batch
    with pytest.raises(HarnessError) as refused:
        HarnessDataModule(task, p.fmt, 4, 0, one_shape=True).train_dataloader()
    assert "train.cuda_graphs" in str(refused.value) and "does not fit on the device" in str(refused.value)


def test_a_step_torch_could_not_capture_fails_the_run_after_its_first_steps(monkeypatch):
    from torch._dynamo.utils import counters

    class Trainer:
        global_step = CaptureCheck.AFTER

    class Module:
        model = torch.nn.Linear(2, 2)

    monkeypatch.setitem(counters, "inductor", collections.Counter())
    CaptureCheck().on_train_batch_end(Trainer, Module, None, None, 0)  # nothing skipped
    counters["inductor"]["cudagraph_skips"] += 1
    with pytest.raises(CaptureFailed, match=r"Linear in CUDA graphs \(1 part\(s\) skipped"):
        CaptureCheck().on_train_batch_end(Trainer, Module, None, None, 0)
    Trainer.global_step += 1  # checked once
    CaptureCheck().on_train_batch_end(Trainer, Module, None, None, 0)


class _First(L.Callback):
    def on_train_start(self, trainer, pl_module):  # type: ignore[no-untyped-def]
        pl_module.seen.append("first")


class _Second(L.Callback):
    def on_train_start(self, trainer, pl_module):  # type: ignore[no-untyped-def]
        pl_module.seen.append("second")


def test_a_group_pickles_for_ddp_spawn_and_still_calls_every_member_in_order():
    """ddp_spawn pickles the callbacks: a group of several members once held a closure that
    could not be pickled, so every ddp_spawn run failed."""
    import pickle
    import types

    from harness.run.grouped import Grouped

    group = pickle.loads(pickle.dumps(Grouped([_First(), _Second()])))
    module = types.SimpleNamespace(seen=[])
    group.on_train_start(None, module)
    assert module.seen == ["first", "second"]
