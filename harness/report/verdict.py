"""What a study's numbers support: statistics per candidate, the comparisons, the best group,
ranks with ties, the quality-versus-cost front, parameter-count matching and the fixed
hyper-parameters that differ between candidates.

:func:`analyze` fills the statistics of each :class:`~.collect.CandidateResult` and returns a
:class:`Verdict`. It reads nothing from the stores, so it runs as well on results built by
hand (tests, golden files). The rules, stated in the report's own words by :mod:`.render`:

* **Comparisons.** Every pair of candidates that has a value is compared on its matched seeds
  (the study's paired test); the p-values of all k(k-1)/2 pairs are Holm-adjusted as one
  family, because the table makes a claim about every pair (the best group, the ranks, the
  difference from the baseline): the family-wise error of the whole table is at most the
  study's level. "A is resolved better than B": adjusted p <= level and A's mean difference
  over the matched seeds is in the objective's direction.
* **Best group**: the best mean and every candidate whose comparison with it is not resolved.
* **Rank** = 1 + the number of candidates resolved better. Candidates nothing separates
  share a rank.
* **Front** (quality versus cost): a candidate is on it unless another is resolved better on
  one axis and not resolved worse on the other. Quality is resolved by the test above; the
  cost is resolved when the two means differ by more than :data:`COST_TOLERANCE` and, for a
  measured cost (throughput, memory), the same test over seeds resolves it too. When no two
  candidates' costs are resolved apart there is no front: it would be the best group again.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from harness.errors import shorten
from harness.keys import val_key
from harness.report import stats
from harness.report.collect import CandidateResult, Comparison, Protocol, cost_value
from harness.study.schema import COSTS, DETERMINED_COSTS

#: A candidate whose parameter count is further than this from ``budget.params`` is flagged.
PARAM_TOLERANCE = 0.05
#: Costs closer than this (relative) are equal for the front.
COST_TOLERANCE = 0.05
#: Configuration keys that are the protocol or a candidate's identity, not a choice of it.
_NOT_HYPERPARAMETERS = ("task.", "tracking.", "plugins")
_PROTOCOL_KEYS = {"train.seed", "train.data_seed", "train.max_steps", "train.max_time_s",
                  "train.progress", "train.devices", "train.num_threads"}
#: Power of the seeds-to-resolve estimate.
POWER = 0.8

Values = Callable[[CandidateResult], dict[int, float]]


@dataclass
class Verdict:
    alpha: float
    test: str
    comparisons: int  # the Holm family: pairs of candidates with values
    floor: stats.ResolutionFloor
    best: str | None
    best_group: list[str]
    order: list[str]  # table order: by rank, then mean; candidates without a value last
    unranked: list[str]  # candidates without a value (every confirmation run failed)
    front: list[str] | None  # None: no front (costs not resolved apart)
    front_note: str
    #: (a, b) -> adjusted p-value of the pair, both orders
    adjusted: dict[tuple[str, str], float] = field(default_factory=dict)
    param_notes: list[str] = field(default_factory=list)
    #: per candidate with failed confirmation seeds: "rwkv6 2 of 5 (seeds 1, 5: ...)"
    failed_seeds: list[str] = field(default_factory=list)
    #: key -> {candidate: value (with "(searched)" / "(matched)")}, fixed values that differ
    fixed_differences: dict[str, dict[str, str]] = field(default_factory=dict)
    #: handicaps the analysis found that limit how far the verdict can be trusted, each as
    #: (a few words for a title, a sentence): :func:`caveats`
    caveats: list[tuple[str, str]] = field(default_factory=list)
    #: candidates whose every seed scored the objective's bound (accuracy 1, loss 0), and
    #: the evaluation length that still separates them (None: none does)
    saturated: list[str] = field(default_factory=list)
    separating_length: int | None = None

    @property
    def resolved(self) -> bool:
        """Whether some candidate with a value is outside the best group."""
        return len(self.best_group) < len(self.order) - len(self.unranked)


def analyze(results: list[CandidateResult], protocol: Protocol) -> Verdict:
    _per_candidate(results, protocol)
    sign = 1.0 if protocol.maximize else -1.0
    alpha, test = protocol.alpha, protocol.test
    ranked = [r for r in results if math.isfinite(r.mean)]
    by_name = {r.name: r for r in results}
    adjusted = _family(ranked, test, CandidateResult.values)

    def better(a: CandidateResult, b: CandidateResult) -> bool:
        return _resolved(adjusted, a, b, alpha, sign, CandidateResult.values)

    for r in ranked:
        r.rank = 1 + sum(better(o, r) for o in ranked if o is not r)
    n_seeds = min((len(r.seeds) for r in ranked), default=0)
    floor = stats.resolution_floor(test, n_seeds, max(1, len(ranked) * (len(ranked) - 1) // 2),
                                   alpha)
    # ties on the mean broken by name, as the table orders them, so "the best mean" is the
    # candidate the table lists first among the best means
    best = min(ranked, key=lambda r: (-sign * r.mean, r.name)) if ranked else None
    group = []
    if best is not None:
        for r in ranked:
            p = adjusted.get((r.name, best.name), math.nan)
            r.best_group = r is best or not p <= alpha
            if r.best_group:
                group.append(r.name)
    base = by_name.get(protocol.baseline)
    for r in ranked:
        _compare_with(r, best, base, protocol, adjusted, floor.comparisons)
    front, note = _front(ranked, protocol, better)
    order = sorted(ranked, key=lambda r: (r.rank or 0, -sign * r.mean, r.name))
    group = [r.name for r in order if r.name in group]  # named in the table's order
    unranked = [r for r in results if r not in ranked]
    verdict = Verdict(alpha, test, floor.comparisons, floor, best.name if best else None, group,
                      [r.name for r in order + unranked], [r.name for r in unranked], front,
                      note, adjusted)
    verdict.param_notes = _params(results, protocol)
    verdict.failed_seeds = [failed_seeds_text(r) for r in results if r.failed_seeds]
    verdict.fixed_differences = fixed_differences(results)
    verdict.saturated, verdict.separating_length = saturation(results, protocol)
    verdict.caveats = caveats(results, verdict, protocol)
    return verdict


# -- caveats -----------------------------------------------------------------------------------
#: The best value a metric can reach: accuracy-like metrics 1, error-like ones 0, perplexity 1.
BOUNDS = {"acc": 1.0, "exact": 1.0, "exact_match": 1.0, "f1": 1.0, "macro_f1": 1.0,
          "loss": 0.0, "bpc": 0.0, "bpb": 0.0, "per": 0.0, "wer": 0.0, "cer": 0.0, "error": 0.0,
          "ppl": 1.0}
#: a value this close to its metric's bound is at it (metrics are logged as float32)
AT_BOUND = 1e-6


def saturation(results: list[CandidateResult], protocol: Protocol) -> tuple[list[str], int | None]:
    """Candidates whose every confirmation seed reached the objective's bound (a ceiling such
    as accuracy 1, or a floor such as loss 0: the objective cannot tell them apart), when
    there are at least two, and the evaluation length that still separates them: the longest
    one at which their means differ (None: none does)."""
    bound = BOUNDS.get(protocol.metric)
    if bound is None:
        return [], None
    at = [r.name for r in results
          if r.seeds and all(abs(s.value - bound) <= AT_BOUND for s in r.seeds)]
    if len(at) < 2:
        return [], None
    by_name = {r.name: r for r in results}
    for n in sorted(protocol.lengths, reverse=True):
        if n == protocol.length:
            continue
        means = [by_name[a].by_length.get(n) for a in at]
        values = [m for m in means if m is not None and math.isfinite(m)]
        if len(values) == len(at) and max(values) - min(values) > AT_BOUND:
            return at, n
    return at, None


def caveats(results: list[CandidateResult], verdict: Verdict, protocol: Protocol
            ) -> list[tuple[str, str]]:
    """What the report detects that limits the verdict: tuned values at the edge of their
    range, parameter counts that differ (or miss the target) by more than
    :data:`PARAM_TOLERANCE`, failed confirmation seeds, an objective at its bound for several
    candidates. Each as (a few words for a title, a sentence for the verdict's first line)."""
    out = []
    edged = [r for r in results if r.edges]
    if edged:
        keys = sorted({e.split(" ")[0].rsplit(".", 1)[-1] for r in edged for e in r.edges})
        out.append((f"{'/'.join(keys)} at range edge ({len(edged)} of {len(results)})",
                    f"the tuned {', '.join(keys)} of {len(edged)} of {len(results)} candidates "
                    f"({', '.join(r.name for r in edged)}) sit at the edge of the searched range, "
                    f"so their optimum may lie outside it (Parameters)"))
    counts = {r.name: r.cost.get("params", math.nan) for r in results}
    counts = {k: v for k, v in counts.items() if math.isfinite(v) and v > 0}
    off = [r.name for r in results if r.params_off is not None and abs(r.params_off) > PARAM_TOLERANCE]
    if protocol.param_target and off:
        out.append((f"params off target ({len(off)})",
                    f"{', '.join(off)} {'misses' if len(off) == 1 else 'miss'} budget.params by more than {PARAM_TOLERANCE:.0%}, so "
                    f"the comparison is not at equal size"))
    elif not protocol.param_target and not protocol.scaling and len(counts) > 1:  # a scaling grid's
        spread = max(counts.values()) / min(counts.values()) - 1  # sizes differ by design
        if spread > PARAM_TOLERANCE:
            out.append((f"params differ {spread:.0%}",
                        f"parameter counts differ by up to {spread:.0%} "
                        f"({min(counts.values()):,.0f} to {max(counts.values()):,.0f}), so the "
                        f"comparison is not at equal size"))
    failed = [r for r in results if r.failed_seeds]
    if failed:
        out.append(("failed seeds: " + ", ".join(
                        f"{r.name} {len(r.failed_seeds)}/{len(r.failed_seeds) + len(r.seeds)}"
                        for r in failed),
                    "confirmation seeds failed (" + "; ".join(
                        f"{r.name} {len(r.failed_seeds)} of {len(r.failed_seeds) + len(r.seeds)}"
                        for r in failed) + "), and the means use only the seeds that finished"))
    if verdict.saturated:
        bound = BOUNDS[protocol.metric]
        where = (f"val/{protocol.metric} at length {verdict.separating_length} still separates "
                 f"them (by evaluation length, below)" if verdict.separating_length is not None
                 else "no evaluation length separates them either")
        out.append((f"objective saturated ({len(verdict.saturated)} at {bound:g})",
                    f"the objective is saturated: {', '.join(verdict.saturated)} score "
                    f"{protocol.objective} = {bound:g} on every seed, so it cannot rank them; "
                    f"{where}"))
    return out


def _per_candidate(results: list[CandidateResult], protocol: Protocol) -> None:
    for r in results:
        values = [s.value for s in r.seeds]
        r.mean = stats.mean(values)
        r.interval = stats.mean_interval(values, protocol.confidence)
        r.cost = {name: stats.mean([cost_value(s.metrics, name) for s in r.seeds]) for name in COSTS}
        for n in protocol.lengths:
            if r.seeds and all(n in s.not_applicable for s in r.seeds):
                r.by_length[n] = None
                continue
            at = [s.metrics.get(val_key(protocol.metric, n), math.nan) for s in r.seeds]
            r.by_length[n] = stats.mean(at)
            r.by_length_interval[n] = stats.mean_interval(at, protocol.confidence)


def _family(ranked: list[CandidateResult], test: str, values: Values) -> dict[tuple[str, str], float]:
    """Holm-adjusted p-values of every pair, keyed by both orders."""
    pairs = [(a, b) for i, a in enumerate(ranked) for b in ranked[i + 1:]]
    raw = [stats.p_value(_diffs(values(a), values(b)), test) for a, b in pairs]
    out = {}
    for (a, b), p in zip(pairs, stats.holm(raw), strict=True):
        out[a.name, b.name] = out[b.name, a.name] = p
    return out


def _diffs(a: dict[int, float], b: dict[int, float]) -> list[float]:
    x, y = stats.matched(a, b)
    return list(x - y)


def _resolved(adjusted: dict[tuple[str, str], float], a: CandidateResult, b: CandidateResult,
              alpha: float, sign: float, values: Values) -> bool:
    """Whether a is resolved better than b (in the direction ``sign``)."""
    p = adjusted.get((a.name, b.name), math.nan)
    return p <= alpha and sign * stats.mean(_diffs(values(a), values(b))) > 0


def _compare_with(r: CandidateResult, best: CandidateResult | None, base: CandidateResult | None,
                  protocol: Protocol, adjusted: dict[tuple[str, str], float], family: int) -> None:
    conf, test = protocol.confidence, protocol.test
    sign = 1.0 if protocol.maximize else -1.0
    for ref, attr in ((best, "vs_best"), (base, "vs_baseline")):
        if ref is None or ref is r or not math.isfinite(ref.mean):
            continue
        paired = stats.paired_comparison(r.values(), ref.values(), conf, test)
        x, y = stats.matched(r.values(), ref.values())
        p_improve, interval = stats.probability_of_improvement(sign * x, sign * y, conf)
        setattr(r, attr, Comparison(
            ref.name, replace(paired, p_adjusted=adjusted.get((r.name, ref.name), math.nan)),
            p_improve, interval,
            # Holm's smallest threshold is level / family: enough seeds for that resolve it
            stats.seeds_to_resolve(list(x - y), protocol.alpha / family, POWER, test)))


# -- the front ---------------------------------------------------------------------------------
def _front(ranked: list[CandidateResult], protocol: Protocol,
           better: Callable[[CandidateResult, CandidateResult], bool]) -> tuple[list[str] | None, str]:
    cost = protocol.front_cost
    measured = cost not in DETERMINED_COSTS  # a measured cost varies over seeds: test it
    csign = 1.0 if COSTS[cost][1] == "maximize" else -1.0
    alpha, test = protocol.alpha, protocol.test

    def costs(r: CandidateResult) -> dict[int, float]:
        return {s.seed: cost_value(s.metrics, cost) for s in r.seeds}

    cost_adjusted = _family(ranked, test, costs) if measured else {}

    def cheaper(a: CandidateResult, b: CandidateResult) -> bool:
        ca, cb = a.cost.get(cost, math.nan), b.cost.get(cost, math.nan)
        if not (math.isfinite(ca) and math.isfinite(cb)) or min(abs(ca), abs(cb)) == 0:
            return False
        if abs(ca - cb) / min(abs(ca), abs(cb)) <= COST_TOLERANCE or csign * (ca - cb) <= 0:
            return False
        return not measured or _resolved(cost_adjusted, a, b, alpha, csign, costs)

    pairs = [(a, b) for a in ranked for b in ranked if a is not b]
    if not any(cheaper(a, b) for a, b in pairs):
        return None, (f"No quality-versus-cost front: no two candidates' {cost} differ by more "
                      f"than {COST_TOLERANCE:.0%}" + (" with a resolved difference over seeds"
                                                     if measured else "")
                      + ", so the best group above is the whole answer.")

    def dominates(b: CandidateResult, a: CandidateResult) -> bool:
        return (not better(a, b) and not cheaper(a, b)) and (better(b, a) or cheaper(b, a))

    front = [a for a in ranked if not any(dominates(b, a) for b in ranked if b is not a)]
    for r in ranked:
        r.on_front = r in front
    return [r.name for r in front], (
        f"★ on the quality-versus-cost front ({protocol.objective} against {cost}): no other "
        f"candidate is resolved better on one axis without being resolved worse on the other. "
        f"Quality differences count when the paired test resolves them (Holm-adjusted, level "
        f"{alpha:.3g}); {cost} differences count above {COST_TOLERANCE:.0%}"
        + (" and when the same test over seeds resolves them" if measured else "") + ".")


# -- parameters --------------------------------------------------------------------------------
def failed_seeds_text(r: CandidateResult) -> str:
    """``rwkv6: 2 of 5 confirmation seeds failed (seeds 1, 5: TrainingDiverged: training loss
    became nan at step 97)``, the first reason shortened."""
    total = len(r.failed_seeds) + len(r.seeds)
    first = next(iter(r.failed_seeds.values())).split(" at /")[0].split(";")[0]
    if "FAILED while training: " in first:
        first = first.split("FAILED while training: ", 1)[1]
    seeds = ", ".join(str(s) for s in r.failed_seeds)
    return (f"{r.name}: {len(r.failed_seeds)} of {total} confirmation seeds failed (seed"
            f"{'s' if len(r.failed_seeds) > 1 else ''} {seeds}: {shorten(first, 160)})")


def _params(results: list[CandidateResult], protocol: Protocol) -> list[str]:
    """Achieved parameter counts against the target (or against each other without one)."""
    notes = []
    counts = {r.name: r.cost.get("params", math.nan) for r in results}
    counts = {k: v for k, v in counts.items() if math.isfinite(v)}
    target = protocol.param_target
    if target:
        for r in results:
            if r.name in counts:
                r.params_off = (counts[r.name] - target) / target
                if abs(r.params_off) > PARAM_TOLERANCE:
                    notes.append(f"{r.name} has {counts[r.name]:,.0f} parameters, {r.params_off:+.1%} "
                                 f"off the target budget.params = {target:,} (more than "
                                 f"{PARAM_TOLERANCE:.0%}): its comparison is not at equal size.")
    elif len(counts) > 1 and min(counts.values()) > 0 and not protocol.scaling:
        spread = max(counts.values()) / min(counts.values()) - 1
        if spread > PARAM_TOLERANCE:
            notes.append(f"No parameter target (budget.params): the candidates' parameter counts "
                         f"differ by up to {spread:.0%} ({min(counts.values()):,.0f} to "
                         f"{max(counts.values()):,.0f}).")
    return notes


def fixed_differences(results: list[CandidateResult]) -> dict[str, dict[str, str]]:
    """Hyper-parameters fixed (not searched) in at least one candidate whose values differ
    between the candidates that have them: a reader must see a handicap such as
    ``tie_embeddings`` differing. Component names (what the candidates are) and the protocol
    (seeds, steps) are left out; values set by parameter matching are marked."""
    keys = sorted({k for r in results for k in r.config})
    out = {}
    for key in keys:
        if key.startswith(_NOT_HYPERPARAMETERS) or key in _PROTOCOL_KEYS or key.endswith(".name"):
            continue
        have = [r for r in results if key in r.config]
        if len(have) < 2 or len({r.config[key] for r in have}) < 2:
            continue
        if all(key in r.searched or key in r.matched for r in have):
            continue
        out[key] = {r.name: r.config[key] + (" (searched)" if key in r.searched else
                                             " (matched)" if key in r.matched else "")
                    for r in have}
    return out
