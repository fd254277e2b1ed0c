"""Plugin loading and the registry: discovery, isolation, conflicts, filters, provenance."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import textwrap
import tomllib
from dataclasses import dataclass
from importlib.metadata import entry_points, version
from pathlib import Path
from typing import Annotated, Any

import pytest

import harness
from harness.errors import PluginError, UnknownNameError
from harness.params import IntRange
from harness.registry import hookspecs, loader
from harness.registry.specs import KINDS, TaskSpec

ROOT = Path(__file__).resolve().parents[1]


# -- built-ins are declared entry points ---------------------------------------------------
def test_every_plugin_module_is_declared_as_an_entry_point():
    modules = {
        f"{path.parent.name}.{path.stem}": f"harness_plugins.{path.parent.name}.{path.stem}"
        for path in (ROOT / "harness_plugins").glob("*/*.py")
        if path.stem != "__init__"
    }
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["harness"]
    installed = {ep.name: ep.value for ep in entry_points(group="harness")
                 if ep.dist and ep.dist.name == "attention-harness"}
    assert modules, "no plugin modules found"
    assert {k: declared[k] for k in modules if k in declared} == modules, "undeclared plugin modules"
    missing_files = sorted(set(declared) - set(modules))
    assert not missing_files, f"entry points without a module: {missing_files}"
    assert installed == declared, "installed metadata is stale: pip install -e . again"


def test_builtins_load_through_entry_points_with_provenance(registry):
    assert not registry.failures, [f.describe() for f in registry.failures]
    spec = registry.get("attention", "multi_head")
    assert spec.plugin == "attention.multi_head"
    assert spec.distribution == "attention-harness"
    assert spec.version == version("attention-harness")


def test_core_never_imports_a_concrete_plugin():
    pattern = re.compile(r"^\s*(from|import)\s+harness_plugins", re.M)
    offenders = [p.name for p in (ROOT / "harness").rglob("*.py") if pattern.search(p.read_text())]
    assert offenders == []


# -- hooks are documented ------------------------------------------------------------------
def _hooks() -> list[str]:
    return [n for n, f in inspect.getmembers(hookspecs, inspect.isfunction) if n.startswith("harness_")]


def test_every_hook_has_a_docstring_and_is_documented_in_the_readme():
    readme = (ROOT / "README.md").read_text()
    assert {f"harness_register_{k}" for k in KINDS} == set(_hooks())
    for name in _hooks():
        func = getattr(hookspecs, name)
        assert len((func.__doc__ or "").strip()) > 80, f"{name} needs a real docstring"
        params = ", ".join(inspect.signature(func).parameters)
        assert f"{name}({params})" in readme, f"README does not document {name}({params})"


def test_every_hook_is_exercised_by_a_test():
    sources = "\n".join(p.read_text() for p in Path(__file__).parent.glob("test_*.py"))
    for name in _hooks():
        assert re.search(rf"def {name}\((self, )?register", sources), f"no test implements {name}"


# -- in-process plugins --------------------------------------------------------------------
@dataclass
class TinyConfig:
    size: Annotated[int, IntRange(1, 10)] = 3


def _task_plugin(task_name: str, *, config: type = TinyConfig) -> Any:
    class Plugin:
        @harness.hookimpl
        def harness_register_task(self, register):
            register(TaskSpec(name=task_name, build=lambda cfg, seed: cfg, config=config))

    Plugin.__name__ = f"plugin_{task_name}"
    return Plugin()


def test_throwaway_plugin_registers_in_process_only():
    plugin = _task_plugin("throwaway")
    reg = loader.load(plugins=[plugin], autoload=False)
    spec = reg.get("task", "throwaway")
    assert spec.distribution == "in-process" and spec.plugin == "plugin_throwaway"
    assert harness.create_task("throwaway", registry=reg, size=7).size == 7
    with pytest.raises(UnknownNameError):
        loader.load(autoload=False).get("task", "throwaway")


def test_duplicate_names_are_an_error_naming_both_plugins():
    reg = loader.load(plugins=[_task_plugin("dup"), _task_plugin("other")], autoload=False)
    second = _task_plugin("dup")
    type(second).__name__ = "second_dup"
    reg = loader.load(plugins=[_task_plugin("dup"), second, _task_plugin("other")], autoload=False)
    with pytest.raises(PluginError) as err:
        reg.get("task", "dup")
    assert "plugin_dup" in str(err.value) and "second_dup" in str(err.value)
    assert reg.get("task", "other").name == "other"  # unrelated names keep working
    assert "dup" in reg.conflicts("task") and "dup" not in reg.names("task")


def test_unknown_name_suggests_close_matches_and_mentions_broken_plugins(tmp_path, registry):
    with pytest.raises(UnknownNameError) as err:
        registry.get("attention", "multi_hed")
    assert "Did you mean 'multi_head'" in str(err.value)
    broken = tmp_path / "broken_attn.py"
    broken.write_text("raise RuntimeError('boom at import')\n")
    reg = loader.load([broken])
    with pytest.raises(UnknownNameError) as err:
        reg.get("attention", "my_attn")
    assert "broken_attn" in str(err.value) and "boom at import" in str(err.value)


def test_broken_plugin_is_recorded_and_does_not_break_others(tmp_path):
    broken = tmp_path / "broken_plugin.py"
    broken.write_text("import harness\nraise ImportError('missing dependency xyz')\n")
    reg = loader.load([broken])
    (failure,) = [f for f in reg.failures if f.plugin == "broken_plugin"]
    assert "missing dependency xyz" in failure.error
    assert "multi_head" in reg.names("attention")


def test_plugin_raising_inside_its_hook_registers_nothing(tmp_path):
    path = tmp_path / "half.py"
    path.write_text(textwrap.dedent("""
        import harness
        from harness.registry.specs import TaskSpec

        @harness.hookimpl
        def harness_register_task(register):
            register(TaskSpec(name="half_a", build=lambda c, seed: None))
            raise ValueError("second registration failed")
    """))
    reg = loader.load([path], autoload=False)
    assert reg.names("task") == []
    assert "second registration failed" in reg.failures[0].error


def test_misspelt_hook_is_rejected(tmp_path):
    path = tmp_path / "typo.py"
    path.write_text(textwrap.dedent("""
        import harness

        @harness.hookimpl
        def harness_register_atention(register):
            pass
    """))
    reg = loader.load([path], autoload=False)
    (failure,) = reg.failures
    assert "harness_register_atention" in failure.error and "harness_register_attention" in failure.error


def test_default_outside_its_range_is_rejected_at_registration():
    @dataclass
    class Bad:
        size: Annotated[int, IntRange(1, 10)] = 99

    reg = loader.load(plugins=[_task_plugin("bad_default", config=Bad)], autoload=False)
    assert reg.names("task") == []
    assert "outside its search range" in reg.failures[0].error


def test_wrong_spec_type_is_rejected():
    class Plugin:
        @harness.hookimpl
        def harness_register_attention(self, register):
            register(TaskSpec(name="oops", build=lambda c, seed: None))

    reg = loader.load(plugins=[Plugin()], autoload=False)
    assert "must pass a harness.AttentionSpec" in reg.failures[0].error


def test_allow_list_deny_list_and_no_autoload(monkeypatch, tmp_path):
    monkeypatch.setenv("HARNESS_PLUGINS", "attention.*")
    reg = loader.load()
    assert reg.names("attention") and reg.names("task") == [] and reg.names("model") == []
    monkeypatch.setenv("HARNESS_PLUGINS", "tasks.copy, models.*")
    reg = loader.load()
    assert reg.names("task") == ["copy"] and reg.names("attention") == []
    monkeypatch.delenv("HARNESS_PLUGINS")
    monkeypatch.setenv("HARNESS_DISABLE_PLUGINS", "tasks.copy")
    assert "copy" not in loader.load().names("task")
    monkeypatch.delenv("HARNESS_DISABLE_PLUGINS")
    monkeypatch.setenv("HARNESS_NO_AUTOLOAD", "1")
    local = tmp_path / "only_local.py"
    local.write_text(textwrap.dedent("""
        import harness
        from harness.registry.specs import TaskSpec

        @harness.hookimpl
        def harness_register_task(register):
            register(TaskSpec(name="local_task", build=lambda c, seed: None))
    """))
    reg = loader.load([local])
    assert [s.name for s in reg] == ["local_task"]
    assert reg.get("task", "local_task").distribution.startswith("file ")


# -- a real external package, exactly as the README shows it ---------------------------------
def readme_files(section: str) -> dict[str, str]:
    """Code blocks preceded by `<!-- file: PATH -->` inside a README section."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index(section)
    end = readme.find("\n## ", start + len(section))
    body = readme[start: end if end > 0 else None]
    blocks = re.findall(r"<!-- file: (\S+) -->\s*```\w*\n(.*?)```", body, re.S)
    return dict(blocks)


