"""What a plugin's import costs itself, apart from what its shared dependencies cost.

A plugin is blamed (``harness list``'s warning) only for its own import time. Modules of a
package that was already imported before the plugin's turn (torch, whose submodules such as
``torch._dynamo`` load lazily the first time anything touches them; the harness's own
modules; a sibling built-in's shared helpers) are a shared dependency's cost: whichever plugin
happens to be first pays for them, and the next would not. :class:`ImportCost` times those
while the plugin imports (an import hook on ``sys.meta_path``, for the time of one import;
only the outermost of nested shared modules counts, so nothing is counted twice) and
:attr:`ImportCost.own` is the rest. A plugin that imports a package nobody had imported yet
(``transformers`` at its top level) still pays for it: that is the plugin's choice.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.abc import Loader, MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any


class _TimedLoader(Loader):
    """``loader`` with its module creation and execution timed into ``cost``."""

    def __init__(self, loader: Any, cost: ImportCost) -> None:
        self.loader, self.cost = loader, cost

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        with self.cost.shared():
            module = self.loader.create_module(spec) if hasattr(self.loader, "create_module") else None
        return module  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.loader  # the module keeps its own loader (linecache, resources)
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        with self.cost.shared():
            self.loader.exec_module(module)


class ImportCost(MetaPathFinder):
    """Time one plugin's import and the part of it spent in shared dependencies (see module)."""

    def __init__(self, own_module: str = "") -> None:
        self.own = 0.0
        self.shared_s = 0.0
        self._own_module = own_module
        self._depth = 0
        self._tops: set[str] = set()

    def find_spec(self, name: str, path: Any, target: Any = None) -> ModuleSpec | None:
        if name.split(".")[0] not in self._tops or name == self._own_module \
                or name.startswith(self._own_module + "."):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _TimedLoader(spec.loader, self)
                return spec  # type: ignore[no-any-return]
        return None

    @contextmanager
    def shared(self) -> Iterator[None]:
        """A shared module's creation or execution: timed when outermost."""
        self._depth += 1
        started = time.perf_counter()
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self.shared_s += time.perf_counter() - started

    @contextmanager
    def measure(self) -> Iterator[ImportCost]:
        """Around the plugin's import: :attr:`own` is its time less the shared modules'."""
        # a submodule's package is imported before it, so the top-level names are the dotless
        # ones (splitting each of the thousands of names cost ~2 ms a plugin, 0.1 s a registry)
        self._tops = {name for name in list(sys.modules) if "." not in name}
        sys.meta_path.insert(0, self)
        started = time.perf_counter()
        try:
            yield self
        finally:
            total = time.perf_counter() - started
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            self.own = max(0.0, total - self.shared_s)
