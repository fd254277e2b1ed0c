"""The package as users install it: the wheel and the sdist built from this checkout, each
installed into a fresh virtual environment *without* ``-e``, and the CLI run from there.

The fresh environment gets the project's dependencies by a ``.pth`` line naming this
environment's site-packages (no download, no second torch); ``.pth`` files found there are not
executed, so this environment's editable install of the project is invisible, and the test
asserts that ``harness`` is imported from the new environment, never from the checkout.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("harness", "harness_plugins")


def shipped_files() -> set[str]:
    """Every file of the checkout the installed package needs: its modules and package data."""
    found = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                found.add(path.relative_to(ROOT).as_posix())
    return found


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """The wheel and the sdist, built by setuptools' own PEP 517 hooks from a copy of the
    tracked files (what a clean clone holds, without this checkout's build leftovers)."""
    out = tmp_path_factory.mktemp("dist")
    tree = tmp_path_factory.mktemp("tree")
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        source = ROOT / name
        if source.is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            (tree / name).write_bytes(source.read_bytes())
    built = {}
    for kind in ("wheel", "sdist"):  # one process each: setuptools keeps state between the two
        code = (f"import sys; from setuptools import build_meta as b; "
                f"print('BUILT', b.build_{kind}(sys.argv[1]))")
        done = subprocess.run([sys.executable, "-c", code, str(out)], cwd=tree, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        name = next(line for line in done.stdout.splitlines() if line.startswith("BUILT ")).split()[1]
        built[kind] = out / name
        assert built[kind].is_file(), done.stdout[-3000:]
    return built


def test_the_wheel_holds_every_module_and_data_file_of_the_package(built):
    names = set(zipfile.ZipFile(built["wheel"]).namelist())
    missing = sorted(shipped_files() - names)
    assert not missing, f"left out of the wheel: {missing}"
    entry_points = zipfile.ZipFile(built["wheel"]).read(
        next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert "harness = harness.cli.main:main" in entry_points


def test_the_sdist_holds_every_module_and_data_file_of_the_package(built):
    with tarfile.open(built["sdist"]) as archive:
        top = archive.getnames()[0].split("/")[0]
        names = {name.removeprefix(f"{top}/") for name in archive.getnames()}
    missing = sorted(shipped_files() - names)
    assert not missing, f"left out of the sdist: {missing}"


def fresh_env(path: Path) -> Path:
    venv.EnvBuilder(with_pip=False).create(path)
    python = path / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # this environment's dependencies, after the fresh environment's own site-packages
    outer = [p for p in sys.path if p.endswith("site-packages")] or [sysconfig.get_path("purelib")]
    (Path(site) / "outer.pth").write_text("".join(f"{p}\n" for p in outer))
    return python


def install(python: Path, artefact: Path, cwd: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                           "--no-deps", "--no-build-isolation", "--no-index", str(artefact)],
                          cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def run(python: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HARNESS_HOME=str(cwd / ".harness"), OMP_NUM_THREADS="1",
               PATH=f"{python.parent}{os.pathsep}{env.get('PATH', '')}")
    return subprocess.run([str(python.parent / args[0]), *args[1:]], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_installed_without_editable_the_cli_lists_trains_and_checks(built, kind, tmp_path):
    python = fresh_env(tmp_path / "venv")
    work = tmp_path / "work"
    work.mkdir()
    install(python, built[kind], work)

    where = run(python, work, "python", "-c", "import harness, harness_plugins; "
                "print(harness.__file__); print(harness_plugins.__file__)")
    assert where.returncode == 0, where.stderr
    for line in where.stdout.split():
        assert Path(line).is_relative_to(tmp_path / "venv"), where.stdout
        assert not Path(line).is_relative_to(ROOT), where.stdout

    helped = run(python, work, "harness", "--help")
    assert helped.returncode == 0 and "train" in helped.stdout, helped.stderr
    listed = run(python, work, "harness", "list")
    assert listed.returncode == 0, listed.stderr
    for name in ("multi_head", "rope", "gla", "transformer", "char_lm"):
        assert name in listed.stdout
    assert "failed to load" not in listed.stdout + listed.stderr

    # char_lm reads its corpus from the package data
    trained = run(python, work, "harness", "train", "--task", "char_lm", "--model", "transformer",
                  "--attention", "multi_head", "--position", "rope", "--max-steps", "2",
                  "--no-progress", "--set", "task.params.length=16", "--set", "train.batch_size=2",
                  "--set", "model.params.d_model=16", "--set", "model.params.layers=1",
                  "--set", "model.params.heads=2")
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert (work / ".harness").is_dir()

    checked = run(python, work, "harness", "check", "--kind", "position", "rope")
    assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr[-3000:]
    assert "rope" in checked.stdout
