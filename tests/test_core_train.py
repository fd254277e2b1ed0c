"""One run end to end on CPU, checked through MlflowClient; failures never leave RUNNING."""

from __future__ import annotations

import copy
import math
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from mlflow.tracking import MlflowClient

import harness
from harness.config import parse_run_config
from harness.data.formats import LM
from harness.errors import ConfigError, IncompatibleError
from harness.registry import loader
from harness.registry.specs import AttentionSpec, ModelSpec, PositionSpec
from harness.run.plan import plan
from harness.store import tracking

TINY: dict[str, Any] = {
    "task": {"name": "copy", "params": {"length": 5, "vocab": 4, "num_train": 256, "num_val": 64,
                                        "eval_lengths": [8]}},
    "model": {"name": "transformer", "params": {"d_model": 32, "layers": 1, "heads": 2},
              "attention": {"name": "multi_head"}, "position": {"name": "sinusoidal"}},
    "train": {"max_steps": 30, "batch_size": 32, "lr": 3e-3, "warmup_steps": 5, "val_every": 10,
              "progress": False, "seed": 3},
    "tracking": {"experiment": "core-test"},
}


def tiny(**train: Any) -> dict[str, Any]:
    cfg = copy.deepcopy(TINY)
    cfg["train"].update(train)
    return cfg


def client() -> MlflowClient:
    return MlflowClient(tracking.tracking_uri())


def all_runs() -> list[Any]:
    c = client()
    return c.search_runs([e.experiment_id for e in c.search_experiments()])


@pytest.mark.slow
def test_end_to_end_run_is_recorded(registry, harness_home):
    result = harness.train(tiny(), registry=registry)
    assert result.status == "FINISHED"
    run = client().get_run(result.run_id)
    assert run.info.status == "FINISHED"
    # the fully resolved config: defaults of every component filled in
    assert run.data.params["model.params.ffn_mult"] == "4"
    assert run.data.params["model.position.params.base"] == "10000.0"
    assert run.data.params["task.params.length"] == "5"
    # provenance
    assert run.data.tags["harness.attention.plugin"] == "attention.multi_head"
    assert run.data.tags["harness.attention.distribution"] == "attention-harness"
    assert run.data.tags["harness.task"] == "copy"
    # metrics: per step, at the train length, per evaluation length, cost
    m = run.data.metrics
    for key in ("val/acc", "val/loss", "val/exact", "val/acc_len5", "val/acc_len8",
                "cost/params", "cost/train_tokens_per_s", "cost/peak_tensor_mb"):
        assert key in m, key
    assert m["val/acc"] == pytest.approx(result.metrics["val/acc"])
    model = harness.create_model("transformer", vocab_size=8, max_length=11, d_model=32, layers=1,
                                 heads=2, registry=registry)
    assert m["cost/params"] == sum(p.numel() for p in model.parameters())
    history = client().get_metric_history(result.run_id, "train/loss")
    assert len(history) >= 3 and len({h.step for h in history}) == len(history)
    artifacts = {a.path for a in client().list_artifacts(result.run_id)}
    assert {"config.yaml", "plots", "attention"} <= artifacts
    assert [a.path for a in client().list_artifacts(result.run_id, "plots")] == [
        "plots/extrapolation.json", "plots/extrapolation.png"]
    # stored in the project-local store, nothing left in the working directory
    assert (harness_home / "mlflow.db").exists()
    assert (harness_home / "artifacts").is_dir()


@pytest.mark.slow
def test_same_seed_same_metrics_and_other_seed_differs(registry):
    a = harness.train(tiny(max_steps=12, val_every=12), registry=registry)
    b = harness.train(tiny(max_steps=12, val_every=12), registry=registry)
    c = harness.train(tiny(max_steps=12, val_every=12, seed=4), registry=registry)
    assert a.metrics["val/loss"] == b.metrics["val/loss"]
    assert a.metrics["val/loss"] != c.metrics["val/loss"]


def test_config_errors_fail_before_anything_is_recorded(registry):
    bad = tiny()
    bad["model"]["attention"]["params"] = {"dropot": 0.1}
    with pytest.raises(ConfigError, match=r"model\.attention\.params: unknown parameter 'dropot' \(did you mean 'dropout'\?\)"):
        harness.train(bad, registry=registry)
    bad = tiny()
    bad["model"]["params"]["heads"] = 3
    with pytest.raises(ConfigError, match="divisible"):
        harness.train(bad, registry=registry)
    bad = tiny()
    bad["train"]["max_stepz"] = 3
    with pytest.raises(ConfigError, match=r"train\.max_stepz: unknown field"):
        harness.train(bad, registry=registry)
    assert all_runs() == []


