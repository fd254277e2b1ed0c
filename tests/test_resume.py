"""Checkpoints and resume (``train.checkpoint_every``, ``harness train --resume``): a run
interrupted at step k and resumed from its last checkpoint is the run that was never
interrupted — the same training loss at every step, the same validation curve and the same
final weights, bit for bit (tolerance 0: CPU, ``deterministic=True``, dropout on so every
generator matters) — for a Transformer, a recurrent mixer and an encoder-decoder; and each
bad resume is one paragraph, exit 2, with nothing changed."""

from __future__ import annotations

import lightning as L
import pytest
import torch
import yaml
from mlflow.tracking import MlflowClient
from text import flat

from harness.cli.main import main
from harness.errors import HarnessError, Interrupted
from harness.run import checkpoint
from harness.run.pipeline import train
from harness.run.trained import load

TASK = {"name": "copy", "params": {"length": 4, "vocab": 4, "num_train": 40, "num_val": 8}}
TRAIN = {"max_steps": 14, "batch_size": 8, "val_every": 4, "progress": False, "num_threads": 1,
         "checkpoint_every": 3, "warmup_steps": 5, "lr": 1e-2}
MODELS = {
    "transformer": {"name": "transformer", "params": {"d_model": 16, "layers": 1, "heads": 2, "dropout": 0.1}},
    "mamba mixer": {"name": "transformer", "params": {"d_model": 16, "layers": 1, "heads": 2, "dropout": 0.1},
                    "mixer": {"name": "mamba"}},
    "encoder-decoder": {"name": "encoder_decoder", "params": {
        "d_model": 16, "encoder_layers": 1, "decoder_layers": 1, "heads": 2, "dropout": 0.1}},
}


class StopAt(L.Callback):
    """Ctrl-C at the end of training step ``k`` (the run ends KILLED, resumable)."""

    def __init__(self, k: int) -> None:
        self.k = k

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == self.k:
            raise Interrupted()


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / "home"))
    return f"sqlite:///{tmp_path / 'm.db'}"


def config(uri: str, model: str = "transformer", **train_changes) -> dict:
    return {"task": TASK, "model": MODELS[model], "train": {**TRAIN, **train_changes}, "tracking": {"uri": uri}}


def curve(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def interrupted(uri: str, cfg: dict, k: int) -> str:
    """The id of a run of ``cfg`` stopped by Ctrl-C after step ``k``."""
    with pytest.raises(Interrupted):
        train(cfg, callbacks=[StopAt(k)])
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("harness").experiment_id],
                              order_by=["attributes.start_time DESC"], max_results=1)
    assert runs[0].info.status == "KILLED"
    return runs[0].info.run_id


def assert_same_run(uri: str, full: str, resumed: str) -> None:
    client = MlflowClient(uri)
    for key in ("train/loss", "val/loss", "val/acc"):
        a, b = curve(client, full, key), curve(client, resumed, key)
        assert b == a, key  # every step once, every value exactly equal
    first, second = load(full).model.state_dict(), load(resumed).model.state_dict()
    assert first.keys() == second.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), name


@pytest.mark.slow
@pytest.mark.parametrize("model, k", [
    ("transformer", 7),       # resumes from step 6 (after a training step), mid-epoch
    ("mamba mixer", 10),      # from step 8 (after a validation)
    ("encoder-decoder", 5),   # from step 4 (written after a validation that improved: best)
])
def test_a_resumed_run_is_bit_exact_with_the_uninterrupted_one(store, model, k):
    cfg = config(store, model)
    full = train(cfg)
    cut = interrupted(store, cfg, k)
    assert checkpoint.latest(checkpoint.folder(cut)) is not None
    result = train(resume=cut, tracking_uri=store)
    assert result.run_id == cut and result.status == "FINISHED"
    assert result.metrics["val/loss"] == full.metrics["val/loss"]
    assert_same_run(store, full.run_id, cut)
    client = MlflowClient(store)
    run = client.get_run(cut)
    assert run.info.status == "FINISHED" and "harness.interrupted" not in run.data.tags
    assert int(run.data.tags["harness.resumed_from_step"]) <= k


@pytest.mark.slow
def test_checkpoints_keep_the_newest_and_the_best_and_report_their_size(store):
    result = train(config(store, checkpoint_keep=2))
    root = checkpoint.folder(result.run_id)
    steps = [s for s, _ in checkpoint.step_files(root)]
    assert len(steps) == 2 and steps[-1] == max(steps)
    assert (root / checkpoint.BEST).is_file() and checkpoint.verify(root / checkpoint.BEST) is None
    best = checkpoint.read(root / checkpoint.BEST)["harness"]
    client = MlflowClient(store)
    during = [v for step, v in curve(client, result.run_id, "val/loss") if step < TRAIN["max_steps"]]
    assert best["value"] == pytest.approx(min(during))  # the final evaluation is no checkpoint
    assert best["step"] % TRAIN["val_every"] == 0  # a validation step
    disk = curve(client, result.run_id, "cost/checkpoint_disk_mb")
    final = sum((root / name).stat().st_size for name in ("model.safetensors", "model.json"))
    assert disk and disk[-1][1] == pytest.approx((checkpoint.disk_bytes(root) - final) / 2**20)
    assert result.metrics["cost/checkpoint_s"] > 0
    for path in root.iterdir():  # weights_only loading reads every checkpoint
        if path.suffix == ".ckpt":
            checkpoint.read(path)


