"""The import graph follows ARCHITECTURE.md: layers import downwards only, the core never names
a plugin, every module says what lives in it, and no façade modules."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "harness"
ARCHITECTURE = ROOT / "ARCHITECTURE.md"

#: The layers from the bottom up; a module may import its own layer and the layers below.
#: (Imports inside functions count too: a lazy import is still a dependency.)
LAYERS = [
    {"harness.errors", "harness.keys", "harness.params", "harness.yaml_io", "harness.runtime", "harness.store"},
    {"harness.data"},
    {"harness.nn"},
    {"harness.plugin", "harness.config", "harness.registry"},
    {"harness.run", "harness.evaluation"},
    {"harness.study"},
    {"harness.report"},
    # users of the public API (the benchmarks build and train models the way users do)
    {"harness.cli", "harness", "harness.testing", "harness.bench"},
]
#: Sub-command modules at the top may reach any layer; within the study package only its cli
#: (which also serves `harness report`) may import the report package.
TOP = {"harness.study.cli", "harness.bench.cli"}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(CORE.rglob("*.py"))}


def imports(path: Path, name: str, typing: bool = False) -> set[str]:
    """Everything a module imports from the harness, at any depth (lazy imports count), except
    under ``if TYPE_CHECKING:`` (annotations only, never executed) unless ``typing``."""
    known = modules()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):  # drop type-checking-only blocks
        if not typing and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = []
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = {f"{target}.{a.name}" for a in node.names}
            submodules = {n for n in names if n in known}
            found |= submodules or {target}  # `from harness import tracking` imports harness.store.tracking
    return {m for m in found if m.split(".")[0] in ("harness", "harness_plugins")}


def layer_of(name: str) -> int:
    best, level = -1, -1
    for i, layer in enumerate(LAYERS):
        for prefix in layer:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
                best, level = len(prefix), i
    return level


def owner(name: str, known: dict[str, Path]) -> str:
    """The module an imported name belongs to (``harness.run.plan.Plan`` -> ``harness.run.plan``)."""
    while name not in known and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def test_every_module_is_in_a_layer_and_has_a_docstring():
    for name, path in modules().items():
        assert layer_of(name) >= 0, f"{name} is in no layer of ARCHITECTURE.md"
        assert ast.get_docstring(ast.parse(path.read_text())), f"{name} has no module docstring"


def test_layers_import_downwards_only_and_the_core_never_names_a_plugin():
    known = modules()
    problems = []
    for name, path in known.items():
        for imported in imports(path, name):
            if imported.startswith("harness_plugins"):
                problems.append(f"{name} imports the plugin {imported}")
                continue
            target = owner(imported, known)
            if name in TOP or target == name:
                continue
            if layer_of(target) > layer_of(name):
                problems.append(f"{name} (layer {layer_of(name)}) imports {target} (layer {layer_of(target)})")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("rule, importer, forbidden", [
    ("nn/ imports nothing from the orchestration layers", "harness.nn", ("harness.run", "harness.study",
     "harness.report", "harness.registry.loader", "harness.store.tracking", "harness.config")),
    ("the report never imports the worker", "harness.report", ("harness.study.worker",)),
    ("a run knows nothing of studies or reports", "harness.run", ("harness.study", "harness.report")),
])
def test_named_import_rules(rule, importer, forbidden):
    known = modules()
    for name, path in known.items():
        if name == importer or name.startswith(importer + "."):
            # on a package boundary: harness.runtime is not harness.run
            bad = [i for i in imports(path, name) if any(i == f or i.startswith(f + ".") for f in forbidden)]
            assert not bad, f"{rule}: {name} imports {bad}"


def test_package_inits_are_documentation_not_facades():
    """No façade modules: a package's __init__ defines or re-exports nothing (harness itself and
    harness.testing, the two public surfaces besides harness.plugin, excepted)."""
    for path in CORE.rglob("__init__.py"):
        name = module_name(path)
        if name in ("harness", "harness.testing", "harness.nn"):
            continue
        body = [n for n in ast.parse(path.read_text()).body if not isinstance(n, ast.Expr)]
        assert not body, f"{name}/__init__.py should only document its package"


def test_no_import_circles():
    """No module reaches itself through imports, lazy and type-checking ones included: a circle
    a reader must hold in mind is one even where it never runs (the four the layout move broke:
    plugin/listing/loader, study counts/progress/storage/summary, run pipeline/trained, data
    formats/tasks)."""
    known = modules()
    graph = {name: {owner(i, known) for i in imports(path, name, typing=True)} & known.keys() - {name}
             for name, path in known.items()}
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        pytest.fail("import circle: " + " -> ".join(exc.args[1]))


def test_the_root_holds_the_public_surfaces_and_the_shared_vocabulary_only():
    """``ls harness`` shows the architecture: packages, and at most eight loose modules."""
    loose = sorted(p.name for p in CORE.glob("*.py"))
    assert len(loose) <= 8, loose
    packages = {p.name for p in CORE.iterdir() if (p / "__init__.py").exists()}
    documented = ARCHITECTURE.read_text()
    missing = [f"harness/{d}/" for d in sorted(packages) if f"`harness/{d}/`" not in documented]
    assert not missing, f"ARCHITECTURE.md does not describe {missing}"
    layered = {prefix.split(".")[1] for layer in LAYERS for prefix in layer if "." in prefix}
    assert packages <= layered, f"packages in no layer: {packages - layered}"