# -- in-process plugins that misbehave -------------------------------------------------------
@dataclass
class NoConfig:
    pass


def _nan_model_plugin() -> Any:
    def build(config: Any, *, task: Any, attention: Any, position: Any) -> Any:
        import torch

        class NaNModel(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.emb = torch.nn.Embedding(task.vocab_size, task.vocab_size)

            def forward(self, tokens: Any, padding_mask: Any = None) -> Any:
                return self.emb(tokens) * float("nan")

        return NaNModel()

    class Plugin:
        @harness.hookimpl
        def harness_register_model(self, register):
            register(ModelSpec(name="nan_model", build=build, task_kinds=frozenset({"lm"})))

    return Plugin()


@pytest.mark.slow
def test_diverging_run_ends_failed_with_reason():
    reg = loader.load(plugins=[_nan_model_plugin()])
    cfg = tiny()
    cfg["model"] = {"name": "nan_model"}
    from harness.errors import RunFailed

    with pytest.raises(RunFailed, match="training loss became nan"):
        harness.train(cfg, registry=reg)
    (run,) = all_runs()
    assert run.info.status == "FAILED"
    assert "TrainingDiverged" in run.data.tags["harness.failure"]


@pytest.mark.slow
def test_pruned_run_ends_finished_named_and_described_not_failed(registry):
    """A pruned run did what the study asked: FINISHED (no failure mark in the UI), tagged,
    its name suffixed "(pruned)" and its description saying when and why."""
    import lightning as L
    import optuna

    class PruneAtFirstValidation(L.Callback):
        def on_validation_end(self, trainer: Any, module: Any) -> None:
            raise optuna.TrialPruned("pruned by test")

    with pytest.raises(optuna.TrialPruned):
        harness.train(tiny(), registry=registry, callbacks=[PruneAtFirstValidation()])
    (run,) = all_runs()
    assert run.info.status == "FINISHED"
    assert run.data.tags["harness.pruned"] == "true"
    assert run.info.run_name.endswith(" (pruned)") and run.data.tags["mlflow.runName"] == run.info.run_name
    assert run.data.tags["mlflow.note.content"].startswith("**Pruned** by the study's pruner, not failed: "
                                                           "pruned by test.")


def test_incompatible_pairing_is_rejected_before_training_with_the_reason(registry):
    class Plugin:
        @harness.hookimpl
        def harness_register_attention(self, register):
            register(AttentionSpec(name="no_bias_attn", build=lambda c, **kw: None,
                                   position_hooks=frozenset({"embedding"}),
                                   why_not={"bias": "it never forms a score matrix"}))

        @harness.hookimpl
        def harness_register_position(self, register):
            register(PositionSpec(name="bias_only", build=lambda c, **kw: None,
                                  hooks=frozenset({"bias"})))

    reg = loader.load(plugins=[Plugin()])
    cfg = tiny()
    cfg["model"]["attention"] = {"name": "no_bias_attn"}
    cfg["model"]["position"] = {"name": "bias_only"}
    with pytest.raises(IncompatibleError, match="it never forms a score matrix"):
        plan(parse_run_config(cfg), reg)
    cfg["model"]["position"] = {"name": "sinusoidal"}
    assert plan(parse_run_config(cfg), reg).position.name == "sinusoidal"


def test_model_without_the_task_kind_is_rejected(registry):
    cfg = tiny()
    cfg["model"]["params"]["causal"] = False
    p = plan(parse_run_config(cfg), registry)
    assert p.fmt is LM  # copy is seq2seq; the decoder-only transformer gets src SEP tgt
    reg = loader.load(plugins=[_nan_model_plugin()])

    class Classify:
        @harness.hookimpl
        def harness_register_task(self, register):
            register(harness.TaskSpec(name="cls", build=lambda c, seed: None, task_kind="classification"))

    reg = loader.load(plugins=[_nan_model_plugin(), Classify()])
    cfg = tiny()
    cfg["task"] = {"name": "cls"}
    cfg["model"] = {"name": "nan_model"}
    with pytest.raises(IncompatibleError, match="supports lm"):
        plan(parse_run_config(cfg), reg)


def test_create_model_and_task_api(registry):
    import torch

    task = harness.create_task("copy", length=7, vocab=5, num_train=10, registry=registry)
    ex = task.examples("train", 7)
    assert len(ex) == 10 and ex[0]["src"] == ex[0]["tgt"] and len(ex[0]["src"]) == 7
    assert task.examples("train", 7) == harness.create_task("copy", length=7, vocab=5, num_train=10,
                                                            registry=registry).examples("train", 7)
    model = harness.create_model("transformer", vocab_size=9, max_length=20, registry=registry,
                                 d_model=32, heads=2, layers=1, attention="multi_head", position="none")
    assert model(torch.randint(0, 9, (2, 6))).shape == (2, 6, 9)
    with pytest.raises(ConfigError, match="did you mean 'layers'"):
        harness.create_model("transformer", vocab_size=9, registry=registry, layer=2)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_run_ends_killed_not_running(tmp_path, harness_home, signum):
    """Ctrl-C, or a scheduler's SIGTERM, mid-training: the run ends KILLED, tagged."""
    cfg = tiny(max_steps=100_000, val_every=50)
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump(cfg))
    log = tmp_path / "child.log"
    proc = subprocess.Popen(
        # --verbose: Lightning's "GPU available" line marks the store and run as created
        [sys.executable, "-m", "harness.cli", "--verbose", "train", str(path)],
        stdout=log.open("w"), stderr=subprocess.STDOUT,
        # a shell's background jobs inherit SIGINT as ignored; a terminal's Ctrl-C does not
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.time() + 120
        # Touch the MLflow store only once the child has created it and its run (Lightning
        # prints its first line after that): opening it during creation races the schema.
        while "GPU available" not in log.read_text():
            assert proc.poll() is None and time.time() < deadline, log.read_text()
            time.sleep(0.2)
        while not any(r.data.metrics.get("train/loss") is not None for r in all_runs()):
            assert proc.poll() is None and time.time() < deadline, log.read_text()
            time.sleep(0.5)
        proc.send_signal(signum)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    # Ctrl-C: 130 with what was kept (issue 15); SIGTERM: 128 + 15, as a shell reports it
    assert proc.returncode == (130 if signum == signal.SIGINT else 143)
    (run,) = all_runs()
    assert run.info.status == "KILLED"
    assert run.data.tags["harness.interrupted"] == "true"



@pytest.mark.slow
def test_a_ddp_spawn_run_on_two_cpu_processes_logs_what_a_single_process_run_logs():
    """Modules and callbacks pickle; validation sums are reduced over both processes' shares
    and the results come back from the spawned workers (issue 12)."""
    cfg = tiny()
    cfg["model"]["position"] = {"name": "none"}
    cfg["train"].update(max_steps=4, val_every=2, accelerator="cpu", num_threads=1)
    single = harness.train(cfg)
    cfg["train"].update(devices=2, strategy="ddp_spawn")
    spawned = harness.train(cfg)
    assert spawned.status == single.status == "FINISHED"
    assert set(spawned.metrics) == set(single.metrics)
    assert spawned.metrics["train/steps"] == single.metrics["train/steps"] == 4
    assert spawned.metrics["cost/train_tokens_per_s"] > 0
    for key in ("val/loss", "val/acc"):
        assert math.isfinite(spawned.metrics[key])
    run = MlflowClient(tracking.tracking_uri()).get_run(spawned.run_id)
    assert {k for k in run.data.metrics if k.startswith("val/")} == {
        k for k in single.metrics if k.startswith("val/")}


def test_attention_maps_carry_each_examples_tokens_for_the_axis_labels(registry):
    from harness.data.formats import LM
    from harness.run.evaluate import attention_maps

    task = harness.create_task("copy", length=5, vocab=4, num_train=8, num_val=4, registry=registry)
    model = harness.create_model("transformer", vocab_size=task.vocab.size, max_length=11,
                                 registry=registry, d_model=16, heads=2, layers=2)
    pairs = attention_maps(model, task, LM, count=2)
    assert len(pairs) == 2
    for (maps, ids), example in zip(pairs, task.examples("val", 5), strict=False):
        lm = example["src"] + [3] + example["tgt"]  # src SEP tgt, inputs drop the last token
        assert ids == lm[:-1]
        assert len(maps) == 2 and all(m.shape[-2:] == (len(ids), len(ids)) for m in maps)


def test_the_project_store_is_found_from_a_sub_folder_like_git_finds_its_repository(tmp_path, monkeypatch):
    monkeypatch.delenv("HARNESS_HOME")
    project = tmp_path / "project"
    (project / "src" / "deep").mkdir(parents=True)
    monkeypatch.chdir(project)
    assert tracking.home() == project / ".harness"  # none yet: a new one here
    (project / ".harness").mkdir()
    monkeypatch.chdir(project / "src" / "deep")
    assert tracking.home() == project / ".harness"
    assert tracking.tracking_uri() == f"sqlite:///{project / '.harness' / 'mlflow.db'}"
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / "elsewhere"))
    assert tracking.home() == tmp_path / "elsewhere"