@pytest.mark.slow
def test_a_corrupt_checkpoint_is_detected_and_the_previous_one_used(store, capsys):
    cfg = config(store)
    full = train(cfg)
    cut = interrupted(store, cfg, 10)
    root = checkpoint.folder(cut)
    (older, _), (newest, path) = checkpoint.step_files(root)[-2:]
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # truncated
    capsys.readouterr()
    found = checkpoint.latest(root)
    assert found == checkpoint.step_path(root, older)
    text = flat(capsys.readouterr().err)  # the harness's own warning line
    assert text.startswith("warning: ") and path.name in text and found.name in text and "SHA-256" in text
    assert load(cut).source == str(found)  # no final weights yet: the newest good checkpoint
    train(resume=cut, tracking_uri=store)
    assert_same_run(store, full.run_id, cut)


def test_checkpoint_writes_are_atomic_and_checked(tmp_path):
    path = tmp_path / "step-000000001.ckpt"
    size = checkpoint.write(path, {"x": torch.arange(4)})
    assert size == path.stat().st_size and checkpoint.verify(path) is None
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp file left
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    assert "does not match" in checkpoint.verify(path)
    path.with_name(path.name + ".sha256").unlink()
    assert "missing" in checkpoint.verify(path)


def test_rng_states_survive_weights_only_loading(tmp_path):
    import random

    import numpy as np

    torch.manual_seed(3)
    random.seed(4)
    np.random.seed(5)
    path = tmp_path / "step-000000001.ckpt"
    checkpoint.write(path, {"rng": checkpoint.rng_state()})
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    checkpoint.set_rng_state(checkpoint.read(path)["rng"])
    got = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(got[0], expected[0]) and got[1:] == expected[1:]


@pytest.mark.slow
def test_bad_resumes_are_one_paragraph_exit_2_and_change_nothing(store, capsys, tmp_path):
    client = MlflowClient(store)
    plain = train(config(store, checkpoint_every="off", max_steps=4))
    assert main(["train", "--resume", plain.run_id, "--tracking-uri", store]) == 2
    assert "FINISHED: there is nothing left to resume" in flat(capsys.readouterr().err)
    # no checkpoint: a run stopped with checkpointing off
    cut = interrupted(store, config(store, checkpoint_every="off"), 5)
    assert main(["train", "--resume", cut, "--tracking-uri", store]) == 2
    err = flat(capsys.readouterr().err)
    assert "has no usable checkpoint" in err and "train.checkpoint_every" in err
    assert client.get_run(cut).info.status == "KILLED"
    # changed config: named
    cut = interrupted(store, config(store), 7)
    before = client.get_run(cut)
    changed = config(store, lr=0.5)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(changed))
    assert main(["train", "--resume", cut, str(tmp_path / "run.yaml"), "--tracking-uri", store]) == 2
    err = flat(capsys.readouterr().err)
    assert "train.lr was 0.01, now 0.5" in err and "Traceback" not in err
    # a changed component: the recorded plugin version differs
    client.set_tag(cut, "harness.model.version", "0.0.1")
    assert main(["train", "--resume", cut, "--tracking-uri", store]) == 2
    assert "harness.model.version was 0.0.1" in flat(capsys.readouterr().err)
    after = client.get_run(cut)
    assert after.info.status == "KILLED" and after.data.metrics == before.data.metrics
    # a FAILED run
    client.set_terminated(cut, "FAILED")
    client.set_tag(cut, "harness.failure", "RuntimeError: boom")
    assert main(["train", "--resume", cut, "--tracking-uri", store]) == 2
    err = flat(capsys.readouterr().err)
    assert "ended FAILED (RuntimeError: boom)" in err
    assert main(["train", "--resume", "0123456789abcdef", "--tracking-uri", store]) == 2
    assert "there is no run 0123456789abcdef" in flat(capsys.readouterr().err)
    with pytest.raises(HarnessError, match="not an MLflow run id"):
        checkpoint.folder("../../etc")


@pytest.mark.slow
def test_a_streaming_task_resumes_at_its_position_in_the_stream(store, tmp_path):
    """``corpus_lm`` draws fresh training windows every step (no training split): a resumed run
    replays its stream to where it stopped and continues bit-exactly."""
    from test_data_corpus_lm import corpus

    path = corpus(tmp_path, docs=200)
    cfg = {"task": {"name": "corpus_lm", "params": {"path": str(path), "length": 16, "eval_tokens": 64}},
           "model": MODELS["transformer"], "train": {**TRAIN, "max_steps": 12}, "tracking": {"uri": store}}
    full = train(cfg)
    cut = interrupted(store, cfg, 7)
    train(resume=cut, tracking_uri=store)
    assert_same_run(store, full.run_id, cut)


class SignalAt(L.Callback):
    """What SIGUSR1's handler does, at the end of training step ``k``."""

    def __init__(self, k: int) -> None:
        self.k = k

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == self.k:
            checkpoint.request_stop()


@pytest.mark.slow
def test_sigusr1_on_a_run_checkpoints_stops_it_and_the_resumed_run_is_identical(store):
    cfg = config(store, checkpoint_every="off")  # only the signal writes a checkpoint
    full = train(cfg)
    with checkpoint.stop_on_sigusr1(), pytest.raises(checkpoint.Preempted) as stopped:
        train(cfg, callbacks=[SignalAt(6)])
    assert stopped.value.code == checkpoint.PREEMPTED_EXIT and stopped.value.step == 6
    client = MlflowClient(store)
    (cut,) = [r for r in client.search_runs([client.get_experiment_by_name("harness").experiment_id])
              if r.info.run_id != full.run_id]
    assert cut.info.status == "KILLED" and cut.data.tags["harness.preempted"] == "true"
    assert [s for s, _ in checkpoint.step_files(checkpoint.folder(cut.info.run_id))] == [6]
    assert not checkpoint.stop_requested()  # the handler's flag is cleared on leaving
    train(resume=cut.info.run_id, tracking_uri=store)
    assert_same_run(store, full.run_id, cut.info.run_id)
