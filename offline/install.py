#!/usr/bin/env python3
"""Install a wheelhouse (made by offline/wheelhouse.py) on a node without internet, then check it.

Run with the node's Python (the one that has its torch), from anywhere::

    python3 WHEELHOUSE/install.py --target /tmp/site
    export PYTHONPATH=/tmp/site

It installs the wheels of ``manifest.json`` beside it into ``--target`` (pip with
``--no-index --no-deps``; without pip, by unpacking the wheels), skipping any package the
node already has: the node's own torch, triton and every other package stay as they are and
are used (a copy on PYTHONPATH would shadow them). Then, in a fresh process with the target
on PYTHONPATH, it checks (``--check-only`` does only this):

* torch and triton are the node's (not from the target);
* every requirement of the project (core and the wheelhouse's extras) is met, with the
  wheelhouse's substitutions (``mlflow`` by ``mlflow-skinny``, sqlalchemy and alembic);
* every module of ``harness`` and ``harness_plugins`` imports, except those needing an
  extra the wheelhouse does not bring (lm-eval: ``harness eval``), which are named;
* the built-in plugins' entry points are found.

Standard library only (and ``packaging``, which lightning brings, for the version check).
Exit 0 when all holds, 1 when a check fails, 2 on bad use.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: modules a missing optional extra may leave unimportable: top-level name -> the extra
OPTIONAL = {"lm_eval": "eval (harness eval, harness-lm-eval)", "datasets": "eval", "nox": "dev"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def under(path: str | None, folder: Path) -> bool:
    return path is not None and Path(path).resolve().is_relative_to(folder.resolve())


def node_packages(target: Path) -> dict[str, str]:
    """The distributions this interpreter sees outside ``target``: {canonical name: version}."""
    found = {}
    for dist in importlib.metadata.distributions():
        where = getattr(dist, "_path", None)
        if where is not None and under(str(where), target):
            continue
        name = dist.metadata["Name"]
        if name:
            found.setdefault(canonical(name), dist.version)
    return found


def unpack(wheel: Path, target: Path) -> None:
    """Install a wheel without pip: its files into ``target``, its ``.data/purelib|platlib``
    too (scripts and headers are not needed: run ``python3 -m harness.cli``)."""
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.infolist():
            parts = Path(member.filename).parts
            if ".." in parts or Path(member.filename).is_absolute():
                raise SystemExit(f"error: {wheel.name} holds an unsafe path {member.filename}")
            if parts and parts[0].endswith(".data"):
                if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                    continue
                parts = parts[2:]
            dest = target.joinpath(*parts)
            if member.is_dir():
                dest.mkdir(parents=True, exist_ok=True)
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(member) as src, open(dest, "wb") as out:
                shutil.copyfileobj(src, out)


def install(manifest: dict, target: Path, use_pip: bool) -> int:
    py = ".".join(map(str, sys.version_info[:2]))
    if py != manifest["python"]:
        print(f"error: this wheelhouse is for Python {manifest['python']}, and this is {py} "
              f"({sys.executable}). Run it with the node's Python, or build one for {py} "
              f"(offline/wheelhouse.py --python-version {py}).", file=sys.stderr)
        return 2
    have = node_packages(target)
    never = [n for n in manifest["never"] if n not in have]
    if never:
        print(f"error: this Python has no {', '.join(never)}: the wheelhouse never brings them; run it "
              f"with the node's Python (the one whose torch sees the GPU).", file=sys.stderr)
        return 2
    files, kept = [], []
    for w in manifest["wheels"]:
        if w["name"] in have:
            kept.append(f"{w['name']} {have[w['name']]}")
        else:
            files.append(HERE / w["file"])
    files.append(HERE / manifest["project"]["file"])
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        print(f"error: the wheelhouse lacks {', '.join(missing)}", file=sys.stderr)
        return 2
    target.mkdir(parents=True, exist_ok=True)
    if kept:
        print(f"kept the node's own: {', '.join(kept)}")
    pip = use_pip and importlib.util.find_spec("pip") is not None
    if pip:
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps",
                               "--no-compile", "--disable-pip-version-check", "--upgrade", "--quiet",
                               "--target", str(target), *map(str, files)])
        if done.returncode != 0:
            return 1
    else:
        for f in files:
            unpack(f, target)
    print(f"installed {len(files)} wheels into {target} ({'pip' if pip else 'unpacked'}); "
          f"use it with: export PYTHONPATH={target}")
    return 0


def check(manifest: dict, target: Path) -> int:
    """The checks of the module documentation, in this process (run with the target on PYTHONPATH)."""
    try:
        from packaging.requirements import Requirement
    except ImportError:
        from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]

    problems, notes = [], []
    for name in manifest["never"]:
        spec = importlib.util.find_spec(name)
        if spec is None:
            problems.append(f"{name} is not importable")
        elif under(spec.origin, target):
            problems.append(f"{name} is imported from the target ({spec.origin}), not the node's")
        else:
            notes.append(f"{name} {importlib.metadata.version(name)} (the node's, {Path(spec.origin).parent})")
    project = manifest["project"]["name"]
    substitutes = manifest["substitutes"]
    extras = ["", *manifest["extras"]]
    met = 0
    try:
        required = importlib.metadata.requires(project) or []
    except importlib.metadata.PackageNotFoundError:
        problems.append(f"{project} is not installed here: is the target on PYTHONPATH? "
                        f"(export PYTHONPATH={target})")
        required = []
    for text in required:
        req = Requirement(text)
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in extras):
            continue
        wanted = [(req.name, req.specifier)]
        if canonical(req.name) in substitutes:
            sub = substitutes[canonical(req.name)]
            wanted = [(sub["by"], req.specifier)] + [(r.name, r.specifier) for r in map(Requirement, sub["with"])]
        for name, specifier in wanted:
            try:
                version = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                problems.append(f"{name}{specifier} (required by {project}) is not installed")
                continue
            if specifier and not specifier.contains(version, prereleases=True):
                problems.append(f"{name} {version} does not satisfy {name}{specifier}")
            else:
                met += 1
    imported, skipped = 0, []
    for package in manifest.get("packages", ["harness", "harness_plugins"]):
        root = importlib.util.find_spec(package)
        if root is None or not root.submodule_search_locations:
            problems.append(f"package {package} not found")
            continue
        base = Path(next(iter(root.submodule_search_locations)))
        for path in sorted(base.rglob("*.py")):
            if path.name == "__main__.py" or "__pycache__" in path.parts:
                continue
            rel = path.relative_to(base.parent).with_suffix("")
            module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
            try:
                importlib.import_module(module)
            except ModuleNotFoundError as exc:
                top = (exc.name or "").split(".")[0]
                if top in OPTIONAL:
                    skipped.append(f"{module} (needs {top}: extra {OPTIONAL[top]})")
                else:
                    problems.append(f"import {module}: {type(exc).__name__}: {exc}")
            except Exception as exc:  # any failure of a module is a finding
                problems.append(f"import {module}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
            else:
                imported += 1
    points = list(importlib.metadata.entry_points(group="harness"))
    if not points and manifest.get("entry_points", True):
        problems.append("no entry point in group 'harness': the built-in plugins would not load")
    # sys.modules may hold objects that are not modules (a package's lazy stand-ins: on the
    # H200 node, 'CythonDotParallel' has no __name__): read only the harness's own, by key
    ops = sorted({op for name, module in list(sys.modules.items())
                  if name.startswith("harness_plugins.mixers") and module is not None
                  for cls in vars(module).values() if isinstance(cls, type)
                  for op in getattr(cls, "fast_path_ops", ())})
    layers = ["fla.layers.GatedLinearAttention"] if "gpu" in manifest["extras"] else []
    for op in ops + layers:  # the fast path's kernels; FLA's own layers (harness bench gpu)
        where, _, name = op.rpartition(".")
        try:
            getattr(importlib.import_module(where), name)
        except Exception as exc:
            problems.append(f"{op}: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
    if ops:
        notes.append(f"{len(ops)} FLA kernels of the fast path and FLA's layers found "
                     f"(fla-core {importlib.metadata.version('fla-core')})")
    for note in notes:
        print(f"ok: {note}")
    subs = ", ".join(f"{k} by {v['by']}" for k, v in substitutes.items()) or "none"
    print(f"ok: {met} requirements of {project} met (extras: {', '.join(manifest['extras']) or 'none'}; "
          f"substituted: {subs})")
    print(f"ok: {imported} modules of {' and '.join(manifest.get('packages', ['harness', 'harness_plugins']))} "
          f"imported; {len(points)} plugin entry points")
    for s in skipped:
        print(f"skipped: {s}")
    for problem in problems:
        print(f"FAILED: {problem}")
    return 1 if problems else 0


def refuse(text: str) -> int:
    """Bad use: one paragraph naming the field and the fix, exit 2 (no traceback)."""
    print(f"error: {text}", file=sys.stderr)
    return 2


#: what each part of a manifest must be (offline/wheelhouse.py writes them all)
MANIFEST = {"python": str, "never": list, "wheels": list, "project": dict, "substitutes": dict, "extras": list}


def read_manifest() -> dict | str:
    """``manifest.json`` beside this file, or why it cannot be used (a sentence)."""
    path = HERE / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        return (f"there is no manifest.json beside {Path(__file__).name} in {HERE}: run the install.py "
                f"that offline/wheelhouse.py copied into a wheelhouse (WHEELHOUSE/install.py), not the "
                f"checkout's.")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return (f"{path} cannot be read as JSON ({str(exc)[:200]}): the wheelhouse is damaged; build it "
                f"again with offline/wheelhouse.py.")
    bad = [k for k, kind in MANIFEST.items() if not isinstance(manifest, dict) or not isinstance(manifest.get(k), kind)]
    if not bad and not all(isinstance(manifest["project"].get(k), str) for k in ("file", "name")):
        bad = ["project.file/name"]
    if bad:
        return (f"{path} lacks {', '.join(bad)} (or they are of the wrong kind): it was not written by "
                f"offline/wheelhouse.py, or is damaged; build the wheelhouse again.")
    return manifest


def target_problem(target: Path, check_only: bool) -> str | None:
    """Why ``--target`` cannot be used, or None (checked before anything is written)."""
    if target.exists() and not target.is_dir():
        return f"--target {target} is a file, not a folder: give a folder to install into (new or yours)."
    if check_only:
        if not target.is_dir() or not any(target.iterdir()):
            return (f"--target {target} holds nothing to check: install into it first (the same "
                    f"command without --check-only).")
        return None
    existing = next(p for p in (target, *target.parents) if p.exists())
    try:  # a real try, not os.access: root, read-only mounts and /proc answer it truly
        os.rmdir(tempfile.mkdtemp(prefix=".install-probe-", dir=existing))
    except OSError as exc:
        return (f"--target {target}: nothing can be written in {existing} ({exc.strerror or exc}); give a "
                f"folder in a place you can write, e.g. --target /tmp/site.")
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--target", required=True, help="the folder to install into (then on PYTHONPATH)")
    p.add_argument("--check-only", action="store_true", help="only check an installed target")
    p.add_argument("--no-pip", action="store_true", help="unpack the wheels instead of using pip")
    p.add_argument("--no-check", action="store_true",
                   help="install only (check later with --check-only: a proof on a short allocation runs "
                        "first and checks after, so a failed check gates nothing)")
    args = p.parse_args(argv)
    manifest = read_manifest()
    if isinstance(manifest, str):
        return refuse(manifest)
    target = Path(args.target).resolve()
    if (problem := target_problem(target, args.check_only)) is not None:
        return refuse(problem)
    if args.check_only:
        return check(manifest, target)
    fresh = not target.exists() or not any(target.iterdir())  # what is in it after a failure is ours
    try:
        code = install(manifest, target, use_pip=not args.no_pip)
    except (OSError, zipfile.BadZipFile, SystemExit) as exc:
        code = refuse(f"installing into {target} failed: {exc}. The wheelhouse may be damaged: build it "
                      f"again with offline/wheelhouse.py." if not isinstance(exc, SystemExit) else
                      str(exc).removeprefix("error: "))
    if code:
        if fresh and target.is_dir():  # a failed install leaves nothing behind
            shutil.rmtree(target, ignore_errors=True)
        return code
    if args.no_check:
        return 0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, str(Path(__file__).resolve()), "--target", str(target),
                           "--check-only"], env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
