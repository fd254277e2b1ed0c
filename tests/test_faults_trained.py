"""Faults of the third probe (issue 33) on `harness generate`, `harness export` and
`harness.load_model`: a shared folder never runs code unless trusted; every damaged folder is
a HarnessError (one paragraph, exit 2), checked before a byte of a wrong-sized model is
allocated; sampling values beyond meaning are refused; export never touches a user's
folder, refuses a taken or unwritable --out before its heavy imports, and writes its files
with one mode."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import threading

import pytest
from text import one_paragraph

import harness
from harness.cli.main import main
from harness.errors import HarnessError
from harness.run.pipeline import train

COPY = {"task": {"name": "copy", "params": {"length": 4, "vocab": 5, "num_train": 32, "num_val": 8}},
        "model": {"name": "transformer", "params": {"d_model": 16, "layers": 1, "heads": 2}},
        "train": {"max_steps": 2, "batch_size": 8, "progress": False, "num_threads": 1}}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(run id, store folder, an exported folder) of a tiny copy run."""
    root = tmp_path_factory.mktemp("trained")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HARNESS_HOME", str(root / "home"))
        result = train({**COPY, "tracking": {"uri": f"sqlite:///{root / 'm.db'}"}})
        assert main(["export", result.run_id, "--out", str(root / "exported")]) == 0
    return result.run_id, root, root / "exported"


@pytest.fixture
def folder(exported, tmp_path):
    """A fresh copy of the exported folder to damage."""
    out = tmp_path / "copy"
    shutil.copytree(exported[2], out)
    return out


def edit_meta(folder, change) -> None:
    meta = json.loads((folder / "model.json").read_text())
    change(meta)
    (folder / "model.json").write_text(json.dumps(meta))


def test_a_shared_folder_never_runs_a_plugin_unless_trusted(folder, tmp_path, capsys):
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.py"
    evil.write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    edit_meta(folder, lambda m: m["config"].__setitem__("plugins", [str(evil)]))
    with pytest.raises(HarnessError, match="trust_plugins=True"):
        harness.load_model(folder)
    assert main(["generate", str(folder), "--prompt", "s1 s2"]) == 2
    assert "--trust-plugins" in one_paragraph(capsys.readouterr().err)
    assert not marker.exists(), "nothing was imported"
    model, config = harness.load_model(folder, trust_plugins=True)
    assert marker.exists() and config["plugins"] == [str(evil)]
    assert main(["generate", str(folder), "--prompt", "s1 s2", "--trust-plugins"]) == 0


def _damage(folder, how: str) -> None:
    weights, meta = folder / "model.safetensors", folder / "model.json"
    if how == "junk json":
        meta.write_text("{junk")
    elif how == "empty json":
        meta.write_text("")
    elif how == "json list":
        meta.write_text("[1, 2]")
    elif how == "json without info":
        edit_meta(folder, lambda m: m.pop("info"))
    elif how == "sizes that do not fit":
        edit_meta(folder, lambda m: m["config"]["model"]["params"].__setitem__("d_model", 32))
    elif how == "a million wide":
        edit_meta(folder, lambda m: m["config"]["model"]["params"].__setitem__("d_model", 10**6))
    elif how == "vocab that does not fit":
        edit_meta(folder, lambda m: m["info"].__setitem__("vocab_size", 99))
    elif how == "truncated weights":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif how == "empty weights":
        weights.write_bytes(b"")
    elif how == "pickle weights":
        weights.write_bytes(pickle.dumps({"w": [1.0, 2.0]}))
    elif how == "weights a folder":
        weights.unlink()
        weights.mkdir()
    elif how == "weights a fifo":
        weights.unlink()
        os.mkfifo(weights)
    elif how == "json a fifo":
        meta.unlink()
        os.mkfifo(meta)


