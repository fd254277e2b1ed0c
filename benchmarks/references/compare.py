"""Harness models and recipe against plain-PyTorch references, same data, same budget.

    python benchmarks/references/compare.py            # the full table (about 75 min, 1 thread)
    python benchmarks/references/compare.py --quick    # a smoke test of every pair (a few minutes)
    python benchmarks/references/compare.py --only transformer --only associative_recall

For every (model plugin, task) pair, at the same steps, batch size, data and seed, three runs
per learning rate of a small sweep:

(a) ``ref``     the independent reference module (``ref_*.py``) with the plain loop
                (``loop.py``: AdamW, constant lr, no warm-up, no clipping);
(b) ``module``  the harness module (``harness.create_model`` with the plugin's default
                params) with the same plain loop: differences from (a) are architecture and
                initialisation;
(c) ``recipe``  ``harness.train`` with the plugin's default params and the default ``train``
                settings except max_steps, batch_size, lr, num_threads, progress (and
                val_every = max_steps, log_attention off: neither changes training):
                differences from (b) are the recipe (warm-up, cosine decay to 0.1, gradient
                clipping, weight-decay grouping).

The best learning rate of each side is kept and reported. Every run is cached in
``results/runs.jsonl`` (keyed by everything that defines it), so an interrupted comparison
resumes and the table can be rebuilt (``--table-only``); ``--fresh`` ignores the cache.
The table lands in ``benchmarks/defaults.md`` between its ``table`` markers.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import logging
import math
import os
import platform
import sys
import time
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HARNESS_HOME", "/tmp/evidence_home")

import torch  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import loop  # noqa: E402
from ref_encoder_decoder import Seq2SeqTransformer  # noqa: E402
from ref_mixer import MixerLM  # noqa: E402
from ref_recurrent import RNNLM  # noqa: E402
from ref_rnnsearch import RNNSearch  # noqa: E402
from ref_transformer import TransformerLM  # noqa: E402

import harness  # noqa: E402
from harness.config import RunConfig  # noqa: E402
from harness.data.formats import FORMATS  # noqa: E402
from harness.run.plan import plan  # noqa: E402

RESULTS = HERE / "results" / "runs.jsonl"
DOC = HERE.parent / "defaults.md"
BATCH = 32
LRS = (1e-3, 3e-3, 1e-2)
SEED = 0
SIDES = ("ref", "module", "recipe")
NOT_RUN = "not run"

# task name -> params and the step budget (batch 32, one CPU thread: every run <= ~60 s)
TASKS: dict[str, dict[str, Any]] = {
    # the issue's setting; a plain Transformer needs ~1200-1500 steps at batch 32 to solve it
    "associative_recall": {"params": {"length": 64, "vocab": 256, "num_kv_pairs": 4,
                                      "num_train": 10_000, "num_val": 500}, "steps": 1500},
    "copy": {"params": {"length": 16, "vocab": 8}, "steps": 300},
    "char_lm": {"params": {"length": 64}, "steps": 600},
    "reverse": {"params": {"length": 16, "vocab": 8, "decode_eval": False}, "steps": 300},
    "g2p": {"params": {"num_train": 4000, "num_val": 300}, "steps": 1000},
}
LM_MODELS = ("transformer", "lstm", "gru", "mlp_mixer")
S2S_MODELS = ("encoder_decoder", "rnn_seq2seq")
PAIRS = [(m, t) for m in LM_MODELS for t in ("associative_recall", "copy", "char_lm", "reverse")]
PAIRS += [(m, t) for m in S2S_MODELS for t in ("reverse", "g2p")]
# Components the harness side needs beyond the plugin defaults. rnn_seq2seq's default is
# *no* attention (Cho et al.); the RNNsearch reference is compared with its additive variant.
MODEL_EXTRA: dict[str, dict[str, Any]] = {"rnn_seq2seq": {"attention": "additive"}}



# -- ablation hooks (used by ablate.py; the comparison itself runs none) ---------------------
# A ``patch`` changes a harness module in place right after it is built (same parameter
# objects, so the optimizer is unaffected); a ``hook`` changes the harness recipe from a
# Lightning callback at the start of training. Both are named in the run's spec (and key).

def _scaled_embeddings(module: torch.nn.Module) -> list[Any]:
    from harness.nn import ScaledEmbedding

    return [m for m in module.modules() if isinstance(m, ScaledEmbedding)]


def _patch_embed_unscaled(module: torch.nn.Module) -> None:
    """ScaledEmbedding without its x sqrt(d) on lookup: weight N(0, 1/d), lookups N(0, 1/d)."""
    for emb in _scaled_embeddings(module):
        emb.scale = 1.0


def _patch_embed_n01(module: torch.nn.Module) -> None:
    """ScaledEmbedding as a plain nn.Embedding: weight N(0, 1), no scale (same lookups at init)."""
    with torch.no_grad():
        for emb in _scaled_embeddings(module):
            emb.weight.normal_(0.0, 1.0)
            emb.scale = 1.0


def _patch_embed_gpt2(module: torch.nn.Module) -> None:
    """GPT-2's embedding: weight N(0, 0.02^2), no scale."""
    with torch.no_grad():
        for emb in _scaled_embeddings(module):
            emb.weight.normal_(0.0, 0.02)
            emb.scale = 1.0


