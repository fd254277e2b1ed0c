"""Build a plugin manager and a registry from entry points, local files and in-process objects.

Loading is explicit (no manager is built at import time), isolated (a plugin that fails to
import, registers bad data or misspells a hook is recorded as a failure and skipped; the
others load) and cheap (plugin modules import torch only inside their ``build`` functions).

Controls (environment variables; the CLI and YAML have equivalents):

``HARNESS_PLUGINS``          comma-separated allow-list of entry-point names or glob
                             patterns (``attention.*,my_plugin``); only these load.
``HARNESS_DISABLE_PLUGINS``  comma-separated deny-list, same syntax.
``HARNESS_NO_AUTOLOAD=1``    load no entry points at all (only local files / in-process).
``HARNESS_TRACE_PLUGINS=1``  print every hook call (pluggy tracing) to stderr.
"""

from __future__ import annotations

import fnmatch
import hashlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pluggy

from harness.errors import HarnessError
from harness.registry import hookspecs
from harness.registry.import_cost import ImportCost
from harness.registry.specs import KINDS, PluginFailure, Registry, stamp, validate_spec

ENTRY_POINT_GROUP = "harness"
ENV_ALLOW = "HARNESS_PLUGINS"
ENV_DENY = "HARNESS_DISABLE_PLUGINS"
ENV_NO_AUTOLOAD = "HARNESS_NO_AUTOLOAD"
ENV_TRACE = "HARNESS_TRACE_PLUGINS"
#: A plugin whose import takes longer than this (beyond the harness's own imports, done
#: first) is named in a warning: it slows every command that loads plugins.
SLOW_IMPORT_S = 0.3


@dataclass(frozen=True)
class _Source:
    name: str
    distribution: str
    version: str
    load: Callable[[], Any]
    module: str = ""  # the module an entry point names (for the listing cache)


def _patterns(value: str | None) -> list[str]:
    return [p.strip() for p in (value or "").split(",") if p.strip()]


def tracing() -> bool:
    """Whether ``HARNESS_TRACE_PLUGINS`` asks for every hook call to be printed."""
    return os.environ.get(ENV_TRACE, "") in ("1", "true", "yes")


