"""What every run reports about its cost (``cost/*``), FLOPs counted against the model's
arithmetic, bf16 autocast on the CPU, and ``train.compile`` (same loss curve as eager; a
backend that fails gives a clear error)."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch
from cost_models import Bigram, BigramPlugin
from mlflow.tracking import MlflowClient

import harness
from harness.keys import Metric
from harness.run import fit
from harness.run.system import CompileFailed
from harness.store import tracking

VOCAB = 4 + 4  # copy's 4 symbols after the 4 special tokens
TASK = {"name": "copy", "params": {"length": 4, "vocab": 4, "num_train": 64, "num_val": 16,
                                    "eval_lengths": [6]}}
TRAIN = {"max_steps": 6, "batch_size": 8, "val_every": 3, "progress": False, "log_attention": False,
         "accelerator": "cpu", "num_threads": 1, "warmup_steps": 1}


@pytest.fixture(scope="module")
def reg():
    return harness.load_plugins(plugins=[BigramPlugin()])


def config(model: dict[str, Any], **train: Any) -> dict[str, Any]:
    return {"task": copy.deepcopy(TASK), "model": model, "train": {**TRAIN, **train}}


def test_a_run_logs_every_cost_and_the_flops_of_its_matmuls(reg):
    d_model = 8
    result = harness.train(config({"name": "bigram", "params": {"d_model": d_model}}), registry=reg)
    m = MlflowClient(tracking.tracking_uri()).get_run(result.run_id).data.metrics
    for key in (Metric.PARAMS, Metric.TOKENS_PER_S, Metric.EVAL_TOKENS_PER_S, Metric.FLOPS_PER_TOKEN,
                Metric.PEAK_TENSOR_MB, Metric.PROCESS_PEAK_RSS_MB, Metric.DATA_WAIT_SHARE,
                Metric.FIT_S, Metric.EVAL_S, Metric.TOTAL_S, Metric.THREADS):
        assert key in m and math.isfinite(m[key]) and m[key] >= 0, key
    # the read-out's forward, its input gradient and its weight gradient: 3 matmuls of
    # 2 * d_model * vocab FLOPs per token (the embedding and the loss do no matmul)
    assert m[Metric.FLOPS_PER_TOKEN] == 6 * d_model * VOCAB
    assert Metric.MFU not in m  # no peak for a CPU: no utilisation figure
    assert 0 <= m[Metric.DATA_WAIT_SHARE] < 1
    assert m[Metric.TOTAL_S] >= m[Metric.FIT_S] + m[Metric.EVAL_S]
    assert m[Metric.THREADS] == 1


def test_bf16_autocast_trains_on_the_cpu_close_to_fp32(reg):
    model = {"name": "bigram", "params": {"d_model": 16}}
    Bigram.seen_autocast.clear()
    fp32 = harness.train(config(model, lr=0.02), registry=reg).metrics
    assert set(Bigram.seen_autocast) == {None}
    Bigram.seen_autocast.clear()
    bf16 = harness.train(config(model, lr=0.02, precision="bf16-mixed"), registry=reg).metrics
    assert set(Bigram.seen_autocast) == {torch.bfloat16}  # every forward ran under autocast
    for key in ("val/loss", "val/acc", "val/loss_len6"):
        assert math.isfinite(bf16[key])
    assert bf16["val/loss"] == pytest.approx(fp32["val/loss"], rel=0.03)


def _broken_backend(gm: Any, example_inputs: Any) -> Any:
    raise RuntimeError("this backend cannot compile anything")


def test_a_model_that_cannot_compile_fails_its_run_with_what_to_do(reg, monkeypatch):
    monkeypatch.setattr(fit, "COMPILE_BACKEND", _broken_backend)
    cfg = config({"name": "bigram"}, compile=True)
    with pytest.raises(CompileFailed, match=r"train\.compile: torch\.compile could not compile .*"
                                            r"cannot compile anything.*train\.compile: false"):
        harness.train(cfg, registry=reg)
    client = MlflowClient(tracking.tracking_uri())
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FAILED" and "CompileFailed" in run.data.tags["harness.failure"]


@pytest.mark.slow
def test_a_compiled_transformer_follows_the_eager_loss_curve(registry):
    """Inductor on the CPU: the same losses step by step (to float32 reassociation), and the
    costs are measured on the compiled run too."""
    model = {"name": "transformer", "params": {"d_model": 16, "layers": 1, "heads": 2, "dropout": 0.0},
             "attention": {"name": "multi_head"}, "position": {"name": "sinusoidal"}}
    client = MlflowClient(tracking.tracking_uri())
    curves, results = [], []
    for compiled in (False, True):
        result = harness.train(config(model, max_steps=8, val_every=8, compile=compiled), registry=registry)
        history = client.get_metric_history(result.run_id, "train/loss")
        curves.append([h.value for h in sorted(history, key=lambda h: h.step)])
        results.append(result.metrics)
    eager, compiled = curves
    assert len(eager) == len(compiled) >= 2
    assert compiled == pytest.approx(eager, rel=1e-4, abs=1e-5)
    assert results[1]["val/loss"] == pytest.approx(results[0]["val/loss"], rel=1e-4)
    assert results[1][Metric.FLOPS_PER_TOKEN] == results[0][Metric.FLOPS_PER_TOKEN]
