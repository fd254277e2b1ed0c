"""Attention-based seq2seq models learn ``reverse`` on CPU, through the real training path.

Each test is one ``harness.train`` run (Lightning, MLflow in the per-test store) on
reversing 8 symbols from an alphabet of 8; the bar is free-running greedy decoding, which
must reverse at least 90% of the validation sources exactly (``val/greedy_exact``, the
reverse task's decoding metric), on top of >= 90% teacher-forced token accuracy.
"""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

import harness
from harness.store import tracking


def reverse_run(model: str, attention: str, params: dict, steps: int, **train) -> dict:
    return {
        "task": {"name": "reverse",
                 "params": {"length": 8, "vocab": 8, "num_train": 4000, "num_val": 200}},
        "model": {"name": model, "params": params, "attention": {"name": attention}},
        "train": {"max_steps": steps, "batch_size": 64, "lr": 3e-3, "warmup_steps": 50,
                  "val_every": steps, "progress": False, "num_threads": 1, **train},
        "tracking": {"experiment": "reverse"},
    }


def assert_learned(result) -> None:
    assert result.status == "FINISHED"
    assert result.metrics["val/acc"] >= 0.9, result.metrics
    assert result.metrics["val/greedy_exact"] >= 0.9, result.metrics


@pytest.mark.slow
@pytest.mark.parametrize(("style", "attention"), [("bahdanau", "additive"), ("luong", "general")])
def test_rnn_seq2seq_with_attention_learns_reverse(registry, style, attention):
    result = harness.train(
        reverse_run("rnn_seq2seq", attention, {"embed_dim": 32, "hidden": 64, "style": style}, 300),
        registry=registry,
    )
    assert_learned(result)
    # the decoder's alignment (target x source) is logged as the run's attention plot
    artifacts = MlflowClient(tracking.tracking_uri()).list_artifacts(result.run_id, "attention")
    assert any(a.path.endswith(".png") for a in artifacts)


@pytest.mark.slow
def test_encoder_decoder_learns_reverse_with_scheduled_sampling_and_label_smoothing(registry):
    params = {"d_model": 32, "heads": 2, "encoder_layers": 2, "decoder_layers": 2, "ffn_mult": 2}
    result = harness.train(
        reverse_run("encoder_decoder", "multi_head", params, 400, lr=5e-3,
                    scheduled_sampling=0.25, label_smoothing=0.1),
        registry=registry,
    )
    assert_learned(result)
