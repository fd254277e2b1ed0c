"""Verdicts of real studies, end to end on CPU: a deliberately handicapped candidate (dropout
0.9, fixed) is ranked below and the report names the fixed parameter that differs; two
identical candidates are reported as indistinguishable; too few seeds are warned about
before training; the exports and the notebook API read the same study."""

from __future__ import annotations

import copy
import csv
import json
from typing import Any

import pytest
import yaml
from mlflow.tracking import MlflowClient
from text import flat

import harness
from harness.cli.main import main

MODEL = {"name": "transformer", "params": {"layers": 1, "heads": 2, "d_model": 16, "ffn_mult": 2},
         "search_declared": False,
         "attention": {"name": "multi_head", "search_declared": False},
         "position": {"name": "sinusoidal", "search_declared": False}}
STUDY: dict[str, Any] = {
    "task": {"name": "copy", "params": {"length": 4, "vocab": 4, "num_train": 256, "num_val": 64}},
    "objective": {"metric": "acc"},
    "train": {"batch_size": 16, "val_every": 20, "warmup_steps": 2, "num_threads": 1, "lr": 0.02},
    "budget": {"trials": 1, "steps": 60},
}


def candidate(name: str, **params: Any) -> dict[str, Any]:
    model = copy.deepcopy(MODEL)
    model["params"].update(params)
    return {"name": name, "model": model}


def write_study(tmp, name: str, candidates: list[dict[str, Any]], **top: Any):
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(copy.deepcopy(STUDY) | {"name": name, "candidates": candidates} | top))
    return path


@pytest.fixture(scope="module")
def handicapped(tmp_path_factory):
    """6 seeds: the fewest with which the exact sign-flip test can reach 0.05 (2/2^6)."""
    tmp = tmp_path_factory.mktemp("handicap")
    path = write_study(tmp, "handicap", [candidate("good"), candidate("handicapped", dropout=0.9)],
                       confirm={"seeds": 6})
    storage, uri = f"sqlite:///{tmp / 'optuna.db'}", f"sqlite:///{tmp / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HARNESS_HOME", str(tmp / ".harness"))
        assert main(["study", "run", str(path), "--storage", storage, "--tracking-uri", uri,
                     "--report", "--out", str(tmp / "report"), "--format", "md,json",
                     "--format", "csv", "--format", "latex"]) == 0
    return {"storage": storage, "uri": uri, "out": tmp / "report"}


@pytest.mark.slow
def test_a_handicapped_candidate_is_ranked_below(handicapped):
    out = handicapped["out"]
    summary = json.loads((out / "summary.json").read_text())
    by_name = {c["name"]: c for c in summary["candidates"]}
    good, bad = by_name["good"], by_name["handicapped"]
    # every seed of the handicapped candidate is below the good one's: the test can resolve it
    assert all(bad["values"][s] < good["values"][s] for s in good["values"])
    assert summary["best"] == "good" and summary["best_group"] == ["good"]
    assert (good["rank"], bad["rank"]) == (1, 2)
    assert bad["vs_best"]["p_value"] == pytest.approx(2 / 2**6)
    assert bad["vs_best"]["mean_difference"] == pytest.approx(bad["mean"] - good["mean"])
    assert summary["fixed_differences"] == {"model.params.dropout": {"good": "0.0", "handicapped": "0.9"}}
    md = (out / "results.md").read_text()
    # enough seeds: no warning line; one trial each, so the first line says the recipe was shared
    first, rest = md.split("\n\n", 1)
    assert first.startswith("**Shared recipe, not tuned") and rest.startswith("# Study handicap")
    assert "Resolved below the best: handicapped" in md and "| model.params.dropout | 0.0 | 0.9 |" in md
    rows = list(csv.DictReader((out / "candidates.csv").open()))
    assert [r["candidate"] for r in rows] == ["good", "handicapped"]
    assert rows[0]["best_group"] == "true" and rows[1]["best_group"] == "false"
    seeds = list(csv.DictReader((out / "seeds.csv").open()))
    assert len(seeds) == 12 and {r["run_id"] for r in seeds} == {
        run for c in summary["candidates"] for run in c["runs"].values()}
    assert r"\mathbf{" in (out / "table.tex").read_text()
    assert not (out / "results.html").exists()  # only the formats asked for
    logged = {f.path for f in MlflowClient(handicapped["uri"]).list_artifacts(summary["parent_run_id"], "report")}
    assert {"report/table.tex", "report/candidates.csv", "report/seeds.png"} <= logged


