"""torch.compile on the CPU: which built-ins compile cleanly, and the speed-up per model family.

    OMP_NUM_THREADS=1 python benchmarks/compile_cpu.py [--quick] [--skip-status] [--out PATH]

*Status* (every attention variant, position scheme, mixer and model): dynamo's counters over
four training steps of a small model compiled with ``aot_eager`` (graph breaks, graphs
compiled in the first step, in the second, and in the third and fourth) or the error that stopped it
(:func:`harness.bench.compile.status`; ``tests/test_compile.py`` checks the same).

*Speed-up* (one representative per family, at ``--d-model``/``--length``/``--batch``): the
first training step (compilation included) and the median of the next ``--steps`` steps,
eager against ``inductor`` (C++ code generation on the CPU), each in a fresh process
(:func:`harness.bench.compile.step_seconds`). Times are upper bounds on a shared machine (its
load is in the record); on a GPU inductor generates Triton kernels instead, not measured here.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import asdict
from datetime import datetime
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

FAMILIES = {"attention": ("models", "transformer"), "position": ("position", "rope"),
            "mixers": ("mixers", "gla"), "models": ("models", "gru")}


def sized(config: dict[str, Any], d_model: int, length: int) -> dict[str, Any]:
    model = dict(config["model"])
    params = dict(model.get("params", {}))
    for key in ("d_model", "width", "hidden"):
        if key in params:
            params[key] = d_model
    model["params"] = params
    task = {"name": "copy", "params": {"length": length, "vocab": 16, "num_train": 64, "num_val": 4}}
    return {**config, "model": model, "task": task}


def worker(job: dict[str, Any]) -> dict[str, Any]:
    import torch

    from harness.bench.compile import status, step_seconds

    torch.set_num_threads(1)
    if job["what"] == "status":
        return asdict(status(job["config"]))
    first, step = step_seconds(job["config"], backend=job["backend"], steps=job["steps"], batch_size=job["batch"])
    return {"first_s": first, "step_s": step}


def run(job: dict[str, Any], timeout: float) -> dict[str, Any]:
    done = subprocess.run([sys.executable, __file__, "--worker", json.dumps(job)], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        return {"error": (lines[-1] if lines else f"exit {done.returncode}")[:200]}
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--skip-status", action="store_true", help="only the speed-up table")
    parser.add_argument("--backend", default="inductor", help="the compiled side of the speed-up table")
    parser.add_argument("--out", default=None, help="record path ('-': none; default benchmarks/compile_cpu_DATE.md)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, to check the script runs")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0
    from harness.bench.common import load_line, machine, record_path, write_record
    from harness.bench.compile import cases

    if args.quick:
        args.d_model, args.length, args.batch, args.steps = 16, 8, 2, 1
    started, load_before = datetime.now(), load_line()
    all_cases = cases()
    lines: list[str] = []
    if not args.skip_status:
        lines += ["## Compile status (aot_eager, 4 training steps of a small model)", "",
                  "| family | plugin | graph breaks | graphs (first step) | compiled in step 2 | "
                  "compiled in steps 3-4 | clean | what broke or stopped it |", "|---|---|---|---|---|---|---|---|"]
        families = {"attention": ["multi_head"]} if args.quick else all_cases
        for family, names in families.items():
            for name in names:
                got = run({"what": "status", "config": all_cases[family][name]}, timeout=900)
                reason = got.get("error") or "; ".join(got.get("break_reasons", []))
                clean = (not got.get("error") and got.get("graph_breaks") == 0 and got.get("steady_recompiles") == 0)
                once = got.get("recompiles", 0) - got.get("steady_recompiles", 0) if "recompiles" in got else ""
                lines.append(f"| {family} | {name} | {got.get('graph_breaks', '')} | {got.get('graphs', '')} | "
                             f"{once} | {got.get('steady_recompiles', '')} | {'yes' if clean else 'no'} | {reason} |")
                print(lines[-1], flush=True)
        lines.append("")
    lines += [f"## Speed-up of {args.backend} over eager (d_model {args.d_model}, batch {args.batch} x "
              f"{2 * args.length + 1} tokens, median of {args.steps} steps)", "",
              f"| family | representative | eager s/step | {args.backend} s/step | speed-up | first compiled step s |",
              "|---|---|---|---|---|---|"]
    for family, (group, name) in FAMILIES.items():
        config = sized(all_cases[group][name], args.d_model, args.length)
        if family == "attention":
            config = {**config, "model": {**config["model"], "attention": {"name": "multi_head"}}}
        job = {"what": "time", "config": config, "steps": args.steps, "batch": args.batch}
        eager = run({**job, "backend": None}, timeout=900)
        compiled = run({**job, "backend": args.backend}, timeout=1800)
        if "error" in eager or "error" in compiled:
            lines.append(f"| {family} | {name} | {eager.get('step_s', eager.get('error'))} | "
                         f"{compiled.get('step_s', compiled.get('error'))} | | |")
        else:
            lines.append(f"| {family} | {name} | {eager['step_s']:.4f} | {compiled['step_s']:.4f} | "
                         f"{eager['step_s'] / compiled['step_s']:.2f}x | {compiled['first_s']:.1f} |")
        print(lines[-1], flush=True)
    seconds = (datetime.now() - started).total_seconds()
    command = "OMP_NUM_THREADS=1 python benchmarks/compile_cpu.py " + " ".join(sys.argv[1:])
    text = "\n".join([
        "# torch.compile on the CPU: status of every built-in, speed-up per family", "",
        f"- Machine: {machine('cpu')}; one torch thread",
        f"- Date: {started:%Y-%m-%d %H:%M}; the run took {seconds / 60:.1f} min",
        f"- Command: `{command}`",
        f"- Machine load: before {load_before}; after {load_line()} (shared: times are upper bounds)",
        "", *lines, ""])
    write_record(record_path(args.out, "compile", "cpu", started), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
