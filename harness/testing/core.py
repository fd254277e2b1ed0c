"""The machinery of the conformance kit: check classes, exemptions, outcomes.

A check class (:class:`Checks` and one subclass per plugin kind) holds the checks of a kind
as methods named ``check_<name>``. Each check raises ``AssertionError`` (or any exception)
when the plugin breaks the contract, :class:`NotApplicable` when the plugin's own
declarations make the check meaningless (a causal-only mixer has no bidirectional padding
to check), and returns otherwise. For every check the class also gets a pytest method
``test_<name>``, so a plugin's test suite subclasses it in two lines; a check the plugin's
spec exempts (``exempt={"name": "reason"}``) or that does not apply is a pytest *skip*
carrying the reason, never a silent pass. :func:`run_checks` runs the same checks outside
pytest (``harness check``) and returns one :class:`Outcome` per check.
"""

from __future__ import annotations

import dataclasses
import difflib
import pickle
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from harness.errors import HarnessError
from harness.params import declared_params, resolve
from harness.registry.specs import Registry, Spec, validate_spec

PASS, FAIL, EXEMPT, NOT_APPLICABLE = "pass", "FAIL", "exempt", "n/a"
PREFIX = "check_"


class NotApplicable(Exception):  # noqa: N818 (a verdict, not an error)
    """Raised by a check that does not apply to this plugin; the message says why."""


@dataclass(frozen=True)
class Outcome:
    """The result of one check: ``status`` is pass, FAIL, exempt or n/a."""

    check: str
    status: str
    detail: str = ""
    seconds: float = 0.0


_REGISTRIES: dict[tuple[str, ...], Registry] = {}


def base_registry(files: tuple[str, ...] = ()) -> Registry:
    """Every installed plugin (plus local ``files``), loaded once per process."""
    if files not in _REGISTRIES:
        import harness

        _REGISTRIES[files] = harness.load_plugins(*files)
    return _REGISTRIES[files]


def registry_with(spec: Spec, base: Registry) -> Registry:
    """``base`` with ``spec`` added (validated as a registration would be), replacing a
    registered component of the same kind and name."""
    spec = validate_spec(spec, spec.kind, spec.plugin or "<harness.testing>")
    reg = Registry()
    for other in base:
        if not (other.kind == spec.kind and other.name == spec.name):
            reg.add(other)
    reg.add(spec)
    return reg


def rand(*shape: int, dtype: torch.dtype = torch.float64, seed: int = 0) -> torch.Tensor:
    """Standard normal numbers from their own generator (the global seed is left alone)."""
    return torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))


def close(actual: Any, expected: Any, what: str, *, atol: float = 1e-9, rtol: float = 1e-7) -> None:
    """``torch.testing.assert_close`` with a message that starts with ``what``."""
    try:
        torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol)
    except AssertionError as exc:
        detail = " ".join(str(exc).split("\n")[1:4])
        raise AssertionError(f"{what} ({detail.strip()})") from None


