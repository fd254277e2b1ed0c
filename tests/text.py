"""What a message says, never where a terminal wrapped it.

The CLI wraps its paragraphs at a terminal's width (``harness.errors.fill``), and the suite
sets ``HARNESS_WRAP_WIDTH=1`` (conftest.py): every space of an error paragraph is a line
break in tests, so a test that asserts a phrase on raw output fails every time instead of by
the length of a temporary path. Assert on :func:`flat` text.
"""

from __future__ import annotations


def flat(text: object) -> str:
    """``text`` with every run of whitespace (line breaks included) as one space."""
    return " ".join(str(text).split())


def one_paragraph(err: str, limit: int = 1500) -> str:
    """The one error paragraph a refused command printed, flattened: no traceback, exactly
    one ``harness: error:``, shorter than ``limit`` characters (a paragraph, not a dump)."""
    assert "Traceback" not in err, err
    line = flat(err)
    assert line.count("harness: error:") == 1, err
    assert len(line) < limit, line
    return line
