"""The published table beside the measured one: a study's ``reference`` block (numbers from a
paper, the candidate closest to each published model, the protocol differences) rendered as
report blocks. Data only: the report never compares the two with a test, since the published
numbers come from another protocol (see the differences listed)."""

from __future__ import annotations

import math
from typing import Any

from harness.report.collect import CandidateResult
from harness.report.render import Block


def reference_blocks(reference: Any, results: list[CandidateResult]) -> list[Block]:
    """The "Published reference" section, or nothing where the study has no reference."""
    if reference is None:
        return []
    ours = {r.name: r for r in results}
    rows = []
    for row in reference.rows:
        r = ours.get(row.candidate) if row.candidate else None
        measured = ("—" if r is None or math.isnan(r.mean)
                    else f"{r.mean * reference.scale:.2f} ({len(r.seeds)} seeds)")
        published = "—" if row.value is None else f"{row.value:.2f}"
        rows.append([row.model, published, row.candidate or "—", measured, row.note])
    blocks: list[Block] = [
        ("h2", "Published reference"),
        ("p", f"{reference.source}. Published: {reference.metric}; ours: the mean over "
              f"confirmation seeds of the study's objective, times {reference.scale:g}, beside the "
              f"candidate closest to each published model. Not a test: the protocols differ."),
        ("table", (["published model", "published", "our candidate", "ours", "note"], rows)),
    ]
    if reference.differences:
        blocks += [("p", "Protocol differences:"), ("list", list(reference.differences))]
    return blocks
