"""Processes the harness starts die with the process that started them."""

from __future__ import annotations

import signal
import sys


def die_with_parent(signum: int = signal.SIGTERM) -> bool:
    """Ask Linux to send ``signum`` to this process when its parent dies."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    pr_set_pdeathsig = 1
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(pr_set_pdeathsig, int(signum), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False
