"""``harness bench gpu --deadline S --records DIR``: the GPU proof as one time-boxed command.

For one cold call on a GPU node (about 9 minutes in all, install and compilation included;
the procedure and the measured costs behind each cap: benchmarks/gpu/README.md):

1. the **environment** (GPU, capability, memory, driver, CUDA, torch, triton, fla-core,
   flash-linear-attention, Python, the harness's version and the commit given with
   ``--commit``), and the node's ``pip list --format=freeze`` into ``DIR/freeze.txt``;
2. the **FLA warmers** (:mod:`harness.bench.warm`) start beside the first sections: each
   compiles its share of the autotuned kernels' configurations into Triton's cache, so the
   mixers section and the tests later find them compiled (:mod:`harness.bench.autotune`);
3. the sections, in the order of what their targets need, each in its own process group with
   a cap: ``ceiling`` (a bf16 8192^3 matrix product: the device's measured rate),
   ``transformer`` (GPT-2-small-shaped, ``harness.train`` against plain PyTorch: MFU against
   the spec and the ceiling, compilations after the first step), ``attention``, ``mixers``
   (each fast path against its reference and FLA's own layer, one length for every mixer
   before the next length), ``tests`` (pytest verbose; at its cap SIGINT, so the JUnit file
   is written, then SIGKILL), ``decode`` and ``small`` (issue 51's tiny Transformer eager and
   with ``train.cuda_graphs``).

Every row is appended to ``DIR/proof.jsonl`` the moment it is measured (each of a mixer's
three measurements, the Transformer's warm-up run before its measured runs), and each
section's table to ``DIR/proof.md`` the moment the section ends, so a run stopped by its
allocation keeps everything finished before. A section is started only with at least its
minimum time left before the deadline, else it is skipped and named; the time a section
leaves unused under its cap goes to the next (never the time the later sections need to start). Every process's stderr
goes to the caller's (the log). ``DIR`` then holds at most four files (``proof.md``,
``proof.jsonl``, ``tests.xml``, ``freeze.txt``). ``--dry-run`` runs the same on the CPU at
tiny shapes (no warmers: FLA's kernels need CUDA).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.bench import common

#: each section: (cap in seconds, the least time worth starting it with), in the order run;
#: the caps come from the costs measured for benchmarks/gpu/README.md ("Expected seconds")
BUDGET = {"ceiling": (30.0, 10.0), "transformer": (170.0, 60.0), "attention": (40.0, 15.0),
          "mixers": (110.0, 30.0), "tests": (90.0, 20.0), "decode": (30.0, 15.0), "small": (60.0, 30.0)}
ORDER = tuple(BUDGET)
#: the mixers with a fast path: the proof measures these (their reference, the kernels, FLA's layers)
FAST_MIXERS = ("gla", "retnet", "deltanet", "gated_deltanet", "rwkv6", "mamba2")
DRY_MIXERS = ("gla", "retnet")
#: a dry run's caps are this many times longer: a CPU starts its processes and trains the tiny
#: Transformer (three times, compiled nothing) slower than a GPU node does the real shapes
DRY_SLACK = 3.0
#: FLA warmers at most (each one process compiling 1/N of every autotuned kernel's configurations)
WARMERS = 8
#: the mixers section waits at most this long for the warmers to finish its shapes
WARM_WAIT_S = 45.0
#: seconds pytest gets after SIGINT to write its JUnit file before SIGKILL
SIGINT_GRACE_S = 10.0
#: each autotuned configuration timed this long in the measuring processes (harness.bench.autotune)
AUTOTUNE_REP_MS = 10.0
#: the environment variable naming the warmers' process groups to pause while a section times
QUIET_ENV = common.QUIET_ENV
quiet = common.quiet


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


def environment(device: str, commit: str | None = None) -> dict[str, Any]:
    """What every figure depends on, read before anything is measured."""
    import platform

    import torch

    from harness.bench import common, gpu
    from harness.store import tracking

    env: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                           "cpus": os.cpu_count(), "load": common.load_line(),
                           "cuda": str(torch.version.cuda), "cudnn": str(torch.backends.cudnn.version()),
                           **versions(),
                           "git_commit": commit or tracking.git_commit() or "unknown (no --commit and no .git)"}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, capability=f"{props.major}.{props.minor}",
                   gpu_memory_gb=round(props.total_memory / 2**30, 1),
                   multiprocessors=props.multi_processor_count, driver=gpu.driver_version())
    else:
        env.update(gpu="none (CPU dry run)", driver="-")
    return env


def freeze(path: Path) -> str:
    """The node's own packages (``pip list --format=freeze`` without PYTHONPATH) into ``path``,
    the list the next wheelhouse is built against (offline/wheelhouse.py --node)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "list", "--format=freeze"], env=env,
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"not read ({type(exc).__name__})"
    path.write_text(f"# {sys.executable}: python -m pip list --format=freeze (PYTHONPATH unset)\n{done.stdout}")
    return f"{len(done.stdout.splitlines())} packages ({path.name})"


