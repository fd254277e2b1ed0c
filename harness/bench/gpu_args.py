"""``harness bench gpu``'s options checked before any work (:mod:`harness.bench.cli`): each
refused in one paragraph naming it and the fix (exit 2). Only the standard library here."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.errors import HarnessError

#: the longest --deadline accepted: a proof is for an allocation of minutes to hours
MAX_DEADLINE_S = 24 * 3600.0


def check_gpu_args(args: argparse.Namespace) -> None:
    """``harness bench gpu``'s options, each refused (naming it and the fix) before any work."""
    import math

    from harness.runtime.paths import writable_folder

    def positive(flag: str, value: float, example: str) -> None:
        if not (math.isfinite(value) and value > 0):
            raise HarnessError(f"{flag} {value:g}: give a positive number of seconds, e.g. {flag} {example}.")

    for flag, value in (("--steps", args.steps), ("--repeats", args.repeats)):
        if value < 1:
            raise HarnessError(f"{flag} {value}: give at least 1 (e.g. {flag} {30 if flag == '--steps' else 1}).")
    positive("--min-time", args.min_time, "1")
    positive("--test-timeout", args.test_timeout, "90")
    proof_only = [f for f, v in (("--records", args.records), ("--tests", args.tests)) if v is not None]
    if args.deadline is None:
        if proof_only:
            raise HarnessError(f"{' and '.join(proof_only)} belong to the time-boxed proof: add --deadline "
                               f"SECONDS (e.g. --deadline 480), or remove {' and '.join(proof_only)}.")
        return
    positive("--deadline", args.deadline, "480")
    if args.deadline > MAX_DEADLINE_S:
        raise HarnessError(f"--deadline {args.deadline:g}: the proof is time-boxed for one allocation; "
                           f"give at most {MAX_DEADLINE_S:g} s (a day), e.g. --deadline 480.")
    if not args.records:
        raise HarnessError("--deadline needs --records DIR: the folder its records are written "
                           "into as each section ends (proof.md, proof.jsonl, tests.xml).")
    writable_folder(args.records, "--records")
    for path in args.tests or ():
        name = Path(path.split("::", 1)[0])
        is_test = name.is_dir() or (name.is_file() and name.suffix == ".py"
                                    and (name.name.startswith("test_") or name.stem.endswith("_test")))
        if not is_test:
            why = "does not exist" if not name.exists() else "is not a pytest file (test_*.py or *_test.py)"
            raise HarnessError(f"--tests {path} {why}: name the test files of the tests section, e.g. "
                               f"--tests tests/test_gpu.py.")
