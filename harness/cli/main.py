"""The ``harness`` command line.

Commands import what they need when they run: ``harness --help`` and ``harness list``
never import torch, lightning or mlflow. User errors (:class:`HarnessError`) print one
paragraph and exit with code 2, without a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import os
import signal
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator, Sequence

from harness.cli.completion import hint
from harness.errors import HarnessError, Interrupted
from harness.store.masking import mask_text

Handler = Callable[[argparse.Namespace], int]


def _plugin_args(p: argparse.ArgumentParser) -> None:
    hint(p.add_argument("--plugin", action="append", default=[], metavar="PATH.py",
                        help="load a local plugin file (repeatable)"), "py")


@contextlib.contextmanager
def ctrl_c(at_once: str) -> Iterator[None]:
    """The first Ctrl-C raises :class:`Interrupted` (the run or trial is ended cleanly and
    recorded); a second one exits at once with code 130, saying ``at_once`` (what is left).
    A SIGINT the shell made us ignore (a background job) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    presses = 0

    def handler(signum: int, frame: object) -> None:
        nonlocal presses
        presses += 1
        if presses == 1:
            raise Interrupted()
        print(f"\nharness: interrupted again: exiting at once. {at_once}", file=sys.stderr, flush=True)
        os._exit(130)

    previous = signal.getsignal(signal.SIGINT)
    if previous == signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        # Once interrupted and cleaned up, a further Ctrl-C (while the message is printed
        # and the process exits with 130) is ignored: what was kept is being reported. Not a
        # Python handler: the interpreter resets those to the default action when it shuts
        # down, and a press in that window would kill the process by SIGINT instead.
        signal.signal(signal.SIGINT, signal.SIG_IGN if presses else previous)


def paragraph(text: str) -> str:
    """A message for stderr as one paragraph, passwords masked: wrapped at a terminal's
    width, one line in a file or a pipe (:func:`harness.errors.fill`)."""
    from harness.errors import MAX_MESSAGE, fill, shorten

    text = shorten(mask_text(text), MAX_MESSAGE)  # a backstop: echoed values are bounded where made
    return fill(" ".join(part.strip() for part in text.splitlines()))


def report_interrupt(exc: Interrupted) -> int:
    """One paragraph: what was kept and how to go on."""
    kept = exc.kept or "nothing was recorded yet"
    text = f"harness: interrupted (Ctrl-C). Kept: {kept}."
    if exc.resume:
        text += f" {exc.resume}"
    print(paragraph(text), file=sys.stderr)
    return 130


def _preempted(exc: BaseException) -> str:
    """What SIGUSR1 did: the run checkpointed and how to continue it, or, for a study worker
    signalled between trials, that nothing was training."""
    run_id, step = getattr(exc, "run_id", "") or "RUN_ID", getattr(exc, "step", None)
    code = getattr(exc, "code", 75)
    if step is None:
        return (f"harness: SIGUSR1: stopped between runs; nothing was training, so nothing was "
                f"checkpointed (exit {code}). The same `harness study run` command continues the study.")
    return (f"harness: SIGUSR1: checkpointed run {run_id} at step {step} and stopped (exit {code}); "
            f"`harness train --resume {run_id}` or the same `harness study run` command continues it.")


def _tracking_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tracking-uri", default=None,
                   help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else the "
                        "project-local store in $HARNESS_HOME or ./.harness)")


# -- list ------------------------------------------------------------------------------
def cmd_list(args: argparse.Namespace) -> int:
    from harness.registry import listing
    from harness.registry.specs import KINDS

    data = listing.listing(args.plugin, refresh=args.refresh)
    print(listing.render(data, [args.kind] if args.kind else list(KINDS), args.verbose))
    return 0


# -- train -----------------------------------------------------------------------------
def cmd_train(args: argparse.Namespace) -> int:
    with ctrl_c("The run stays RUNNING in MLflow (resume it with --resume RUN_ID if it saved a "
                "checkpoint, else train it again)."):
        try:
            return _train(args)
        except Interrupted as exc:
            exc.resume = exc.resume or ("Run the same command again to train it from the start, "
                                        "or continue it with `harness train --resume RUN_ID` if it "
                                        "saved a checkpoint (train.checkpoint_every).")
            raise


