"""Long-context studies: the width sweep (recall against state), objectives over the
evaluation grid, and the report's two pictures, from the schema to real studies on CPU.

The grid's summaries and the Pareto front are checked against hand counts and brute force; two
real studies (tiny runs) must put the heatmap and the frontier in the HTML report and on the
parent MLflow run, with the trial values equal to what the child runs' cells say and the
state bytes equal to the architectures' own formulas (attention: 2 x length x d_model per
layer; an LSTM: hidden and cell, 2 x width per layer; 4 bytes each in float32).
"""

from __future__ import annotations

import csv
import itertools
import random
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from mlflow.tracking import MlflowClient

import harness
from harness.cli.main import main
from harness.errors import ConfigError
from harness.report.collect import CandidateResult, SeedRun
from harness.report.recall import Point, pareto, state_needed
from harness.run import grid
from harness.study.schema import parse_study_config

BASE: dict[str, Any] = {"task": {"name": "associative_recall"}, "budget": {"trials": 1, "steps": 2}}
ATTENTION = {"name": "transformer", "params": {"layers": 2, "heads": 2}, "search_declared": False,
             "attention": {"name": "multi_head", "search_declared": False}, "position": {"name": "none"}}
LSTM = {"name": "lstm", "params": {"layers": 2}, "search_declared": False}


def config(**extra: Any) -> Any:
    return parse_study_config({**BASE, "candidates": [{"name": "attention", "model": ATTENTION},
                                                      {"name": "lstm", "model": LSTM}], **extra})


def test_a_sweep_runs_every_candidate_at_every_width():
    cfg = config(sweep={"widths": [32, 8, 16]}, confirm={"baseline": "lstm"})
    assert [c.name for c in cfg.candidates] == ["attention.w8", "attention.w16", "attention.w32",
                                                "lstm.w8", "lstm.w16", "lstm.w32"]
    assert [(c.swept.base, c.swept.width) for c in cfg.candidates][:2] == [("attention", 8), ("attention", 16)]
    assert cfg.baseline == "lstm.w32"  # the named candidate at its largest width
    again = parse_study_config(cfg.model_dump(mode="json"))  # a stored record is not expanded twice
    assert again.fingerprint() == cfg.fingerprint() and len(again.candidates) == 6
    assert config().fingerprint() == config().fingerprint() and "sweep" not in config().protocol_dict()


@pytest.mark.parametrize("extra, message", [
    ({"sweep": {"widths": [8]}}, "at least 2"),
    ({"sweep": {"widths": [8, 8]}}, "two widths are the same"),
    ({"sweep": {"widths": [8, 16]}, "budget": {"trials": 1, "steps": 2, "params": 1000}}, "keep one"),
    ({"objective": {"metric": "recall", "over": "longest"}}, "needs threshold"),
    ({"objective": {"metric": "loss", "over": "longest", "threshold": 1.0}}, "is minimised"),
    ({"objective": {"metric": "acc", "threshold": 0.5}}, "threshold belongs to over: longest"),
    ({"objective": {"metric": "acc", "over": "grid", "length": 64}}, "remove objective.length"),
    ({"objective": {"metric": "recall", "over": "longest", "threshold": 1.5}}, "threshold 1.5: 'recall' runs from 0 to 1"),
    ({"objective": {"metric": "recall", "over": "longest", "threshold": -0.1}}, "threshold -0.1: .* above 0"),
    ({"objective": {"metric": "acc", "over": "longest", "threshold": 0}}, "threshold 0: .* held by every length or none"),
    ({"objective": {"metric": "recall", "over": "longest", "threshold": float("nan")}}, "threshold: .* finite"),
])
def test_bad_sweeps_and_grid_objectives_are_refused(extra, message):
    with pytest.raises(ConfigError, match=message):
        config(**extra)