def _patch_xavier(module: torch.nn.Module) -> None:
    """Xavier-uniform on every matrix except embeddings (nn.Transformer's own init)."""
    embeds = {id(e.weight) for e in _scaled_embeddings(module)}
    with torch.no_grad():
        for p in module.parameters():
            if p.dim() > 1 and id(p) not in embeds:
                torch.nn.init.xavier_uniform_(p)


PATCHES = {"embed_unscaled": _patch_embed_unscaled, "embed_n01": _patch_embed_n01,
           "embed_gpt2": _patch_embed_gpt2, "xavier": _patch_xavier}


def _cosine_to_zero(warmup: int, total: int) -> Any:
    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))

    return factor


def _hook(name: str) -> Any:
    import lightning as L

    class Hook(L.Callback):
        def on_train_start(self, trainer: Any, system: Any) -> None:
            for part in name.split("+"):
                if part in PATCHES:
                    PATCHES[part](system.model)
                elif part == "constant_lr":  # no warm-up, no decay
                    for cfg in trainer.lr_scheduler_configs:
                        cfg.scheduler.lr_lambdas = [lambda step: 1.0 for _ in cfg.scheduler.lr_lambdas]
                elif part == "cosine_to_0":  # the same warm-up, cosine decay to 0 instead of 0.1
                    fn = _cosine_to_zero(system.cfg.warmup_steps, system.cfg.max_steps)
                    for cfg in trainer.lr_scheduler_configs:
                        cfg.scheduler.lr_lambdas = [fn for _ in cfg.scheduler.lr_lambdas]
                elif part == "wd_all":  # weight decay on every parameter, as plain AdamW does
                    for opt in trainer.optimizers:
                        for group in opt.param_groups:
                            group["weight_decay"] = system.cfg.weight_decay
                else:
                    raise ValueError(f"unknown hook {part!r}")
            for cfg in trainer.lr_scheduler_configs:  # apply a replaced schedule from step 0
                sched = cfg.scheduler
                for group, base, fn in zip(sched.optimizer.param_groups, sched.base_lrs,
                                           sched.lr_lambdas, strict=True):
                    group["lr"] = base * fn(sched.last_epoch)

    return Hook()


_registry: Any = None
_tasks: dict[str, Any] = {}


def registry() -> Any:
    global _registry
    if _registry is None:
        _registry = harness.load_plugins()
    return _registry


def get_task(name: str) -> Any:
    if name not in _tasks:
        _tasks[name] = harness.create_task(name, registry=registry(), **TASKS[name]["params"])
    return _tasks[name]


def fmt_of(model: str, task: Any) -> str:
    return "seq2seq" if model in S2S_MODELS else "lm"


def max_length(task: Any, fmt: str) -> int:
    """The longest training input, as the harness computes it (``harness.run.build``)."""
    return max(FORMATS[fmt].input_length(e, task.task_kind)
               for e in task.examples("train", task.train_length))


def primary(task: str) -> tuple[str, bool]:
    """The metric a pair is judged by, and whether higher is better."""
    return {"char_lm": ("bpc", False), "g2p": ("per", False)}.get(task, ("acc", True))


# -- the three sides ------------------------------------------------------------------------

def build_reference(model: str, vocab: int, length: int) -> torch.nn.Module:
    if model == "transformer":
        return TransformerLM(vocab, max_length=length)
    if model in ("lstm", "gru"):
        return RNNLM(vocab, cell=model)
    if model == "mlp_mixer":
        return MixerLM(vocab, length=length)
    if model == "encoder_decoder":
        return Seq2SeqTransformer(vocab, max_length=length)
    if model == "rnn_seq2seq":
        return RNNSearch(vocab)
    raise ValueError(model)


