"""``harness list``: the registry as text, cached so that a repeated listing imports no plugin.

Loading plugins imports torch (plugin modules are plain Python with top-level module
classes), which takes a second or more. The listing is therefore kept as JSON in the cache
folder (``$HARNESS_CACHE_DIR``, else ``$XDG_CACHE_HOME/harness``, else ``~/.cache/harness``)
under a key that covers everything it depends on: the Python and harness versions, the
harness's own source files, every entry point of the ``harness`` group (name, module,
distribution, version) with the size and modification time of the file of the module it
names, the local plugin files, and the plugin filters in the environment. Any change there
loads the plugins again. ``harness list --refresh`` (or ``HARNESS_NO_CACHE=1``) always does, and
so does ``HARNESS_TRACE_PLUGINS=1`` (tracing prints the hook calls of a load).

Finding an entry point's file imports its parent packages (for the built-ins, empty
``__init__`` files), never the plugin module itself.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from harness.runtime.cache import cache_dir

ENV_NO_CACHE = "HARNESS_NO_CACHE"
FORMAT = 1  # bump when the snapshot's shape changes


def _stamp(path: str | os.PathLike[str] | None) -> str:
    try:
        st = os.stat(path) if path else None
    except OSError:
        return f"{path}:missing"
    return f"{path}:{st.st_size}:{st.st_mtime_ns}" if st else "none"


def _module_file(module: str) -> str | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):  # a parent package that fails: loading will report it
        return None
    return spec.origin if spec is not None else None


def cache_key(local_files: Iterable[str | os.PathLike[str]] = ()) -> str:
    """A digest of everything the listing depends on (see the module documentation)."""
    from harness.registry import loader

    parts = [f"format {FORMAT}", sys.version]
    core = Path(__file__).parent
    parts += [_stamp(p) for p in sorted(core.rglob("*.py"))]
    for source in loader.sources_of(local_files):
        parts.append(f"{source.name}|{source.module}|{source.distribution}|{source.version}")
        parts.append(_stamp(source.module if source.distribution.startswith("file ")
                            else _module_file(source.module)))
    parts += [f"{k}={os.environ.get(k, '')}" for k in
              (loader.ENV_ALLOW, loader.ENV_DENY, loader.ENV_NO_AUTOLOAD)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def snapshot(registry: Any) -> dict[str, Any]:
    """What ``harness list`` shows of a registry, as plain data."""
    from harness.params import declared_params
    from harness.registry.specs import KINDS

    specs = []
    for spec in registry:
        specs.append({
            "kind": str(spec.kind), "name": spec.name, "description": spec.description,
            "provenance": spec.provenance(), "declarations": spec.declarations() + spec.notes(),
            "params": [{"name": p.name, "default": repr(p.default), "bounds": p.describe_bounds(),
                        "range": p.range.describe() if p.range else "", "doc": p.doc}
                       for p in declared_params(spec.config)],
        })
    conflicts = {kind: {name: [s.provenance() for s in owners]
                        for name, owners in registry.conflicts(kind).items()} for kind in KINDS}
    return {"specs": specs, "conflicts": conflicts,
            "failures": [f.describe() for f in registry.failures], "warnings": list(registry.warnings)}


def listing(local_files: Iterable[str | os.PathLike[str]] = (), refresh: bool = False) -> dict[str, Any]:
    """The snapshot of the registry, from the cache when nothing it depends on changed."""
    from harness.registry import loader

    files = [str(Path(f).resolve()) for f in local_files]
    # tracing the hook calls needs the plugins loaded: it implies a refresh
    use_cache = (not refresh and not loader.tracing()
                 and os.environ.get(ENV_NO_CACHE, "") not in ("1", "true", "yes"))
    path = cache_dir() / f"listing-{cache_key(files)}.json"
    if use_cache and path.is_file():
        try:
            return dict(json.loads(path.read_text()))
        except (OSError, ValueError):
            pass  # a torn or foreign file: rebuild it
    data = snapshot(loader.load(files))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as fh:
            json.dump(data, fh)
        os.replace(fh.name, path)
    except OSError:
        pass  # an unwritable cache only costs speed
    return data


def render(data: dict[str, Any], kinds: list[str], verbose: bool) -> str:
    """The text of ``harness list``."""
    out = []
    for kind in kinds:
        specs = [s for s in data["specs"] if s["kind"] == kind]
        out.append(f"{kind} ({len(specs)})")
        for spec in specs:
            out.append(f"  {spec['name']:<22} {spec['description']}")
            if verbose:
                out.append(f"      plugin: {spec['provenance']}")
                out += [f"      {line}" for line in spec["declarations"]]
                for p in spec["params"]:
                    valid = f"  valid: {p['bounds']}" if p["bounds"] else ""
                    rng = f"  search: {p['range']}" if p["range"] else ""
                    doc = f"  # {p['doc']}" if p["doc"] else ""
                    out.append(f"      {p['name']} = {p['default']}{valid}{rng}{doc}")
        for name, owners in data["conflicts"].get(kind, {}).items():
            out.append(f"  {name:<22} CONFLICT: registered by " + " and ".join(owners))
    if data["failures"]:
        out += ["", f"plugins that failed to load ({len(data['failures'])}):"]
        out += [f"  {f}" for f in data["failures"]]
    if data["warnings"]:
        out += ["", "warnings:"] + [f"  {w}" for w in data["warnings"]]
    return "\n".join(out)