def _train(args: argparse.Namespace) -> int:
    from harness.config import load_run_config

    overrides = list(args.set)
    for flag, key in (("task", "task.name"), ("model", "model.name"),
                      ("attention", "model.attention.name"), ("position", "model.position.name"),
                      ("max_steps", "train.max_steps"), ("seed", "train.seed"),
                      ("experiment", "tracking.experiment")):
        value = getattr(args, flag)
        if value is not None:
            overrides.insert(0, f"{key}={value}")
    if args.resume:
        return _resume(args, overrides)
    if args.from_run:
        if args.config or overrides:
            raise HarnessError("harness train --from-run RUN_ID re-runs a recorded run as it was: "
                               "pass no config file, --set or component flags with it.")
        from harness.cli.reproduce import reproduce

        return reproduce(args.from_run, tracking_uri=args.tracking_uri,
                         extra_plugins=[os.path.abspath(p) for p in args.plugin])
    if args.no_progress:
        overrides.append("train.progress=false")
    if args.config is None and not any(o.startswith("task.name=") for o in overrides):
        raise HarnessError("harness train needs a config file or --task and --model; "
                           "try `harness train studies/copy_quickstart.yaml`.")
    cfg = load_run_config(args.config, overrides)
    cfg.plugins.extend(os.path.abspath(p) for p in args.plugin)
    if args.tracking_uri:  # as given: a URI is not YAML ('#' would start a comment)
        cfg.tracking.uri = args.tracking_uri
    from harness.store import tracking

    tracking.preflight(cfg.tracking.uri)  # seconds, before torch is imported

    from harness.run.checkpoint import stop_on_sigusr1
    from harness.run.console import Announce
    from harness.run.pipeline import train

    with stop_on_sigusr1():
        result = train(cfg, callbacks=[Announce(cfg.train.checkpoint_every)])
    if result.rank:  # a distributed run's other processes: rank 0 says it once
        return 0
    print(f"\nrun {result.run_id} {result.status}; {result.num_params:,} parameters")
    for key in sorted(result.metrics):
        print(f"  {key:<32} {result.metrics[key]:.4f}")
    if result.not_applicable:
        print(f"  not applicable at lengths: {', '.join(map(str, result.not_applicable))}")
    print("browse it with `harness ui`")
    return 0


def _resume(args: argparse.Namespace, overrides: list[str]) -> int:
    """``harness train --resume RUN_ID [CONFIG]``: a config given must be the run's own."""
    from harness.run.pipeline import train

    cfg = None
    if args.config or overrides:
        from harness.config import load_run_config

        base = None
        if not args.config:  # flags alone: they change the recorded config (free fields pass)
            from harness.run.resume import recorded_base

            base = recorded_base(args.resume, args.tracking_uri)
        cfg = load_run_config(args.config, overrides, base=base)
        cfg.plugins.extend(os.path.abspath(p) for p in args.plugin if os.path.abspath(p) not in cfg.plugins)
        if args.tracking_uri:
            cfg.tracking.uri = args.tracking_uri
    from harness.run.checkpoint import stop_on_sigusr1
    from harness.run.console import Announce

    with stop_on_sigusr1():
        result = train(cfg, resume=args.resume, tracking_uri=args.tracking_uri,
                       callbacks=[Announce()])
    if result.rank:
        return 0
    print(f"\nrun {result.run_id} {result.status} (resumed); {result.num_params:,} parameters")
    for key in sorted(result.metrics):
        print(f"  {key:<32} {result.metrics[key]:.4f}")
    return 0


# -- ui --------------------------------------------------------------------------------
def cmd_ui(args: argparse.Namespace) -> int:
    from harness.cli import ui

    args.quiet = not args.library_output
    return ui.run(args)


# -- completion ------------------------------------------------------------------------
def cmd_completion(args: argparse.Namespace) -> int:
    from harness.cli import completion

    if args.complete is not None:
        print("\n".join(completion.complete(build_parser(), args.complete)))
    else:
        print(completion.script(args.shell))
    return 0