def build_harness(model: str, vocab: int, length: int, fmt: str, params: dict[str, Any],
                  extra: dict[str, Any]) -> torch.nn.Module:
    return harness.create_model(model, vocab_size=vocab, max_length=length, batch_format=fmt,
                                registry=registry(), **{**MODEL_EXTRA.get(model, {}), **extra},
                                **params)


def run_loop(spec: dict[str, Any]) -> dict[str, Any]:
    """Sides (a) and (b): a module in the plain loop."""
    task = get_task(spec["task"])
    fmt = fmt_of(spec["model"], task)
    length = max_length(task, fmt)
    torch.manual_seed(spec["seed"])
    if spec["side"] == "ref":
        module = build_reference(spec["model"], task.vocab.size, length)
    else:
        module = build_harness(spec["model"], task.vocab.size, length, fmt, spec["model_params"],
                               spec.get("components", {}))
        for part in filter(None, spec.get("patch", "").split("+")):
            PATCHES[part](module)
    metrics = loop.train(module, task, fmt, steps=spec["steps"], batch_size=spec["batch"],
                         lr=spec["lr"], seed=spec["seed"])
    metrics["params"] = loop.count(module)
    return metrics


def run_config(spec: dict[str, Any]) -> dict[str, Any]:
    """The ``harness.train`` config of a harness-side spec: the plugin's defaults except the
    spec's params and components, the default ``train`` settings except the budget, the lr and
    the settings that do not change training (threads, progress, validation once at the end,
    no attention maps)."""
    model = spec["model"]
    components = {**MODEL_EXTRA.get(model, {}), **spec.get("components", {})}
    mcfg: dict[str, Any] = {"name": model, "params": dict(spec.get("model_params", {}))}
    for role in ("attention", "position"):
        if role in components:
            mcfg[role] = {"name": components[role]}
    train = {"max_steps": spec["steps"], "batch_size": spec["batch"], "lr": spec["lr"],
             "seed": spec["seed"], "num_threads": 1, "progress": False,
             "val_every": spec["steps"], "log_attention": False, **spec.get("train", {})}
    return {"task": {"name": spec["task"], "params": TASKS[spec["task"]]["params"]},
            "model": mcfg, "train": train, "tracking": {"experiment": "evidence"}}


def run_recipe(spec: dict[str, Any]) -> dict[str, Any]:
    """Side (c): ``harness.train`` with the defaults except the budget and the lr."""
    t0 = time.perf_counter()
    try:
        hooks = [_hook(spec["hook"])] if spec.get("hook") else []
        result = harness.train(run_config(spec), registry=registry(), callbacks=hooks)
    except Exception as exc:  # a diverged run (TrainingDiverged) is a result, not a crash
        return {"loss": math.nan, "acc": 0.0, "failed": f"{type(exc).__name__}: {exc}"[:200],
                "seconds": time.perf_counter() - t0}
    out = {k[len("val/"):]: v for k, v in result.metrics.items()
           if k.startswith("val/") and "_len" not in k}
    out["params"] = result.num_params
    out["seconds"] = time.perf_counter() - t0
    return out


def resolved(spec: dict[str, Any]) -> dict[str, Any]:
    """What the harness resolves a spec to (nothing for the reference side): the model with
    every parameter and component filled in from the current defaults, and for the recipe
    every ``train`` setting. Part of the cache key, so a changed default re-runs exactly the
    runs it changes (and an explicit setting equal to the new default reuses its run)."""
    if spec["side"] == "ref":
        return {}
    full = plan(RunConfig.model_validate(run_config(spec)), registry()).resolved_config()
    return {"model": full["model"], **({"train": full["train"]} if spec["side"] == "recipe" else {})}


def key(spec: dict[str, Any]) -> str:
    """The cache key: the spec, its params, components and train settings as resolved."""
    fixed = {k: spec[k] for k in spec if k not in ("label", "model_params", "train", "components")}
    if spec["side"] == "ref":
        fixed["model_params"] = spec.get("model_params", {})
    return json.dumps({**fixed, "resolved": resolved(spec)}, sort_keys=True)


