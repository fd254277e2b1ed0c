"""``harness check``: run the conformance kit (:mod:`harness.testing`) from the command line.

Prints one table per component: a row per check (pass, FAIL with the first line of the
failure, exempt with the plugin's reason, n/a with why), then a summary. Exit code 0 when
every check passes, 1 when any fails, 2 for bad input (an unknown name). Imports torch only
when it runs.
"""

from __future__ import annotations

import argparse
import difflib
import time
from typing import Any

from harness.errors import HarnessError, UnknownNameError
from harness.registry.specs import KINDS

MARKS = {"pass": "ok", "FAIL": "FAIL", "exempt": "exempt", "n/a": "n/a"}


def _selected(registry: Any, args: argparse.Namespace, files: list[str]) -> list[Any]:
    """The specs to check: by name (every kind that has it, or --kind), --all, or every
    component the --plugin files register."""
    kinds = [args.kind] if args.kind else list(KINDS)
    if args.all:
        return [s for k in kinds for s in registry.specs(k)]
    if not args.names:
        if not files:
            raise HarnessError("harness check needs plugin names, --all, or --plugin FILE.py; "
                               "try `harness check multi_head` or `harness check --all --kind task`.")
        local = {f"file {f}" for f in files}
        return [s for k in kinds for s in registry.specs(k) if s.distribution in local]
    specs = []
    for name in args.names:
        found = [registry.get(k, name) for k in kinds if name in registry.names(k)]
        if not found:
            if args.kind:
                registry.get(args.kind, name)  # raises with close matches
            known = sorted({n for k in kinds for n in registry.names(k)})
            close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
            hint = (" Did you mean " + " or ".join(f"'{c}'" for c in close) + "?") if close else ""
            raise UnknownNameError(f"no plugin component is called '{name}'.{hint} Run `harness list` "
                                   f"to see every registered name (and --plugin FILE.py for a local file).")
        specs += found
    return specs


def _table(spec: Any, outcomes: list[Any], seconds: float, verbose: bool) -> str:
    lines = [f"{spec.kind} {spec.name}  ({spec.provenance()})"]
    width = max(len(o.check) for o in outcomes)
    for o in outcomes:
        extra = " ".join(x for x in (o.detail, f"[{o.seconds:.2f} s]" if verbose else "") if x)
        lines.append(f"  {MARKS[o.status]:<6} {o.check:<{width}}  {extra}".rstrip())
    counts = {s: sum(o.status == s for o in outcomes) for s in MARKS}
    lines.append(f"  -> {counts['pass']} passed, {counts['FAIL']} failed, {counts['exempt']} exempt, "
                 f"{counts['n/a']} not applicable ({seconds:.1f} s)")
    return "\n".join(lines)


def cmd_check(args: argparse.Namespace) -> int:
    import os

    from harness import testing
    from harness.testing.core import FAIL, base_registry, run_checks

    files = [os.path.abspath(p) for p in args.plugin]
    for path in files:
        if not os.path.isfile(path):
            raise HarnessError(f"--plugin {path}: no such file. Pass the path of a plugin .py file.")
    registry = base_registry(tuple(files))
    local = {f"file {f}" for f in files}
    broken = [f for f in registry.failures if f.distribution in local]
    for failure in broken:
        print(f"plugin failed to load: {failure.describe()}")
    specs = _selected(registry, args, files)
    if not specs and broken:
        return 1
    if not specs:
        what = (" of kind " + args.kind) if args.kind else ""
        raise HarnessError(f"nothing to check: no component{what} is registered"
                           + (" by the --plugin files." if files else "."))
    if args.coord:
        from harness.cli.coord import run_coord

        return run_coord(registry, specs, args, _params(args.set, specs)) or (1 if broken else 0)
    _check_names(args.check, {spec.kind for spec in specs})
    params = _params(args.set, specs)
    failed, total = [], 0
    for spec in specs:
        cls = testing.checks_for(spec.kind, spec.name, plugin_files=files, params=params,
                                 _kit_registry=registry)
        started = time.perf_counter()
        outcomes = list(run_checks(cls, only=args.check or None))
        total += len(outcomes)
        print(_table(spec, outcomes, time.perf_counter() - started, args.verbose), flush=True)
        if any(o.status == FAIL for o in outcomes):
            failed.append(f"{spec.kind} {spec.name}")
    verdict = f"FAILED: {', '.join(failed)}" if failed else "all checks pass"
    print(f"\n{len(specs)} component(s), {total} checks: {verdict}")
    return 1 if failed or broken else 0


def _params(pairs: list[str], specs: list[Any]) -> dict[str, Any]:
    """``--set NAME=VALUE`` hyper-parameters (YAML values), validated for every component."""
    import yaml

    from harness.params import resolve

    params = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise HarnessError(f"--set {pair}: expected NAME=VALUE, e.g. --set window=4")
        params[name.strip()] = yaml.safe_load(value)
    for spec in specs:
        resolve(spec.config, params, f"--set for {spec.kind} '{spec.name}'")
    return params


def _check_names(names: list[str], kinds: set[str]) -> None:
    """Refuse a --check that no selected kind has, with the closest names."""
    from harness import testing

    known = sorted({c for k in kinds for c in testing.CHECKS[k].all_checks()})
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise HarnessError(f"--check {name}: no such check.{hint} Checks: {', '.join(known)}.")


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "check", help="run the conformance checks on plugins (pass/fail table)",
        description="Run the conformance kit (harness.testing) on plugin components: each check "
                    "passes, fails (with the first line of the failure), is exempt (with the plugin's "
                    "reason) or does not apply. Exit code 0 if all pass, 1 if any fails.")
    p.add_argument("names", nargs="*", metavar="NAME", help="component names (every kind that has the name)")
    p.add_argument("--kind", choices=KINDS, help="only components of this kind")
    p.add_argument("--all", action="store_true", help="every registered component (of --kind)")
    p.add_argument("--plugin", action="append", default=[], metavar="FILE.py",
                   help="load a local plugin file; without names, check what it registers (repeatable)")
    p.add_argument("--check", action="append", default=[], metavar="CHECK",
                   help="run only this check (repeatable), e.g. --check causality")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="check with this hyper-parameter value (repeatable), e.g. --set window=4")
    p.add_argument("--verbose", "-v", action="store_true", help="show each check's time")
    coord = p.add_argument_group(
        "coordinate check (μP)", "--coord runs harness.testing.coord instead of the kit: each model, "
        "mixer or attention variant trained a few steps at several widths under the standard "
        "parametrization and under μP; a table of every layer's activation size and its growth "
        "with width, and a figure. Exit 1 when a layer grows under μP.")
    coord.add_argument("--coord", action="store_true", help="run the coordinate check")
    coord.add_argument("--widths", default="32,64,128,256,512", metavar="W,W,...",
                       help="widths (the first is μP's base; default 32,64,128,256,512)")
    coord.add_argument("--steps", type=int, default=4, help="training steps recorded (default 4)")
    coord.add_argument("--seeds", type=int, default=2, help="seeds averaged (default 2)")
    coord.add_argument("--lr", type=float, default=1e-2, help="learning rate (default 1e-2)")
    coord.add_argument("--optimizer", choices=("adam", "adamw", "sgd"), default="adam")
    coord.add_argument("--out", default=".", metavar="DIR",
                       help="where the figures go (coord_<kind>_<name>.png; default: here)")
    p.set_defaults(handler=cmd_check)
