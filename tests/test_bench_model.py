"""``harness bench model``: the reference has the harness model's shapes, FLOPs are counted by
the stated formula, the gate fails where it should, and the command measures and records."""

from __future__ import annotations

import pytest
import torch
from text import flat

import harness
from harness.bench import model as bench
from harness.cli import main as cli

SMALL = {
    "task": {"name": "char_lm", "params": {"length": 16, "num_train": 64, "num_val": 2}},
    "model": {"name": "transformer", "params": {"d_model": 32, "layers": 2, "heads": 4},
              "attention": {"name": "multi_head"}, "position": {"name": "sinusoidal"}},
    "train": {"batch_size": 4},
}


def settings(**model_changes):
    config = {**SMALL, "model": {**SMALL["model"], **model_changes}}
    return bench.Settings(config=config, steps=6, warmup=2, repeats=1)


def harness_model(s: bench.Settings, shapes: dict):
    m = s.config["model"]
    return harness.create_model(m["name"], vocab_size=shapes["vocab"], max_length=shapes["length"],
                                attention=(m.get("attention") or {}).get("name"), **m["params"])


@pytest.mark.parametrize("model", [
    {},
    {"params": {"d_model": 32, "layers": 3, "heads": 2, "norm": "post", "tie_embeddings": False}},
    {"name": "lstm", "params": {"width": 24, "layers": 2}, "attention": None, "position": None},
    {"name": "gru", "params": {"width": 24, "layers": 1, "tie_embeddings": False}, "attention": None,
     "position": None},
])
def test_reference_has_the_harness_models_parameters(model):
    s = settings(**model)
    shapes = bench.reference_shapes(s)
    assert isinstance(shapes, dict), shapes
    reference = bench.load_reference(s.reference).build(shapes)
    ours = harness_model(s, shapes)
    assert bench.count_params(reference) == bench.count_params(ours)
    assert bench.matmul_params(reference) == bench.matmul_params(ours)
    tokens = torch.randint(4, shapes["vocab"], (2, shapes["length"]))
    assert reference(tokens).shape == ours(tokens).shape == (2, shapes["length"], shapes["vocab"])


@pytest.mark.parametrize("change, reason", [
    ({"position": {"name": "rope"}}, "sinusoidal"),
    ({"attention": {"name": "linear"}}, "multi_head"),
    ({"params": {"d_model": 32, "layers": 2, "heads": 4, "mlp": "swiglu"}}, "GELU"),
])
def test_no_reference_says_why(change, reason):
    why = bench.reference_shapes(settings(**change))
    assert isinstance(why, str) and reason in why


@pytest.mark.parametrize("tie", [True, False])
def test_flops_per_token_is_6n_plus_the_attention_term(tie):
    s = settings(params={**SMALL["model"]["params"], "tie_embeddings": tie})
    shapes = bench.reference_shapes(s)
    model = harness_model(s, shapes)
    d, layers, length = 32, 2, shapes["length"]
    n = sum(p.numel() for p in model.parameters())  # tied head: the table counts once, as a matmul
    if not tie:
        n -= shapes["vocab"] * d  # an untied input table is a lookup: it multiplies nothing
    assert bench.matmul_params(model) == n
    assert bench.flops_per_token(model, length) == 6 * n + 12 * layers * d * length
    untied = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10))
    assert bench.matmul_params(untied) == 4 * 10 + 10  # the lookup table multiplies nothing


def test_throughput_counts_the_wall_time_between_steps_but_not_the_interleaved_reference():
    steps = [(0.0, 1.0, 100), (1.5, 2.0, 100), (2.0, 3.0, 100), (3.5, 4.0, 100)]
    rate, step_ms = bench.throughput(steps, warmup=1)
    assert rate == pytest.approx(300 / 2.5)  # from the start of step 1 to the end of step 3
    assert step_ms == pytest.approx(500.0)
    reference = [(1.0, 1.2), (3.0, 3.4)]  # the second lies in the window: not the harness's time
    assert bench.throughput(steps, 1, reference)[0] == pytest.approx(300 / 2.1)


def test_gate_fails_below_the_ratio_and_above_the_fixed_cost():
    ok = bench.Summary(10.0, 10.0, 0.97, 1.0, None, None)
    assert bench.failures(ok, 0.95, 3.0) == []
    slow = bench.Summary(9.0, 10.0, 0.90, 4.0, None, None)
    failed = bench.failures(slow, 0.95, 3.0)
    assert len(failed) == 2 and "0.900 < 0.95" in failed[0] and "4.00 s > 3.0 s" in failed[1]
    assert bench.failures(bench.Summary(None, None, None, None, None, None), 0.95, None)  # nothing measured


@pytest.mark.slow
def test_bench_model_command_measures_both_and_records(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    out = tmp_path / "model.md"
    args = ["bench", "model", "--task", "char_lm", "--model", "transformer", "--attention", "multi_head",
            "--set", "task.params.length=16", "--set", "task.params.num_train=64", "--set",
            "task.params.num_val=2", "--set", "model.params.d_model=32", "--set", "train.batch_size=4",
            "--steps", "5", "--warmup", "2", "--repeats", "1", "--peak-tflops", "0.1", "--output", str(out),
            "--min-ratio", "1000", "--max-fixed-cost", "1000"]
    assert cli.main(args) == 1  # the record is written, then the gate fails: no harness is 1000x faster
    err = flat(capsys.readouterr().err)
    assert "FAILED: harness / reference" in err and "fixed cost" not in err
    text = out.read_text()
    assert "| harness (`harness.train`) |" in text and "| plain PyTorch reference |" in text
    assert "Fixed cost per run" in text and "Machine load" in text and "CPU " in text
    row = next(line for line in text.splitlines() if line.startswith("| 1 |"))
    ratio, fixed = float(row.split("|")[6]), float(row.split("|")[10])
    assert ratio > 0 and fixed > 0


def test_bench_model_needs_a_config():
    assert cli.main(["bench", "model"]) == 2