def load_cache() -> dict[str, dict[str, Any]]:
    cache = {}
    if RESULTS.exists():
        for line in RESULTS.read_text().splitlines():
            row = json.loads(line)
            cache[row["key"]] = row
    return cache


@contextlib.contextmanager
def quiet() -> Any:
    """Silence Lightning's and MLflow's chatter (results are printed by this script)."""
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def run(spec: dict[str, Any], cache: dict[str, dict[str, Any]], fresh: bool = False) -> dict[str, Any]:
    spec.setdefault("model_params", {})
    spec.setdefault("train", {})
    k = key(spec)
    if k in cache and not fresh:
        return cache[k]
    with quiet():
        metrics = run_recipe(spec) if spec["side"] == "recipe" else run_loop(spec)
    row = {"key": k, "spec": spec, "resolved": json.loads(k)["resolved"], "metrics": metrics,
           "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as f:
        f.write(json.dumps(row) + "\n")
    cache[k] = row
    name, _ = primary(spec["task"])
    print(f"  {spec['side']:6s} {spec['model']:15s} {spec['task']:18s} lr={spec['lr']:<7g} "
          f"seed={spec['seed']} {spec.get('label', ''):28s} {name}={metrics.get(name, math.nan):.4f} "
          f"acc={metrics.get('acc', math.nan):.4f} ({metrics['seconds']:.0f} s)", flush=True)
    return row


def pair_specs(model: str, task: str, steps: int, lrs: tuple[float, ...], seed: int) -> list[dict[str, Any]]:
    return [{"side": side, "model": model, "task": task, "lr": lr, "seed": seed, "steps": steps,
             "batch": BATCH} for side in SIDES for lr in lrs]


def best(rows: list[dict[str, Any]], task: str) -> dict[str, Any]:
    name, higher = primary(task)

    def score(row: dict[str, Any]) -> float:
        v = row["metrics"].get(name, math.nan)
        if v is None or math.isnan(v):
            return -math.inf
        return v if higher else -v

    return max(rows, key=score)


# -- the table --------------------------------------------------------------------------------

def fmt_metric(m: dict[str, Any], task: str) -> str:
    name, _ = primary(task)
    v = m.get(name, math.nan)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "diverged"
    if task in ("copy", "reverse"):
        return f"{v:.3f} (ex {m.get('exact', math.nan):.2f})"
    if task == "g2p":
        return f"{v:.3f} (acc {m.get('acc', math.nan):.3f})"
    return f"{v:.3f}"


def verdict(a: float, other: float, task: str) -> str:
    name, higher = primary(task)
    gap = (a - other) if higher else (other - a)  # > 0: the harness side is worse
    tol = {"acc": (0.02, 0.05), "bpc": (0.03, 0.08), "per": (0.01, 0.03)}[name]
    if math.isnan(other):
        return "WORSE"
    if gap <= tol[0]:
        return "ok"
    return "borderline" if gap <= tol[1] else "WORSE"


def table(cache: dict[str, dict[str, Any]], pairs: list[tuple[str, str]], steps_of: dict[str, int],
          lrs: tuple[float, ...], seed: int) -> tuple[str, str]:
    head = ("| model | task | metric | (a) reference | (b) harness module, plain loop | "
            "(c) harness recipe | params a / harness | best lr a / b / c | verdict b, c |\n"
            "|---|---|---|---|---|---|---|---|---|\n")
    sweep = ("| model | task | side | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " |\n"
             "|---|---|---|" + "---|" * len(lrs) + "\n")
    lines, sweep_lines = [], []
    for model, task in pairs:
        specs = pair_specs(model, task, steps_of[task], lrs, seed)
        by_side: dict[str, list[dict[str, Any]]] = {}
        for spec in specs:
            spec.setdefault("model_params", {})
            spec.setdefault("train", {})
            row = cache.get(key(spec))
            if row is not None:
                by_side.setdefault(spec["side"], []).append(row)
        name, _ = primary(task)
        b = {side: best(rows, task) for side, rows in by_side.items()}
        value = {side: b[side]["metrics"].get(name, math.nan) if side in b else math.nan
                 for side in SIDES}
        cell = {side: fmt_metric(b[side]["metrics"], task) if side in b else NOT_RUN
                for side in SIDES}
        params = {side: f"{b[side]['metrics']['params']:,}" if side in b else NOT_RUN
                  for side in SIDES}
        if "module" not in b:  # the recipe trains the same module
            params["module"] = params["recipe"]
        lrs_best = " / ".join(f"{b[s]['spec']['lr']:g}" if s in b else NOT_RUN for s in SIDES)
        verdicts = ", ".join(verdict(value["ref"], value[s], task) if "ref" in b and s in b
                             else NOT_RUN for s in ("module", "recipe"))
        lines.append(
            f"| {model} | {task} | {name} | {cell['ref']} | {cell['module']} | {cell['recipe']} | "
            f"{params['ref']} / {params['module']} | {lrs_best} | {verdicts} |")
        for side in SIDES:
            vals = {r["spec"]["lr"]: r["metrics"].get(name, math.nan) for r in by_side.get(side, [])}
            cells = []
            for lr in lrs:
                v = vals.get(lr)
                cells.append(NOT_RUN if lr not in vals else "diverged" if v is None or math.isnan(v)
                             else f"{v:.3f}")
            sweep_lines.append(f"| {model} | {task} | {side} | " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n", sweep + "\n".join(sweep_lines) + "\n"


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return (f"{cpu}, {os.cpu_count()} cores visible (runs use 1 torch thread, one at a time); "
            f"torch {torch.__version__}, Python {platform.python_version()}, {platform.system()}")


def write_doc(summary: str, sweep: str, command: str, minutes: float | None) -> None:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    took = f"; the runs took {minutes:.0f} min" if minutes else ""
    block = (
        "<!-- table:start (generated by benchmarks/references/compare.py; edit outside the markers) -->\n"
        f"- Machine: {machine()}\n"
        f"- Date: {now}{took}\n"
        f"- Command: `{command}`\n"
        f"- Budget: batch {BATCH}; steps per task: "
        + ", ".join(f"{t} {TASKS[t]['steps']}" for t in TASKS)
        + f"; learning rates swept per side: {', '.join(f'{lr:g}' for lr in LRS)}; "
        f"seed {SEED} (model init and data order), data seed 0.\n"
        "- Task settings: " + "; ".join(f"`{t}` {TASKS[t]['params']}" for t in TASKS) + "\n\n"
        + summary + "\nEvery learning rate of the sweep (the primary metric):\n\n" + sweep
        + "<!-- table:end -->\n"
    )
    text = DOC.read_text() if DOC.exists() else "# Default training recipe: evidence\n\n"
    start, end = "<!-- table:start", "<!-- table:end -->\n"
    if start in text and end in text:
        text = text[: text.index(start)] + block + text[text.index(end) + len(end):]
    else:
        text += "\n" + block
    DOC.write_text(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: a tenth of the steps, one lr (3e-3); writes no table")
    parser.add_argument("--only", action="append", default=[],
                        help="a model or task name (repeatable; pairs matching all given kinds)")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--fresh", action="store_true", help="ignore cached runs")
    parser.add_argument("--table-only", action="store_true", help="rebuild the table from the cache")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("mlflow").setLevel(logging.ERROR)

    models = [o for o in args.only if o in LM_MODELS + S2S_MODELS]
    tasks = [o for o in args.only if o in TASKS]
    unknown = set(args.only) - set(models) - set(tasks)
    if unknown:
        parser.error(f"unknown --only {sorted(unknown)}; models: {LM_MODELS + S2S_MODELS}, tasks: {list(TASKS)}")
    pairs = [(m, t) for m, t in PAIRS if (not models or m in models) and (not tasks or t in tasks)]
    steps_of = {t: TASKS[t]["steps"] // (10 if args.quick else 1) for t in TASKS}
    lrs = (3e-3,) if args.quick else LRS
    global RESULTS
    if args.quick:  # smoke-test runs never mix with the evidence
        RESULTS = HERE / "results" / "quick.jsonl"
    cache = {} if args.fresh else load_cache()
    t0 = time.perf_counter()
    if not args.table_only:
        for model, task in pairs:
            print(f"{model} on {task} ({steps_of[task]} steps)", flush=True)
            for spec in pair_specs(model, task, steps_of[task], lrs, args.seed):
                run(spec, cache, fresh=args.fresh)
    summary, sweep = table(cache, pairs, steps_of, lrs, args.seed)
    print(summary)
    print(sweep)
    if not args.quick and args.seed == SEED and pairs == PAIRS:
        write_doc(summary, sweep, "python benchmarks/references/compare.py",
                  None if args.table_only else (time.perf_counter() - t0) / 60)


if __name__ == "__main__":
    main()
