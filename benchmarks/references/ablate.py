"""Ablations behind ``benchmarks/defaults.md``: why a harness side trails its reference.

    python benchmarks/references/ablate.py                 # every group (see GROUPS)
    python benchmarks/references/ablate.py --group tying   # one group
    python benchmarks/references/ablate.py --table-only    # rebuild the tables from the cache

Each group toggles one suspect at a time (tied embeddings, the x sqrt(d) embedding scale,
embedding initialisation, warm-up, cosine decay, gradient clipping, weight-decay grouping,
position scheme, seed) on the budget and data of ``compare.py``, through the same ``run``
and the same cache (``results/runs.jsonl``). Module changes that no config can express
(the embedding scale, re-initialisation) are ``patch``es applied to the harness module right
after it is built; recipe changes no config can express (constant lr, cosine to 0, weight
decay on every parameter) are Lightning-callback ``hook``s (see ``compare.py``). The tables
land in ``benchmarks/defaults.md`` between its ``ablations`` markers.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compare  # noqa: E402  (sets OMP_WAIT_POLICY and HARNESS_HOME before torch loads)
import torch  # noqa: E402


def default_tying(model: str) -> bool:
    """The plugin's current ``tie_embeddings`` default."""
    fields = dataclasses.fields(compare.registry().get("model", model).config)
    return bool({f.name: f.default for f in fields}["tie_embeddings"])


def spec(side: str, model: str, task: str, lr: float, label: str, *, seed: int = 0,
         params: dict[str, Any] | None = None, train: dict[str, Any] | None = None,
         patch: str = "", hook: str = "", components: dict[str, Any] | None = None) -> dict[str, Any]:
    """A run; a label's ``{tied}`` becomes "tied" or "untied" as ``params`` (or the plugin's
    default) says, marked "(default)" where that is the plugin's current default."""
    if "{tied}" in label:
        default = default_tying(model)
        tied = (params or {}).get("tie_embeddings", default)
        label = label.replace("{tied}", ("tied" if tied else "untied")
                              + (" (default)" if tied == default else ""))
    out: dict[str, Any] = {"side": side, "model": model, "task": task, "lr": lr, "seed": seed,
                           "steps": compare.TASKS[task]["steps"], "batch": compare.BATCH,
                           "model_params": params or {}, "train": train or {}, "label": label}
    if patch:
        out["patch"] = patch
    if hook:
        out["hook"] = hook
    if components:
        out["components"] = components
    return out


UNTIED = {"tie_embeddings": False}
TIED = {"tie_embeddings": True}


def g_tying() -> list[dict[str, Any]]:
    """Transformer on recall, harness module in the plain loop (no warm-up, no schedule, no
    clipping): tying, the x sqrt(d) embedding scale and the embedding init, one at a time."""
    m, t = "transformer", "associative_recall"
    out = []
    for lr in (3e-4, 1e-3):
        out += [
            spec("ref", m, t, lr, "reference (untied, N(0,1) embedding)"),
            spec("module", m, t, lr, "{tied}, x sqrt(d)", params=TIED),
            spec("module", m, t, lr, "{tied}, no x sqrt(d) (N(0,1/d) lookups)", params=TIED,
                 patch="embed_unscaled"),
            spec("module", m, t, lr, "{tied}, GPT-2 init N(0, 0.02²), no scale", params=TIED,
                 patch="embed_gpt2"),
            spec("module", m, t, lr, "{tied}, x sqrt(d)", params=UNTIED),
            spec("module", m, t, lr, "{tied}, plain N(0,1) embedding", params=UNTIED, patch="embed_n01"),
        ]
    return out


