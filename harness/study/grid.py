"""The ``grid`` sampler: every tuning slot is one point of the Cartesian grid of the study's
``search`` lists, so each candidate is tried at every combination exactly once (MAD tunes
this way: its learning rates x weight decays, the best kept per cell).

Creating the study enqueues slot ``i`` with the ``i``-th point as fixed Optuna parameters
(``train.lr``, ...); a worker that claims it suggests exactly those values. Each search entry
must be a list of options, no candidate may search anything of its own (``search_declared:
false`` and no ``search``), and ``budget.trials`` must equal the number of points.
"""

from __future__ import annotations

import itertools
from typing import Any

from harness.errors import ConfigError


def points(config: Any) -> list[dict[str, Any]]:
    """The grid's points as Optuna parameters (``train.<key>``), in the order of ``search``
    and of each list; empty when the study's sampler is not ``grid``."""
    if config.sampler.name != "grid":
        return []
    keys = list(config.search)
    return [{f"train.{k}": v for k, v in zip(keys, values, strict=True)}
            for values in itertools.product(*(config.search[k] for k in keys))]


def check(space: Any) -> None:
    """Refuse a grid study that some trial would leave off the grid."""
    config = space.config
    if config.sampler.name != "grid":
        return
    if not config.search:
        raise ConfigError("sampler: grid tries every combination of the search lists, and the "
                          "study has no search:; add search: {lr: [...]} or use another sampler.")
    ranges = [k for k, v in config.search.items() if not isinstance(v, list)]
    if ranges:
        raise ConfigError(f"search.{ranges[0]}: sampler grid needs a list of values to try, not a "
                          f"range; e.g. search: {{{ranges[0]}: [1.0e-4, 5.0e-4]}}.")
    for cand in space.candidates:
        own = [f"{c.role}.{name}" for c in cand.components() for name in c.ranges]
        if own:
            raise ConfigError(
                f"candidates[{cand.index}] ({cand.name}) searches {', '.join(own[:4])}: sampler "
                f"grid tries the study's search lists only; fix those under params, or set "
                f"search_declared: false on the candidate's components.")
    n = len(points(config))
    if config.budget.trials != n:
        raise ConfigError(f"budget.trials: {config.budget.trials}, but sampler grid has {n} "
                          f"points (the product of the search lists' lengths); set budget.trials: {n}.")
