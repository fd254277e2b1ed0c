"""Triton autotuning inside a short GPU allocation: compile in parallel, measure briefly.

FLA's kernels are ``triton.autotune``-d over up to 48 configurations each (GLA's forward and
backward in one dtype: about 270), and Triton autotunes one configuration after the other in
the calling process: each is compiled (about 1.4 s on one core for ``chunk_fwd_kernel_h`` for
sm_90, measured on the CPU: benchmarks/gpu/README.md) and then timed by ``do_bench`` for
125 ms. In a cold process that is minutes per mixer, longer than the proof's mixers section.

Two patches of :class:`triton.runtime.autotuner.Autotuner`, both stated in the proof's record:

* :func:`precompile_slice` (the **warmers**, ``python -m harness.bench.warm``): the first time
  an autotuned kernel is called with a new key, this process compiles only its share
  (``configs[index::count]``) of the configurations, without launching them
  (``JITFunction.run(warmup=True)``), then runs the kernel once with the first configuration
  and nothing timed. ``count`` such processes started beside the proof's earlier sections
  fill Triton's on-disk cache with every configuration's binary, so the measuring process
  later finds each compile there (same source, arguments' specialisation, options and
  target: the same cache key);
* :func:`brief_benchmarks` (the measuring processes): each configuration timed for
  ``rep_ms`` (the proof: 10 ms, after 5 ms of warm-up) instead of Triton's 100 ms (after 25):
  the choice among configurations is the same method on fewer repetitions.

Neither changes which configurations exist, which one is chosen on the measurements, or the
kernels' code. Both are applied from the environment when this module is loaded as a pytest
plugin (``-p harness.bench.autotune``) or by :func:`apply_from_environment`:
``HARNESS_AUTOTUNE_SLICE=index/count`` and ``HARNESS_AUTOTUNE_REP_MS=ms``.
"""

from __future__ import annotations

import os
from typing import Any

SLICE_ENV, REP_ENV = "HARNESS_AUTOTUNE_SLICE", "HARNESS_AUTOTUNE_REP_MS"


def parse_slice(text: str) -> tuple[int, int]:
    """``"i/n"`` -> (i, n) with 0 <= i < n; ValueError naming the form otherwise."""
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise ValueError(f"{SLICE_ENV}={text!r}: expected INDEX/COUNT, e.g. 0/8") from None
    if not 0 <= index < count:
        raise ValueError(f"{SLICE_ENV}={text!r}: INDEX must be in [0, COUNT)")
    return index, count


def _key(tuner: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """The autotuner's own cache key for a call (as ``Autotuner.run`` builds it)."""
    named = {**dict(zip(tuner.arg_names, args, strict=False)), **kwargs}
    named = {k: v for k, v in named.items() if k in tuner.arg_names}
    key = [named[k] for k in tuner.keys if k in named]
    key += [str(v.dtype) for v in named.values() if hasattr(v, "dtype")]
    return tuple(key)


def precompile_slice(index: int, count: int) -> dict[str, int]:
    """Patch ``Autotuner.run`` as described in the module documentation; returns live counters
    (``compiled``: configurations compiled here, ``failed``: ones the compiler refused)."""
    from triton.runtime.autotuner import Autotuner

    stats = {"compiled": 0, "failed": 0, "keys": 0}
    original = Autotuner.run

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        if len(self.configs) <= 1:
            return original(self, *args, **kwargs)
        key = _key(self, args, kwargs)
        seen = self.__dict__.setdefault("_harness_precompiled", set())
        self.nargs = dict(zip(self.arg_names, args, strict=False))
        configs = self.prune_configs(kwargs)
        if key not in seen:
            seen.add(key)
            stats["keys"] += 1
            meta = {k: v for k, v in kwargs.items() if k != "warmup"}
            for config in configs[index::count]:
                try:
                    self.fn.run(*args, warmup=True, **meta, **config.all_kwargs())
                    stats["compiled"] += 1
                except Exception:  # a configuration the compiler refuses is skipped by the tuner too
                    stats["failed"] += 1
        every = self.configs
        self.configs = configs[:1]  # one launch, nothing timed: the outputs are not used
        try:
            return original(self, *args, **kwargs)
        finally:
            self.configs = every

    Autotuner.run = run  # type: ignore[method-assign]
    return stats


def brief_benchmarks(rep_ms: float, warmup_ms: float = 5.0) -> None:
    """Time each configuration for ``rep_ms`` (after ``warmup_ms``) where the kernel does not
    bring its own benchmark function."""
    import triton.testing
    from triton.runtime.autotuner import Autotuner

    def quick(kernel_call: Any, quantiles: Any) -> Any:
        return triton.testing.do_bench(kernel_call, warmup=warmup_ms, rep=rep_ms, quantiles=quantiles)

    Autotuner.do_bench = property(lambda self: self._do_bench or quick)  # type: ignore[assignment,method-assign]


def apply_from_environment() -> str:
    """Apply what ``HARNESS_AUTOTUNE_SLICE`` / ``HARNESS_AUTOTUNE_REP_MS`` ask for (nothing
    where Triton is not installed); returns a line saying what was applied."""
    import importlib.util

    said = []
    if importlib.util.find_spec("triton") is None:
        return "autotune: triton not installed, nothing patched"
    if os.environ.get(SLICE_ENV):
        index, count = parse_slice(os.environ[SLICE_ENV])
        precompile_slice(index, count)
        said.append(f"compiling configurations {index}::{count} only, none timed")
    if os.environ.get(REP_ENV):
        rep = float(os.environ[REP_ENV])
        if not rep > 0:
            raise ValueError(f"{REP_ENV}={os.environ[REP_ENV]!r}: give a positive number of milliseconds")
        brief_benchmarks(rep)
        said.append(f"each configuration timed for {rep:g} ms")
    return "autotune: " + ("; ".join(said) or "Triton's own")


def pytest_configure(config: Any) -> None:  # loaded with ``pytest -p harness.bench.autotune``
    print(apply_from_environment())