def test_a_swept_width_goes_to_each_models_own_width_param(registry):
    from harness.study.space import validate

    cfg = config(sweep={"widths": [8, 16]})
    space = validate(cfg, registry)
    runs = {c.name: space.run_config(c, None, 0)["model"]["params"] for c in space.candidates}
    assert runs["attention.w16"]["d_model"] == 16 and runs["lstm.w8"]["width"] == 8
    fixed = {**BASE, "sweep": {"widths": [8, 16]},
             "candidates": [{"name": "lstm", "model": {**LSTM, "params": {"width": 32}}}]}
    with pytest.raises(ConfigError, match=r"params.width: sweep.widths sets the width"):
        validate(parse_study_config(fixed), registry)


def test_grid_summaries_by_hand():
    m = {"val/recall_depth0_len64": 1.0, "val/recall_depth100_len64": 0.8,
         "val/recall_depth0_len128": 0.5, "val/recall_depth100_len128": 1.0,
         "val/recall_depth0_len256": 1.0, "val/recall_depth100_len256": 1.0,
         "val/recall_len64": 0.9, "val/acc_len64": 0.2}
    assert grid.grid_mean(m, "recall") == pytest.approx((1 + 0.8 + 0.5 + 1 + 1 + 1) / 6)
    assert grid.longest_held(m, "recall", 0.9) == 64  # 128 falls to 0.75: 256 does not count
    assert grid.longest_held(m, "recall", 0.7) == 256
    assert grid.longest_held(m, "recall", 0.95) == 0
    assert grid.longest_held(m, "recall", 0.7, lengths=[64, 96, 128, 256]) == 64  # 96 not run
    assert grid.grid_mean({"val/acc_len8": 0.2, "val/acc_len16": 0.4}, "acc") == pytest.approx(0.3)
    assert grid.metrics_with_cells(m) == ["recall"]


def test_the_pareto_front_is_what_brute_force_says():
    rng = random.Random(0)
    for _ in range(50):
        points = [Point("a", f"p{i}", 8, rng.choice([64, 128, 256, 512]), rng.choice([0.1, 0.5, 0.9]), None)
                  for i in range(6)]
        front = pareto(points, maximize=True)
        for p in points:
            beaten = any(q.state <= p.state and q.value >= p.value and (q.state, q.value) != (p.state, p.value)
                         for q in points)
            assert (p.name in front) == (not beaten)
    pts = [Point("gla", "g1", 8, 100, 0.3, None), Point("gla", "g2", 16, 400, 0.95, None),
           Point("lstm", "l1", 8, 50, 0.6, None)]
    assert state_needed(pts, 0.5, True) == {"gla": 400, "lstm": 50}
    assert state_needed(pts, 0.9, True) == {"gla": 400, "lstm": None}


def hand_results(cfg: Any) -> list[CandidateResult]:
    """Two seeds per swept candidate: needle cells (depths 0 and 100, lengths 16 and 32), the
    state bytes attention (2 x 16 x width x 4 x 2 layers) or an LSTM (2 x width x 4 x 2) keeps."""
    out = []
    for c in cfg.candidates:
        width, attention = c.swept.width, c.swept.base == "attention"
        seeds = []
        for seed in (1, 2):
            far = 1.0 if attention or width == 32 else width / 32 + 0.05 * seed  # a narrow LSTM forgets
            metrics = {"val/recall_depth0_len16": far, "val/recall_depth100_len16": 1.0,
                       "val/recall_depth0_len32": far if far == 1.0 else far / 2, "val/recall_depth100_len32": 1.0,
                       "cost/state_bytes": float((2 * 16 * width if attention else 2 * width) * 4 * 2)}
            metrics["val/recall_grid"] = grid.grid_mean(metrics, "recall")
            seeds.append(SeedRun(seed, f"run-{c.name}-{seed}", metrics["val/recall_grid"], metrics))
        out.append(CandidateResult(c.name, c.name, seeds, {}, config={"model.params.layers": "2"}))
    return out


