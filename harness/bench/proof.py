"""``harness bench gpu --deadline S --records DIR``: the GPU proof as one time-boxed command.

For a short allocation on a GPU node (about 8 minutes, cold caches and compilation included):

1. the **environment** first (GPU, capability, memory, driver, CUDA, torch, triton, fla-core,
   flash-linear-attention, Python, the harness's version and commit), written at once;
2. then the sections in order of value, each in its own process group with a time cap:
   ``tests`` (the pytest files ``--tests`` names, each test under ``--test-timeout`` when
   pytest-timeout is installed), ``mixers`` (each fast-path mixer's reference vs fast path
   vs FLA's own layer at L 2048 and 8192), ``attention`` (flash attention to 32k),
   ``transformer`` (the GPT-2-small-shaped Transformer's MFU against plain PyTorch, whose
   steps run interleaved in the same process), ``decode`` (latency per token).

Every row is appended to ``DIR/proof.jsonl`` the moment it is measured, and each section's
table to ``DIR/proof.md`` the moment the section ends, so a run stopped by its allocation
keeps everything finished before. A section is started only with at least its minimum time
left before the deadline, else it is skipped and named; one that reaches its cap (or the
deadline) is stopped and its finished rows kept. ``DIR`` then holds at most three files
(``proof.md``, ``proof.jsonl``, ``tests.xml``). ``--dry-run`` runs the same on the CPU at
tiny shapes (CI runs it).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

#: each section: (cap in seconds, the least time worth starting it with)
BUDGET = {"tests": (150.0, 30.0), "mixers": (120.0, 40.0), "attention": (40.0, 15.0),
          "transformer": (150.0, 90.0), "decode": (40.0, 15.0)}
ORDER = ("tests", "mixers", "attention", "transformer", "decode")
#: the mixers with a fast path: the proof measures these (their reference, the kernels, FLA's layers)
FAST_MIXERS = ("gla", "retnet", "deltanet", "gated_deltanet", "rwkv6", "mamba2")
DRY_MIXERS = ("gla", "retnet")
#: a dry run's caps are this many times longer: a CPU starts its processes and trains the tiny
#: Transformer (three times, compiled nothing) slower than a GPU node does the real shapes
DRY_SLACK = 3.0


@dataclass
class Outcome:
    section: str
    status: str  # done | stopped at its cap | failed (exit N) | skipped: why
    seconds: float = 0.0


def versions() -> dict[str, str]:
    import importlib.metadata

    found = {}
    for name in ("torch", "triton", "fla-core", "flash-linear-attention", "lightning", "mlflow-skinny",
                 "mlflow", "optuna", "attention-harness"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "absent"
    return found


def environment(device: str) -> dict[str, Any]:
    """What every figure depends on, read before anything is measured."""
    import platform

    import torch

    from harness.bench import common, gpu
    from harness.store import tracking

    env: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                           "load": common.load_line(),
                           "cuda": str(torch.version.cuda), "cudnn": str(torch.backends.cudnn.version()),
                           **versions(), "git_commit": tracking.git_commit() or "unknown"}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, capability=f"{props.major}.{props.minor}",
                   gpu_memory_gb=round(props.total_memory / 2**30, 1),
                   multiprocessors=props.multi_processor_count, driver=gpu.driver_version())
    else:
        env.update(gpu="none (CPU dry run)", driver="-")
    return env


class Records:
    """``DIR/proof.md`` and ``DIR/proof.jsonl``, appended as results come."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.md, self.jsonl, self.xml = folder / "proof.md", folder / "proof.jsonl", folder / "tests.xml"
        for path in (self.md, self.jsonl, self.xml):
            if path.exists():
                raise FileExistsError(path)

    def event(self, **fields: Any) -> None:
        with self.jsonl.open("a") as f:
            f.write(json.dumps(fields) + "\n")

    def text(self, text: str) -> None:
        with self.md.open("a") as f:
            f.write(text)

    def rows(self, section: str) -> list[dict[str, Any]]:
        if not self.jsonl.exists():
            return []
        found = [json.loads(line) for line in self.jsonl.read_text().splitlines() if line.strip()]
        return [r for r in found if r.get("section") == section and "event" not in r]


def environment_markdown(env: dict[str, Any], command: str, started: datetime, deadline: float) -> str:
    lines = "\n".join(f"| {k} | {v} |" for k, v in env.items())
    return (f"# GPU proof{' (dry run on the CPU: tiny shapes, no figure to read)' if env['driver'] == '-' else ''}\n\n"
            f"- Command: `{command}`\n- Started: {started:%Y-%m-%d %H:%M:%S} UTC; deadline {deadline:.0f} s\n"
            f"- Sections in order of value, each with a cap: "
            + ", ".join(f"{s} {BUDGET[s][0]:.0f} s" for s in ORDER) + "\n\n## Environment\n\n| | |\n|---|---|\n"
            + lines + "\n")


