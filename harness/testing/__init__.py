"""The conformance kit: the checks every plugin must pass, for its own test suite.

One check class per plugin kind: :class:`AttentionChecks`, :class:`MixerChecks`,
:class:`PositionChecks`, :class:`ModelChecks`, :class:`TaskChecks` (all in :data:`CHECKS`).
A plugin's tests subclass the class of its kind and say which component to check::

    from harness.testing import AttentionChecks

    class TestCosine(AttentionChecks):
        plugin = "cosine"                 # a registered name (installed or in plugin_files)
        # spec = AttentionSpec(...)       # or the spec itself, registered or not
        # params = {"init_scale": 5.0}    # hyper-parameters to check with (default: defaults)
        # plugin_files = ("cosine.py",)   # local plugin files to load

μP's coordinate check (:mod:`harness.testing.coord`: activation sizes over the first steps at
several widths, flat under ``model.parametrization: mup``) is its own class,
:class:`CoordinateChecks` (``kind`` and ``plugin``; a model, mixer or attention variant), and
``harness check --coord NAME`` prints its table and figure.

Each check is a pytest test (``test_causality``, ``test_padding``, ...). A check the spec
exempts (``exempt={"row_stochastic": "weights are kernel features"}``) is skipped with
``exempt: <reason>``; a check the plugin's own declarations make meaningless (padding of a
causal-only mixer) is skipped with ``not applicable: <why>``; an exemption naming no check
fails ``test_exemptions``. ``harness check NAME`` runs the same checks from the command line.

The ``reference`` a spec may declare (an independent float64 implementation) has one
signature per kind: attention and mixers ``reference(layer, x, *, causal) -> Tensor``;
positions ``reference(scheme, method, *args)``; models ``reference(model, fmt, batch) ->
Tensor``; tasks ``reference(task, example) -> bool`` (see each module). Importing this
module imports torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from harness.registry.specs import Registry
from harness.testing.coord import CoordinateChecks
from harness.testing.core import Checks, NotApplicable, Outcome, base_registry, run_checks
from harness.testing.layers import AttentionChecks, MixerChecks
from harness.testing.models import ModelChecks
from harness.testing.positions import PositionChecks
from harness.testing.tasks import TaskChecks

#: The check class of every plugin kind (a new kind adds its class here).
CHECKS: dict[str, type[Checks]] = {
    cls.kind: cls for cls in (AttentionChecks, MixerChecks, PositionChecks, ModelChecks, TaskChecks)
}


def checks_for(kind: str, name: str, *, plugin_files: Iterable[str] = (),
               params: Mapping[str, Any] | None = None, **attrs: Any) -> type[Checks]:
    """A check class for the registered component ``name`` of ``kind``."""
    body = {"plugin": name, "plugin_files": tuple(str(f) for f in plugin_files),
            "params": dict(params or {}), **attrs}
    return type(f"Test_{kind}_{name}".replace("-", "_"), (CHECKS[kind],), body)


def test_classes(registry: Registry | None = None, kinds: Iterable[str] | None = None,
                 params: Mapping[tuple[str, str], Mapping[str, Any]] | None = None) -> dict[str, type[Checks]]:
    """One pytest class per registered component: ``globals().update(test_classes())`` in a
    test module checks every plugin installed (``params`` by ``(kind, name)``)."""
    reg = registry or base_registry()
    out = {}
    for kind in kinds or CHECKS:
        for name in reg.names(kind):
            extra: dict[str, Any] = {"_kit_registry": registry} if registry is not None else {}
            cls = checks_for(kind, name, params=(params or {}).get((kind, name)), **extra)
            out[cls.__name__] = cls
    return out


test_classes.__test__ = False  # type: ignore[attr-defined]  # not a test, despite its name

__all__ = [
    "CHECKS", "Checks", "NotApplicable", "Outcome", "run_checks", "checks_for", "test_classes",
    "AttentionChecks", "MixerChecks", "PositionChecks", "ModelChecks", "TaskChecks",
    "CoordinateChecks",
]