@pytest.fixture(scope="module")
def external_package(tmp_path_factory):
    """Install the README's example plugin package with pip into a temporary prefix."""
    src = tmp_path_factory.mktemp("pkg_src")
    files = readme_files("## Writing a plugin")
    assert "pyproject.toml" in files and len(files) >= 2
    for rel, text in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(target), str(src)],
        check=True,
    )
    return target


def test_external_plugin_package_is_discovered_and_trains(external_package, monkeypatch):
    monkeypatch.syspath_prepend(str(external_package))
    reg = loader.load()
    assert not [f for f in reg.failures if f.plugin == "cosine"]
    spec = reg.get("attention", "cosine")
    assert spec.distribution == "harness-cosine-attention" and spec.version == "0.1.0"
    model = harness.create_model("transformer", attention="cosine", vocab_size=12, max_length=16,
                                 registry=reg, d_model=32, heads=2, layers=1)
    import torch

    tokens = torch.randint(4, 12, (3, 10))
    logits = model(tokens)
    assert logits.shape == (3, 10, 12)
    logits.sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_external_plugin_shows_in_harness_list(external_package):
    out = subprocess.run(
        [sys.executable, "-m", "harness.cli", "list", "--kind", "attention", "--verbose"],
        capture_output=True, text=True, env={**_env(), "PYTHONPATH": str(external_package)},
    )
    assert out.returncode == 0, out.stderr
    assert "cosine" in out.stdout and "harness-cosine-attention 0.1.0" in out.stdout


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_PLUGINS")}


def test_readme_lists_every_builtin_plugin(registry):
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Built-in plugins"): readme.index("## Writing a plugin")]
    for spec in registry:
        if spec.distribution == "attention-harness":
            assert f"| `{spec.name}` |" in section, f"README's built-in list lacks {spec.kind} {spec.name}"
