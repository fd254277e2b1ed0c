"""The MAD protocol: the suite's settings against MAD's definitions, the grid sampler, the
score's statistics against scipy on hand-made numbers, the shipped suite, and one tiny
`harness mad` run end to end (slow) whose report and MLflow runs are read back.

Budget: about 8 s on 2 CPU cores without the slow test (about 2 minutes with it, loaded).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import scipy.stats
import yaml
from text import flat

from harness.errors import ConfigError
from harness.study import grid
from harness.study.mad import TASKS, MadSuite, cells, load_suite, studies
from harness.study.schema import parse_study_config

ROOT = Path(__file__).resolve().parent.parent
MODEL = {"name": "transformer", "params": {"d_model": 16, "layers": 1, "heads": 2},
         "attention": {"name": "multi_head"}, "position": {"name": "none"}}


def suite(**over: Any) -> MadSuite:
    data = {"kind": "mad", "name": "s", "candidates": [{"name": "a", "model": MODEL}],
            "budget": {"steps": 3}, **over}
    return MadSuite.model_validate(data)


# -- MAD's settings -------------------------------------------------------------------------
def test_settings_are_madss_baseline_and_one_change_at_a_time():
    """MAD's configs/tasks/*.yml: a baseline and every listed value of each changed setting,
    the others at baseline; 66 settings over the six tasks."""
    counts = {t: len(cells(suite(), t)) for t in TASKS}
    assert counts == {"in_context_recall": 11, "fuzzy_in_context_recall": 11, "noisy_in_context_recall": 14,
                      "selective_copying": 13, "compression": 11, "memorization": 6}
    for task in TASKS:
        base, *changes = cells(suite(), task)
        assert base.axis is None and base.mad == TASKS[task].baseline
        for cell in changes:
            differ = [k for k in base.mad if base.mad[k] != cell.mad[k]]
            assert differ == [cell.axis] and cell.mad[cell.axis] == cell.value


def test_mad_settings_map_onto_the_plugins_as_mad_counts_them():
    """Selective copying: MAD's sequence is source + copy token + the copies, and its vocabulary
    counts the blank and copy tokens; noisy recall's vocabulary counts the noise symbols."""
    s = suite()
    data = studies(s)
    copy = data["selective_copying"].task.params
    assert copy["length"] + 1 + copy["num_tokens"] == 256 and copy["vocab"] == 14
    noisy = data["noisy_in_context_recall"].task.params
    assert noisy == {"vocab": 32, "length": 128, "noise_vocab": 16, "frac_noise": 0.2,
                     "num_train": 12_800, "num_val": 1_280}
    names = [c.name for c in data["noisy_in_context_recall"].candidates]
    assert "a.frac_noise-0.8" in names and "a.num_train_examples-800" in names
    cand = next(c for c in data["noisy_in_context_recall"].candidates if c.name == "a.frac_noise-0.8")
    assert cand.task == {"frac_noise": 0.8}, "a setting's own params are the changed ones only"
    assert data["memorization"].search == {"lr": [1e-4, 5e-4, 1e-3], "weight_decay": [0.0, 0.1]}
    assert data["memorization"].budget.trials == 6 and data["memorization"].sampler.name == "grid"


def test_a_suite_names_unknown_settings():
    with pytest.raises(ValueError, match="seq_length"):
        suite(settings={"compression": {"changes": {"seq_length": [64]}}})


# -- the grid sampler -----------------------------------------------------------------------
def study(**over: Any) -> Any:
    data = {"name": "g", "task": {"name": "copy", "params": {"length": 4, "vocab": 4, "num_train": 16, "num_val": 8}},
            "candidates": [{"name": "a", "model": {**MODEL, "search_declared": False,
                                                   "attention": {"name": "multi_head", "search_declared": False}}}],
            "search": {"lr": [1e-3, 3e-3], "weight_decay": [0.0, 0.1, 0.2]},
            "sampler": {"name": "grid"}, "budget": {"trials": 6, "steps": 2}, **over}
    return parse_study_config(data)


def test_grid_points_are_the_product_of_the_search_lists():
    points = grid.points(study())
    assert len(points) == 6 and len({tuple(p.items()) for p in points}) == 6
    assert {p["train.lr"] for p in points} == {1e-3, 3e-3}
    assert {p["train.weight_decay"] for p in points} == {0.0, 0.1, 0.2}


