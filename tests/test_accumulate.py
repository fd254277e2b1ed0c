"""Gradient accumulation (harness.run.accumulate): micro-batches give the whole batch's gradient
(float64, a real model, padding that varies between micro-batches), the loss is normalised by
the batch's tokens and not a mean of means, a run with micro-batches trains the same weights
on the same steps, and a budget buys the same steps at every micro-batch size."""

from __future__ import annotations

import warnings

import pytest
import torch

from harness.config import RunConfig, parse_run_config
from harness.errors import ConfigError
from harness.run.accumulate import BATCH_TOKENS, split, with_batch_tokens
from harness.run.build import build
from harness.run.plan import load_registry, plan
from harness.run.system import HarnessSystem, masked_stats

TASK = {"name": "copy", "params": {"length": 6, "vocab": 5, "num_train": 40, "num_val": 8}}
MODEL = {"name": "transformer", "params": {"d_model": 16, "layers": 2, "heads": 2}}


def the_plan(**train):
    cfg = parse_run_config({"task": TASK, "model": MODEL, "train": {"progress": False, **train}})
    return plan(cfg, load_registry(cfg, None))


def real_batch(p, rows: int, seed: int):
    """A batch of the task's training examples whose rows end at random places (padded and
    unscored after), so that micro-batches hold different numbers of scored tokens."""
    built = build(p)
    examples = built.task.examples("train", built.task.train_length)[:rows]
    batch = p.fmt.collate(examples, built.task.task_kind)
    batch.pop("examples")
    g = torch.Generator().manual_seed(seed)
    width = batch["tokens"].shape[1]
    ends = torch.randint(2, width + 1, (rows,), generator=g)
    ends[0] = width  # the batch keeps its width
    beyond = torch.arange(width).unsqueeze(0) >= ends.unsqueeze(1)
    batch["padding_mask"] = batch["padding_mask"] | beyond
    batch["loss_mask"] = batch["loss_mask"] & ~beyond
    batch["tokens"] = batch["tokens"].masked_fill(beyond, 0)
    return built, batch


def grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def accumulated(system, batch, fmt, micro: int) -> dict[str, torch.Tensor]:
    """What Lightning does with what training_step returns: divide by the micro-batches per
    step, backward each, leave the sum in .grad."""
    system.model.zero_grad(set_to_none=True)
    parts = split(batch, fmt, micro)
    assert len(parts) == system.accumulate
    for i, part in enumerate(parts):
        (system.training_step(part, i) / system.accumulate).backward()
    return grads(system.model)


@pytest.mark.parametrize("micro", [1, 3, 4])
def test_accumulated_gradients_equal_the_whole_batchs_in_float64(micro):
    p = the_plan(batch_size=8, micro_batch_size=micro)
    built, batch = real_batch(p, 8, seed=micro)
    system = HarnessSystem(built.model.double(), built.task, p.fmt, p.config.train)
    counts = [int(part["loss_mask"].sum()) for part in split(batch, p.fmt, micro)]
    assert len(set(counts)) > 1  # the micro-batches hold different numbers of scored tokens
    system.model.zero_grad(set_to_none=True)
    masked_stats(system(batch), batch)["loss"].backward()  # the whole batch's token mean
    whole = grads(system.model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # self.log outside a Trainer
        got = accumulated(system, batch, p.fmt, micro)
    assert got.keys() == whole.keys() and whole
    for name in whole:
        torch.testing.assert_close(got[name], whole[name], rtol=1e-10, atol=1e-13, msg=name)


def test_the_loss_is_normalised_by_the_batchs_tokens_not_a_mean_of_means():
    """The mean of the micro-batches' own means weighs a micro-batch with few scored tokens
    like one with many: its gradient is measurably different from the whole batch's."""
    p = the_plan(batch_size=8, micro_batch_size=4)
    built, batch = real_batch(p, 8, seed=11)
    model = built.model.double()
    model.zero_grad(set_to_none=True)
    masked_stats(model(batch["tokens"], padding_mask=batch["padding_mask"]), batch)["loss"].backward()
    whole = grads(model)
    model.zero_grad(set_to_none=True)
    parts = split(batch, p.fmt, 4)
    assert int(parts[0]["loss_mask"].sum()) != int(parts[1]["loss_mask"].sum())
    for part in parts:
        (masked_stats(model(part["tokens"], padding_mask=part["padding_mask"]), part)["loss"] / 2).backward()
    mean_of_means = grads(model)
    gap = max(float((mean_of_means[n] - whole[n]).abs().max()) for n in whole)
    assert gap > 1e-4


def test_micro_batches_are_cut_to_their_longest_row_and_carry_the_batchs_tokens():
    p = the_plan(batch_size=8, micro_batch_size=3)
    _, batch = real_batch(p, 8, seed=5)
    parts = split(batch, p.fmt, 3)
    assert [len(q["tokens"]) for q in parts] == [3, 3, 2]
    for i, part in enumerate(parts):
        rows = slice(3 * i, 3 * i + 3)
        width = int((~batch["padding_mask"][rows]).int().cumsum(1).argmax(1).max()) + 1
        assert part["tokens"].shape[1] == width
        assert torch.equal(part["tokens"], batch["tokens"][rows, :width])
        assert int(part[BATCH_TOKENS]) == int(batch["loss_mask"].sum())


def run(store: str, **train):
    from harness.run.pipeline import train as train_run
    from harness.run.trained import load

    base = {"max_steps": 4, "batch_size": 8, "val_every": 2, "progress": False, "num_threads": 1,
            "precision": "64-true", "warmup_steps": 1, "lr": 1e-2}
    result = train_run({"task": TASK, "model": MODEL, "train": {**base, **train},
                        "tracking": {"uri": store}})
    assert result.status == "FINISHED"
    return result, load(result.run_id).model.state_dict()


@pytest.mark.slow
def test_a_run_with_micro_batches_trains_the_same_weights_on_the_same_steps(tmp_path):
    store = f"sqlite:///{tmp_path / 'm.db'}"
    whole, a = run(store)
    micro, b = run(store, micro_batch_size=3)
    assert micro.metrics["train/steps"] == whole.metrics["train/steps"] == 4
    assert micro.metrics["cost/train_tokens"] == whole.metrics["cost/train_tokens"]
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-9, atol=1e-12, msg=name)
    assert micro.metrics["val/loss"] == pytest.approx(whole.metrics["val/loss"], rel=1e-9)


