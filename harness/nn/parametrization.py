"""μP (the maximal-update parametrization; Yang et al. 2022, "Tensor Programs V",
arXiv:2203.03466) for any model, found from shapes.

Under the standard parametrization the loss-optimal learning rate drifts as a model widens;
under μP the hyper-parameters tuned at a small *base* width hold at any width. What μP
changes depends on each parameter's *role*, and the role follows from which of its
dimensions grow with width, as the ``mup`` package's infinite shapes find it: the model is
built at its base shape (``model.base``) and at four times it (the *delta*), and every
dimension that differs is a width (:mod:`harness.nn.widths`; ``p.infshape`` then holds each
dimension's base and actual size). So a plugin written without μP in mind gets it without
code:

========  ===========================  ================  ===========  ============  =========
role      infinite dimensions          initial std       Adam(W) lr   SGD lr        multiplier
========  ===========================  ================  ===========  ============  =========
hidden    two (fan-in and fan-out)     ∝ 1/sqrt(fan-in)  / m          / (m_in/m_out)
readout   fan-in only (a Linear's      constant          1            x m           input x 1/m
          weight, fan-out finite)
vector    one (embeddings, input       constant          1            x m
          weights, biases, gains,
          gates, decays, kernels)
fixed     none                         as built          1            1
========  ===========================  ================  ===========  ============  =========

``m`` is the width multiplier of the parameter's main (fan-in) dimension, actual / base.
The learning rates and weight decays per role are the paper's (:func:`harness.nn.widths.mu_groups`,
the rules of ``mup``'s ``MuAdam``/``MuAdamW``/``MuSGD``); the readout's multiplier (what
``mup``'s ``MuReadout`` does) is attached to any ``nn.Linear`` whose fan-in grows and fan-out
does not (a forward pre-hook, so the module's class and state dict stay as they are).

Initialisation: a plugin initialises as it likes; μP keeps the plugin's constant and corrects
the exponent. Each parameter's std is compared at the base and the delta width to find the
power of ``m`` the plugin's initialisation follows (snapped to a multiple of 1/2, as every
initialisation in use is: 0, -1/2, -1), and the parameter is multiplied by ``m`` to the
difference between its role's exponent and that one. ``mup``'s own bias and readout rescaling
are this rule for PyTorch's default initialisation. Constant initialisations (zeros, ones,
tables) are left alone.

What shapes cannot say, written by hand where the built-ins need it (each found by the
coordinate check, :mod:`harness.testing.coord`):

* attention scores use 1/d: a module with a ``qk_dim`` attribute (every attention variant,
  and the attention-like mixers) computes its scale with :func:`qk_scale`, which is the
  standard 1/sqrt(d) (or the variant's fixed factor) at the base width and falls as 1/d
  beyond it; for queries and keys of unit length (``qk_normalized``: DeltaNet) the product
  is of order 1 at any width and the scale is held at its base value;
* multipliers that a module computes from its width (``ScaledEmbedding``'s sqrt(width)) are
  named in its ``mup_fixed`` and held at their base-width values.

At the base width every multiplier is 1 and nothing is rescaled: the μP model is the standard
one, bit for bit (``tests/test_mup.py``). The constants μP tunes at the base width besides the
learning rate (output, attention and input multipliers, initial std, zero readout:
``model.mup``) are :mod:`harness.nn.multipliers`, applied after this.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

HIDDEN, READOUT, VECTOR, FIXED = "hidden", "readout", "vector", "fixed"
ROLES = (HIDDEN, READOUT, VECTOR, FIXED)
#: the initial-std exponent of each role, in powers of its main width multiplier
TARGET_EXPONENT = {HIDDEN: -0.5, READOUT: 0.0, VECTOR: 0.0, FIXED: 0.0}
#: the delta model's width params are this many times the base's (a wide gap keeps the
#: measured initialisation exponent of a small vector clear of the rounding boundary)
DELTA = 4
#: an initialisation exponent is read from parameters of at least this many entries at the
#: base width, and only when it lies within SNAP of a multiple of 1/2
MIN_SAMPLE, SNAP = 64, 0.15
#: at most this many draws of the base and delta models pool their stds (small vectors)
MAX_DRAWS = 8


@dataclass(frozen=True)
class Role:
    """What μP makes of one parameter."""

    role: str
    mult: float  # the main dimension's width multiplier (actual / base)
    init: float  # the factor the initialisation was multiplied by


def qk_scale(module: Any, dim: int, standard: Any, *, fixed: bool = False) -> Any:
    """The query-key scale of an attention-like ``module`` whose queries and keys are ``dim``
    wide. ``standard``: the scale the caller uses under the standard parametrization, returned
    as it is there and at μP's base width (1/sqrt(dim); None stands for it where the kernel
    computes it, as ``F.scaled_dot_product_attention`` does); ``fixed``: that scale does not
    depend on ``dim`` (an unscaled variant's 1). Under μP: ``c · base / dim``, c the standard
    scale at the base width (scores fall as 1/d), or c itself when the module's queries and
    keys have unit length (``qk_normalized``: their product is of order 1 at any width).
    Both times the attention multiplier ``model.mup.attn_mult`` (:mod:`harness.nn.multipliers`)."""
    if not qk_changed(module, dim):
        return standard
    base = getattr(module, "mup_qk_base", None) or dim
    at_base = standard if fixed else base**-0.5
    at_base *= getattr(module, "mup_attn_mult", 1.0)
    if getattr(module, "qk_normalized", False):
        return at_base
    return at_base * base / dim


def qk_changed(module: Any, dim: int) -> bool:
    """Whether μP changes ``module``'s query-key scale at query width ``dim`` (beyond the base
    width, or with an attention multiplier)."""
    return getattr(module, "mup_qk_base", None) not in (None, dim) or getattr(module, "mup_attn_mult", 1.0) != 1


def qk_divisor(module: Any, dim: int) -> float:
    """sqrt(dim), what a caller dividing its queries by sqrt(dim) divides by; under μP the
    inverse of :func:`qk_scale`."""
    return 1.0 / qk_scale(module, dim, None) if qk_changed(module, dim) else math.sqrt(dim)


def is_mup(module: Any) -> bool:
    """Whether ``module`` (a model) was given μP by :func:`apply`."""
    return bool(getattr(module, "mup_roles", None))


class InputMultiplier:
    """A forward pre-hook scaling a module's first input (μP's readout multiplier 1/m):
    a class, not a closure, so that a model with it pickles."""

    def __init__(self, factor: float) -> None:
        self.factor = factor

    def __call__(self, module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (args[0] * self.factor, *args[1:])


def _named(model: nn.Module) -> dict[str, Tensor]:
    return dict(model.named_parameters())


def roles(model: nn.Module) -> dict[str, str]:
    """Each parameter's role from its ``infshape`` (:func:`harness.nn.widths.set_dims`): readout
    for the weight of an ``nn.Linear`` whose fan-in is a width and fan-out is not."""
    readouts = {id(m.weight) for m in readout_modules(model)}
    out = {}
    for name, p in _named(model).items():
        n = p.infshape.ninf()  # type: ignore[attr-defined]
        out[name] = (HIDDEN if n >= 2 else FIXED if n == 0
                     else READOUT if id(p) in readouts else VECTOR)
    return out


def _is_readout(weight: Tensor) -> bool:
    shape = weight.infshape  # type: ignore[attr-defined]
    return len(shape) == 2 and shape[1].isinf() and not shape[0].isinf()


def _std(draws: list[Tensor]) -> float:
    """The std of one parameter over its draws (their variances pooled)."""
    if draws[0].numel() < 2 or not draws[0].is_floating_point() or draws[0].is_meta:
        return 0.0  # (a model built on the meta device, to count FLOPs: no values to rescale)
    return math.sqrt(sum(float(p.detach().double().var()) for p in draws) / len(draws))


def init_exponent(base: list[Tensor], delta: list[Tensor], mult: float) -> float | None:
    """The power of the width multiplier the plugin's initialisation of one parameter
    follows (its std at the delta width over the base's, each pooled over its draws), snapped
    to a multiple of 1/2; None where that cannot be told: a constant initialisation, a
    dimension that did not grow, fewer than ``MIN_SAMPLE`` entries over the base's draws (a
    per-head vector: its std is too noisy to read an exponent from, and such draws do not
    depend on width), or a measured exponent more than ``SNAP`` from a multiple of 1/2."""
    s0, s1 = _std(base), _std(delta)
    if s0 <= 0 or s1 <= 0 or mult == 1 or sum(p.numel() for p in base) < MIN_SAMPLE:
        return None
    measured = math.log(s1 / s0) / math.log(mult)
    snapped = round(2 * measured) / 2
    return snapped if abs(measured - snapped) <= SNAP else None


def apply(model: nn.Module, bases: list[nn.Module], deltas: list[nn.Module], width_mult: float) -> dict[str, Role]:
    """Give ``model`` μP, its roles found from ``bases`` (drawn at the base shape) and
    ``deltas`` (at ``DELTA`` times it; :func:`build`): infshapes, initialisation, readout
    multipliers, attention scales and fixed multipliers (see the module docs). ``width_mult``:
    the model's width over the base's, the multiplier of parameters none of whose dimensions
    grow (a readout's bias: PyTorch initialises it from the fan-in). Returns the role of every
    parameter (also kept as ``model.mup_roles``)."""
    import torch

    from harness.nn.widths import set_dims

    base, delta = bases[0], deltas[0]
    names, base_p, delta_p = _named(model), _named(base), _named(delta)
    base_draws = [_named(b) for b in bases]
    delta_draws = [_named(d) for d in deltas]
    if not (names.keys() == base_p.keys() == delta_p.keys()):
        odd = sorted(set(names) ^ set(base_p) | set(names) ^ set(delta_p))[:4]
        raise ValueError(f"μP needs the same parameters at every width; built at the base and "
                         f"delta shapes the model has different ones ({', '.join(odd)})")
    set_dims(model, base, delta)
    set_dims(delta, base, delta)
    kinds = roles(model)
    out: dict[str, Role] = {}
    with torch.no_grad():
        for name, p in names.items():
            shape, role = p.infshape, kinds[name]  # type: ignore[attr-defined]
            if shape.ninf() > 2:
                raise ValueError(f"parameter '{name}' {tuple(p.shape)} has more than two "
                                 f"dimensions that grow with width, which μP does not define")
            finite = shape.ninf() == 0
            mult = width_mult if finite else float(shape.width_mult())
            grown = float(DELTA if finite else delta_p[name].infshape.width_mult())  # type: ignore[attr-defined]
            exponent = init_exponent([d[name] for d in base_draws], [d[name] for d in delta_draws], grown)
            factor = 1.0
            if exponent is not None and mult != 1:
                factor = mult ** (TARGET_EXPONENT[role] - exponent)
                if factor != 1:
                    p.mul_(factor)
            out[name] = Role(role, 1.0 if finite else mult, factor)
    _readout_multipliers(model)
    _module_multipliers(model, base)
    model.mup_roles = out  # type: ignore[assignment]
    return out


def readout_modules(model: nn.Module) -> list[nn.Linear]:
    """The readouts of a model with infshapes: each ``nn.Linear`` whose fan-in grows and fan-out
    does not."""
    return [m for m in model.modules() if isinstance(m, nn.Linear) and _is_readout(m.weight)]


def _readout_multipliers(model: nn.Module) -> None:
    for module in readout_modules(model):
        mult = float(module.weight.infshape.width_mult())  # type: ignore[attr-defined]
        if mult != 1:
            module.register_forward_pre_hook(InputMultiplier(1.0 / mult))


def _module_multipliers(model: nn.Module, base: nn.Module) -> None:
    """Attention scales (``qk_dim``) and ``mup_fixed`` multipliers, from the base model's
    module of the same name."""
    at_base = dict(base.named_modules())
    for name, module in model.named_modules():
        ref = at_base.get(name)
        if ref is None:
            continue
        qk = getattr(module, "qk_dim", None)
        if isinstance(qk, int) and isinstance(getattr(ref, "qk_dim", None), int) and ref.qk_dim != qk:
            module.mup_qk_base = ref.qk_dim
        for attr in getattr(module, "mup_fixed", ()):
            setattr(module, attr, getattr(ref, attr))


def build(make: Callable[[dict[str, int]], nn.Module], base: dict[str, int]) -> tuple[list[nn.Module], list[nn.Module]]:
    """The base and delta models (``make(params)`` builds the model with ``params`` over its
    own), drawn from a forked random state so that building them leaves the run's draws as
    they were; more draws of both (up to ``MAX_DRAWS``) when a parameter that grows has fewer
    than ``MIN_SAMPLE`` entries at the base (a bias at base width 32), so that its
    initialisation's exponent can be read from the pooled draws."""
    import torch

    delta = {k: DELTA * v for k, v in base.items()}
    with torch.random.fork_rng(devices=[]):
        bases, deltas = [make(dict(base))], [make(delta)]
        sizes = [p.numel() for (_, p), (_, q) in zip(bases[0].named_parameters(), deltas[0].named_parameters(),
                                                      strict=False) if p.shape != q.shape]
        draws = min(MAX_DRAWS, math.ceil(MIN_SAMPLE / min(sizes))) if sizes else 1
        for k in range(1, draws):
            torch.manual_seed(k)
            bases.append(make(dict(base)))
            deltas.append(make(delta))
    return bases, deltas
