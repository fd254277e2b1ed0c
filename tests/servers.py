"""Helpers for tests that start real servers on 127.0.0.1."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 180,
                       log: Path | None = None) -> None:
    """Poll ``url``/health until it answers; fail if the server exits or never answers."""
    deadline = time.time() + timeout_s
    while True:
        try:
            urllib.request.urlopen(url + "/health", timeout=2)
            return
        except OSError:
            if time.time() > deadline or proc.poll() is not None:
                tail = log.read_text()[-2000:] if log is not None and log.exists() else ""
                raise AssertionError(f"server at {url} did not start: {tail}") from None
            time.sleep(0.5)
