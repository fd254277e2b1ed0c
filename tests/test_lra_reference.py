"""The published LRA table beside ours: every LRA study's `reference` block agrees with the one
home of the numbers (benchmarks/lra_reference.yaml); the report renders it; it never changes a
study's fingerprint. The LRA studies that read the researcher's own data (studies/lra/) have
only GPU profiles; they validate here as the shipped studies do in test_study_profiles."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from harness.errors import ConfigError
from harness.report.collect import CandidateResult
from harness.report.reference import reference_blocks
from harness.report.render import render_markdown
from harness.study.schema import load_study_config, parse_study_config
from harness.study.space import load_registry, validate

ROOT = Path(__file__).resolve().parents[1]
HOME = yaml.safe_load((ROOT / "benchmarks" / "lra_reference.yaml").read_text())
#: (study file, profile) -> the task column of Table 1 its reference copies
COLUMNS = {
    ("lra_listops.yaml", "full"): "listops", ("lra_listops.yaml", "cpu"): "listops",
    ("lra_pathfinder.yaml", "full"): "pathfinder", ("lra_pathfinder.yaml", "cpu"): "pathfinder",
    ("lra_pathfinder.yaml", "full_pathx"): "path_x",
    ("lra/lra_text.yaml", "full"): "text", ("lra/lra_retrieval.yaml", "full"): "retrieval",
    ("lra/lra_image.yaml", "full"): "image",
}
DATA_STUDIES = sorted((ROOT / "studies" / "lra").glob("*.yaml"))


def published(column: str) -> dict[str, float | None]:
    return {row["model"]: (None if row["values"][column] == "FAIL" else row["values"][column])
            for row in HOME["rows"]}


@pytest.mark.parametrize("study,profile", sorted(COLUMNS), ids=lambda x: str(x))
def test_every_lra_study_copies_its_column_of_the_published_table(study, profile):
    cfg = load_study_config(ROOT / "studies" / study, profile=profile)
    assert cfg.reference is not None
    want = published(COLUMNS[study, profile])
    got = {row.model: row.value for row in cfg.reference.rows}
    assert got == want
    home_candidates = {row["model"]: row["candidate"] for row in HOME["rows"]}
    assert {row.model: row.candidate for row in cfg.reference.rows} == home_candidates
    assert cfg.reference.differences, "a reference states its protocol differences"


def test_the_data_studies_are_all_covered():
    assert {f"lra/{p.name}" for p in DATA_STUDIES} == {s for s, _ in COLUMNS if s.startswith("lra/")}


@pytest.mark.parametrize("path", DATA_STUDIES, ids=lambda p: p.stem)
def test_the_data_studies_validate_in_every_profile(path, tmp_path):
    """Validating builds the task, which reads its data: a few files in each release's layout."""
    import numpy as np
    from test_lra_data import make_aan, make_cifar, make_imdb

    data = {"lra_text": lambda: make_imdb(tmp_path, {(s, p): ["a review"] for s in ("train", "test")
                                                     for p in ("pos", "neg")}),
            "lra_retrieval": lambda: make_aan(tmp_path / "tsv", {s: [("1", "a", "b"), ("0", "c", "d")]
                                                                for s in ("train", "val", "test")}),
            "lra_image": lambda: make_cifar(tmp_path / "cifar", 2, np.random.default_rng(0)) and tmp_path / "cifar"}
    folder = data[path.stem]()
    from harness.report.stats import resolution_floor

    for name in yaml.safe_load(path.read_text())["profiles"]:
        cfg = load_study_config(path, profile=name, overrides=[f"task.params.data_dir={folder}"])
        validate(cfg, load_registry(cfg))
        k = len(cfg.candidates)
        floor = resolution_floor(cfg.confirm.test, cfg.confirm.seeds, k * (k - 1) // 2,
                                 round(1 - cfg.confirm.confidence, 12))
        assert floor.possible, floor.sentence()


def study_with(reference):
    data = yaml.safe_load((ROOT / "studies" / "lra_listops.yaml").read_text())
    data.pop("profiles")
    data["reference"] = reference
    return parse_study_config(data)


def test_a_reference_never_changes_the_fingerprint_and_names_real_candidates():
    a = study_with({"source": "paper", "metric": "acc", "rows": [{"model": "T", "value": 1.0}]})
    b = study_with({"source": "other paper", "metric": "acc", "rows": [{"model": "U", "value": 2.0}]})
    assert a.fingerprint() == b.fingerprint()
    with pytest.raises(ConfigError, match="reference.rows name candidates this study lacks: nope"):
        study_with({"source": "s", "metric": "m", "rows": [{"model": "T", "value": 1.0, "candidate": "nope"}]})


def result(name: str, mean: float, seeds: int) -> CandidateResult:
    r = CandidateResult(name=name, label=name, seeds=[object()] * seeds, tuning={})  # type: ignore[list-item]
    r.mean = mean
    return r


def test_the_report_renders_published_beside_measured_with_the_differences():
    cfg = load_study_config(ROOT / "studies" / "lra_listops.yaml", profile="cpu")
    results = [result("multi_head", 0.4125, 3), result("linear", math.nan, 0), result("s4d", 0.25, 3)]
    text = render_markdown(reference_blocks(cfg.reference, results))
    lines = text.splitlines()
    assert "## Published reference" in text and "arXiv:2011.04006" in text
    row = next(line for line in lines if line.startswith("| Transformer"))
    assert "36.37" in row and "multi_head" in row and "41.25 (3 seeds)" in row
    row = next(line for line in lines if line.startswith("| Linear Trans."))
    assert "16.13" in row and row.count("—") == 1  # no measured value: a dash, not nan
    row = next(line for line in lines if line.startswith("| Mamba"))
    assert "not reported" in row
    assert "smoke scale" in text  # the cpu profile's own differences
    assert reference_blocks(None, results) == []
