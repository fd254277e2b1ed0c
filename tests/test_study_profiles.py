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
           if "candidates" in yaml.safe_load(p.read_text())]  # not the run configs


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
