"""One tiny real ``harness.train`` run per kind of task added in issue 5: the whole path
(registry, data, batches, Lightning, evaluation at every length, MLflow) works and records
each task's metrics. A few optimizer steps each: these prove plumbing, not learning.

Budget: about 30 s in all on 2 CPU cores (each run well under 30 s).
"""

from __future__ import annotations

import math
from typing import Any

import pytest

import harness
from harness.store import tracking

TINY_TRAIN = {"max_steps": 3, "batch_size": 8, "val_every": 3, "warmup_steps": 0,
              "accelerator": "cpu", "devices": 1, "num_threads": 1, "progress": False,
              "log_attention": False}
TRANSFORMER = {"name": "transformer", "params": {"d_model": 32, "layers": 1, "heads": 2}}
ENCODER_DECODER = {"name": "encoder_decoder",
                   "params": {"d_model": 32, "encoder_layers": 1, "decoder_layers": 1, "heads": 2}}


def run(registry: Any, task: dict[str, Any], model: dict[str, Any]) -> Any:
    result = harness.train({"task": task, "model": model, "train": TINY_TRAIN,
                            "tracking": {"experiment": "tasks"}}, registry=registry)
    assert result.status == "FINISHED" and result.run_id
    return result


def logged(result: Any) -> dict[str, float]:
    """The metrics as MLflow stored them, not as the run returned them."""
    import mlflow

    return dict(mlflow.MlflowClient(tracking.tracking_uri()).get_run(result.run_id).data.metrics)


@pytest.mark.slow
def test_lm_probe_trains_and_evaluates_past_its_training_length(registry):
    task = {"name": "associative_recall",
            "params": {"length": 32, "num_kv_pairs": 4, "vocab": 32, "num_train": 48,
                       "num_val": 16, "eval_lengths": [64]}}
    metrics = run(registry, task, TRANSFORMER).metrics
    for key in ("val/acc", "val/acc_len32", "val/acc_len64", "val/exact_len64"):
        assert 0.0 <= metrics[key] <= 1.0, key


@pytest.mark.slow
def test_char_lm_logs_perplexity_and_bits_per_character_with_sliding_evaluation(registry):
    task = {"name": "char_lm",
            "params": {"length": 32, "num_train": 48, "num_val": 4, "eval_lengths": [64],
                       "eval_protocol": "sliding", "score_last": 16}}
    result = run(registry, task, TRANSFORMER)
    for n in (32, 64):
        loss = result.metrics[f"val/loss_len{n}"]
        assert math.isfinite(loss) and loss > 0
        assert result.metrics[f"val/ppl_len{n}"] == pytest.approx(math.exp(loss))
        assert result.metrics[f"val/bpc_len{n}"] == pytest.approx(loss / math.log(2))
    assert "val/bpc" in logged(result)


@pytest.mark.slow
@pytest.mark.parametrize("model", [TRANSFORMER, ENCODER_DECODER], ids=["decoder_only", "encoder_decoder"])
def test_g2p_reports_phoneme_and_word_error_rates(registry, model):
    task = {"name": "g2p", "params": {"length": 8, "num_train": 48, "num_val": 12,
                                      "eval_lengths": [10]}}
    result = run(registry, task, model)
    stored = logged(result)
    for key in ("val/per", "val/wer", "val/per_len10", "val/wer_len10"):
        assert key in stored and stored[key] == pytest.approx(result.metrics[key])
    assert result.metrics["val/per"] > 0, "three steps cannot have learned g2p"
    assert 0.0 <= result.metrics["val/wer"] <= 1.0
