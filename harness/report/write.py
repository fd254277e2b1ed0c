"""Assemble a study's report folder from :mod:`.collect`, :mod:`.verdict`, :mod:`.figures`,
:mod:`.document`, :mod:`.render` and :mod:`.export` in the formats asked for (``md``,
``html``, ``csv``, ``latex``, ``json``), and log it to the study's parent MLflow run."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.report import recall
from harness.report.collect import CandidateResult, Protocol, collect, protocol, with_data
from harness.report.document import document
from harness.report.export import (
    DEFAULT_FORMATS,
    FILES,
    candidates_csv,
    latex_table,
    seeds_csv,
    summary,
)
from harness.report.figures import (
    attention_maps,
    extrapolation,
    front,
    learning_curves,
    optuna_plots,
    palette,
    seeds_strip,
)
from harness.report.reference import reference_blocks
from harness.report.render import Block, fmt, render_html, render_markdown
from harness.report.verdict import Verdict, analyze
from harness.store import tracking
from harness.study.progress import progress, reconcile, settle_parent
from harness.study.storage import StudyHandle


def analysed(handle: StudyHandle, settle: bool = True
             ) -> tuple[list[CandidateResult], Verdict, Protocol]:
    """The study's results, read back and analysed (``settle``: first end orphaned runs and
    a complete study's parent run, as the report always has)."""
    if settle:
        reconcile(handle)
    prog = progress(handle)
    if settle:
        settle_parent(handle, prog)
    results = collect(handle)
    proto = with_data(protocol(handle, prog.complete), results, handle.config)
    return results, analyze(results, proto), proto


def write_report(handle: StudyHandle, out: str | Path | None = None, log_to_parent: bool = True,
                 formats: Sequence[str] = DEFAULT_FORMATS) -> Path:
    """Write the report folder in ``formats`` and log it to the parent run; returns the
    folder. Figures are drawn only for the Markdown and HTML reports."""
    out_dir = Path(out) if out else tracking.home() / "reports" / handle.name
    out_dir.mkdir(parents=True, exist_ok=True)
    results, verdict, proto = analysed(handle)
    from harness.report import scaling

    analysis = scaling.analyse(handle.config, results, confidence=proto.confidence)
    long_context: dict[str, Any] = {}
    if "md" in formats or "html" in formats:
        blocks = _full_document(handle, results, verdict, proto, out_dir)
        blocks = _with_compute(blocks, handle, results, analysis, out_dir)
        extra, long_context = recall.blocks(handle, results, proto, palette(
            [c.name for c in handle.config.candidates]), out_dir)  # depth x length, recall v state
        blocks = recall.insert(blocks, extra)
        if "md" in formats:
            (out_dir / "results.md").write_text(render_markdown(blocks))
        if "html" in formats:
            (out_dir / "results.html").write_text(render_html(blocks, f"Study {handle.name}"))
    if "csv" in formats:
        (out_dir / "candidates.csv").write_text(candidates_csv(results, verdict, proto))
        (out_dir / "seeds.csv").write_text(seeds_csv(results, proto))
    if "latex" in formats:
        (out_dir / "table.tex").write_text(latex_table(results, verdict, proto))
    if "json" in formats:
        data = summary(results, verdict, proto, parent_run_id=handle.parent_run_id)
        (out_dir / "summary.json").write_text(json.dumps(data, indent=2))
    if analysis is not None:
        _write_scaling(analysis, formats, out_dir)
    if log_to_parent:
        if long_context:
            recall.log_parent(handle, long_context)
        handle.tracker.client.log_artifacts(handle.parent_run_id, str(out_dir), "report")
    return out_dir


def _with_compute(blocks: list[Block], handle: StudyHandle, results: list[CandidateResult],
                  analysis: Any, out_dir: Path) -> list[Block]:
    """The report with its compute sections (realised compute, a scaling study's fits and
    figures: :mod:`.scaling`) before the ranking."""
    from harness.report import scaling

    section = scaling.compute_blocks(scaling.compute_rows(results), handle.config)
    if analysis is not None:
        colors = palette(list(analysis.runs) or list(analysis.fits))
        section = scaling.blocks(analysis, scaling.figures(analysis, colors, out_dir)) + section
    at = next((i for i, b in enumerate(blocks) if b == ("h2", "Ranking")), len(blocks))
    return blocks[:at] + section + blocks[at:]