class Checks:
    """Base of the per-kind check classes. Configure a subclass with class attributes:

    ``plugin``: the registered name of the component to check (found among installed
    plugins and ``plugin_files``); or ``spec``: the spec object itself (it need not be
    registered). ``params``: hyper-parameters, validated like a run config's ``params``.
    ``plugin_files``: local plugin ``.py`` files to load. ``seed``: the seed of every
    random draw.
    """

    kind: ClassVar[str] = ""
    plugin: ClassVar[str | None] = None
    spec: ClassVar[Spec | None] = None
    params: ClassVar[Mapping[str, Any]] = {}
    plugin_files: ClassVar[tuple[str, ...]] = ()
    seed: ClassVar[int] = 0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _add_tests(cls)

    # -- what is checked --------------------------------------------------------------
    @classmethod
    def all_checks(cls) -> list[str]:
        """The checks of this class, in definition order (``exemptions`` first, the checks
        every kind shares last)."""
        names: list[str] = ["exemptions"]
        kinds = [k for k in reversed(cls.__mro__) if k is not Checks]
        for klass in [*kinds, Checks]:  # the kind's own checks first, the shared ones last
            for attr in vars(klass):
                name = attr[len(PREFIX):]
                if attr.startswith(PREFIX) and name not in names:
                    names.append(name)
        return names

    @classmethod
    def describe_check(cls, name: str) -> str:
        """The first line of a check's docstring."""
        return ((getattr(cls, PREFIX + name).__doc__ or "").strip().splitlines() or [""])[0]

    def registry(self) -> Registry:
        """The registry the checks run against (the checked component included)."""
        cached = type(self).__dict__.get("_kit_registry")
        if cached is None:
            base = base_registry(tuple(str(f) for f in self.plugin_files))
            cached = registry_with(self.spec, base) if self.spec is not None else base
            type.__setattr__(type(self), "_kit_registry", cached)
        return cached

    def component(self) -> Any:
        """The spec of the checked component."""
        if self.spec is not None:
            return self.registry().get(self.kind, self.spec.name)
        if not self.plugin:
            raise HarnessError(
                f"{type(self).__name__}: set `plugin = \"<registered name>\"` or `spec = <{self.kind} spec>` "
                f"on the class to say which {self.kind} to check."
            )
        return self.registry().get(self.kind, self.plugin)

    def config(self, **overrides: Any) -> Any:
        """The component's config from ``params`` (and ``overrides``) over the spec's
        ``check_params``, validated."""
        spec = self.component()
        return resolve(spec.config, {**spec.check_params, **self.params, **overrides},
                       f"{self.kind} '{spec.name}' params")

    def config_fields(self) -> set[str]:
        return {f.name for f in dataclasses.fields(self.component().config)}

    # -- checks every kind shares -----------------------------------------------------
    def check_exemptions(self) -> None:
        """Every exemption the spec declares names a check of its kind and gives a reason."""
        spec, known = self.component(), self.all_checks()
        problems = []
        for name, reason in spec.exempt.items():
            if name == "exemptions":
                problems.append("'exemptions' cannot be exempted")
            elif name not in known:
                close_to = difflib.get_close_matches(name, known, n=1)
                hint = f" (did you mean '{close_to[0]}'?)" if close_to else ""
                problems.append(f"unknown check '{name}'{hint}")
            elif not str(reason).strip():
                problems.append(f"the exemption from '{name}' gives no reason")
        assert not problems, (f"{self.kind} '{spec.name}' exempt={{...}}: " + "; ".join(problems)
                              + f". The {self.kind} checks are: {', '.join(known)}.")

    def check_bounds(self) -> None:
        """Every numeric hyper-parameter declares hard bounds (Ge, Gt, Le, Lt, Interval)."""
        spec = self.component()
        missing = [f"{p.name} ({getattr(p.type, '__name__', p.type)})"
                   for p in declared_params(spec.config) if p.numeric and not p.bounds]
        assert not missing, (
            f"numeric hyper-parameters of {spec.config.__name__} without bounds: {', '.join(missing)}. "
            f"Annotate each with its hard limits, e.g. `Annotated[int, Ge(1), IntRange(1, 8)]` "
            f"(from harness.plugin)."
        )

    def check_pickle(self) -> None:
        """What the plugin builds survives pickling (ddp_spawn, data-loader workers) unchanged."""
        original = self.pickle_subject()
        try:
            data = pickle.dumps(original)
        except Exception as exc:
            raise AssertionError(
                f"{type(original).__name__} cannot be pickled ({type(exc).__name__}: {exc}); define "
                f"every class at module level and store no lambdas or local functions on it."
            ) from None
        self.compare_pickled(original, pickle.loads(data))

    # -- what kinds provide -----------------------------------------------------------
    def pickle_subject(self) -> Any:
        raise NotImplementedError

    def compare_pickled(self, original: Any, restored: Any) -> None:
        raise NotImplementedError


#: How far under 6 x the weights a count may fall: a recurrence from a zero state skips its
#: first step's hidden products (1/L of them), a classifier's head runs once per sequence.
FLOP_SLACK = 0.1


