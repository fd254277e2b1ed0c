"""Training metrics accumulated on the device and logged every N steps
(:mod:`harness.run.trainlog`): each logged point is the mean of the per-step values since the
previous one, checked against the losses the training steps returned, read by a callback of
the test's own; and a kill at the exact instant between a checkpoint's write and its step's
log loses no point and repeats none (issue 49: a hook kills the process there, not load)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import lightning as L
import pytest
import torch
import yaml
from mlflow.tracking import MlflowClient
from test_resume import assert_same_run, config, curve

from harness.run import checkpoint
from harness.run.pipeline import train
from harness.run.trainlog import LOG_EVERY, TrainMetrics, log_every


class StepLosses(L.Callback):
    """Each optimizer step's loss as its training step returned it (the test's own record)."""

    def __init__(self) -> None:
        self.losses: dict[int, float] = {}

    def on_train_batch_end(self, trainer, module, outputs, batch, idx):
        self.losses[trainer.global_step - 1] = float(outputs["loss"])


def g2p(uri: str, **train_changes) -> dict:
    """g2p: rows score different numbers of tokens, so a step's mean is not a window's."""
    return {"task": {"name": "g2p", "params": {"length": 8, "num_train": 64, "num_val": 8, "decode_eval": False}},
            "model": {"name": "transformer", "params": {"d_model": 16, "layers": 1, "heads": 2, "dropout": 0.0}},
            "train": {"max_steps": 8, "batch_size": 8, "val_every": 8, "progress": False, "num_threads": 1,
                      "log_attention": False, "precision": "64-true", **train_changes},
            "tracking": {"uri": uri}}


def points(uri: str, run_id: str, key: str) -> dict[int, float]:
    history = MlflowClient(uri).get_metric_history(run_id, key)
    assert len({m.step for m in history}) == len(history), history  # one point per step
    return {m.step: m.value for m in history}


def test_a_logged_training_point_is_the_mean_of_the_steps_since_the_previous_one(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / "home"))
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    every, windowed = StepLosses(), StepLosses()
    one = train(g2p(uri, log_every=1), callbacks=[every])
    three = train(g2p(uri, log_every=3), callbacks=[windowed])
    assert sorted(every.losses) == list(range(8)) and windowed.losses == every.losses  # same steps
    assert points(uri, one.run_id, "train/loss") == pytest.approx(every.losses, rel=1e-12)
    windows = {2: [0, 1, 2], 5: [3, 4, 5], 7: [6, 7]}  # the last one closes at max_steps
    loss, acc = points(uri, three.run_id, "train/loss"), points(uri, three.run_id, "train/acc")
    per_step_acc = points(uri, one.run_id, "train/acc")
    assert sorted(loss) == sorted(acc) == sorted(windows)
    for end, steps in windows.items():
        assert loss[end] == pytest.approx(sum(every.losses[s] for s in steps) / len(steps), rel=1e-12)
        assert acc[end] == pytest.approx(sum(per_step_acc[s] for s in steps) / len(steps), rel=1e-12)


def test_the_window_is_read_in_step_order_and_survives_a_checkpoint_bit_for_bit():
    """Where the reads and a checkpoint fall does not change a bit of a logged mean."""
    values = torch.rand(13, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    values[:, 2] = torch.randint(0, 9, (13,), generator=torch.Generator().manual_seed(4))  # 0: nothing scored
    plain = TrainMetrics(every=13, check_every=1000)
    for step, row in enumerate(values):
        plain.add(step, row)
    assert [plain.due(i, 20) for i in range(13)] == [False] * 12 + [True] and plain.due(19, 20)
    expected = plain.flush()
    per_step = [(r[0] / max(r[2], 1.0), r[1] / max(r[2], 1.0)) for r in values.tolist()]
    assert expected == pytest.approx({"train/loss": sum(x for x, _ in per_step) / 13,
                                      "train/acc": sum(y for _, y in per_step) / 13}, rel=1e-14)
    first = TrainMetrics(every=13, check_every=3)  # reads every 3 steps, checkpointed after step 7
    for step, row in enumerate(values[:8]):
        first.add(step, row)
        if first.read_due(step):
            first.read()
    resumed = TrainMetrics(every=13, check_every=3)
    resumed.load_state_dict(first.state_dict())
    for step, row in enumerate(values[8:], start=8):
        resumed.add(step, row)
    assert resumed.flush() == expected  # equal, not approximately
    assert resumed.flush() == {} and resumed.steps == 0
    resumed.load_state_dict(None)  # a checkpoint written before windows existed
    assert resumed.steps == 0 and resumed.flush() == {}


def test_the_default_interval_keeps_short_runs_per_step_and_long_ones_at_the_measured_one():
    from harness.config import TrainConfig

    assert log_every(TrainConfig(val_every=4)) == 1
    assert log_every(TrainConfig(val_every=40)) == 10
    assert log_every(TrainConfig()) == LOG_EVERY
    assert log_every(TrainConfig(log_every=7)) == 7


#: Runs ``train`` on a config with the process SIGKILLed at the exact instant around the
#: write of the checkpoint of step ``K`` ("before": as the write starts; "after": as it ends).
KILLER = textwrap.dedent("""
    import os, signal, sys, yaml
    from harness.run import checkpoint
    from harness.run.pipeline import train

    cfg, when, at = yaml.safe_load(open(sys.argv[1])), sys.argv[2], int(sys.argv[3])
    write = checkpoint.write

    def killing_write(path, payload):
        due = payload["harness"]["step"] == at
        if due and when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        size = write(path, payload)
        if due and when == "after":
            os.kill(os.getpid(), signal.SIGKILL)
        return size

    checkpoint.write = killing_write
    train(cfg)
