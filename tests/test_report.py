"""Report rendering: the same blocks as Markdown and HTML, escaped; undefined numbers shown
as such, never as a misleading value. (The report of a real study is checked in
tests/test_study.py.)"""

from __future__ import annotations

import json
import math

from harness.report.render import _fmt, _interval, render_html, render_markdown
from harness.report.write import _finite

BLOCKS = [
    ("h1", "Study <x>"),
    ("p", "a | b & c"),
    ("table", (["candidate", "val/acc"], [["a|b", "0.5"], ["<script>", "n/a"]])),
    ("img", ("front.png", "Quality versus cost")),
    ("list", ["note one"]),
    ("code", "model: {d_model: 32}"),
]


def test_markdown_keeps_tables_intact():
    md = render_markdown(BLOCKS)
    assert "# Study <x>" in md
    assert "| a\\|b | 0.5 |" in md  # a pipe inside a cell does not split it
    assert "![Quality versus cost](front.png)" in md
    assert "```yaml\nmodel: {d_model: 32}\n```" in md


def test_html_is_escaped():
    page = render_html(BLOCKS, "Study <x>")
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "<title>Study &lt;x&gt;</title>" in page
    assert '<img src="front.png" alt="Quality versus cost">' in page
    assert page.count("<tr>") == 3


def test_undefined_numbers():
    assert _fmt(None) == "n/a"  # a length the model cannot run
    assert _fmt(math.nan) == "–"  # no value
    assert _interval(0.5, (math.nan, math.nan)) == "0.5 (one seed)"
    assert _interval(0.5, (0.4, 0.6)) == "0.5 [0.4, 0.6]"
    assert json.loads(json.dumps(_finite({"ci": (math.nan, 1.0), "x": [math.inf]}))) == {
        "ci": [None, 1.0], "x": [None]}
