"""Assemble a study's report folder (``results.md``, ``results.html``, ``summary.json``, the
figures) from :mod:`.collect`, :mod:`.figures` and :mod:`.render`, and log it to the study's
parent MLflow run."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from harness import tracking
from harness.report.collect import (
    N_RESAMPLES,
    CandidateResult,
    collect,
    front_cost,
)
from harness.report.figures import (
    attention_maps,
    extrapolation,
    front,
    learning_curves,
    optuna_plots,
)
from harness.report.render import (
    Block,
    _fmt,
    length_table,
    ranked_table,
    render_html,
    render_markdown,
)
from harness.study.progress import progress, reconcile, settle_parent
from harness.study.storage import StudyHandle


def write_report(handle: StudyHandle, out: str | Path | None = None, log_to_parent: bool = True) -> Path:
    """Write the report folder and log it to the parent run; returns the folder."""
    import yaml

    cfg = handle.config
    out_dir = Path(out) if out else tracking.home() / "reports" / handle.name
    out_dir.mkdir(parents=True, exist_ok=True)
    reconcile(handle)
    prog = progress(handle)
    settle_parent(handle, prog)
    train_length = int(handle.record["train_length"])
    lengths = tuple(int(n) for n in handle.record["eval_lengths"])
    length = cfg.objective.length or train_length
    results = collect(handle, lengths)

    blocks: list[Block] = [("h1", f"Study {handle.name}")]
    if cfg.description:
        blocks.append(("p", cfg.description.strip()))
    blocks.append(("p", _protocol_text(handle, length, prog.complete)))
    blocks.append(("h2", "Ranking"))
    blocks.append(ranked_table(handle, results, length))
    blocks.append(("p", "★: on the quality-versus-cost front (no other candidate is at least as "
                        f"good in both val/{cfg.objective.metric} and {front_cost(handle)}). "
                        "Cost columns are means over the confirmation seeds."))
    notes = list(handle.record.get("notes", []))
    figures: list[tuple[str, Path | None]] = [
        ("Learning curves", learning_curves(handle, results, out_dir / "learning_curves.png")),
        ("Evaluation length", extrapolation(handle, results, train_length, out_dir / "extrapolation.png")),
        ("Quality versus cost", front(handle, results, out_dir / "front.png")),
    ]
    if len(lengths) > 1:
        blocks.append(("h2", f"val/{cfg.objective.metric} by evaluation length (mean over seeds)"))
        blocks.append(length_table(handle, results, lengths, train_length))
        if any(v is None for r in results for v in r.by_length.values()):
            blocks.append(("p", "n/a: the model cannot run at that length (for example a learned "
                                "position table or a fixed-length mixer)."))
    for title, path in figures:
        if path is not None:
            blocks += [("h2", title), ("img", (path.name, title))]
    opt_figs, opt_notes = optuna_plots(handle, out_dir)
    notes += opt_notes
    if opt_figs:
        blocks.append(("h2", "Tuning (Optuna)"))
        blocks += [("img", (str(p.relative_to(out_dir)), t)) for t, p in opt_figs]
    who, maps = attention_maps(handle, results, out_dir)
    if maps:
        blocks.append(("h2", f"Attention maps: {who}"))
        blocks += [("img", (str(p.relative_to(out_dir)), p.stem)) for p in maps]
    else:
        notes.append("no attention maps: no attention-based candidate logged any")
    blocks.append(("h2", "Best configuration per candidate"))
    for r in results:
        if r.best_config:
            shown = {k: r.best_config[k] for k in ("model", "train") if k in r.best_config}
            blocks.append(("p", f"{r.name}: tuning trial #{r.best_trial}, "
                                f"val/{cfg.objective.metric} = {_fmt(r.best_value)}"))
            blocks.append(("code", yaml.safe_dump(shown, sort_keys=False).strip()))
        else:
            blocks.append(("p", f"{r.name}: no completed tuning trial"))
    if notes:
        blocks += [("h2", "Notes"), ("list", notes)]

    (out_dir / "results.md").write_text(render_markdown(blocks))
    (out_dir / "results.html").write_text(render_html(blocks, f"Study {handle.name}"))
    summary = _finite(_summary(handle, results, length, prog.complete))
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    if log_to_parent:
        handle.tracker.client.log_artifacts(handle.parent_run_id, str(out_dir), "report")
    return out_dir


def _protocol_text(handle: StudyHandle, length: int, complete: bool) -> str:
    cfg = handle.config
    b = cfg.budget
    match = f", widths matched to {b.params:,} parameters" if b.params else ""
    state = "" if complete else " THE STUDY IS NOT COMPLETE: numbers below are partial."
    return (
        f"Task {cfg.task.name} {cfg.task.params}. Objective: {cfg.objective.direction} "
        f"val/{cfg.objective.metric} at evaluation length {length}. Protocol: every candidate "
        f"tuned with {b.trials} trials of {b.steps} steps ({cfg.sampler.name} sampler, "
        f"{cfg.pruner.name} pruner{match}); its best configuration re-run with "
        f"{cfg.confirm.seeds} fresh seeds ({', '.join(map(str, cfg.confirm_seeds()))}). Mean and "
        f"{cfg.confirm.confidence:.0%} percentile bootstrap interval ({N_RESAMPLES:,} resamples) "
        f"over seeds; Δ and p against the baseline {cfg.baseline} on matched seeds (exact "
        f"two-sided sign-flip permutation test; with n seeds no p-value can be below 2/2^n, "
        f"{2 / 2 ** cfg.confirm.seeds:.3g} here). Rank 1 is best; ties share a rank.{state}"
    )


def _summary(handle: StudyHandle, results: list[CandidateResult], length: int,
             complete: bool) -> dict[str, Any]:
    cfg = handle.config
    return {
        "study": handle.name, "complete": complete, "parent_run_id": handle.parent_run_id,
        "objective": {"metric": cfg.objective.metric, "direction": cfg.objective.direction,
                      "length": length},
        "baseline": cfg.baseline, "confidence": cfg.confirm.confidence,
        "candidates": [
            {"name": r.name, "label": r.label, "rank": r.rank, "mean": r.mean, "ci": list(r.ci),
             "values": {str(s.seed): s.value for s in r.seeds},
             "runs": {str(s.seed): s.run_id for s in r.seeds},
             "paired": asdict(r.paired) if r.paired else None, "cost": r.cost,
             "by_length": {str(n): v for n, v in r.by_length.items()}, "on_front": r.on_front,
             "tuning": r.tuning, "best_trial": r.best_trial, "best_value": r.best_value}
            for r in results
        ],
    }


def _finite(x: Any) -> Any:
    """JSON has no NaN: undefined numbers (one seed, no value) become null."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x
