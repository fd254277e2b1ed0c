"""``harness new-plugin``: every kind's skeleton passes ``harness check`` and ruff as generated;
bad names and existing files are refused; a generated package installs with pip, is listed,
checked, passes its own tests and runs in a one-trial study."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from text import flat

from harness.cli import scaffold
from harness.cli.main import main

KINDS = ("attention", "mixer", "position", "model", "task")


def ruff(*paths: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    return subprocess.run([exe, "check", "--no-cache", "--isolated", "--line-length", "110",
                           *map(str, paths)], capture_output=True, text=True)


def test_every_kind_skeleton_passes_the_checks_and_lint_as_generated(tmp_path, capsys):
    paths = []
    for kind in KINDS:
        assert main(["new-plugin", kind, f"my_{kind}", "--out", str(tmp_path)]) == 0
        paths.append(tmp_path / f"my_{kind}.py")
    capsys.readouterr()
    args = [a for p in paths for a in ("--plugin", str(p))]
    assert main(["check", *args]) == 0
    out = capsys.readouterr().out
    assert "5 component(s)" in out and "all checks pass" in out and "FAIL" not in out
    lint = ruff(*paths)
    assert lint.returncode == 0, lint.stdout


@pytest.mark.parametrize("name", ["../evil", "a/b", "Cosine", "1st", "with-dash", "class", "x" * 41, ""])
def test_names_that_are_not_identifiers_are_refused(tmp_path, capsys, name):
    assert main(["new-plugin", "attention", name, "--out", str(tmp_path)]) == 2
    assert "lower-case identifier" in flat(capsys.readouterr().err)
    assert not any(tmp_path.iterdir())


def test_existing_files_are_never_overwritten(tmp_path, capsys):
    assert main(["new-plugin", "task", "mine", "--out", str(tmp_path)]) == 0
    (tmp_path / "mine.py").write_text("# my edits\n")
    assert main(["new-plugin", "task", "mine", "--out", str(tmp_path)]) == 2
    assert "not overwriting" in flat(capsys.readouterr().err)
    assert (tmp_path / "mine.py").read_text() == "# my edits\n"


def test_the_package_skeleton_is_complete():
    files = scaffold.render("mixer", "my_mix", package=True)
    assert set(files) == {"harness_my_mix.py", "pyproject.toml", "README.md", "tests/test_my_mix.py",
                          "noxfile.py", ".github/workflows/ci.yml"}
    assert 'my_mix = "harness_my_mix"' in files["pyproject.toml"]
    assert "class TestMyMix(MixerChecks):" in files["tests/test_my_mix.py"]
    assert "def tests(" in files["noxfile.py"] and "def lint(" in files["noxfile.py"]
    workflow = yaml.safe_load(files[".github/workflows/ci.yml"])
    assert workflow["jobs"]["nox"]["steps"][-1]["run"] == "nox"


def harness(*args: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})


@pytest.mark.slow
def test_a_generated_package_installs_lists_checks_and_runs_in_a_study(tmp_path, harness_home):
    name = "kit_probe_attention"
    assert main(["new-plugin", "attention", name, "--package", "--out", str(tmp_path)]) == 0
    root = tmp_path / "harness-kit-probe-attention"
    pip = [sys.executable, "-m", "pip"]
    install = subprocess.run([*pip, "install", "-q", "--no-deps", "--no-build-isolation", str(root)],
                             capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr
    try:
        listed = harness("list", "--kind", "attention", "-v", cwd=tmp_path)
        assert listed.returncode == 0 and name in listed.stdout, listed.stdout + listed.stderr
        assert "harness-kit-probe-attention 0.1.0" in listed.stdout
        checked = harness("check", name, cwd=tmp_path)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        own = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                             cwd=root, capture_output=True, text=True, timeout=300)
        assert own.returncode == 0 and " passed" in own.stdout, own.stdout + own.stderr
        study = {
            "name": "probe",
            "task": {"name": "copy", "params": {"length": 4, "vocab": 4, "num_train": 64, "num_val": 16}},
            "candidates": [{"name": "probe", "model": {
                "name": "transformer", "params": {"layers": 1, "heads": 2, "d_model": 16, "ffn_mult": 2},
                "search_declared": False, "attention": {"name": name}, "position": {"name": "none"}}}],
            "train": {"batch_size": 16, "val_every": 4, "num_threads": 1},
            "budget": {"trials": 1, "steps": 8},
            "confirm": {"seeds": 1},
        }
        (tmp_path / "probe.yaml").write_text(yaml.safe_dump(study))
        ran = harness("study", "run", "probe.yaml", cwd=tmp_path)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=f"sqlite:///{harness_home / 'mlflow.db'}")
        runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
        trained = [r for r in runs if r.data.params.get("model.attention.name") == name]
        assert trained and all(r.info.status == "FINISHED" for r in trained), [r.info for r in runs]
    finally:
        subprocess.run([*pip, "uninstall", "-y", "-q", "harness-kit-probe-attention"], capture_output=True)