@pytest.mark.parametrize(("over", "says"), [
    ({"budget": {"trials": 4, "steps": 2}}, "set budget.trials: 6"),
    ({"search": {"lr": {"low": 1e-3, "high": 3e-3}}, "budget": {"trials": 1, "steps": 2}}, "needs a list"),
])
def test_grid_refuses_a_study_some_trial_would_leave(registry, over, says):
    from harness.study.space import validate

    with pytest.raises(ConfigError) as err:
        validate(study(**over), registry)
    assert says in flat(err.value)


def test_grid_refuses_a_candidate_searching_its_own_ranges(registry):
    from harness.study.space import validate

    cand = {"name": "a", "model": {**MODEL, "search": {"ffn_mult": [2, 4]}}}
    with pytest.raises(ConfigError) as err:
        validate(study(candidates=[cand]), registry)
    assert "search_declared: false" in flat(err.value)


# -- the score's statistics -----------------------------------------------------------------
def test_scores_average_settings_then_tasks_per_seed_and_intervals_are_student_t():
    from harness.report.mad import MadResults

    s = suite(tasks=["compression", "memorization"], confirm={"seeds": 3})
    res = MadResults(s, [1, 2, 3])
    res.cells = {"compression": {"a": {"base": {1: 0.5, 2: 0.7, 3: 0.6}, "seq_len-64": {1: 0.1, 2: 0.3, 3: 0.2}}},
                 "memorization": {"a": {"base": {1: 1.0, 2: 0.9, 3: 0.8}}}}
    per_seed = [((0.5 + 0.1) / 2 + 1.0) / 2, ((0.7 + 0.3) / 2 + 0.9) / 2, ((0.6 + 0.2) / 2 + 0.8) / 2]
    score = res.score("a")
    assert list(score.by_seed.values()) == pytest.approx(per_seed)
    assert score.mean == pytest.approx(sum(per_seed) / 3)
    low, high = scipy.stats.t.interval(0.95, 2, loc=sum(per_seed) / 3, scale=scipy.stats.sem(per_seed))
    assert (score.interval.low, score.interval.high) == pytest.approx((low, high))
    assert score.interval.method == "Student t"
    res.cells["memorization"]["a"]["base"][2] = math.nan  # a failed run: that seed has no score
    assert math.isnan(res.score("a").by_seed[2]) and not math.isnan(res.score("a").by_seed[1])


# -- the shipped suite ----------------------------------------------------------------------
@pytest.mark.parametrize("profile", ["cpu", "full"])
def test_shipped_mad_suite_validates(registry, profile):
    from harness.study.space import validate

    path = ROOT / "studies" / "mad.yaml"
    assert yaml.safe_load(path.read_text())["kind"] == "mad"
    s = load_suite(str(path), profile)
    configs = studies(s)
    assert set(configs) == set(TASKS)
    for task, cfg in configs.items():
        space = validate(cfg, registry)
        assert len(space.candidates) == len(s.candidates) * len(cells(s, task))


# -- end to end -----------------------------------------------------------------------------
TINY = """\
kind: mad
name: tiny
candidates:
  - name: attn
    model: {name: transformer, params: {d_model: 16, layers: 1, heads: 2}, attention: {name: multi_head}, position: {name: none}}
  - name: hyena
    model: {name: transformer, params: {d_model: 16, layers: 1, heads: 2}, position: {name: none}, mixer: {name: hyena}}
tasks: [compression, noisy_in_context_recall]
search: {lr: [1.0e-3, 3.0e-3], weight_decay: [0.0]}
train: {batch_size: 16, val_every: 1000}
budget: {steps: 3}
test_examples: 16
confirm: {seeds: 2}
settings:
  compression: {baseline: {seq_len: 8, num_train_examples: 32}, changes: {seq_len: [12]}}
  noisy_in_context_recall: {baseline: {seq_len: 16, num_train_examples: 32}, changes: {frac_noise: [0.6]}}
"""