def g_recipe() -> list[dict[str, Any]]:
    """Transformer on recall, ``harness.train``: tying, then one recipe element at a time on
    the untied model (default recipe: warm-up 100, cosine to 0.1, clip 1.0, no decay on
    embeddings/norms/biases)."""
    m, t = "transformer", "associative_recall"
    out = []
    for lr in (1e-3, 3e-3, 1e-2):
        out += [
            spec("recipe", m, t, lr, "recipe, {tied}", params=TIED),
            spec("recipe", m, t, lr, "recipe, {tied}", params=UNTIED),
        ]
    for lr in (1e-3, 3e-3):
        out += [
            spec("recipe", m, t, lr, "{tied}, warm-up 0", params=UNTIED, train={"warmup_steps": 0}),
            spec("recipe", m, t, lr, "{tied}, no clipping", params=UNTIED, train={"grad_clip": None}),
            spec("recipe", m, t, lr, "{tied}, constant lr (no warm-up, no decay)", params=UNTIED,
                 hook="constant_lr"),
            spec("recipe", m, t, lr, "{tied}, decay every parameter", params=UNTIED, hook="wd_all"),
            spec("recipe", m, t, lr, "{tied}, no x sqrt(d)", params=TIED, hook="embed_unscaled"),
        ]
    return out


def g_positions() -> list[dict[str, Any]]:
    """Transformer on recall, ``harness.train`` at lr 3e-3: tying under other position
    schemes (the issue: "any position"; recall_baselines.yaml uses rope)."""
    m, t = "transformer", "associative_recall"
    out = []
    for pos in ("rope", "learned", "none"):
        comps = {"position": pos}
        out += [spec("recipe", m, t, 3e-3, pos + ", {tied}", params=TIED, components=comps),
                spec("recipe", m, t, 3e-3, pos + ", {tied}", params=UNTIED, components=comps)]
    return out


def g_short() -> list[dict[str, Any]]:
    """Transformer on copy and reverse (300 steps) at the default lr 1e-3, where the recipe
    trails the reference: tying vs warm-up/decay."""
    out = []
    for t in ("copy", "reverse"):
        for lr in (1e-3, 3e-3):
            out += [
                spec("ref", "transformer", t, lr, "reference"),
                spec("module", "transformer", t, lr, "module, {tied}", params=TIED),
                spec("module", "transformer", t, lr, "module, {tied}", params=UNTIED),
                spec("recipe", "transformer", t, lr, "recipe, {tied}", params=TIED),
                spec("recipe", "transformer", t, lr, "recipe, {tied}", params=UNTIED),
                spec("recipe", "transformer", t, lr, "recipe, {tied}, constant lr", params=TIED,
                     hook="constant_lr"),
                spec("recipe", "transformer", t, lr, "recipe, {tied}, constant lr", params=UNTIED,
                     hook="constant_lr"),
                spec("recipe", "transformer", t, lr, "recipe, {tied}, warm-up 0", params=UNTIED,
                     train={"warmup_steps": 0}),
            ]
    return out


def g_untie_all() -> list[dict[str, Any]]:
    """Every tied model on every task, ``harness.train`` at the recipe's best lr of the main
    table: tied vs untied (the plugin's current default marked). Decides tie_embeddings per
    model."""
    best = {("transformer", "copy"): 1e-2, ("transformer", "char_lm"): 1e-2,
            ("transformer", "reverse"): 1e-2,
            ("lstm", "associative_recall"): 3e-3, ("lstm", "copy"): 1e-2, ("lstm", "char_lm"): 1e-2,
            ("lstm", "reverse"): 3e-3,
            ("gru", "associative_recall"): 1e-2, ("gru", "copy"): 1e-2, ("gru", "char_lm"): 1e-2,
            ("gru", "reverse"): 1e-2,
            ("mlp_mixer", "associative_recall"): 1e-2, ("mlp_mixer", "copy"): 1e-3,
            ("mlp_mixer", "char_lm"): 1e-2, ("mlp_mixer", "reverse"): 1e-3,
            ("encoder_decoder", "reverse"): 1e-3, ("encoder_decoder", "g2p"): 3e-3}
    out = []
    for (m, t), lr in best.items():
        out += [spec("recipe", m, t, lr, "recipe, {tied}", params=TIED),
                spec("recipe", m, t, lr, "recipe, {tied}", params=UNTIED)]
    return out