""")


@pytest.mark.slow
@pytest.mark.parametrize("when", ["after", "before"])
def test_a_kill_at_a_checkpoint_loses_no_logged_point_and_repeats_none(tmp_path, monkeypatch, when):
    """The checkpoint of step 6 is written after training step 5 (not a validation step):
    killed just after it is on disk, the resumed run starts at step 6, so step 5's point must
    already be logged; killed just before, it resumes from step 3 and logs steps 3-5 again,
    which must not appear twice. Either way the run equals the uninterrupted one, bit for bit."""
    home = tmp_path / "home"
    monkeypatch.setenv("HARNESS_HOME", str(home))
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    cfg = config(uri, checkpoint_best=False)  # a point per step, checkpoints every 3 steps, validation every 4
    full = train(cfg)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([sys.executable, "-c", KILLER, str(path), when, "6"], capture_output=True, text=True,
                          env={**os.environ, "HARNESS_HOME": str(home)}, timeout=600)
    assert proc.returncode == -9, proc.stderr[-3000:]
    client = MlflowClient(uri)
    (cut,) = [r.info.run_id for r in client.search_runs([client.get_experiment_by_name("harness").experiment_id])
              if r.info.run_id != full.run_id]
    newest = checkpoint.latest(checkpoint.folder(cut))
    assert newest is not None and newest.name == f"step-{6 if when == 'after' else 3:09d}.ckpt"
    logged = curve(client, cut, "train/loss")
    assert [s for s, _ in logged] == list(range(6 if when == "after" else len(logged)))
    result = train(resume=cut, tracking_uri=uri)
    assert result.status == "FINISHED"
    assert_same_run(uri, full.run_id, cut)  # every step once, every value exactly equal


def test_the_step_s_loss_and_counts_match_a_position_by_position_reference():
    """masked_stats against a loop over the scored positions (label smoothing as its formula:
    (1 - e) nll + e mean over classes of -log p), on fresh inputs."""
    from harness.run.system import masked_stats

    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(3, 5, 6, dtype=torch.float64, generator=gen)
    targets = torch.randint(0, 6, (3, 5), generator=gen)
    mask = torch.rand(3, 5, generator=gen) > 0.3
    batch = {"targets": targets, "loss_mask": mask}
    for smoothing in (0.0, 0.2):
        out = masked_stats(logits, batch, smoothing, evaluation=False)
        loss = correct = tokens = 0.0
        for b in range(3):
            for t in range(5):
                if mask[b, t]:
                    logp = torch.log_softmax(logits[b, t], -1)
                    loss += float(-(1 - smoothing) * logp[targets[b, t]] - smoothing * logp.mean())
                    correct += float(logits[b, t].argmax() == targets[b, t])
                    tokens += 1
        assert float(out["loss_sum"]) == pytest.approx(loss, rel=1e-12)
        assert float(out["loss"]) == pytest.approx(loss / tokens, rel=1e-12)
        assert (int(out["correct"]), int(out["tokens"])) == (correct, tokens)
        assert set(out) == {"loss", "loss_sum", "correct", "tokens"}
