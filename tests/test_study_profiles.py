"""Study profiles: one file, a budget per machine; every shipped study validates in every
profile, and its CPU profile runs end to end with a tiny budget so the files never rot."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harness.errors import ConfigError
from harness.study import profiles
from harness.study.schema import load_study_config
from harness.study.space import load_registry, validate

STUDIES = [p for p in sorted((Path(__file__).resolve().parents[1] / "studies").glob("*.yaml"))
           if "candidates" in yaml.safe_load(p.read_text())  # not the run configs
           and yaml.safe_load(p.read_text()).get("kind", "study") == "study"]  # MAD suites: test_mad


def test_a_profile_merges_mappings_and_replaces_everything_else():
    base = {"budget": {"trials": 12, "steps": 3000}, "candidates": [1, 2, 3], "task": {"params": {"a": 1, "b": 2}}}
    merged = profiles.merge(base, {"budget": {"steps": 300}, "candidates": [1], "task": {"params": {"b": 5}}})
    assert merged == {"budget": {"trials": 12, "steps": 300}, "candidates": [1], "task": {"params": {"a": 1, "b": 5}}}
    assert base["budget"]["steps"] == 3000  # the study itself is untouched


def test_the_profile_names_the_study_and_a_wrong_one_is_refused(tmp_path):
    path = tmp_path / "mine.yaml"
    study = yaml.safe_load(STUDIES[0].read_text()) if STUDIES else {}
    study.pop("profiles", None)
    study.pop("name", None)
    study["profiles"] = {"cpu": {"budget": {"steps": 7}}, "full": {}}
    path.write_text(yaml.safe_dump(study))
    cpu = load_study_config(path, profile="cpu")
    assert (cpu.name, cpu.profile, cpu.budget.steps) == ("mine-cpu", "cpu", 7)
    full = load_study_config(path, profile="full")
    assert full.name == "mine-full" and full.fingerprint() != cpu.fingerprint()
    assert load_study_config(path).profile == "cpu"  # no GPU here
    with pytest.raises(ConfigError, match="Did you mean 'full'"):
        load_study_config(path, profile="ful")


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.stem)
def test_every_shipped_study_validates_in_every_profile(path):
    names = list(yaml.safe_load(path.read_text()).get("profiles") or {None: None})
    for name in names:
        cfg = load_study_config(path, profile=name)
        validate(cfg, load_registry(cfg))


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.stem)
def test_every_shipped_profile_confirms_with_seeds_its_test_can_resolve(path):
    """A shipped profile never confirms with too few seeds for its test to reach its level
    after the Holm correction over every pair of candidates (the report's family)."""
    from harness.report.stats import resolution_floor

    for name in yaml.safe_load(path.read_text()).get("profiles") or {}:
        cfg = load_study_config(path, profile=name)
        k = len(cfg.candidates)
        floor = resolution_floor(cfg.confirm.test, cfg.confirm.seeds, k * (k - 1) // 2,
                                 round(1 - cfg.confirm.confidence, 12))
        assert floor.possible, f"{path.name} profile {name}: {floor.sentence()}"


def test_every_shipped_study_has_a_cpu_and_a_full_profile():
    for path in STUDIES:
        assert {"cpu", "full"} <= set(yaml.safe_load(path.read_text()).get("profiles") or {}), path.name


#: Merged over a study's CPU profile: one tuning trial and two confirmation seeds of two steps,
#: on a few examples (every shipped task has num_train and num_val), without the attention
#: maps each run would draw (most of a tiny run's time; tests/test_core_train.py draws them).
TINY_RUN = {"budget": {"trials": 1, "steps": 2}, "confirm": {"seeds": 2},
            "task": {"params": {"num_train": 64, "num_val": 8}},
            "train": {"val_every": 1, "log_attention": False}, "pruner": {"name": "none"},
            "resume": {"heartbeat_s": 1, "grace_s": 60, "poll_s": 0.3}}
#: A scaling study's cells carry their compute (schema: 3 budgets spanning 10x, each buying
#: every size at least one step): batches of two 32-token windows make the smallest such grid
#: 16 times cheaper than the profile's own batches; validation only at the end, on 256 tokens,
#: and a report with 20 bootstrap replicates (its intervals coarse: this proves it is written).
TINY_SCALING = {"scaling": {"budgets": [6e7, 2e8, 6e8], "bootstrap": 20},
                "train": {"batch_size": 2, "val_every": 1000},
                "task": {"params": {"length": 32, "eval_tokens": 256}}}


@pytest.mark.slow
@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.stem)
def test_every_shipped_cpu_profile_runs_end_to_end_with_a_tiny_budget(path, tmp_path, capsys):
    """The CPU profile as shipped (task, candidates, search, matching), only the budget made
    tiny: every slot of every candidate completes and the report is written."""
    import json

    from harness.cli.main import main

    data = yaml.safe_load(path.read_text())
    data["profiles"]["cpu"] = profiles.merge(data["profiles"]["cpu"] or {}, TINY_RUN)
    if "scaling" in data:  # a scaling study's cells carry the compute: the smallest that fit a step
        data["profiles"]["cpu"]["budget"] = {"trials": 1}
        data["profiles"]["cpu"] = profiles.merge(data["profiles"]["cpu"], TINY_SCALING)
    study = tmp_path / path.name
    study.write_text(yaml.safe_dump(data))
    out = tmp_path / "report"
    assert main(["study", "run", str(study), "--profile", "cpu", "--report", "--out", str(out),
                 "--format", "json"]) == 0
    assert "FAILED" not in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    cfg = load_study_config(study, profile="cpu")  # what ran (a scaling study's cells are named by budget)
    assert sorted(c["name"] for c in summary["candidates"]) == sorted(c.name for c in cfg.candidates)
    assert summary["complete"] and all(len(c["runs"]) == 2 for c in summary["candidates"])


def test_study_create_prints_a_run_command_with_the_same_profile_and_overrides(tmp_path, capsys):
    """The command `study create` suggests runs the study it created: same profile and --set
    values (without them a worker on a CPU machine would run the cpu profile instead)."""
    from harness.cli.main import main

    path = tmp_path / "mine.yaml"
    study = yaml.safe_load(STUDIES[0].read_text())
    study.pop("name", None)
    study["profiles"] = {"cpu": {"budget": {"steps": 7}}, "full": {}}
    path.write_text(yaml.safe_dump(study))
    storage = f"sqlite:///{tmp_path / 'o.db'}"
    assert main(["study", "create", str(path), "--profile", "full", "--set", "budget.trials=2",
                 "--storage", storage]) == 0
    out = capsys.readouterr().out
    assert (f"start workers with `harness study run {path} --profile full --storage {storage} "
            f"--set budget.trials=2`") in out
