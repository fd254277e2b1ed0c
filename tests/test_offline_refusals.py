"""The offline installer and wheelhouse builder refuse bad use in one paragraph (exit 2, no
traceback) and leave nothing behind: a --target that is a file or under /proc, a manifest that
is missing, not JSON or empty, a corrupt wheel (the target it made is removed), --check-only on
an empty target; --node missing, binary or a folder, --out a file, a --python that is not a
Python; --out is neither created nor left filled by a build refused later (issue 49)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from test_offline import load, make_house, run_installer
from text import flat

wheelhouse = load("wheelhouse")
PYTHON = Path(sys.executable)


def refused(done) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    return flat(done.stderr)


@pytest.fixture
def house(tmp_path) -> Path:
    index = tmp_path / "index"
    from test_offline import make_wheel

    make_wheel(index, "alpha", "1.0", ("beta>=2",))
    make_wheel(index, "beta", "2.0")
    return make_house(tmp_path, index, (), "")


def test_a_target_that_is_a_file_or_cannot_be_written_is_refused(house, tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("mine\n")
    assert "is a file, not a folder" in refused(run_installer(PYTHON, house, "--target", str(a_file)))
    assert a_file.read_text() == "mine\n"
    text = refused(run_installer(PYTHON, house, "--target", "/proc/harness-site"))
    assert "--target /proc/harness-site: nothing can be written in /proc" in text


@pytest.mark.parametrize("content, said", [(None, "no manifest.json beside install.py"),
                                           ("{not json", "cannot be read as JSON"),
                                           ("{}", "lacks python, never, wheels, project"),
                                           ("[1, 2]", "lacks python")])
def test_a_missing_or_damaged_manifest_is_refused(house, tmp_path, content, said):
    manifest = house / "manifest.json"
    if content is None:
        manifest.unlink()
    else:
        manifest.write_text(content)
    for extra in ((), ("--check-only",)):
        assert said in refused(run_installer(PYTHON, house, "--target", str(tmp_path / "site"), *extra))
    assert not (tmp_path / "site").exists()


@pytest.mark.parametrize("how", [(), ("--no-pip",)])
def test_a_corrupt_wheel_fails_and_its_target_is_removed(house, tmp_path, how):
    manifest = json.loads((house / "manifest.json").read_text())
    (house / manifest["project"]["file"]).write_bytes(b"not a zip archive")
    target = tmp_path / "site"
    done = run_installer(PYTHON, house, "--target", str(target), *how)
    assert done.returncode in (1, 2) and "Traceback" not in done.stderr, done.stderr
    assert not target.exists()


def test_check_only_on_an_empty_target_says_to_install_first(house, tmp_path):
    (tmp_path / "empty").mkdir()
    for target in (tmp_path / "empty", tmp_path / "absent"):
        assert "holds nothing to check: install into it first" in refused(
            run_installer(PYTHON, house, "--target", str(target), "--check-only"))


# -- the wheelhouse builder -----------------------------------------------------------------------
def build(tmp_path, capsys, *args: str) -> str:
    code = wheelhouse.main(list(args))
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    return flat(err)


def test_a_node_list_that_cannot_be_read_is_refused(tmp_path, capsys):
    binary = tmp_path / "node.bin"
    binary.write_bytes(b"\xff\xfe\x00torch")
    for node, said in ((tmp_path / "absent.txt", "no such file"), (binary, "not UTF-8 text"),
                       (tmp_path, "a folder")):
        text = build(tmp_path, capsys, "--node", str(node), "--out", str(tmp_path / "out"))
        assert f"--node {node}: {said}" in text and "pip list --format=freeze" in text
    assert not (tmp_path / "out").exists()


def node_list(tmp_path: Path) -> Path:
    node = tmp_path / "node.txt"
    node.write_text("torch==2.11.0\ntriton==3.6.0\n")
    return node


def test_out_that_is_a_file_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    out.write_text("mine\n")
    assert f"--out {out} is a file" in build(tmp_path, capsys, "--node", str(node_list(tmp_path)), "--out", str(out))
    assert out.read_text() == "mine\n"


@pytest.mark.parametrize("args, said", [(("--python-version", "3.99"), "no Python 3.99 found here"),
                                        (("--python-version", "twelve"), "give the node's Python as major.minor"),
                                        (("--python", "/bin/true"), "--python /bin/true printed no Python version"),
                                        (("--python", "/nonexistent/python"), "cannot be run")])
def test_a_refused_build_leaves_no_out_folder_behind(tmp_path, capsys, args, said):
    out = tmp_path / "out"
    text = build(tmp_path, capsys, "--node", str(node_list(tmp_path)), "--out", str(out), *args)
    assert said in text, text
    assert "is Python ," not in text
    assert not out.exists()  # the next run is not refused with "--out is not empty"


def test_a_build_refused_after_it_began_empties_out_again(tmp_path, capsys):
    """The project's wheel is built into --out, then pip finds nothing (an index that has
    nothing, as an unreachable one): --out is empty again for the next run."""
    out, nothing = tmp_path / "out", tmp_path / "nothing"
    out.mkdir()
    nothing.mkdir()
    text = build(tmp_path, capsys, "--node", str(node_list(tmp_path)), "--out", str(out),
                 "--python", sys.executable, "--python-version", ".".join(map(str, sys.version_info[:2])),
                 "--pip-arg=--no-index", f"--pip-arg=--find-links={nothing}")
    assert "pip could not resolve" in text
    assert out.is_dir() and not any(out.iterdir())