def matrix_weights(module: torch.nn.Module) -> int:
    """The weights a token multiplies and adds: every trainable parameter with at least two
    dimensions longer than 1 (matrices, convolution kernels), each shared one once; the
    tables of ``nn.Embedding`` modules (looked up, not multiplied) left out unless another
    module also holds them (a head tied to the embedding), and so are those a module names in
    ``sequence_weights`` (parameter or sub-module names: weights used once per position of
    the sequence rather than per token of the batch, such as a generated filter's)."""
    skipped: set[int] = set()
    for m in module.modules():
        for name in getattr(m, "sequence_weights", ()):
            part = m.get_submodule(name) if name in dict(m.named_modules()) else m.get_parameter(name)
            skipped |= {id(p) for p in (part.parameters() if isinstance(part, torch.nn.Module) else [part])}
    used: dict[int, int] = {}
    for m in module.modules():
        if isinstance(m, torch.nn.Embedding):
            continue
        for p in m.parameters(recurse=False):
            if p.requires_grad and id(p) not in skipped and sum(n > 1 for n in p.shape) >= 2:
                used[id(p)] = p.numel()
    return sum(used.values())


def check_flop_count(module: torch.nn.Module, loss: Callable[[], torch.Tensor], positions: float,
                     what: str) -> None:
    """One forward and backward pass (``loss().backward()``) under the harness's FLOP counter
    must count at least 6 x :func:`matrix_weights` x ``positions`` (2 FLOPs per
    multiply-add; forward, the inputs' and the weights' gradients), within
    :data:`FLOP_SLACK`: below it, work runs where the counter does not look and a FLOP
    budget would give the plugin free compute."""
    from harness.run.flops import flop_counter

    weights = matrix_weights(module)
    with flop_counter(module) as counter:
        loss().backward()
    counted, bound = counter.get_total_flops() / positions, 6.0 * weights
    assert counted >= (1 - FLOP_SLACK) * bound, (
        f"{what}: the FLOP counter sees {counted:,.0f} FLOPs per token (forward and backward), "
        f"under the lower bound 6 x {weights:,} weights = {bound:,.0f} (2 FLOPs per multiply-add, "
        f"3 passes): the work runs where torch's FlopCounterMode does not look (a fused or custom "
        f"kernel), so a FLOP budget would give it free compute. Declare it: give the module that "
        f"runs it `hidden_flops(inputs, output)` returning the forward and backward FLOPs of one "
        f"call, or register a formula for its op (torch.utils.flop_counter.register_flop_formula).")


def _add_tests(cls: type[Checks]) -> None:
    """A pytest method ``test_<name>`` for each ``check_<name>`` the class defines."""
    for attr, fn in list(vars(cls).items()):
        if attr.startswith(PREFIX) and callable(fn):
            setattr(cls, "test_" + attr[len(PREFIX):], _pytest_method(attr[len(PREFIX):], fn))


def _pytest_method(name: str, fn: Callable[..., Any]) -> Callable[[Checks], None]:
    def test(self: Checks) -> None:
        import pytest

        reason = self.component().exempt.get(name) if name != "exemptions" else None
        if reason is not None:
            pytest.skip(f"exempt: {reason}")
        try:
            getattr(self, PREFIX + name)()
        except NotApplicable as exc:
            pytest.skip(f"not applicable: {exc}")

    test.__name__ = test.__qualname__ = f"test_{name}"
    test.__doc__ = fn.__doc__
    return test


_add_tests(Checks)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    line = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__


def run_checks(cls: type[Checks], only: list[str] | None = None) -> Iterator[Outcome]:
    """Run the checks of a configured check class outside pytest, one :class:`Outcome` each."""
    inst = cls()
    try:
        exempt = dict(inst.component().exempt)
    except Exception as exc:
        yield Outcome("setup", FAIL, first_line(exc))
        return
    for name in cls.all_checks():
        if only and name not in only:
            continue
        if name in exempt and name != "exemptions":
            yield Outcome(name, EXEMPT, str(exempt[name]))
            continue
        started = time.perf_counter()
        try:
            getattr(inst, PREFIX + name)()
        except NotApplicable as exc:
            yield Outcome(name, NOT_APPLICABLE, str(exc), time.perf_counter() - started)
        except Exception as exc:
            detail = first_line(exc)
            if not str(exc).strip():  # a bare assert: say where
                frame = traceback.extract_tb(exc.__traceback__)[-1]
                detail += f" at {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}: {frame.line}"
            yield Outcome(name, FAIL, detail, time.perf_counter() - started)
        else:
            yield Outcome(name, PASS, "", time.perf_counter() - started)