# -- parser ----------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="harness",
        description="Compare attention variants, position schemes and baselines fairly.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=textwrap.dedent("""\
            examples:
              harness list --verbose
              harness train studies/copy_quickstart.yaml
              harness train --task copy --model transformer --attention multi_head --max-steps 200
              harness ui
            """),
    )
    parser.add_argument("--version", action=_Version, help="print the version and exit")
    parser.add_argument("--verbose", dest="library_output", action="store_true",
                        help="let the libraries' own output through (Lightning, MLflow, Optuna "
                             "info lines and warnings)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("list", help="list registered plugins")
    p.add_argument("--kind", choices=["attention", "mixer", "position", "model", "task"])
    p.add_argument("--verbose", "-v", action="store_true", help="show hyper-parameters and declarations")
    p.add_argument("--refresh", action="store_true",
                   help="load every plugin again instead of using the cached listing")
    _plugin_args(p)
    p.set_defaults(handler=cmd_list)

    p = sub.add_parser("train", help="train one run from a YAML file and/or flags")
    hint(p.add_argument("config", nargs="?", help="run config YAML"), "yaml")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set model.params.d_model=128")
    for flag in ("task", "model", "attention", "position"):
        hint(p.add_argument(f"--{flag}", default=None), f"plugin:{flag}")
    p.add_argument("--experiment", default=None)
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--from-run", default=None, metavar="RUN_ID",
                   help="re-run a recorded MLflow run (its config, seeds and plugins) and say "
                        "whether its metrics match the recorded ones")
    p.add_argument("--resume", default=None, metavar="RUN_ID",
                   help="continue a stopped run from its last checkpoint, in the same MLflow run "
                        "(see train.checkpoint_every)")
    _plugin_args(p)
    _tracking_args(p)
    p.set_defaults(handler=cmd_train)

    p = sub.add_parser("ui", help="the MLflow UI over the project's store, on 127.0.0.1",
                       description="Start the MLflow UI on 127.0.0.1 and print links to the "
                                   "runs of each study (or of one, with --study). Ctrl-C stops "
                                   "it and every process it started.")
    p.add_argument("--port", type=int, default=5000)
    hint(p.add_argument("--study", default=None, metavar="NAME",
                        help="link to this study's experiment and parent run"), "study")
    p.add_argument("--open", action="store_true",
                   help="open the first link (the latest study's candidates, ranked) in a web browser")
    p.add_argument("--storage", default=None, metavar="URL",
                   help="Optuna storage of the studies (default: SQLite in $HARNESS_HOME or ./.harness)")
    _tracking_args(p)
    p.set_defaults(handler=cmd_ui)

    p = sub.add_parser("completion", help="shell completion: eval \"$(harness completion bash)\"",
                       description="Print a completion script for bash or zsh: commands, options, "
                                   "plugin names (from the cached listing), study files and names. "
                                   "Add `eval \"$(harness completion bash)\"` to ~/.bashrc "
                                   "(or `zsh` to ~/.zshrc).")
    p.add_argument("shell", nargs="?", choices=["bash", "zsh"], default="bash")
    p.add_argument("--complete", nargs=argparse.REMAINDER, default=None, help=argparse.SUPPRESS)
    p.set_defaults(handler=cmd_completion)

    for module in EXTENSION_MODULES:
        if importlib.util.find_spec(module) is not None:
            importlib.import_module(module).add_parsers(sub)
    return parser


#: Modules that add sub-commands: each defines ``add_parsers(subparsers)``, imports only
#: cheap modules at top level and imports heavy ones inside its handlers.
EXTENSION_MODULES = ("harness.study.cli", "harness.bench.cli", "harness.cli.check", "harness.cli.scaffold",
                     "harness.data.cli", "harness.cli.trained", "harness.evaluation.cli",
                     "harness.evaluation.probe_cli", "harness.cli.mad")


class _Version(argparse.Action):
    """``--version``: looks the version up only when asked (``--help`` stays fast)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help=str(kwargs.get("help", "")))

    def __call__(self, parser: argparse.ArgumentParser, *_args: object) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            text = version("attention-harness")
        except PackageNotFoundError:  # pragma: no cover - a source tree never installed
            text = "unknown"
        parser.exit(message=f"harness {text} (attention-harness)\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.library_output:
        from harness.runtime import noise

        noise.quiet()
    if not getattr(args, "handler", None):
        parser.print_help()
        return 0
    try:
        return int(args.handler(args))
    except HarnessError as exc:
        print(paragraph(f"harness: error: {exc}"), file=sys.stderr)
        return exc.exit_code
    except Interrupted as exc:
        return report_interrupt(exc)
    except KeyboardInterrupt:
        print("harness: interrupted (Ctrl-C); nothing was recorded.", file=sys.stderr)
        return 130
    except Exception as exc:
        from harness.runtime.files import permission_denied
        from harness.store.guard import explain

        # a store that filled up or broke under the command; a path this user may not reach
        error = explain(exc) or (permission_denied(exc) if isinstance(exc, PermissionError) else None)
        if error is None:
            raise
        print(paragraph(f"harness: error: {error}"), file=sys.stderr)
        return error.exit_code
    except SystemExit as exc:
        if type(exc).__name__ == "Preempted":  # SIGUSR1: checkpointed (harness.run.checkpoint)
            print(_preempted(exc), file=sys.stderr)
            return int(exc.code or 75)
        # Lightning turns SIGTERM into SIGTERMException, a SystemExit without a code, which
        # would exit 0: report the termination the way a shell and a scheduler expect.
        if type(exc).__name__ == "SIGTERMException":
            print("harness: terminated (SIGTERM)", file=sys.stderr)
            return 128 + 15
        raise


if __name__ == "__main__":
    sys.exit(main())