def _matches(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _entry_point_sources(allow: Sequence[str], deny: Sequence[str]) -> list[_Source]:
    sources = []
    # a distribution's name and version are read from its METADATA, parsed again at each
    # access: once per distribution, not twice per entry point (~1 s a run with 58 built-ins)
    facts: dict[Any, tuple[str, str]] = {}
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        if (allow and not _matches(ep.name, allow)) or _matches(ep.name, deny):
            continue
        dist = ep.dist
        key = str(getattr(dist, "_path", None) or id(dist))
        if key not in facts:
            facts[key] = (dist.name, dist.version) if dist else ("", "")
        sources.append(_Source(ep.name, *facts[key], ep.load, ep.value.split(":")[0]))
    return sources


def import_file(path: str | os.PathLike[str]) -> Any:
    """Import a plugin from a ``.py`` file under a unique module name."""
    path = Path(path).resolve()
    if not path.is_file():
        raise HarnessError(
            f"plugin file {path} does not exist. Pass the path of a .py file that implements "
            f"harness hooks (see the plugin author's guide in the README)."
        )
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
    module_name = f"harness_local_{path.stem}_{digest}"
    stat = path.stat()
    stamp = (stat.st_size, stat.st_mtime_ns)
    loaded = sys.modules.get(module_name)
    if loaded is not None and getattr(loaded, "__harness_stamp__", None) == stamp:
        return loaded  # the same file, unchanged: importing it again would re-run its code
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    module.__harness_stamp__ = stamp  # type: ignore[attr-defined]
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


def _identity(obj: Any) -> Any:
    return obj


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip().rstrip(":")


def load(
    local_files: Iterable[str | os.PathLike[str]] = (),
    *,
    plugins: Iterable[Any] = (),
    autoload: bool | None = None,
    allow: Sequence[str] | None = None,
    deny: Sequence[str] | None = None,
) -> Registry:
    """Load plugins and return a fresh :class:`Registry`.

    ``local_files``: paths of plugin ``.py`` files. ``plugins``: in-process plugin objects
    (modules, classes or instances with hook implementations), registered like any other.
    ``autoload``/``allow``/``deny`` default to the environment variables above.
    """
    # The harness's own heavy imports (torch, through the base classes) come first, so the
    # time a plugin takes to import is its own.
    import harness.plugin  # noqa: F401

    sources = sources_of(local_files, plugins=plugins, autoload=autoload, allow=allow, deny=deny)
    pm = pluggy.PluginManager(ENTRY_POINT_GROUP)
    pm.add_hookspecs(hookspecs)
    if tracing():
        pm.trace.root.setwriter(lambda msg: print(msg, end="", file=sys.stderr))
        pm.enable_tracing()

    registry = Registry()
    for source in sources:
        failure = _load_one(pm, registry, source)
        if failure:
            registry.failures.append(
                PluginFailure(source.name, source.distribution, source.version, failure)
            )
    return registry


# load()'s parameters again, by design: this answers what load() would load with them
def sources_of(
    local_files: Iterable[str | os.PathLike[str]] = (),
    *,
    plugins: Iterable[Any] = (),
    autoload: bool | None = None,
    allow: Sequence[str] | None = None,
    deny: Sequence[str] | None = None,
) -> list[_Source]:
    """The plugins :func:`load` would load, in order, without importing any of them."""
    if autoload is None:
        autoload = os.environ.get(ENV_NO_AUTOLOAD, "") not in ("1", "true", "yes")
    allow = list(allow) if allow is not None else _patterns(os.environ.get(ENV_ALLOW))
    deny = list(deny) if deny is not None else _patterns(os.environ.get(ENV_DENY))
    sources: list[_Source] = _entry_point_sources(allow, deny) if autoload else []
    for path in local_files:
        resolved = Path(path).resolve()
        sources.append(_Source(resolved.stem, f"file {resolved}", "", partial(import_file, resolved),
                               str(resolved)))
    for obj in plugins:
        name = getattr(obj, "__name__", None) or type(obj).__name__
        sources.append(_Source(name, "in-process", "", partial(_identity, obj)))
    return sources


def _import(registry: Registry, source: _Source) -> tuple[Any, str | None]:
    """Import one plugin, isolated from everything it may raise or exit with (but Ctrl-C),
    and time it; a slow import is recorded as a warning naming what it imported."""
    before = set(sys.modules)
    try:
        with ImportCost(source.module).measure() as cost:  # less what shared dependencies cost
            obj = source.load()
    except HarnessError as exc:
        return None, str(exc)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SystemExit, an exception from a C extension, ...
        return None, f"failed to import: {_describe(exc)}"
    seconds = cost.own
    if seconds > SLOW_IMPORT_S:
        own = source.module.split(".")[0]
        shared = {m.split(".")[0] for m in before}  # not the plugin's: see ImportCost
        heavy = sorted({m.split(".")[0] for m in set(sys.modules) - before} - {own, "harness_plugins"} - shared)
        registry.warnings.append(
            f"plugin {source.name} takes {seconds:.1f} s to import"
            + (f" (it imports {', '.join(heavy[:6])}{' ...' if len(heavy) > 6 else ''})" if heavy else "")
            + ": every command that loads plugins waits for it. Import heavy libraries inside "
              "the functions that need them."
        )
    return obj, None


def _load_one(pm: pluggy.PluginManager, registry: Registry, source: _Source) -> str | None:
    """Import, validate and register one plugin; return an error text or None."""
    if pm.has_plugin(source.name):
        return f"another plugin is already loaded under the name '{source.name}'"
    obj, error = _import(registry, source)
    if error is not None:
        return error
    try:
        pm.register(obj, name=source.name)
    except (ValueError, pluggy.PluginValidationError) as exc:
        return f"invalid plugin: {_describe(exc)}"
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        pm.unregister(obj)
        return (
            f"{exc}. Hook names must be one of: "
            + ", ".join(f"harness_register_{k}" for k in KINDS)
        )

    staged = []
    others = [p for p in pm.get_plugins() if p is not obj]
    try:
        for kind in KINDS:
            # Through pluggy (its tracing shows the call), for this plugin's implementation only.
            caller = pm.subset_hook_caller(f"harness_register_{kind}", remove_plugins=others)

            def register(spec: Any, kind: str = kind) -> None:
                staged.append(validate_spec(spec, kind, source.name))

            caller(register=register)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        pm.unregister(obj)
        return f"failed while registering: {_describe(exc)}"
    for spec in staged:
        registry.add(stamp(spec, source.name, source.distribution, source.version))
    return None