@pytest.mark.slow
def test_harness_mad_scores_every_candidate_and_records_it(tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    from harness.cli.main import main
    from harness.store import tracking

    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    out = tmp_path / "report"
    assert main(["mad", str(path), "--out", str(out)]) == 0
    text = (out / "mad.md").read_text()
    assert "## MAD scores" in text and "MAD score [95% Student t]" in text
    assert "confirmation seeds 1, 2" in text
    for task in ("compression", "noisy_in_context_recall"):
        assert f"## {task}" in text and f"](mad_{task}.png)" in text and (out / f"mad_{task}.png").stat().st_size > 0
    assert "seq_len=12" in text and "frac_noise=0.6" in text
    data = json.loads((out / "mad.json").read_text())
    client = MlflowClient(tracking.tracking_uri())
    exp = client.get_experiment_by_name("tiny")
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    mad_run = [r for r in runs if r.data.tags.get("harness.kind") == "mad"]
    assert len(mad_run) == 1 and mad_run[0].info.status == "FINISHED"
    # every score re-derived from the confirmation runs MLflow holds: per seed, the mean over
    # each task's settings, then over tasks
    confirm = [r for r in runs if r.data.tags.get("harness.phase") == "confirm"]
    assert len(confirm) == 2 * 2 * 2 * 2  # candidates x tasks x settings x seeds
    by_seed: dict[tuple[str, int], list[float]] = {}
    for task, length in (("compression", None), ("noisy_in_context_recall", None)):
        for r in confirm:
            if r.data.tags["harness.study"] != f"tiny.{task}":
                continue
            cand = r.data.tags["harness.candidate"].split(".")[0]
            train_length = int(r.data.params["task.params.length"])
            acc = r.data.metrics[f"val/acc_len{length or train_length}"]
            by_seed.setdefault((f"{cand}/{task}", int(r.data.tags["harness.seed"])), []).append(acc)
    for cand in ("attn", "hyena"):
        per_seed = [sum(sum(by_seed[(f"{cand}/{t}", s)]) / 2 for t in ("compression", "noisy_in_context_recall")) / 2
                    for s in (1, 2)]
        assert data["scores"][cand]["overall"]["mean"] == pytest.approx(sum(per_seed) / 2)
        assert mad_run[0].data.metrics[f"mad/{cand}"] == pytest.approx(sum(per_seed) / 2)
    # the grid sampler tried each setting at both learning rates exactly once
    tune = [r for r in runs if r.data.tags.get("harness.phase") == "tune"]
    lrs: dict[str, list[float]] = {}
    for r in tune:
        lrs.setdefault(r.data.tags["harness.study"] + r.data.tags["harness.candidate"], []).append(
            float(r.data.params["train.lr"]))
    assert len(lrs) == 8 and all(sorted(v) == [1e-3, 3e-3] for v in lrs.values())
    assert "attn: MAD score" in capsys.readouterr().out


def test_published_orderings_are_checked_with_the_difference_over_seeds():
    from harness.report.mad import MadResults, reference_blocks

    cands = [{"name": "a", "model": MODEL}, {"name": "b", "model": MODEL}]
    s = suite(candidates=cands, tasks=["memorization"], confirm={"seeds": 3},
              orderings=[{"better": "a", "worse": "b", "source": "paper"},
                         {"better": "b", "worse": "a", "task": "memorization", "source": "other"}])
    res = MadResults(s, [1, 2, 3])
    res.cells = {"memorization": {"a": {"base": {1: 0.9, 2: 0.8, 3: 0.85}},
                                  "b": {"base": {1: 0.5, 2: 0.6, 3: 0.4}}}}
    table = next(v for k, v in reference_blocks(res) if k == "table")
    (first, second) = table[1]
    diffs = [0.4, 0.2, 0.45]
    low, high = scipy.stats.t.interval(0.95, 2, loc=sum(diffs) / 3, scale=scipy.stats.sem(diffs))
    assert first[2] == f"{100 * sum(diffs) / 3:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]"
    assert first[3].startswith("agrees (resolved") and second[3].startswith("disagrees (resolved")
    with pytest.raises(ValueError, match="lacks: c"):
        suite(orderings=[{"better": "a", "worse": "c", "source": "x"}])


def test_harness_mad_refuses_a_bad_suite_naming_the_field(tmp_path, capsys):
    from harness.cli.main import main

    path = tmp_path / "bad.yaml"
    path.write_text(TINY.replace("changes: {seq_len: [12]}", "changes: {seq_length: [12]}"))
    assert main(["mad", str(path)]) == 2
    err = flat(capsys.readouterr().err)
    assert "settings.compression.changes: unknown seq_length" in err and "Traceback" not in err
    path.write_text("name: x\ntask: {name: copy}\n")
    assert main(["mad", str(path)]) == 2
    assert "is not a MAD suite (kind: mad)" in flat(capsys.readouterr().err)
