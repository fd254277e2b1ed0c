#!/usr/bin/env python3
"""Build a wheelhouse for a GPU node without internet: exactly the wheels the node lacks.

Run on a connected machine, from a checkout of the project::

    python offline/wheelhouse.py --node offline/nodes/reference_h100.txt --out .whl

``--node`` is the node's ``pip list --format=freeze`` (``name==version`` lines; ``pip
freeze`` prints ``name @ url`` for some packages, which gives no version). What it does:

1. builds the project's wheel from the tracked files of this checkout;
2. reads the project's requirements from that wheel (the core ones and ``--extras``,
   default ``gpu``: fla-core, flash-linear-attention, triton), with one substitution:
   ``mlflow`` is brought as ``mlflow-skinny`` plus ``sqlalchemy`` and ``alembic`` (the
   SQLite-backed store the harness writes; not the tracking server's Flask stack, so
   ``harness ui`` is not available on the node);
3. resolves them with pip's own resolver in a scratch environment of the node's Python
   (``--python``, a CPython of the node's major.minor on this machine) in which every
   package of the node's list is present (an empty ``.dist-info`` of its name and version):
   what pip would install there is what the node lacks, and a package of the node that
   does not satisfy a requirement is refused, never replaced;
4. downloads those wheels for the node's platform (``--platform``, default manylinux
   glibc 2.28 and older, x86-64; binary wheels only), beside the project's wheel, the
   installer (``install.py``) and ``manifest.json`` (each wheel's name, version, size and
   SHA-256), and prints the sizes against ``--max-mib`` (default 48).

torch and triton are never brought: the node's own are used. On the node,
``python3 WHEELHOUSE/install.py --target DIR`` installs them (docs/scaling_out.md, "A GPU node
without internet"). Needs pip >= 22.3 here (``pip --python``).
"""

from __future__ import annotations