@pytest.mark.slow
def test_notebook_api_reads_the_same_study(handicapped, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", handicapped["uri"])
    runs = harness.study_runs("handicap", storage=handicapped["storage"])
    assert len(runs) == 14  # 2 candidates x (1 tuning trial + 6 seeds)
    assert list(runs[["candidate", "phase"]].value_counts().sort_index().items()) == [
        (("good", "confirm"), 6), (("good", "tune"), 1),
        (("handicapped", "confirm"), 6), (("handicapped", "tune"), 1)]
    confirm = runs[runs.phase == "confirm"]
    assert sorted(confirm.seed.unique()) == [1, 2, 3, 4, 5, 6]
    assert (confirm["params.model.params.dropout"].astype(float) >= 0).all()
    summary = harness.study_summary("handicap", storage=handicapped["storage"])
    means = confirm.groupby("candidate").objective.mean()
    for cand in summary["candidates"]:
        assert cand["mean"] == pytest.approx(means[cand["name"]])
    assert summary == json.loads((handicapped["out"] / "summary.json").read_text())


@pytest.mark.slow
def test_identical_candidates_are_indistinguishable(tmp_path, capsys):
    path = write_study(tmp_path, "twins", [candidate("one"), candidate("two")],
                       budget={"trials": 1, "steps": 20},
                       confirm={"seeds": 3, "test": "t", "vary_data": True})
    assert main(["study", "run", str(path), "--report", "--out", str(tmp_path / "r")]) == 0
    assert "warning" not in capsys.readouterr().err  # the t-test can resolve with 3 seeds
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    one, two = summary["candidates"]
    assert one["values"] == two["values"]  # same configuration, same seeds: same runs
    # vary_data: the k-th confirmation seed draws data sample data_seed + k, for both twins
    runs = harness.study_runs("twins")
    seeds = runs[["phase", "seed", "params.train.data_seed"]].drop_duplicates()
    assert sorted(map(tuple, seeds.astype(str).values.tolist())) == [
        ("confirm", "1", "1"), ("confirm", "2", "2"), ("confirm", "3", "3"), ("tune", "0", "0")]
    assert len(set(one["values"].values())) > 1
    assert summary["resolved"] is False and sorted(summary["best_group"]) == ["one", "two"]
    assert one["rank"] == two["rank"] == 1 and summary["front"] is None
    md = (tmp_path / "r" / "results.md").read_text()
    body = md.split("\n\n", 1)[1]  # after the first line (one trial each: a shared recipe)
    assert md.startswith("**Shared recipe, not tuned")
    assert "No difference is resolved" in body and "★" not in body and "**" not in body
    assert "and the data sample too (confirm.vary_data" in md


def test_vary_data_is_validated_and_fingerprinted():
    from harness.errors import ConfigError
    from harness.study.schema import parse_study_config

    data = copy.deepcopy(STUDY) | {"name": "v", "candidates": [candidate("a")]}
    plain = parse_study_config(data)
    assert not plain.confirm.vary_data and plain.confirm.test == "sign_flip"
    assert "vary_data" not in json.dumps(plain.protocol_dict())  # old studies keep their fingerprint
    varied = parse_study_config(data | {"confirm": {"vary_data": True}})
    assert varied.fingerprint() != plain.fingerprint()
    assert [varied.confirm_data_seed(s) for s in varied.confirm_seeds()] == [1, 2, 3]
    assert [plain.confirm_data_seed(s) for s in plain.confirm_seeds()] == [0, 0, 0]
    with pytest.raises(ConfigError, match="confirm.vary_data"):
        parse_study_config(data | {"confirm": {"vary_data": "yes"}})
    with pytest.raises(ConfigError, match="confirm.test"):
        parse_study_config(data | {"confirm": {"test": "wilcoxon"}})


@pytest.mark.slow
def test_too_few_seeds_warn_before_training(tmp_path, capsys):
    path = write_study(tmp_path, "few", [candidate("a"), candidate("b"), candidate("c")],
                       confirm={"seeds": 5})
    assert main(["study", "create", str(path)]) == 0
    err = capsys.readouterr().err
    assert "warning: with 5 confirmation seed(s) the exact sign-flip permutation test cannot " \
           "reach the study's level 0.05" in flat(err)
    err = flat(err)
    assert "0.188 after the Holm correction over 3 comparisons" in err  # 3 * 2/2^5
    assert "at least 7 seeds" in err


def test_the_warning_names_the_fix(capsys):
    from harness.study.cli import _warn_seeds
    from harness.study.schema import parse_study_config

    data = copy.deepcopy(STUDY) | {"candidates": [candidate("a"), candidate("b")]}
    _warn_seeds(parse_study_config(data | {"confirm": {"seeds": 3}}))
    err = flat(capsys.readouterr().err)
    assert "its smallest p-value is 0.25, so no difference" in err and "at least 6 seeds" in err
    assert "or confirm.test: t" in err
    for ok in ({"seeds": 6}, {"seeds": 3, "test": "t"}):
        _warn_seeds(parse_study_config(data | {"confirm": ok}))
        assert capsys.readouterr().err == ""
    _warn_seeds(parse_study_config(data | {"candidates": [candidate("a")]}))  # nothing to compare
    assert capsys.readouterr().err == ""


def test_unknown_format_fails_before_anything_runs(tmp_path, capsys):
    path = write_study(tmp_path, "fmt", [candidate("a")])
    assert main(["study", "run", str(path), "--report", "--format", "docx"]) == 2
    assert "--format: unknown format(s) docx" in flat(capsys.readouterr().err)
    assert not (tmp_path / ".harness" / "optuna.db").exists()