class Records:
    """``DIR/proof.md`` and ``DIR/proof.jsonl``, appended as results come."""

    NAMES = ("proof.md", "proof.jsonl", "tests.xml", "freeze.txt")

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.md, self.jsonl, self.xml, self.freeze = (folder / n for n in self.NAMES)
        for path in (self.md, self.jsonl, self.xml, self.freeze):
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
            f"- Sections in order, each with a cap: "
            + ", ".join(f"{s} {cap:.0f} s" for s, (cap, _) in BUDGET.items()) + "\n\n## Environment\n\n| | |\n|---|---|\n"
            + lines + "\n")


def run_group(cmd: list[str], timeout: float, env: dict[str, str] | None = None,
              interrupt_first: bool = False) -> tuple[int | None, float]:
    """Run ``cmd`` in its own process group (its output to ours); at ``timeout`` send the group
    SIGINT first when ``interrupt_first`` (pytest then writes its reports) and SIGKILL after
    :data:`SIGINT_GRACE_S`. Returns its exit code (None: stopped) and seconds."""
    start = time.perf_counter()
    # SIGINT at its default in the group even when the proof was started with it ignored (a
    # background job of a script): an ignored signal would stay ignored there, and pytest would
    # never write its report before the SIGKILL
    proc = subprocess.Popen(cmd, start_new_session=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        code: int | None = proc.wait(timeout=max(timeout, 1.0))
    except subprocess.TimeoutExpired:
        if interrupt_first:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=SIGINT_GRACE_S)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        code = None
    return code, time.perf_counter() - start


# -- the FLA warmers ----------------------------------------------------------------------------
class Warmers:
    """The processes of :mod:`harness.bench.warm`, started at the proof's beginning."""

    def __init__(self, count: int, mixers: tuple[str, ...], lengths: tuple[int, ...], tests: list[str],
                 say: Callable[[str], None]) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="harness-warm-"))
        self.started = time.perf_counter()
        self.procs: list[subprocess.Popen[bytes]] = []
        for i in range(count):
            cmd = [sys.executable, "-m", "harness.bench.warm", "--slice", f"{i}/{count}", "--mixers", *mixers,
                   "--lengths", *map(str, lengths), "--done", str(self.folder / f"{i}.mixers"),
                   "--tests", *[t for t in tests if "fast_path" in Path(t).name]]
            self.procs.append(subprocess.Popen(cmd, start_new_session=True, preexec_fn=lambda: os.nice(5)))
        say(f"warmers: {count} started (mixers {', '.join(mixers)} at L {', '.join(map(str, lengths))})")

    def pgids(self) -> str:
        return ",".join(str(p.pid) for p in self.procs if p.poll() is None)

    def running(self) -> int:
        return sum(p.poll() is None for p in self.procs)

    def wait_for_mixers(self, limit: float) -> float:
        """Wait until every warmer has finished the mixers' shapes (or ended), at most ``limit`` s."""
        start = time.perf_counter()
        while time.perf_counter() - start < limit:
            if all(p.poll() is not None or (self.folder / f"{i}.mixers").exists() for i, p in enumerate(self.procs)):
                break
            time.sleep(0.5)
        return time.perf_counter() - start

    def resume(self) -> None:
        """SIGCONT every warmer (a section stopped at its cap may have left them paused)."""
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGCONT)

    def stop(self) -> str:
        codes = []
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
            codes.append(p.wait())
        ended = sum(c == 0 for c in codes)
        return f"{ended} of {len(codes)} warmers finished, {time.perf_counter() - self.started:.0f} s after the start"


# -- the sections -------------------------------------------------------------------------------
def pytest_timeout_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("pytest_timeout") is not None


