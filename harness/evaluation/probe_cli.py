"""``harness probe RUN --task needle --lengths ...``: a long-context probe of a trained run
(:mod:`harness.evaluation.probe`). Imports torch only when the command runs."""

from __future__ import annotations

import argparse
from typing import Any


def _ints(text: str, flag: str) -> list[int]:
    from harness.errors import ConfigError

    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: give comma-separated whole numbers, e.g. {flag} 256,512.") from None


def _params(pairs: list[str]) -> dict[str, Any]:
    from harness.errors import ConfigError
    from harness.yaml_io import parse_value

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {pair}: expected NAME=VALUE, e.g. --set num_keys=4")
        out[key.strip()] = parse_value(value, f"--set {key.strip()}")
    return out


def table(result: Any) -> str:
    """The grid as text: one row per depth (or one row), one column per length."""
    lengths = result.lengths
    head = "depth    " + "".join(f"{n:>9}" for n in lengths)
    rows = [head]
    metric = result.metric
    if result.depths:
        for d in result.depths:
            rows.append(f"{d:>4}%    " + "".join(f"{result.by_length[n].get(f'{metric}_depth{d}', float('nan')):>9.3f}"
                                                  for n in lengths))
    rows.append("mean     " + "".join(f"{result.by_length[n].get(metric, float('nan')):>9.3f}" for n in lengths))
    return "\n".join(rows)


def cmd_probe(args: argparse.Namespace) -> int:
    import math

    from harness.errors import ConfigError
    from harness.evaluation.probe import probe

    if not (math.isfinite(args.threshold) and 0 < args.threshold <= 1):
        raise ConfigError(f"--threshold {args.threshold:g}: recall is a fraction, so the level a length "
                          f"must hold is above 0 and at most 1, e.g. --threshold 0.9.")
    depths = _ints(args.depths, "--depths") if args.depths else None
    result = probe(args.run, args.task, lengths=_ints(args.lengths, "--lengths"), depths=depths,
                   params=_params(args.set), num=args.num, split=args.split, max_length=args.max_length,
                   batch_size=args.batch_size, name=args.name, log=not args.no_log,
                   tracking_uri=args.tracking_uri, trust_plugins=args.trust_plugins, seed=args.seed)
    for note in result.notes:
        print(note)
    print(f"probe {result.name}: task {result.task}, val/{result.metric} ({result.examples} examples per "
          f"length, split {args.split}), run {result.run}")
    print(table(result))
    past = [n for n in result.lengths if n > result.train_length]
    if past:
        print(f"lengths {', '.join(map(str, past))} are past the {result.train_length} tokens the run "
              f"trained on: extrapolation, read whole (never cut)")
    mean = result.grid_mean()
    print(f"mean over the grid {mean:.4f}; longest length held >= {args.threshold:g}: "
          f"{result.longest_held(args.threshold)}" if mean is not None else "nothing scored")
    if result.logged:
        print(f"logged to run {result.run}: metrics probe/{result.name}/..., artifacts "
              f"probe/{result.name}/heatmap.png and grid.json")
    else:
        print("(not logged: " + ("--no-log" if args.no_log else f"{args.run} is a folder, not a run") + ")")
    return 0


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("probe", help="score a trained language-model run on a long-context probe (needle...)",
                       description="Probe a trained language-model run (a run id, or a folder written "
                                   "by `harness export`) zero-shot with a RULER-style task (needle, "
                                   "variable_tracking, common_words, frequent_words) over a grid of "
                                   "context lengths and needle depths, through the run's own "
                                   "vocabulary, and log each cell to the run (probe/<name>/...). A "
                                   "length the model cannot read whole is refused, never cut "
                                   "(docs/long_context.md).")
    p.add_argument("run", metavar="RUN_ID_OR_DIR")
    p.add_argument("--task", default="needle", help="the probe's task (default: needle)")
    p.add_argument("--lengths", required=True, help="context lengths in tokens, comma-separated")
    p.add_argument("--depths", default=None, help="needle depths in percent, comma-separated "
                                                  "(default: the task's, 0,25,50,75,100)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="a task param (repeatable), e.g. --set num_keys=4 or --set haystack=random")
    p.add_argument("--num", type=int, default=100, help="examples per length (spread over the depths)")
    p.add_argument("--split", default="test", choices=("val", "test"),
                   help="the corpus split the haystack is read from (default: test)")
    p.add_argument("--max-length", type=int, default=None,
                   help="refuse lengths above this (default: what the model can read)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--threshold", type=float, default=0.9, help="the level for 'longest length held'")
    p.add_argument("--name", default=None, help="the probe's name in the run's metrics (default: the task)")
    p.add_argument("--seed", type=int, default=0, help="the probe's data seed")
    p.add_argument("--tracking-uri", default=None)
    p.add_argument("--no-log", action="store_true", help="print only; log nothing to the run")
    p.add_argument("--trust-plugins", action="store_true",
                   help="load an exported folder whose model.json names plugin files")
    p.set_defaults(handler=cmd_probe)