import argparse
import email.parser
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: a requirement the node gets in another form: (its replacement, what else it then needs)
SUBSTITUTES = {"mlflow": ("mlflow-skinny", ("sqlalchemy>=1.4,<3", "alembic!=1.10.0,<2"))}
#: the node's own, never brought (a wheelhouse with them would shadow its CUDA build)
NEVER = frozenset({"torch", "triton"})
#: the default platforms: manylinux with glibc 2.28 or older, x86-64 (pip matches each exactly)
PLATFORMS = tuple([f"manylinux_2_{n}_x86_64" for n in range(28, 16, -1)]
                  + ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"])


class Refused(Exception):
    """A wheelhouse that cannot be built as asked (exit 2, one paragraph)."""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_freeze(path: Path) -> dict[str, str]:
    """``name==version`` per line (comments and blank lines skipped) -> {canonical name: version}."""
    found: dict[str, str] = {}
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        kind = "a folder" if path.is_dir() else "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) \
            else (exc.strerror or str(exc)).lower()
        raise Refused(f"--node {path}: {kind}. Give a text file: the node's `python3 -m pip list "
                      f"--format=freeze`, saved there.") from None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        if match is None:
            raise Refused(f"{path}, line {number}: '{line}' is not 'name==version'. Give the node's "
                          f"`python3 -m pip list --format=freeze` (plain `pip freeze` prints "
                          f"'name @ url' for packages installed from a file, without their version).")
        found[canonical(match[1])] = match[2]
    if not found:
        raise Refused(f"{path} lists no package: give the node's `python3 -m pip list --format=freeze`.")
    missing = sorted(NEVER - found.keys())
    if missing:
        raise Refused(f"{path} has no {' and no '.join(missing)}: the node must have its own PyTorch "
                      f"(and Triton) for its CUDA; this wheelhouse never brings them. Install them "
                      f"there first, or give the list of a node that has them.")
    return found


#: the oldest setuptools that reads pyproject.toml's SPDX ``license`` string (PEP 639)
SETUPTOOLS_MIN = (77, 0)


def check_setuptools(python: str = sys.executable) -> str:
    """The version of setuptools ``python`` builds the project's wheel with; Refused when it
    has none or one older than :data:`SETUPTOOLS_MIN` (the wheel build would fail on the
    licence field), naming the Python and the fix."""
    probe = "import setuptools; print(setuptools.__version__)"
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise Refused(f"could not run {python} to read its setuptools ({type(exc).__name__}).") from None
    version = done.stdout.strip()
    parts = tuple(int(x) for x in re.findall(r"\d+", version)[:2]) if done.returncode == 0 else ()
    if len(parts) < 2 or parts < SETUPTOOLS_MIN:
        have = f"setuptools {version}" if done.returncode == 0 else "no setuptools"
        raise Refused(f"this script builds the project's wheel with the Python running it ({python}), "
                      f"which has {have}; pyproject.toml's licence field needs setuptools >= "
                      f"{'.'.join(map(str, SETUPTOOLS_MIN))}. Run it with a Python that has it (the "
                      f"project's virtual environment: .venv/bin/python offline/wheelhouse.py ...), or "
                      f"upgrade it there: {python} -m pip install 'setuptools>=77'.")
    return version


def build_project_wheel(out: Path) -> Path:
    """The project's wheel, built by setuptools from a copy of the checkout's tracked files."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    with tempfile.TemporaryDirectory(prefix="wheelhouse-tree-") as tmp:
        tree = Path(tmp)
        for name in filter(None, listed):
            source = ROOT / name
            if source.is_file():
                (tree / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, tree / name)
        code = "import sys; from setuptools import build_meta as b; print('BUILT', b.build_wheel(sys.argv[1]))"
        done = subprocess.run([sys.executable, "-c", code, str(out)], cwd=tree, capture_output=True,
                              text=True, timeout=600)
    if done.returncode != 0:
        raise Refused(f"building the project's wheel failed:\n{done.stderr[-2000:]}")
    name = next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("BUILT "))
    return out / name


def wheel_metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return email.parser.Parser().parsestr(archive.read(name).decode())


def node_environment(python: str, extra: str) -> dict[str, str]:
    """Marker values of a CPython ``python`` (major.minor) on linux x86-64 (the node)."""
    return {"python_version": python, "python_full_version": f"{python}.0", "sys_platform": "linux",
            "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
            "implementation_name": "cpython", "platform_python_implementation": "CPython",
            "platform_release": "", "platform_version": "", "implementation_version": f"{python}.0",
            "extra": extra}


def requirements(wheel: Path, extras: list[str], python: str) -> list[str]:
    """The project's requirements for the node (markers evaluated there, ``extras`` chosen),
    each without its marker, with :data:`SUBSTITUTES` applied."""
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pip vendors it
        from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]

    chosen: list[str] = []
    for text in wheel_metadata(wheel).get_all("Requires-Dist") or []:
        req = Requirement(text)
        if req.marker is not None and not any(req.marker.evaluate(node_environment(python, e))
                                              for e in ["", *extras]):
            continue
        req.marker = None
        name = canonical(req.name)
        if name in SUBSTITUTES:
            other, needs = SUBSTITUTES[name]
            chosen += [f"{other}{req.specifier}", *needs]
        else:
            chosen.append(str(req))
    return chosen


def resolver_python(given: str | None, python: str) -> str:
    """A CPython ``python`` (major.minor) on this machine: the scratch environment's."""
    candidates = [given] if given else [shutil.which(f"python{python}"), sys.executable,
                                         *sorted(str(p) for p in Path.home().glob(f".pyenv/versions/{python}*/bin/python"))]
    for candidate in filter(None, candidates):
        try:
            out = subprocess.run([candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                 capture_output=True, text=True, timeout=60).stdout.strip()
        except (OSError, subprocess.SubprocessError) as exc:
            if given:
                raise Refused(f"--python {given} cannot be run ({exc}): give the path of a Python "
                              f"{python} of this machine (pyenv, uv python, conda).") from None
            continue
        if out == python:
            return candidate
        if given:
            said = f"is Python {out}" if out else "printed no Python version (it is not a Python)"
            raise Refused(f"--python {given} {said}, but the node runs {python}: pip resolves "
                          f"for the interpreter it runs in (markers, Requires-Python), so give a Python "
                          f"{python} of this machine (pyenv, uv python, conda).")
    raise Refused(f"no Python {python} found here (python{python} on PATH, this interpreter, pyenv): pip "
                  f"resolves for the interpreter it runs in, so give one with --python PATH.")


def resolve(python: str, node: dict[str, str], reqs: list[str], pip_args: list[str], work: Path
            ) -> list[tuple[str, str, str]]:
    """What pip would install for ``reqs`` on the node: [(canonical name, version, file name)]."""
    env = work / "node-env"
    subprocess.run([python, "-m", "venv", "--without-pip", str(env)], check=True)
    target = env / "bin" / "python"
    site = subprocess.run([str(target), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    for name, version in node.items():  # the node's packages, present as far as pip can tell
        info = Path(site) / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "INSTALLER").write_text("wheelhouse\n")
    report = work / "report.json"
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(target), "install", "--dry-run",
                           "--quiet", "--report", str(report), "--only-binary=:all:", "--no-input",
                           *pip_args, *reqs], capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if "is ignored" not in line]
        raise Refused("pip could not resolve the project's requirements for the node:\n"
                      + "\n".join(errors[-30:]))
    planned = [(canonical(i["metadata"]["name"]), i["metadata"]["version"],
                i["download_info"]["url"].rsplit("/", 1)[-1].split("#")[0])
               for i in json.loads(report.read_text())["install"]]
    replaced = [(n, v) for n, v, _ in planned if n in node]
    if replaced:
        said = ", ".join(f"{n} {node[n]} (would become {v})" for n, v in replaced)
        raise Refused(f"the node's {said} does not satisfy the project's requirements "
                      f"({', '.join(reqs)}). This wheelhouse never replaces a package of the node "
                      f"(a copy on PYTHONPATH would shadow it for everything else there): update it "
                      f"on the node, or pin a version of the project's requirement it satisfies.")
    brought = [n for n, _, _ in planned if n in NEVER]
    if brought:
        raise Refused(f"resolving would bring {', '.join(brought)}, which the node must have itself.")
    return planned


def download(pins: list[tuple[str, str, str]], out: Path, python: str, platforms: list[str],
             pip_args: list[str]) -> list[Path]:
    """The wheels of ``pins`` for the node's Python and platforms, into ``out``."""
    if not pins:
        return []
    args = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
            "--python-version", python, "--implementation", "cp", "-d", str(out), "--no-input",
            *[f"--platform={p}" for p in platforms], *pip_args, *[f"{n}=={v}" for n, v, _ in pins]]
    done = subprocess.run(args, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if "is ignored" not in line]
        raise Refused("pip found no wheel for the node's platform for some of them (raise --platform "
                      "to the node's glibc, `ldd --version` there):\n" + "\n".join(errors[-20:]))
    files = []
    for name, version, _ in pins:
        found = [w for w in out.glob("*.whl")
                 if canonical(w.name.split("-")[0]) == name and w.name.split("-")[1] == version]
        if len(found) != 1:
            raise Refused(f"expected one wheel of {name} {version} in {out}, found {len(found)}")
        files += found
    return files


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree_bytes() -> int:
    """The checkout's tracked and untracked-not-ignored files (what travels with it)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    return sum((ROOT / n).stat().st_size for n in filter(None, listed) if (ROOT / n).is_file())


def mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def build(args: argparse.Namespace) -> dict:
    node_file = Path(args.node)
    node = read_freeze(node_file)
    check_setuptools()  # before anything is written
    out = Path(args.out).resolve()
    if out.exists() and not out.is_dir():
        raise Refused(f"--out {out} is a file: give a new folder for the wheelhouse.")
    if out.exists() and any(out.iterdir()):
        raise Refused(f"--out {out} is not empty: give a new folder (a wheelhouse holds exactly the "
                      f"wheels of one node; old ones would be installed too).")
    if not re.fullmatch(r"3\.\d{1,2}", args.python_version):
        raise Refused(f"--python-version {args.python_version}: give the node's Python as major.minor, "
                      f"e.g. --python-version 3.12.")
    python = resolver_python(args.python, args.python_version)
    existed = out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        return fill(args, node, node_file, out, python)
    except BaseException:  # a failed build leaves --out as it found it (empty, or absent)
        for entry in list(out.iterdir()) if existed else [out]:
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
        raise


def fill(args: argparse.Namespace, node: dict[str, str], node_file: Path, out: Path, python: str) -> dict:
    """The wheelhouse's files in ``out`` (see :func:`build`)."""
    project = build_project_wheel(out)
    reqs = requirements(project, args.extras, args.python_version)
    with tempfile.TemporaryDirectory(prefix="wheelhouse-") as tmp:
        planned = resolve(python, node, reqs, args.pip_arg, Path(tmp))
    wheels = download(planned, out, args.python_version, args.platform or list(PLATFORMS), args.pip_arg)
    shutil.copyfile(Path(__file__).with_name("install.py"), out / "install.py")
    meta = wheel_metadata(project)
    manifest = {
        "project": {"file": project.name, "name": meta["Name"], "version": meta["Version"],
                    "bytes": project.stat().st_size, "sha256": sha256(project)},
        "extras": args.extras, "python": args.python_version, "packages": ["harness", "harness_plugins"],
        "platforms": args.platform or list(PLATFORMS),
        "node": {"file": node_file.name, "sha256": sha256(node_file), "packages": len(node)},
        "requirements": reqs,
        "substitutes": {k: {"by": v[0], "with": list(v[1])} for k, v in SUBSTITUTES.items()},
        "never": sorted(NEVER),
        "wheels": [{"file": w.name, "name": n, "version": v, "bytes": w.stat().st_size, "sha256": sha256(w)}
                   for (n, v, _), w in zip(planned, wheels, strict=True)],
    }
    manifest["total_bytes"] = sum(p.stat().st_size for p in out.iterdir()) + 4096  # + the manifest
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def report(manifest: dict, max_mib: float) -> int:
    rows = sorted(manifest["wheels"], key=lambda w: -w["bytes"])
    print(f"{'wheel':<48} {'version':<16} {'size':>12}")
    for w in rows:
        print(f"{w['name']:<48} {w['version']:<16} {mib(w['bytes']):>12}")
    print(f"{'the project: ' + manifest['project']['file']:<65} {mib(manifest['project']['bytes']):>12}")
    total = manifest["total_bytes"]
    print(f"\n{len(rows)} wheels the node lacks + the project + install.py + manifest.json: {mib(total)} "
          f"(limit {max_mib:g} MiB)")
    print(f"with the checkout's files (what a device run carries beside it): {mib(total + tree_bytes())}")
    if total > max_mib * 2**20:
        print(f"error: the wheelhouse is {mib(total)}, over --max-mib {max_mib:g}.", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--node", required=True, help="the node's `pip list --format=freeze`")
    p.add_argument("--out", required=True, help="a new folder for the wheelhouse")
    p.add_argument("--extras", nargs="*", default=["gpu"], help="the project's extras to bring (default gpu)")
    p.add_argument("--python-version", default="3.12", help="the node's Python, major.minor (default 3.12)")
    p.add_argument("--python", default=None, help="a Python of that version here (default: found)")
    p.add_argument("--platform", action="append", default=None,
                   help="a wheel platform tag of the node (repeatable; default manylinux glibc <= 2.28, x86-64)")
    p.add_argument("--pip-arg", action="append", default=[], metavar="ARG",
                   help="passed to pip (repeatable), e.g. --pip-arg=--index-url=URL")
    p.add_argument("--max-mib", type=float, default=48.0, help="fail above this total (default 48)")
    args = p.parse_args(argv)
    try:
        manifest = build(args)
    except Refused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return report(manifest, args.max_mib)


if __name__ == "__main__":
    os.environ.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    sys.exit(main())