def tests_section(records: Records, tests: list[str], per_test: float, timeout: float,
                  env: dict[str, str]) -> tuple[str, str, float]:
    """The tests, verbose, JUnit XML into ``records.xml``; (status, Markdown, seconds)."""
    cmd = [sys.executable, "-m", "pytest", "-v", "-rA", "-p", "no:cacheprovider", "-p", "harness.bench.autotune",
           "-o", "addopts=", f"--junitxml={records.xml}", *tests]
    timed = pytest_timeout_available()
    if timed:
        cmd.append(f"--timeout={per_test:g}")
    code, seconds = run_group(cmd, timeout, env=env, interrupt_first=True)
    results = junit_results(records.xml)
    for r in results:
        records.event(section="tests", **r)
    counts = {k: sum(r["outcome"] == k for r in results) for k in ("passed", "failed", "error", "skipped")}
    how = (f"each test under {per_test:g} s (pytest-timeout)" if timed
           else "no per-test timeout: pytest-timeout is not installed here")
    stopped = (" (stopped at its cap by SIGINT: the tests after the last listed did not run)"
               if code is None else "")
    table = "\n".join(f"| {r['test']} | {r['outcome']} | {r['seconds']:.1f} | {r['message']} |" for r in results)
    status = "done" if code is not None else f"stopped at its cap ({timeout:.0f} s)"
    return status, (f"\n## tests: {counts['passed']} passed, {counts['failed']} failed, {counts['error']} errors, "
                    f"{counts['skipped']} skipped in {seconds:.0f} s{stopped}\n\n`{' '.join(tests)}`; {how}.\n\n"
                    f"| test | outcome | s | message |\n|---|---|---|---|\n{table}\n"), seconds


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
                text = (node.get("message") or node.text or "").strip()
                message = text.splitlines()[0][:200] if text else ""
                break
        found.append({"test": f"{case.get('classname', '')}::{case.get('name', '')}", "outcome": outcome,
                      "seconds": float(case.get("time") or 0.0), "message": message.replace("|", "/")})
    return found


def bench_section(records: Records, section: str, dry_run: bool, timeout: float,
                  env: dict[str, str] | None = None) -> tuple[int | None, float]:
    """One ``harness bench gpu --only SECTION`` process, its rows into ``proof.jsonl``."""
    mixers = DRY_MIXERS if dry_run else FAST_MIXERS
    cmd = [sys.executable, "-m", "harness.cli", "bench", "gpu", "--only", section, "--output", "-",
           "--jsonl", str(records.jsonl), "--mixers", *mixers, "--steps", "50", "--min-time", "0.5",
           *(["--dry-run"] if dry_run else [])]
    return run_group(cmd, timeout, env=env)


def section_markdown(records: Records, section: str, status: str, seconds: float, note: str = "") -> str:
    from harness.bench import gpu

    rows = [gpu.Row(**{k: r[k] for k in ("section", "name", "implementation", "length", "status",
                                          "tokens_per_s", "ms", "peak_mb", "extra")})
            for r in records.rows(section)]
    if section == "transformer":
        note += ceiling_note(records, rows)
    table = "\n".join(gpu.format_row(r) for r in rows) or "| (no row finished) | | | | | | | |"
    return f"\n## {section}: {status} in {seconds:.0f} s\n\n{note}{gpu.HEADER}\n{table}\n"


def ceiling_note(records: Records, rows: list[Any]) -> str:
    """Each Transformer row's achieved FLOP/s against the ceiling section's measured rate."""
    rates = [r["extra"].get("flops_per_s") for r in records.rows("ceiling") if r["status"] == "ok"]
    if not rates:
        return "No measured ceiling (the ceiling section has no row): MFU against the spec peak only.\n\n"
    lines = []
    for r in rows:
        per_token = r.extra.get("flops_per_token")
        if r.status == "ok" and per_token and r.tokens_per_s:
            lines.append(f"{r.implementation}: {per_token * r.tokens_per_s / 1e12:,.0f} TFLOP/s, "
                         f"{per_token * r.tokens_per_s / max(rates):.1%} of the measured ceiling")
    return ("Against the measured bf16 matrix-product ceiling (" + f"{max(rates) / 1e12:,.0f} TFLOP/s): "
            + ("; ".join(lines) or "no finished run") + ".\n\n")