def test_the_report_draws_both_pictures_and_logs_them_to_the_parent_run(tmp_path):
    from harness.report.collect import Protocol
    from harness.report.recall import blocks, insert, log_parent
    from harness.report.render import render_html
    from harness.report.verdict import analyze
    from harness.store.tracking import Tracker

    cfg = config(sweep={"widths": [8, 32]}, objective={"metric": "recall", "over": "grid"})
    results = hand_results(cfg)
    proto = Protocol("s", "recall", True, 16, 16, (16, 32), "attention.w32", 0.95, "t", (1, 2),
                     over="grid")
    analyze(results, proto)
    tracker = Tracker(f"sqlite:///{tmp_path / 'm.db'}")
    parent = tracker.start_run(tracker.client.create_experiment("s"), run_name="s")
    handle = SimpleNamespace(config=cfg, tracker=tracker, parent_run_id=parent)
    extra, numbers = blocks(handle, results, proto, {}, tmp_path)
    html = render_html(insert([("h1", "Study s"), ("h2", "Ranking")], extra), "s")
    assert html.index("<h2>Depth x length</h2>") < html.index("<h2>Recall against state</h2>") < html.index("<h2>Ranking</h2>")
    assert 'src="heatmap.png"' in html and 'src="frontier.png"' in html
    assert (tmp_path / "heatmap.png").stat().st_size > 0 and (tmp_path / "frontier.png").stat().st_size > 0
    # per layer: attention 2 x 16 x width x 4 bytes; the LSTM 2 x width x 4
    rows = {r["candidate"]: r for r in csv.DictReader((tmp_path / "frontier.csv").open())}
    assert float(rows["attention.w8"]["state_bytes"]) == 2 * 16 * 8 * 4 == 1024
    assert float(rows["lstm.w32"]["state_bytes"]) == 2 * 32 * 4 == 256
    # the LSTM at width 32 recalls every needle with 256 bytes, attention needs 1024: most per byte
    assert "Most recall per byte of state: lstm" in html and "attention at 1,024 (4x)" in html
    assert rows["lstm.w32"]["front"] == "1" and rows["attention.w8"]["front"] == "0"
    assert rows["lstm.w8"]["front"] == "1" and rows["lstm.w8"]["own_front"] == "1"
    heat = list(csv.DictReader((tmp_path / "heatmap.csv").open()))
    assert {r["candidate"] for r in heat} == {c.name for c in cfg.candidates} and len(heat) == 16
    log_parent(handle, numbers)
    logged = tracker.client.get_run(parent).data.metrics
    lstm8 = results[2]
    assert logged["lstm.w8/val/recall_depth0_len32"] == pytest.approx(
        sum(s.metrics["val/recall_depth0_len32"] for s in lstm8.seeds) / 2)
    history = tracker.client.get_metric_history(parent, "lstm/state_front/recall")
    assert sorted(h.step for h in history) == [64, 256]


def run_study(tmp, name: str, data: dict[str, Any]) -> dict[str, Any]:
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, **data}))
    storage, uri = f"sqlite:///{tmp / 'optuna.db'}", f"sqlite:///{tmp / 'mlflow.db'}"
    out = tmp / name
    assert main(["study", "run", str(path), "--storage", storage, "--tracking-uri", uri, "--report",
                 "--out", str(out), "--format", "md,html,csv,json"]) == 0
    client = MlflowClient(uri)
    parent = client.search_runs([client.get_experiment_by_name(name).experiment_id],
                                "tags.`harness.kind` = 'study'")[0]
    return {"out": out, "client": client, "parent": parent, "storage": storage}


TRAIN = {"batch_size": 8, "val_every": 2, "warmup_steps": 1, "num_threads": 1, "lr": 0.01}