def run_group(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> tuple[int | None, float]:
    """Run ``cmd`` in its own process group; kill the whole group at ``timeout``. Returns its
    exit code (None: stopped) and seconds."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, start_new_session=True, env=env)
    try:
        code: int | None = proc.wait(timeout=max(timeout, 1.0))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        code = None
    return code, time.perf_counter() - start


def pytest_timeout_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("pytest_timeout") is not None


def tests_section(records: Records, tests: list[str], per_test: float, timeout: float) -> str:
    """The tests, JUnit XML into ``records.xml``; returns the section's Markdown."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-o", "addopts=",
           f"--junitxml={records.xml}", *tests]
    timed = pytest_timeout_available()
    if timed:
        cmd.append(f"--timeout={per_test:g}")
    code, seconds = run_group(cmd, timeout)
    results = junit_results(records.xml)
    for r in results:
        records.event(section="tests", **r)
    counts = {k: sum(r["outcome"] == k for r in results) for k in ("passed", "failed", "error", "skipped")}
    how = (f"each test under {per_test:g} s (pytest-timeout)" if timed
           else "no per-test timeout: pytest-timeout is not installed here")
    stopped = " (stopped at its cap: the tests after the last listed did not run)" if code is None else ""
    table = "\n".join(f"| {r['test']} | {r['outcome']} | {r['seconds']:.1f} | {r['message']} |" for r in results)
    return (f"\n## tests: {counts['passed']} passed, {counts['failed']} failed, {counts['error']} errors, "
            f"{counts['skipped']} skipped in {seconds:.0f} s{stopped}\n\n`{' '.join(tests)}`; {how}.\n\n"
            f"| test | outcome | s | message |\n|---|---|---|---|\n{table}\n")


def junit_results(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError:
        return []
    found = []
    for case in root.iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                message = (node.get("message") or node.text or "").strip().splitlines()[0][:200] if (
                    node.get("message") or node.text) else ""
                break
        found.append({"test": f"{case.get('classname', '')}::{case.get('name', '')}", "outcome": outcome,
                      "seconds": float(case.get("time") or 0.0), "message": message.replace("|", "/")})
    return found


def bench_section(records: Records, section: str, dry_run: bool, timeout: float) -> tuple[int | None, float]:
    """One ``harness bench gpu --only SECTION`` process, its rows into ``proof.jsonl``."""
    mixers = DRY_MIXERS if dry_run else FAST_MIXERS
    cmd = [sys.executable, "-m", "harness.cli", "bench", "gpu", "--only", section, "--output", "-",
           "--jsonl", str(records.jsonl), "--mixers", *mixers, "--steps", "20", "--min-time", "0.5",
           *(["--dry-run"] if dry_run else [])]
    return run_group(cmd, timeout)


def section_markdown(records: Records, section: str, status: str, seconds: float) -> str:
    from harness.bench import gpu

    rows = [gpu.Row(**{k: r[k] for k in ("section", "name", "implementation", "length", "status",
                                          "tokens_per_s", "ms", "peak_mb", "extra")})
            for r in records.rows(section)]
    table = "\n".join(gpu.format_row(r) for r in rows) or "| (no row finished) | | | | | | | |"
    return f"\n## {section}: {status} in {seconds:.0f} s\n\n{gpu.HEADER}\n{table}\n"


def run(folder: Path, deadline: float, tests: list[str], per_test: float, dry_run: bool,
        say: Callable[[str], None] = print) -> list[Outcome]:
    """The proof (see module). Returns each section's outcome."""
    t0 = time.perf_counter()
    started = datetime.now(UTC)
    records = Records(folder)
    device = "cpu" if dry_run else "cuda"
    env = environment(device)
    command = "harness " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    records.event(event="environment", **env)
    records.text(environment_markdown(env, command, started, deadline))
    say(f"environment: {json.dumps(env)}")
    outcomes = []
    for section in ORDER:
        cap, least = BUDGET[section]
        cap *= DRY_SLACK if dry_run else 1.0
        left = deadline - (time.perf_counter() - t0)
        if section == "tests" and not tests:
            outcomes.append(Outcome(section, "skipped: no --tests given"))
            continue
        if left < least:
            outcomes.append(Outcome(section, f"skipped: {left:.0f} s left before the deadline, it needs at "
                                             f"least {least:.0f} s"))
            say(f"{section}: {outcomes[-1].status}")
            continue
        timeout = min(cap, left)
        say(f"{section}: starting with {timeout:.0f} s ({left:.0f} s left)")
        if section == "tests":
            text = tests_section(records, tests, per_test, timeout)
            seconds = time.perf_counter() - t0 - (deadline - left)
            status = "done"
        else:
            code, seconds = bench_section(records, section, dry_run, timeout)
            status = ("done" if code == 0 else f"failed (exit {code})" if code is not None
                      else f"stopped at {'its cap' if timeout == cap else 'the deadline'} ({timeout:.0f} s)")
            text = section_markdown(records, section, status, seconds)
        records.text(text)
        records.event(event="section", section=section, status=status, seconds=round(seconds, 1))
        outcomes.append(Outcome(section, status, seconds))
        say(f"{section}: {status} in {seconds:.0f} s")
    skipped = [o for o in outcomes if o.status.startswith("skipped")]
    total = time.perf_counter() - t0
    records.text(f"\n## Summary\n\n{len(outcomes) - len(skipped)} sections run in {total:.0f} s of the "
                 f"{deadline:.0f} s deadline. "
                 + ("Skipped: " + "; ".join(f"{o.section} ({o.status.removeprefix('skipped: ')})" for o in skipped)
                    if skipped else "None skipped.") + "\n")
    records.event(event="end", seconds=round(total, 1), skipped=[o.section for o in skipped])
    return outcomes
