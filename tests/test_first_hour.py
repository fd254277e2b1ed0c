"""The first hour (issue 40): messages wrap only at a terminal and tests read them unwrapped;
Optuna's warnings about the harness's own choices are silent; a folder the user may not read
is one paragraph, not a PermissionError traceback (run as a real non-root user)."""

from __future__ import annotations

import os
import pty
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import pytest
from text import flat, one_paragraph

from harness.cli.main import main

LONG = "/tmp/" + "a-long-folder-name/" * 12 + "missing.yaml"  # a path as long as a temporary one


def _cli(*args: str, wrap: str | None, stderr: int | None = subprocess.PIPE, columns: int | None = None
         ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HARNESS_WRAP_WIDTH", "COLUMNS")}
    if wrap is not None:
        env["HARNESS_WRAP_WIDTH"] = wrap
    if columns is not None:
        env["COLUMNS"] = str(columns)
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], stdout=subprocess.PIPE, stderr=stderr,
                          text=True, timeout=120, env=env)


# -- wrapped text ---------------------------------------------------------------------------------
def test_an_error_to_a_file_or_pipe_is_one_whole_line():
    """A log keeps the message whole (the old CLI wrapped at 100 columns everywhere, so a
    phrase near a long path was split wherever the path's length put the break)."""
    done = _cli("train", LONG, wrap=None)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"config file {LONG} does not exist" in done.stderr


def test_an_error_at_a_terminal_is_wrapped_to_its_width():
    leader, follower = pty.openpty()
    try:
        done = _cli("train", LONG, wrap=None, stderr=follower, columns=60)
        os.close(follower)
        follower = -1
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the terminal closed (EIO on Linux)
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)
    text = b"".join(chunks).decode().replace("\r\n", "\n")
    assert done.returncode == 2
    lines = text.strip().splitlines()
    assert len(lines) > 1 and all(len(line) <= 60 for line in lines if " " in line.strip()), text
    assert f"config file {LONG} does not exist" in flat(text), "the path is never split"


def test_harness_wrap_width_sets_the_width_anywhere():
    done = _cli("train", LONG, wrap="40")
    assert len(done.stderr.splitlines()) > 3 and f"{LONG} does not exist" in flat(done.stderr)
    done = _cli("train", LONG, wrap="0")
    assert done.stderr.count("\n") == 1


def test_the_suite_wraps_every_space_so_a_raw_phrase_can_never_pass(capsys):
    """The guard (conftest.py): in tests every space of a paragraph is a line break, so a test
    that asserts a phrase on raw output fails every time, whatever a path's length."""
    assert os.environ["HARNESS_WRAP_WIDTH"] == "1"
    assert main(["train", LONG]) == 2
    err = capsys.readouterr().err
    assert "does not exist" not in err and "does not exist" in one_paragraph(err)
    assert " " not in err.strip(), "a space survived: the guard is off"


# -- Optuna's experimental warnings -----------------------------------------------------------------
def test_optunas_warnings_about_the_harnesss_own_choices_are_silent_and_only_those(tmp_path):
    import optuna
    from optuna.storages import RetryHeartbeatStaleTrialCallback

    from harness.study.storage import open_storage, quiet_experimental, retry_callback

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        retry_callback(None)  # the SIGUSR1 path of a study worker made it unguarded
        storage = open_storage(f"sqlite:///{tmp_path / 'o.db'}", heartbeat_s=60, grace_s=120)
        with quiet_experimental():  # as harness.study.progress.fail_stale calls it
            optuna.storages.fail_stale_trials(optuna.create_study(storage=storage))
    assert [str(w.message) for w in caught if "experimental" in str(w.message)] == []
    with warnings.catch_warnings(record=True) as caught:  # a user's own call still warns
        warnings.simplefilter("always")
        RetryHeartbeatStaleTrialCallback(max_retry=1)
    assert any("RetryHeartbeatStaleTrialCallback is experimental" in str(w.message) for w in caught)


# -- a folder the user may not read -------------------------------------------------------------------
def _as_nobody() -> list[str]:
    """A command prefix that runs as the unprivileged user ``nobody``, or a skip."""
    if os.geteuid() != 0:
        pytest.skip("needs root to become another user (a non-root run is covered by "
                    "test_faults_prepare's own non-root branch)")
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) is not installed")
    prefix = [setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    probe = subprocess.run([*prefix, sys.executable, "-c", "import harness.cli.main"], capture_output=True,
                           text=True, timeout=120)
    if probe.returncode != 0:
        pytest.skip(f"user nobody cannot run this interpreter: {probe.stderr.strip()[-200:]}")
    return prefix


@pytest.fixture
def shared_dir():
    """A folder user nobody can enter (pytest's temporary folders are root's only)."""
    folder = Path(tempfile.mkdtemp(prefix="harness-nobody-"))
    folder.chmod(0o777)
    yield folder
    for path in (folder, *folder.rglob("*")):
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o755)
    shutil.rmtree(folder)


def _prepare_as_nobody(prefix: list[str], folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HOME=str(folder), HARNESS_HOME=str(folder / "home"), HARNESS_WRAP_WIDTH="0",
               HARNESS_CACHE_DIR=str(folder / "cache"))
    return subprocess.run([*prefix, sys.executable, "-m", "harness.cli", "data", "prepare", *args, "--tokenizer",
                           "bytes", "--quiet"], capture_output=True, text=True, timeout=300, env=env, cwd=folder)


def test_an_unreadable_folder_is_one_paragraph_naming_it_for_a_non_root_user(shared_dir):
    """As `nobody`: a datasets.save_to_disk folder it may not enter, a glob and a file below
    such a folder, an --out below one: each exits 2 naming the folder and the user."""
    import datasets

    prefix = _as_nobody()
    datasets.Dataset.from_dict({"text": [f"document {i}" for i in range(20)]}).save_to_disk(
        str(shared_dir / "locked"))
    (shared_dir / "closed" / "in").mkdir(parents=True)
    (shared_dir / "a.jsonl").write_text('{"text": "a readable document"}\n')
    (shared_dir / "a.jsonl").chmod(0o644)
    for folder in (shared_dir / "locked", shared_dir / "closed"):
        folder.chmod(0)
    cases = [([str(shared_dir / "locked"), "--out", str(shared_dir / "o1")], shared_dir / "locked"),
             ([str(shared_dir / "closed" / "in" / "*.jsonl"), "--out", str(shared_dir / "o2")], shared_dir / "closed"),
             ([str(shared_dir / "closed" / "in" / "x.jsonl"), "--out", str(shared_dir / "o3")], shared_dir / "closed"),
             ([str(shared_dir / "a.jsonl"), "--out", str(shared_dir / "closed" / "in" / "o")], shared_dir / "closed")]
    for args, blocked in cases:
        done = _prepare_as_nobody(prefix, shared_dir, *args)
        assert done.returncode == 2, done.stderr
        line = one_paragraph(done.stderr)
        assert "PermissionError" not in line and f"may not search the folder {blocked}" in line, line
        assert "user nobody" in line and f"chmod u+rx {blocked}" in line
    assert not any((shared_dir / name).exists() for name in ("o1", "o2", "o3")), "nothing is written"