@pytest.mark.slow
def test_a_sweep_study_draws_recall_against_state(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / "home"))
    s = run_study(tmp_path, "sweep", {
        "task": {"name": "associative_recall", "params": {"length": 16, "vocab": 16, "num_kv_pairs": 2,
                                                          "num_train": 64, "num_val": 16}},
        "candidates": [{"name": "attention", "model": ATTENTION}, {"name": "lstm", "model": LSTM}],
        "sweep": {"widths": [8, 16]}, "objective": {"metric": "acc"}, "train": TRAIN,
        "budget": {"trials": 1, "steps": 2}, "confirm": {"seeds": 2, "test": "t"}})
    html = (s["out"] / "results.html").read_text()
    assert "<h2>Recall against state</h2>" in html and 'src="frontier.png"' in html
    assert "Most acc per byte of state" in html or "No candidate reaches" in html
    rows = list(csv.DictReader((s["out"] / "frontier.csv").open()))
    state = {r["candidate"]: float(r["state_bytes"]) for r in rows}
    # per layer, at the training length 16, float32
    assert state == {"attention.w8": 2 * 16 * 8 * 4, "attention.w16": 2 * 16 * 16 * 4,
                     "lstm.w8": 2 * 8 * 4, "lstm.w16": 2 * 16 * 4}
    client, parent = s["client"], s["parent"]
    assert {"report/frontier.png", "report/frontier.csv", "report/results.html"} <= {
        a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    history = client.get_metric_history(parent.info.run_id, "attention/state_front/acc")
    assert sorted(h.step for h in history) == [1024, 2048]
    for row in rows:
        assert row["own_front"] in ("0", "1") and row["front"] in ("0", "1")
    summary = (s["out"] / "summary.json").read_text()
    assert "attention.w16" in summary


@pytest.mark.slow
def test_a_needle_study_ranks_by_the_grid_and_draws_each_candidates_heatmap(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / "home"))
    small = {"d_model": 16, "layers": 1, "heads": 2}
    s = run_study(tmp_path, "needle", {
        "task": {"name": "needle", "params": {"length": 24, "eval_lengths": [48], "depths": [0, 50, 100],
                                              "num_train": 64, "num_val": 12, "keys": 8, "values": 8, "words": 8}},
        "candidates": [
            {"name": "full", "model": {**ATTENTION, "params": small}},
            {"name": "window", "model": {**ATTENTION, "params": small,
                                         "attention": {"name": "sliding_window", "params": {"window": 4},
                                                       "search_declared": False}}}],
        "objective": {"metric": "recall", "over": "grid"}, "train": TRAIN,
        "budget": {"trials": 1, "steps": 2}, "confirm": {"seeds": 2, "test": "t"}})
    html = (s["out"] / "results.html").read_text()
    assert "<h2>Depth x length</h2>" in html and 'src="heatmap.png"' in html
    assert "val/recall, mean over the depth x length grid" in html
    client, parent = s["client"], s["parent"]
    children = client.search_runs([parent.info.experiment_id],
                                  f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    by_run = {}
    for child in children:  # the run logs its grid's mean; the study ranks by it
        m = child.data.metrics
        cells = [m[f"val/recall_depth{d}_len{n}"] for d, n in itertools.product((0, 50, 100), (24, 48))]
        assert m["val/recall_grid"] == pytest.approx(sum(cells) / 6)
        by_run[child.info.run_id] = m["val/recall_grid"]
    rows = list(csv.DictReader((s["out"] / "heatmap.csv").open()))
    assert {(r["candidate"], r["depth"], r["length"]) for r in rows} == {
        (c, str(d), str(n)) for c in ("full", "window") for d in (0, 50, 100) for n in (24, 48)}
    seeds = list(csv.DictReader((s["out"] / "seeds.csv").open()))
    assert len(seeds) == 4
    for row in seeds:  # each confirmation seed's value is its run's grid mean
        assert float(row["val/recall, mean over the depth x length grid"]) == pytest.approx(by_run[row["run_id"]], abs=1e-6)
    frame = harness.study_runs("needle", s["storage"], str(client.tracking_uri))
    for _, row in frame.iterrows():  # the notebook's objective column is what the study ranked by
        assert row["objective"] == pytest.approx(row["metrics.val/recall_grid"])
    logged = client.get_run(parent.info.run_id).data.metrics
    assert "full/val/recall_depth50_len48" in logged and "window/val/recall_depth0_len24" in logged
    assert "report/heatmap.png" in {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