DAMAGES = ["junk json", "empty json", "json list", "json without info", "sizes that do not fit",
           "a million wide", "vocab that does not fit", "truncated weights", "empty weights",
           "pickle weights", "weights a folder", "weights a fifo", "json a fifo"]


@pytest.mark.parametrize("how", DAMAGES)
def test_every_damaged_folder_is_the_harness_s_own_error(folder, capsys, how):
    _damage(folder, how)
    timer = threading.Timer(60, os._exit, (99,))  # a FIFO must never be waited on
    timer.start()
    try:
        with pytest.raises(HarnessError) as raised:
            harness.load_model(folder)
        assert type(raised.value).__module__.startswith("harness.")
        assert main(["generate", str(folder), "--prompt", "s1"]) == 2
    finally:
        timer.cancel()
    line = one_paragraph(capsys.readouterr().err)
    assert str(folder) in line


def test_sampling_values_beyond_meaning_are_refused(exported, monkeypatch, capsys):
    run_id, root, _ = exported
    monkeypatch.setenv("HARNESS_HOME", str(root / "home"))
    for flags in (["--temperature", "1e-310"], ["--temperature", "inf"], ["--temperature", "nan"],
                  ["--seed", str(2**70)], ["--seed", "-1"]):
        assert main(["generate", run_id, "--prompt", "s1", *flags]) == 2, flags
        assert flags[0] in one_paragraph(capsys.readouterr().err)
    for ref in ("a" * 300, "x/" * 200):
        assert main(["generate", ref, "--prompt", "s1"]) == 2
        one_paragraph(capsys.readouterr().err)
    assert main(["export", "a" * 300, "--out", str(root / "never")]) == 2
    one_paragraph(capsys.readouterr().err)


def test_export_never_touches_a_users_folder_and_writes_one_mode(exported, tmp_path, monkeypatch):
    run_id, root, _ = exported
    monkeypatch.setenv("HARNESS_HOME", str(root / "home"))
    mine = tmp_path / ".keep.tmp"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    assert main(["export", run_id, "--out", str(tmp_path / "keep")]) == 0
    assert (mine / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".keep.tmp", "keep"]
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "keep").iterdir()}
    assert sorted(modes) == ["model.json", "model.safetensors"] and len(set(modes.values())) == 1, modes


@pytest.mark.parametrize("where", ["exists", "below a file", "proc"])
def test_export_refuses_a_taken_or_unwritable_out_before_importing_torch(tmp_path, where):
    (tmp_path / "taken").mkdir()
    (tmp_path / "file").write_text("x")
    out = {"exists": tmp_path / "taken", "below a file": tmp_path / "file" / "out",
           "proc": "/proc/harness-export"}[where]
    script = ("import sys; from harness.cli.main import main; "
              f"code = main(['export', '0123abcd', '--out', {str(out)!r}]); "
              "print(sorted(m for m in ('torch', 'lightning', 'mlflow') if m in sys.modules)); sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout.strip() == "[]", done.stdout
    assert "--out" in one_paragraph(done.stderr)


def test_generate_on_a_classifier_says_so_before_reading_the_prompt(tmp_path, monkeypatch, capsys):
    from pathlib import Path

    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / "home"))
    parity = train({"task": {"name": "parity", "params": {"length": 4, "num_train": 16, "num_val": 4}},
                    "model": {"name": "transformer", "params": {"d_model": 8, "layers": 1, "heads": 2}},
                    "train": {"max_steps": 2, "batch_size": 8, "progress": False, "num_threads": 1},
                    "plugins": [str(Path(__file__).resolve().parents[1] / "docs/examples/parity_task.py")],
                    "tracking": {"uri": f"sqlite:///{tmp_path / 'm.db'}"}})
    capsys.readouterr()
    assert main(["generate", parity.run_id, "--prompt", "words not in any vocabulary"]) == 2
    line = one_paragraph(capsys.readouterr().err)
    assert "generate needs a language-model or encoder-decoder run" in line and "vocabulary" not in line