def g_untie_seeds() -> list[dict[str, Any]]:
    """Where untying changed a result of ``untie_all`` by more than the table's tolerance
    (mlp_mixer on recall and char_lm), the same pair with seeds 1 and 2."""
    out = []
    for seed in (0, 1, 2):
        for t in ("associative_recall", "char_lm"):
            out += [spec("recipe", "mlp_mixer", t, 1e-2, "recipe, {tied}", params=TIED, seed=seed),
                    spec("recipe", "mlp_mixer", t, 1e-2, "recipe, {tied}", params=UNTIED, seed=seed)]
    return out


def g_module_gaps() -> list[dict[str, Any]]:
    """The other module-vs-reference gaps of the main table, with seeds 1 and 2: GRU on
    char_lm (is it tying?), rnn_seq2seq on g2p (additive attention's extra value/output
    projections?), and the untied LSTM module, which must equal the reference exactly (the
    same architecture built in the same order: a check of the comparison itself)."""
    out = [spec("module", "lstm", "associative_recall", 3e-3, "module, {tied} (= reference?)",
                params=UNTIED)]
    for seed in (0, 1, 2):
        out += [
            spec("ref", "gru", "char_lm", 3e-3, "reference", seed=seed),
            spec("module", "gru", "char_lm", 3e-3, "module, {tied}", params=TIED, seed=seed),
            spec("module", "gru", "char_lm", 3e-3, "module, {tied}", params=UNTIED, seed=seed),
            spec("ref", "rnn_seq2seq", "g2p", 3e-3, "reference", seed=seed),
            spec("module", "rnn_seq2seq", "g2p", 1e-3, "module (additive)", seed=seed),
            spec("module", "rnn_seq2seq", "g2p", 3e-3, "module (additive)", seed=seed),
        ]
    return out


def g_seeds() -> list[dict[str, Any]]:
    """The headline rows with seeds 1 and 2 (seed 0 is the main table): transformer on
    recall, each side at its best lr, and the untied harness."""
    m, t = "transformer", "associative_recall"
    out = []
    for seed in (0, 1, 2):
        out += [
            spec("ref", m, t, 1e-3, "reference", seed=seed),
            spec("module", m, t, 1e-3, "module, {tied}", params=TIED, seed=seed),
            spec("module", m, t, 1e-3, "module, {tied}", params=UNTIED, seed=seed),
            spec("recipe", m, t, 3e-3, "recipe, {tied}", params=TIED, seed=seed),
            spec("recipe", m, t, 3e-3, "recipe, {tied}", params=UNTIED, seed=seed),
        ]
    return out


def g_optimizer() -> list[dict[str, Any]]:
    """Transformer on recall, ``harness.train`` with the default recipe (untied, warm-up,
    cosine, clipping) under each optimizer: AdamW (decoupled decay 0.01, the default) against
    Adam and SGD with momentum 0.9 (at larger learning rates, as SGD needs), with AdamW's 0.01
    as an L2 term (what they got before 2026-11-25) and without decay (their default since)."""
    m, t = "transformer", "associative_recall"
    out = []
    for lr in (1e-3, 3e-3):
        out.append(spec("recipe", m, t, lr, "{tied}, AdamW, weight decay 0.01 (default)", params=UNTIED))
        out.append(spec("recipe", m, t, lr, "{tied}, Adam, L2 0.01", params=UNTIED,
                        train={"optimizer": "adam", "weight_decay": 0.01}))
        out.append(spec("recipe", m, t, lr, "{tied}, Adam, no decay (default)", params=UNTIED,
                        train={"optimizer": "adam", "weight_decay": 0.0}))
    for lr in (3e-2, 1e-1):
        out.append(spec("recipe", m, t, lr, "{tied}, SGD momentum 0.9, L2 0.01", params=UNTIED,
                        train={"optimizer": "sgd", "momentum": 0.9, "weight_decay": 0.01}))
    return out


