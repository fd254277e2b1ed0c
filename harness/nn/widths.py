"""Which dimensions of a parameter grow with width, and the optimiser groups μP derives from
them (Yang et al. 2022, "Tensor Programs V", arXiv:2203.03466: Table 3, and Table 8 for SGD).

A model built at its base shape and at a wider *delta* shape tells, for each parameter, which
dimensions are widths (those that differ) and what each was at the base: a :class:`Dims` on
``p.infshape``, the same notion as the ``mup`` package's infinite shapes. The harness keeps
its own few lines rather than depend on ``mup`` 1.0.0, whose package declares torchvision and
seaborn (never imported here) and ships as an sdist only: with it, ``pip install`` of the
harness pulls a torchvision that pins its own torch build, and an offline GPU node's
wheelhouse grows past its budget (``offline/``). ``tests/test_mup.py`` checks the groups
below against the paper's rules on fresh shapes.

========  =======================  ==================  ===================
dims      role                     Adam(W)             SGD
========  =======================  ==================  ===================
two       hidden matrix            lr / m, wd x m      lr / (m_in/m_out), wd x (m_in/m_out)
one       vector-like, readout     as given            lr x m, wd / m
none      fixed                    as given            as given
========  =======================  ==================  ===================

``m`` is the multiplier (now / base) of the parameter's main dimension: the last that grows
(a matrix's fan-in). Weight decay moves against the learning rate, so that AdamW's decay per
step (lr x wd) is the same at every width.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from torch import Tensor


@dataclass(frozen=True)
class Dim:
    base: int | None  # its size at the base width; None: it does not grow with width
    now: int

    def isinf(self) -> bool:
        return self.base is not None

    def width_mult(self) -> float:
        return self.now / self.base if self.base else 1.0


class Dims(tuple[Dim, ...]):
    """A parameter's dimensions, each with its base size where it grows (``p.infshape``)."""

    def ninf(self) -> int:
        return sum(d.isinf() for d in self)

    def width_mult(self) -> float:
        """The multiplier of the main dimension: the last that grows (1 where none does)."""
        grown = [d for d in self if d.isinf()]
        return grown[-1].width_mult() if grown else 1.0

    def fanin_fanout_mult_ratio(self) -> float:
        return self[1].width_mult() / self[0].width_mult()


def dims(now: Tensor, base: Tensor, delta: Tensor) -> Dims:
    """``now``'s dimensions: a width where the base and delta builds differ in it."""
    if not (now.dim() == base.dim() == delta.dim()):
        raise ValueError(f"a parameter has {base.dim()} dimensions at the base width and "
                         f"{delta.dim()} at the delta: μP needs the same at every width")
    return Dims(Dim(b if b != d else None, n) for n, b, d in zip(now.shape, base.shape, delta.shape, strict=True))


def set_dims(model: Any, base: Any, delta: Any) -> None:
    """``p.infshape`` for every parameter of ``model`` (the same names in all three)."""
    at_base, at_delta = dict(base.named_parameters()), dict(delta.named_parameters())
    for name, p in model.named_parameters():
        p.infshape = dims(p, at_base[name], at_delta[name])


def mu_groups(groups: list[dict[str, Any]], optimizer: str) -> list[dict[str, Any]]:
    """``groups`` (each with ``params``, ``lr`` and ``weight_decay``) split by μP's rule for
    ``optimizer`` (``adam``/``adamw``, or ``sgd``; see the module's table)."""
    out = []
    for group in groups:
        split: dict[tuple[str, float], list[Any]] = defaultdict(list)
        for p in group["params"]:
            shape: Dims = p.infshape
            if shape.ninf() > 2:
                raise ValueError(f"a parameter of shape {tuple(p.shape)} has more than two "
                                 f"dimensions that grow with width, which μP does not define")
            if optimizer == "sgd":
                key = (("matrix", shape.fanin_fanout_mult_ratio()) if shape.ninf() == 2
                       else ("vector", shape.width_mult()) if shape.ninf() == 1 else ("fixed", 1.0))
            else:
                key = ("matrix", shape.width_mult()) if shape.ninf() == 2 else ("other", 1.0)
            split[key].append(p)
        for (kind, m), params in split.items():
            lr, wd = group["lr"], group["weight_decay"]
            if kind == "matrix":
                lr, wd = lr / m, wd * m
            elif kind == "vector":
                lr, wd = lr * m, wd / m
            out.append({**group, "params": params, "lr": lr, "weight_decay": wd})
    return out