def _write_scaling(analysis: Any, formats: Sequence[str], out_dir: Path) -> None:
    """A scaling study's exports: scaling.csv and scaling_runs.csv, scaling.tex, scaling.json."""
    from harness.report import scaling

    if "csv" in formats:
        (out_dir / "scaling.csv").write_text(scaling.fits_csv(analysis))
        (out_dir / "scaling_runs.csv").write_text(scaling.runs_csv(analysis))
    if "latex" in formats:
        (out_dir / "scaling.tex").write_text(scaling.latex_table(analysis))
    if "json" in formats:
        (out_dir / "scaling.json").write_text(json.dumps(scaling.summary(analysis), indent=2))


def written_files(out_dir: Path, formats: Sequence[str]) -> list[Path]:
    return [out_dir / name for f in formats for name in FILES[f]]


def _full_document(handle: StudyHandle, results: list[CandidateResult], verdict: Verdict,
                   proto: Protocol, out_dir: Path) -> list[Block]:
    """The document with its figures and the sections that read the stores."""
    import yaml

    colors = palette([c.name for c in handle.config.candidates])
    notes = list(handle.record.get("notes", []))
    figures: list[tuple[str, Path | None]] = [
        ("Learning curves", learning_curves(handle, results, colors, out_dir / "learning_curves.png")),
        ("Evaluation length", extrapolation(results, proto, colors, out_dir / "extrapolation.png")),
        ("Quality versus cost", front(handle, results, verdict, proto, colors, out_dir / "front.png")),
    ]
    extra: list[Block] = []
    opt_figs, opt_notes = optuna_plots(handle, out_dir)
    notes += opt_notes
    if opt_figs:
        extra.append(("h2", "Tuning (Optuna)"))
        extra += [("img", (str(p.relative_to(out_dir)), t)) for t, p in opt_figs]
    who, maps = attention_maps(handle, results, verdict, out_dir)
    if maps:
        extra.append(("h2", f"Attention maps: {who}"))
        extra += [("img", (str(p.relative_to(out_dir)), p.stem)) for p in maps]
    else:
        notes.append("no attention maps: no attention-based candidate logged any")
    extra.append(("h2", "Best configuration per candidate"))
    configs = best_configs(handle, out_dir / "configs")
    for r in results:
        if r.best_config:
            shown: dict[str, Any] = {k: r.best_config[k] for k in ("model", "train") if k in r.best_config}
            runnable = (f" The complete configuration (every declared field, defaults included): "
                        f"`configs/{r.name}.yaml`; `harness train configs/{r.name}.yaml` re-runs it."
                        if r.name in configs else "")
            extra.append(("p", f"{r.name}: tuning trial #{r.best_trial}, "
                               f"val/{proto.metric} = {fmt(r.best_value)}.{runnable}"))
            extra.append(("code", yaml.safe_dump(shown, sort_keys=False).strip()))
        else:
            extra.append(("p", f"{r.name}: no completed tuning trial"))
    extra += reference_blocks(handle.config.reference, results)
    if notes:
        extra += [("h2", "Notes"), ("list", notes)]
    strip = seeds_strip(results, verdict, proto, colors, out_dir / "seeds.png")
    return document(results, verdict, proto, seeds_figure=strip,
                    figures=[(t, p) for t, p in figures if p is not None], extra=extra)


def best_configs(handle: StudyHandle, folder: Path) -> dict[str, Path]:
    """Each candidate's best tuning run as a complete, runnable run config: the resolved
    config that run recorded (``config.yaml``: every declared field, defaults included), less
    its tracking block (a re-run records where the user's store is)."""
    import yaml

    from harness.keys import Attr, Phase
    from harness.study.progress import best_trial

    out: dict[str, Path] = {}
    for cand in handle.config.candidates:
        best = best_trial(handle.load(Phase.TUNE, cand.name), handle.config)
        if best is None or not best.user_attrs.get(Attr.RUN):
            continue
        run_id = best.user_attrs[Attr.RUN]
        try:
            config = handle.tracker.client.download_artifacts(run_id, "config.yaml")
        except Exception:  # a run recorded before configs were logged, or a store out of reach
            continue
        data = yaml.safe_load(Path(config).read_text())
        data.pop("tracking", None)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{cand.name}.yaml"
        path.write_text(f"# Best tuning trial #{best.number} of candidate {cand.name} in study "
                        f"{handle.name} (MLflow run {run_id}).\n"
                        + yaml.safe_dump(data, sort_keys=False))
        out[cand.name] = path
    return out
