"""Faults of the third probe (issue 33) on budgets and sizes: values the schema once accepted
but no machine could finish (a FLOP budget past a year on the fastest device in the peak
table, 10^16 tokens, a 25 x 25 scaling grid, a vocabulary of 10^9) are refused at once with
what they would cost; scaling transfer fields missing or zero are the schema's messages, not
a KeyError or a ZeroDivisionError; a size too large to allocate is one paragraph."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from text import one_paragraph

from harness.cli.main import main
from harness.config import parse_run_config
from harness.errors import ConfigError
from harness.runtime import bounds
from harness.runtime.devices import PEAKS
from harness.study.schema import parse_study_config
from harness.yaml_io import read_yaml

ROOT = Path(__file__).resolve().parents[1]
TINY = ["train", "--task", "copy", "--model", "transformer", "--set", "model.params.d_model=16",
        "--set", "model.params.layers=1", "--no-progress"]


def test_the_flop_bound_is_a_year_at_the_fastest_peak():
    fastest = max(p.bf16_tflops for p in PEAKS) * 1e12
    assert bounds.max_flops() == pytest.approx(fastest * 365.25 * 86400)
    assert bounds.flops_problem(bounds.max_flops() * 0.99) is None
    assert "years" in bounds.flops_problem(bounds.max_flops() * 10)


@pytest.mark.parametrize("value", ["1e30", "1e24"])
def test_a_flop_budget_past_a_year_is_refused_before_anything(capsys, tmp_path, value):
    code = main([*TINY, "--set", f"train.max_flops={value}", "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}"])
    line = one_paragraph(capsys.readouterr().err)
    assert code == 2 and "train.max_flops" in line and "years" in line
    assert not (tmp_path / "m.db").exists(), "nothing recorded"


def test_a_token_budget_of_a_trillion_years_of_steps_is_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / "home"))
    code = main([*TINY, "--set", "train.max_tokens=10000000000000000", "--tracking-uri",
                 f"sqlite:///{tmp_path / 'm.db'}"])
    line = one_paragraph(capsys.readouterr().err)
    assert code == 2 and "train.max_tokens" in line and "optimizer steps" in line


def test_a_vocabulary_of_a_billion_is_a_memory_refusal_before_building(capsys, tmp_path):
    import time

    started = time.perf_counter()
    code = main([*TINY, "--set", "task.params.vocab=1000000000", "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}"])
    line = one_paragraph(capsys.readouterr().err)
    assert code == 1 and "task.params.vocab=1,000,000,000" in line and "GiB" in line
    assert time.perf_counter() - started < 60


def _scaling(**changes) -> dict:
    data = read_yaml(ROOT / "studies/scaling_lm.yaml")
    cpu = data.pop("profiles")["cpu"]
    data["scaling"] = copy.deepcopy(cpu["scaling"])
    data["candidates"] = cpu["candidates"][:1]
    for key, value in changes.items():
        data["scaling"][key] = value
    return data


@pytest.mark.parametrize("change, field", [
    ({"transfer": {"rule": "scaled", "width": 32}}, "needs lr"),
    ({"transfer": {"rule": "scaled", "lr": 0.01}}, "needs lr"),
    ({"transfer": {"rule": "scaled", "lr": 0.01, "width": 0}}, "scaling.transfer.width"),
    ({"budgets": [1e10, 1e20, 1e30]}, "years"),
    ({"sizes": [{"d_model": 16 + 2 * i, "layers": 2, "heads": 2} for i in range(25)],
      "budgets": [1e10 * 1.2**i for i in range(25)]}, "625 cells"),
])
def test_scaling_grids_beyond_meaning_are_the_schema_s_messages(change, field):
    with pytest.raises(ConfigError) as raised:
        parse_study_config(_scaling(**change))
    assert field in str(raised.value)


def test_a_plain_study_s_flop_budget_past_a_year_is_refused():
    data = read_yaml(ROOT / "studies/quickstart.yaml")
    data.pop("profiles", None)
    data["budget"] = {**data["budget"], "flops": 1e30}
    data["budget"].pop("steps", None)
    with pytest.raises(ConfigError, match="budget.flops.*years"):
        parse_study_config(data)


def test_a_run_config_below_the_bound_is_accepted():
    cfg = parse_run_config({"task": {"name": "copy"}, "model": {"name": "transformer"},
                            "train": {"max_flops": 1e21}})
    assert cfg.train.max_flops == 1e21


def test_plugins_null_in_a_study_file_is_said(tmp_path):
    import yaml

    from harness.study.schema import load_study_config

    data = read_yaml(ROOT / "studies/quickstart.yaml")
    data["plugins"] = None
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="plugins is null"):
        load_study_config(tmp_path / "s.yaml", profile="cpu")