GROUPS = {"tying": g_tying, "recipe": g_recipe, "positions": g_positions, "short": g_short,
          "untie_all": g_untie_all, "untie_seeds": g_untie_seeds, "module_gaps": g_module_gaps, "seeds": g_seeds,
          "optimizer": g_optimizer}


def metric_cell(row: dict[str, Any], task: str) -> str:
    name, _ = compare.primary(task)
    v = row["metrics"].get(name, math.nan)
    return "diverged" if v is None or math.isnan(v) else f"{v:.3f}"


def tables(cache: dict[str, Any], groups: list[str]) -> str:
    parts = []
    for g in groups:
        specs = GROUPS[g]()
        lrs = sorted({s["lr"] for s in specs})
        seeds = sorted({s["seed"] for s in specs})
        labels: dict[tuple[str, str, str], dict[float, str]] = {}
        values: dict[tuple[str, str, str], dict[float, list[float]]] = {}
        for s in specs:
            s.setdefault("model_params", {})
            row = cache.get(compare.key(s))
            cell = metric_cell(row, s["task"]) if row else compare.NOT_RUN
            label = s["label"] + (f" (seed {s['seed']})" if len(seeds) > 1 else "")
            labels.setdefault((s["model"], s["task"], label), {})[s["lr"]] = cell
            if row:
                v = row["metrics"].get(compare.primary(s["task"])[0], math.nan)
                values.setdefault((s["model"], s["task"], s["label"]), {}).setdefault(s["lr"], []).append(
                    math.nan if v is None else v)
        if len(seeds) > 1:  # a mean row per variant run with every seed
            for (m, t, label), by_lr in values.items():
                if not any(len(v) == len(seeds) for v in by_lr.values()):
                    continue
                labels[(m, t, f"**{label}: mean of seeds {', '.join(map(str, seeds))}**")] = {
                    lr: (f"**{sum(v) / len(v):.3f}**" if len(v) == len(seeds) else compare.NOT_RUN)
                    for lr, v in by_lr.items()}
        doc = " ".join((GROUPS[g].__doc__ or g).split())
        head = ("| model | task | variant | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " |\n"
                "|---|---|---|" + "---|" * len(lrs) + "\n")
        rows = [f"| {m} | {t} | {label} | " + " | ".join(cells.get(lr, "") for lr in lrs) + " |"
                for (m, t, label), cells in labels.items()]
        parts.append(f"**{g}**: {doc}\n\n" + head + "\n".join(rows) + "\n")
    legend = ("A blank cell is a learning rate outside that variant's design; \"not run\" is a "
              "designed run that has not been run. \"(default)\" marks the plugin's current "
              "default.\n\n")
    return legend + "\n".join(parts)


def write_doc(text: str) -> None:
    start, end = "<!-- ablations:start", "<!-- ablations:end -->\n"
    block = ("<!-- ablations:start (generated by benchmarks/references/ablate.py) -->\n" + text + end)
    doc = compare.DOC.read_text() if compare.DOC.exists() else ""
    if start in doc and end in doc:
        doc = doc[: doc.index(start)] + block + doc[doc.index(end) + len(end):]
    else:
        doc += "\n" + block
    compare.DOC.write_text(doc)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--group", action="append", choices=sorted(GROUPS), default=[])
    parser.add_argument("--only", action="append", default=[],
                        help="run only the specs of this model or task (repeatable; all must match)")
    parser.add_argument("--table-only", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    groups = args.group or list(GROUPS)
    cache = compare.load_cache()
    t0 = time.perf_counter()
    if not args.table_only:
        for g in groups:
            print(f"== {g}", flush=True)
            for s in GROUPS[g]():
                if all(o in (s["model"], s["task"]) for o in args.only):
                    compare.run(s, cache)
    text = tables(cache, list(GROUPS))
    print(text)
    write_doc(text)
    print(f"({(time.perf_counter() - t0) / 60:.1f} min)")


if __name__ == "__main__":
    main()
