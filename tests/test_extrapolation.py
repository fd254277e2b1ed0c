"""The length-extrapolation protocol, end to end.

* ``lm_windows``: which stream tokens each protocol scores and how much context each
  scored token sees (non-overlapping windows vs the sliding last-k protocol).
* Real (tiny) runs through ``harness.train`` into a real MLflow store, read back with
  ``MlflowClient``: a metric per evaluation length, the extrapolation plot, and models that
  cannot run a length reported as not applicable instead of crashing or clamping.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import harness
from harness.data.formats import collate
from harness.data.tasks import lm_windows
from harness.registry.specs import ModelSpec

STREAM = list(range(1000, 1100))  # token value = 1000 + its index in the stream


def scored(windows, start_of):
    """(stream index of each scored target, number of context tokens it sees) pairs."""
    out = []
    for w, window in enumerate(windows):
        for t, is_scored in enumerate(window["loss_mask"]):
            if is_scored:
                target = window["tokens"][t + 1]
                assert target == STREAM[start_of(w) + t + 1]
                out.append((target - STREAM[0], t + 1))
    return out


def test_non_overlapping_windows_score_every_token_once():
    windows = lm_windows(STREAM, length=10)
    assert len(windows) == 9  # 9 * 10 + 1 <= 100 tokens
    for w, window in enumerate(windows):
        assert window["tokens"] == STREAM[10 * w: 10 * w + 11]
    pairs = scored(windows, lambda w: 10 * w)
    assert [i for i, _ in pairs] == list(range(1, 91))  # each once, in order
    # context restarts in every window: 1, 2, ..., 10 tokens
    assert [c for _, c in pairs] == list(range(1, 11)) * 9


def test_sliding_windows_score_only_the_last_k_with_long_context():
    length, k = 10, 3
    windows = lm_windows(STREAM, length=length, score_last=k)
    for w, window in enumerate(windows):
        assert window["tokens"] == STREAM[k * w: k * w + length + 1]
        assert window["loss_mask"] == [False] * (length - k) + [True] * k
    pairs = scored(windows, lambda w: k * w)
    indices = [i for i, _ in pairs]
    # contiguous and disjoint: every token from the first scored one on, exactly once
    assert indices == list(range(length - k + 1, indices[-1] + 1))
    assert len(windows) == (len(STREAM) - length - 1) // k + 1
    # every scored token sees at least length - k + 1 tokens (its own window's prefix)
    assert min(c for _, c in pairs) == length - k + 1
    assert max(c for _, c in pairs) == length


def test_sliding_protocol_batches_score_exactly_the_masked_targets():
    windows = lm_windows(STREAM, length=8, count=4, score_last=2)
    assert len(windows) == 4
    batch = collate(windows, "lm", "lm")
    assert batch["tokens"].shape == (4, 8)
    expected = [STREAM[2 * w + t + 1] for w in range(4) for t in (6, 7)]
    assert batch["targets"][batch["loss_mask"]].tolist() == expected
    # inputs are the window's tokens; a scored target's context is the row up to it
    assert batch["tokens"][1].tolist() == STREAM[2: 10]


def test_score_last_equal_to_length_is_the_non_overlapping_protocol():
    assert lm_windows(STREAM, 7, score_last=7) == lm_windows(STREAM, 7)


@pytest.mark.parametrize("k", [0, 11])
def test_score_last_outside_the_window_is_rejected(k):
    with pytest.raises(ValueError, match="score_last"):
        lm_windows(STREAM, 10, score_last=k)


# -- end to end, through harness.train and MLflow -------------------------------------------
TRAIN_LENGTH, EVAL_LENGTHS = 4, (6, 8)


def run_config(model="transformer", position=None, **position_params):
    model_cfg = {"name": model, "params": {"d_model": 16, "layers": 1}}
    if model == "transformer":
        model_cfg["params"].update(heads=2, ffn_mult=2)
        model_cfg["position"] = {"name": position, "params": position_params}
    return {
        "task": {"name": "copy", "params": {"length": TRAIN_LENGTH, "eval_lengths": list(EVAL_LENGTHS),
                                            "num_train": 64, "num_val": 16, "vocab": 4}},
        "model": model_cfg,
        "train": {"max_steps": 3, "batch_size": 16, "val_every": 3, "warmup_steps": 0,
                  "progress": False, "log_attention": False, "num_threads": 1},
        "tracking": {"experiment": "extrapolation"},
    }


RUNS = {
    "sinusoidal": run_config(position="sinusoidal"),
    "learned": run_config(position="learned"),
    # copy at length n is 2n model inputs: a table of 2 x 8 rows covers length 8
    "learned_x2": run_config(position="learned", table_factor=2.0),
    "mlp_mixer": run_config(model="mlp_mixer"),
}


def build_flat_lm(config, *, task, attention=None, position=None):
    """A language model that reads its whole input as one flat vector, so it can only run
    inputs of the length it was built for; it declares that in its spec (extrapolates=False)
    and, unlike the built-in models, has no ``supports_length``."""
    from torch import nn

    class FlatLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.length, self.vocab = task.max_length, task.vocab_size
            self.embed = nn.Embedding(task.vocab_size, 4)
            self.mix = nn.Linear(4 * self.length, self.length * task.vocab_size)

        def forward(self, tokens, padding_mask=None):
            batch, length = tokens.shape
            x = self.embed(tokens).new_zeros(batch, self.length, 4)  # fails past self.length
            x[:, :length] = self.embed(tokens)
            causal = self.mix(x.flatten(1)).view(batch, self.length, self.vocab)  # (not causal)
            return causal[:, :length]

    return FlatLM()


class FlatLMPlugin:
    @harness.hookimpl
    def harness_register_model(self, register):
        register(ModelSpec(name="flat_lm", build=build_flat_lm, extrapolates=False))


@pytest.fixture(scope="module")
def finished_runs(tmp_path_factory):
    """Each run of RUNS trained once into one store: (client, {name: RunResult})."""
    from harness.store import tracking

    root = tmp_path_factory.mktemp("extrapolation")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HARNESS_HOME", str(root / ".harness"))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        mp.chdir(root)
        results = {name: harness.train(cfg) for name, cfg in RUNS.items()}
        registry = harness.load_plugins(plugins=[FlatLMPlugin()])
        flat = run_config(model="flat_lm")
        del flat["model"]["params"]
        results["flat_lm"] = harness.train(flat, registry=registry)
        from mlflow.tracking import MlflowClient

        yield MlflowClient(tracking.tracking_uri()), results


def download_json(client, run_id, path, tmp_path) -> dict:
    local = client.download_artifacts(run_id, path, str(tmp_path))
    return json.loads(Path(local).read_text())


@pytest.mark.slow
def test_every_evaluation_length_is_logged_with_its_plot(finished_runs, tmp_path):
    client, results = finished_runs
    result = results["sinusoidal"]
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    metrics = run.data.metrics
    for length in (TRAIN_LENGTH, *EVAL_LENGTHS):
        for name in ("acc", "loss", "exact"):
            assert f"val/{name}_len{length}" in metrics
        assert 0.0 <= metrics[f"val/acc_len{length}"] <= 1.0
    assert metrics["val/acc"] == metrics[f"val/acc_len{TRAIN_LENGTH}"]
    assert "harness.not_applicable_lengths" not in run.data.tags
    assert result.not_applicable == []
    artifacts = {a.path for a in client.list_artifacts(result.run_id, "plots")}
    assert {"plots/extrapolation.png", "plots/extrapolation.json"} <= artifacts
    curve = download_json(client, result.run_id, "plots/extrapolation.json", tmp_path)
    assert curve["train_length"] == TRAIN_LENGTH
    assert {int(k): v for k, v in curve["points"].items()} == {
        n: metrics[f"val/acc_len{n}"] for n in (TRAIN_LENGTH, *EVAL_LENGTHS)
    }
    png = client.download_artifacts(result.run_id, "plots/extrapolation.png", str(tmp_path))
    assert Path(png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["learned", "mlp_mixer", "flat_lm"])
def test_lengths_a_model_cannot_run_are_tagged_not_applicable(finished_runs, tmp_path, name):
    client, results = finished_runs
    result = results[name]
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["harness.not_applicable_lengths"] == ",".join(map(str, EVAL_LENGTHS))
    assert result.not_applicable == list(EVAL_LENGTHS)
    assert f"val/acc_len{TRAIN_LENGTH}" in run.data.metrics
    for length in EVAL_LENGTHS:
        assert not any(k.endswith(f"_len{length}") for k in run.data.metrics)
    curve = download_json(client, result.run_id, "plots/extrapolation.json", tmp_path)
    assert list(curve["points"]) == [str(TRAIN_LENGTH)]


@pytest.mark.slow
def test_learned_with_a_larger_table_evaluates_the_lengths_it_covers(finished_runs):
    client, results = finished_runs
    run = client.get_run(results["learned_x2"].run_id)
    assert "harness.not_applicable_lengths" not in run.data.tags
    for length in EVAL_LENGTHS:
        assert f"val/acc_len{length}" in run.data.metrics