def run(folder: Path, deadline: float, tests: list[str], per_test: float, dry_run: bool,
        say: Callable[[str], None] = print, commit: str | None = None) -> list[Outcome]:
    """The proof (see module). Returns each section's outcome."""
    t0 = time.perf_counter()
    started = datetime.now(UTC)
    records = Records(folder)
    device = "cpu" if dry_run else "cuda"
    env = environment(device, commit)
    env["node_packages"] = freeze(records.freeze)
    command = "harness " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    records.event(event="environment", **env)
    records.text(environment_markdown(env, command, started, deadline))
    say(f"environment: {json.dumps(env)}")
    warmers = start_warmers(dry_run, tests, say)
    records.text(f"\n- FLA warmers: {f'{len(warmers.procs)} processes' if warmers else 'none'} "
                 f"({'harness.bench.autotune: each compiles 1/N of every autotuned configuration, paused while a section times the GPU' if warmers else 'no CUDA or no FLA here'}); "
                 f"autotuned configurations timed {AUTOTUNE_REP_MS:g} ms each in the measuring processes.\n")
    outcomes = []
    banked = 0.0  # seconds earlier sections left unused under their caps: the next ones may use them
    sections = tuple(BUDGET)  # in order; a test may give fewer
    for n, section in enumerate(sections):
        cap, least = BUDGET[section]
        cap *= DRY_SLACK if dry_run else 1.0
        left = deadline - (time.perf_counter() - t0)
        reserve = sum(BUDGET[later][1] for later in sections[n + 1:])  # the least each later one needs
        cap = max(cap, min(cap + banked, left - reserve))
        if section == "tests" and not tests:
            outcomes.append(Outcome(section, "skipped: no --tests given"))
            continue
        if left < least:
            outcomes.append(Outcome(section, f"skipped: {left:.0f} s left before the deadline, it needs at "
                                             f"least {least:.0f} s"))
            say(f"{section}: {outcomes[-1].status}")
            continue
        timeout = min(cap, left)
        note = ""
        if warmers is not None:
            if section == "mixers":
                waited = warmers.wait_for_mixers(min(WARM_WAIT_S, timeout / 2))
                timeout -= waited
                note = f"Waited {waited:.0f} s for the warmers to compile these shapes. "
            if section == "decode":
                note = warmers.stop() + " (stopped before decode). "
            else:
                note += f"{warmers.running()} warmers running (paused while this section times the GPU).\n\n"
        sub_env = section_env(warmers, dry_run)
        say(f"{section}: starting with {timeout:.0f} s ({left:.0f} s left)")
        if section == "tests":
            status, text, seconds = tests_section(records, tests, per_test, timeout, sub_env)
        else:
            code, seconds = bench_section(records, section, dry_run, timeout, sub_env)
            status = ("done" if code == 0 else f"failed (exit {code})" if code is not None
                      else f"stopped at {'its cap' if timeout == cap else 'the deadline'} ({timeout:.0f} s)")
            text = section_markdown(records, section, status, seconds, note)
        if warmers is not None:
            warmers.resume()
        banked = max(0.0, timeout - seconds)
        records.text(text)
        records.event(event="section", section=section, status=status, seconds=round(seconds, 1))
        outcomes.append(Outcome(section, status, seconds))
        say(f"{section}: {status} in {seconds:.0f} s")
    if warmers is not None and warmers.procs and any(p.returncode is None for p in warmers.procs):
        records.text(f"\n- {warmers.stop()}.\n")
    skipped = [o for o in outcomes if o.status.startswith("skipped")]
    total = time.perf_counter() - t0
    records.text(f"\n## Summary\n\n{len(outcomes) - len(skipped)} sections run in {total:.0f} s of the "
                 f"{deadline:.0f} s deadline. "
                 + ("Skipped: " + "; ".join(f"{o.section} ({o.status.removeprefix('skipped: ')})" for o in skipped)
                    if skipped else "None skipped.") + "\n")
    records.event(event="end", seconds=round(total, 1), skipped=[o.section for o in skipped])
    return outcomes


def start_warmers(dry_run: bool, tests: list[str], say: Callable[[str], None]) -> Warmers | None:
    """The FLA warmers on a GPU with FLA (None on a dry run or without FLA)."""
    if dry_run:
        return None
    from harness.bench import gpu
    from harness.nn import fast_path

    if not fast_path.fla_importable():
        say("warmers: none (fla-core or triton not importable)")
        return None
    count = max(1, min(WARMERS, (os.cpu_count() or 2) // 2))
    return Warmers(count, FAST_MIXERS, gpu.Settings().mixer_lengths, tests, say)


def section_env(warmers: Warmers | None, dry_run: bool) -> dict[str, str]:
    """A section process's environment: the warmers to pause, the autotuner's brief timing."""
    from harness.bench import autotune

    env = dict(os.environ)
    if warmers is not None:
        env[QUIET_ENV] = warmers.pgids()
    if not dry_run:
        env[autotune.REP_ENV] = f"{AUTOTUNE_REP_MS:g}"
    return env
