"""``harness bench gpu`` refuses every bad option before any work (issue 49): one paragraph
naming the option and the fix, exit 2, no traceback, nothing written; and every benchmark's
--output is checked writable before the measurements (a refusal after them loses them)."""

from __future__ import annotations

from pathlib import Path

import pytest
from text import one_paragraph

from harness.cli import main as cli


def refused(capsys, *args: str) -> str:
    assert cli.main(["bench", "gpu", "--dry-run", *args]) == 2, args
    return one_paragraph(capsys.readouterr().err)


@pytest.mark.parametrize("deadline", ["0", "-5", "nan", "inf", "1e12"])
def test_a_deadline_that_is_no_time_box_is_refused(tmp_path, capsys, deadline):
    text = refused(capsys, "--deadline", deadline, "--records", str(tmp_path / "r"))
    assert f"--deadline {float(deadline):g}" in text and "--deadline 480" in text
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("args, said", [
    (["--steps", "0"], "--steps 0: give at least 1"),
    (["--repeats", "-1"], "--repeats -1: give at least 1"),
    (["--test-timeout", "0"], "--test-timeout 0: give a positive number of seconds"),
    (["--min-time", "nan"], "--min-time nan"),
    (["--records", "r"], "--records belong to the time-boxed proof: add --deadline"),
    (["--tests", "tests/test_gpu.py"], "--tests belong to the time-boxed proof"),
])
def test_options_without_meaning_are_refused(capsys, args, said):
    assert said in refused(capsys, *args)


def test_tests_that_are_missing_or_not_tests_are_refused(tmp_path, capsys):
    proof = ["--deadline", "60", "--records", str(tmp_path / "r")]
    assert "--tests tests/nope.py does not exist" in refused(capsys, *proof, "--tests", "tests/nope.py")
    readme = str(Path(__file__).resolve().parents[1] / "README.md")
    assert f"--tests {readme} is not a pytest file" in refused(capsys, *proof, "--tests", readme)
    assert not (tmp_path / "r").exists()


def test_records_that_are_a_file_or_unwritable_are_refused(tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("mine\n")
    assert f"--records {a_file}: {a_file} is a file, not a folder" in refused(
        capsys, "--deadline", "60", "--records", str(a_file))
    assert a_file.read_text() == "mine\n"
    assert "--records /proc/proof: nothing can be written in /proc" in refused(
        capsys, "--deadline", "60", "--records", "/proc/proof")


def test_an_output_that_cannot_be_written_is_refused_before_measuring(tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("mine\n")
    for output, said in ((str(a_file / "gpu.md"), "is a file, not a folder"),
                         ("/proc/gpu.md", "nothing can be written in /proc"),
                         (str(a_file), "already exists (a file)")):
        benches = [["gpu", "--dry-run"]] + ([["attention", "--lengths", "16"]] if "proc" in output else [])
        for bench in benches:  # record_path: every benchmark's --output
            assert cli.main(["bench", *bench, "--output", output]) == 2
            text = one_paragraph(capsys.readouterr().err)
            assert f"--output {output}" in text and said in text, text
            assert "| " not in text  # refused before the first row was measured
    assert a_file.read_text() == "mine\n"
