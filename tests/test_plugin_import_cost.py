"""A plugin is blamed for its own import time only (issue 49): the lazily loaded submodules of
a package already imported (torch._dynamo, pulled in by whichever plugin touches it first) are
that package's cost, not the plugin's; a plugin that sleeps, or imports a heavy package nobody
had imported, is still named."""

from __future__ import annotations

import importlib
import secrets

import pytest

from harness.registry import loader

SLEEP = 3 * loader.SLOW_IMPORT_S  # well over the warning's threshold


@pytest.fixture
def packages(tmp_path, monkeypatch):
    """Two packages whose ``heavy`` submodule sleeps on import: ``shared`` already imported
    (as torch is before any plugin), ``fresh`` not."""
    names = {}
    for role in ("shared", "fresh"):
        name = f"{role}_{secrets.token_hex(4)}"
        folder = tmp_path / "site" / name
        folder.mkdir(parents=True)
        (folder / "__init__.py").write_text("")
        (folder / "heavy.py").write_text(f"import time\ntime.sleep({SLEEP})\n")
        names[role] = name
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.import_module(names["shared"])
    return names


def plugin(tmp_path, name: str, body: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(body + "\n")
    return str(path)


def warnings_for(path: str) -> list[str]:
    registry = loader.load([path], autoload=False)
    assert not registry.failures, registry.failures
    return [w for w in registry.warnings if "to import" in w]


def test_a_shared_dependency_s_lazy_submodule_is_not_the_plugin_s_cost(tmp_path, packages):
    assert warnings_for(plugin(tmp_path, "uses_shared", f"import {packages['shared']}.heavy")) == []


def test_a_plugin_s_own_slow_import_is_named(tmp_path, packages):
    own = warnings_for(plugin(tmp_path, "sleeps", f"import time\ntime.sleep({SLEEP})"))
    assert len(own) == 1 and "plugin sleeps takes" in own[0]
    fresh = warnings_for(plugin(tmp_path, "imports_fresh", f"import {packages['fresh']}.heavy"))
    assert len(fresh) == 1 and f"it imports {packages['fresh']}" in fresh[0]


def test_the_shared_part_is_subtracted_not_the_plugin_s_own(tmp_path, packages):
    both = warnings_for(plugin(tmp_path, "both", f"import time\nimport {packages['shared']}.heavy\n"
                                                 f"time.sleep({SLEEP})"))
    assert len(both) == 1 and "plugin both takes" in both[0]
    seconds = float(both[0].split("takes ")[1].split(" s")[0])
    assert seconds < 2 * SLEEP  # its own sleep, not the shared module's too