def test_a_token_budget_buys_the_same_steps_at_every_micro_batch_size():
    from harness.run.flops import resolve_steps

    steps = {m: resolve_steps(the_plan(batch_size=8, micro_batch_size=m, max_tokens=8 * 12 * 30))
             for m in (None, 1, 3, 8)}
    assert set(steps.values()) == {steps[None]}


def test_batch_tokens_sets_the_batch_size_from_the_tokens_of_an_example():
    p = the_plan()
    built = build(p)
    examples = built.task.examples("train", built.task.train_length)
    per_example = p.fmt.tokens(p.fmt.collate(examples[:1], built.task.task_kind))
    resolved = with_batch_tokens(the_plan(batch_tokens=per_example * 12))
    assert resolved.config.train.batch_size == 12
    assert RunConfig.model_validate(resolved.resolved_config()).train.batch_size == 12
    with pytest.raises(ConfigError, match="train.batch_tokens"):
        with_batch_tokens(the_plan(batch_tokens=1))


@pytest.mark.slow
def test_a_run_with_micro_batches_resumes_bit_exact(tmp_path):
    """Checkpoints fall on optimizer steps; the resumed run skips the optimizer batches the
    micro-batches consumed and ends with the uninterrupted run's weights."""
    import lightning as L

    from harness.errors import Interrupted
    from harness.run.pipeline import train as train_run
    from harness.run.trained import load

    class StopAt(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 3 and not trainer.fit_loop.epoch_loop._should_accumulate():
                raise Interrupted()

    store = f"sqlite:///{tmp_path / 'm.db'}"
    cfg = {"task": TASK, "model": MODEL, "tracking": {"uri": store},
           "train": {"max_steps": 7, "batch_size": 8, "micro_batch_size": 3, "val_every": 5,
                     "progress": False, "num_threads": 1, "checkpoint_every": 1, "warmup_steps": 1}}
    full = train_run(cfg)
    with pytest.raises(Interrupted):
        train_run(cfg, callbacks=[StopAt()])
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store)
    cut = client.search_runs([client.get_experiment_by_name("harness").experiment_id],
                             order_by=["attributes.start_time DESC"], max_results=1)[0].info.run_id
    resumed = train_run(resume=cut, tracking_uri=store)
    assert resumed.status == "FINISHED" and resumed.metrics["val/loss"] == full.metrics["val/loss"]
    a, b = load(full.run_id).model.state_dict(), load(cut).model.state_dict()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_the_memory_check_counts_one_micro_batchs_logits():
    from harness.run.build import task_info
    from harness.run.resources import estimate

    p = the_plan(batch_size=64)
    info = task_info(p, build(p).task)
    whole = estimate(p, info, lambda p, info: build(p).model)
    micro = estimate(the_plan(batch_size=64, micro_batch_size=8), info, lambda p, info: build(p).model)
    assert micro.logits_bytes * 8 == whole.logits_bytes and micro.state_bytes == whole.state_bytes


def test_the_logged_training_loss_is_the_whole_batchs_at_any_micro_batch_size(tmp_path):
    """``train/loss`` is the optimizer batch's token-weighted loss, summed over its micro-batches
    (g2p: rows score different numbers of tokens), not the last micro-batch's: the same curve
    with and without micro-batches (identical weights in float64)."""
    from mlflow.tracking import MlflowClient

    from harness.run.pipeline import train as train_run

    store = f"sqlite:///{tmp_path / 'm.db'}"
    curves = []
    for micro in (None, 3):
        result = train_run({
            "task": {"name": "g2p", "params": {"length": 8, "num_train": 64, "num_val": 8, "decode_eval": False}},
            "model": {"name": "transformer", "params": {"d_model": 16, "layers": 1, "heads": 2, "dropout": 0.0}},
            "train": {"max_steps": 4, "batch_size": 8, "val_every": 4, "progress": False, "num_threads": 1,
                      "log_attention": False, "precision": "64-true", "micro_batch_size": micro},
            "tracking": {"uri": store}})
        history = MlflowClient(store).get_metric_history(result.run_id, "train/loss")
        curves.append({m.step: m.value for m in history})
    assert sorted(curves[0]) == [0, 1, 2, 3]
    for step, value in curves[0].items():
        assert curves[1][step] == pytest.approx(value, rel=1e-9), (step, curves)
