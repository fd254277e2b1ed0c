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
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compare  # noqa: E402  (sets OMP_WAIT_POLICY and HARNESS_HOME before torch loads)
import torch  # noqa: E402


def spec(side: str, model: str, task: str, lr: float, label: str, *, seed: int = 0,
         params: dict[str, Any] | None = None, train: dict[str, Any] | None = None,
         patch: str = "", hook: str = "", components: dict[str, Any] | None = None) -> dict[str, Any]:
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
LRS = (1e-3, 3e-3)


def g_tying() -> list[dict[str, Any]]:
    """Transformer on recall, harness module in the plain loop: tying and embedding scale."""
    m, t = "transformer", "associative_recall"
    out = []
    for lr in LRS:
        out += [
            spec("module", m, t, lr, "default: tied, x sqrt(d)"),
            spec("module", m, t, lr, "tied, no x sqrt(d)", patch="embed_unscaled"),
            spec("module", m, t, lr, "tied, GPT-2 init N(0, 0.02²)", patch="embed_gpt2"),
            spec("module", m, t, lr, "untied, x sqrt(d)", params=UNTIED),
            spec("module", m, t, lr, "untied, plain N(0,1) embedding", params=UNTIED, patch="embed_n01"),
        ]
    return out


def g_recipe() -> list[dict[str, Any]]:
    """Transformer on recall, harness.train untied: one recipe element at a time."""
    m, t = "transformer", "associative_recall"
    out = []
    for lr in LRS:
        out += [
            spec("recipe", m, t, lr, "recipe, tied (default)"),
            spec("recipe", m, t, lr, "recipe, untied", params=UNTIED),
            spec("recipe", m, t, lr, "untied, warm-up 0", params=UNTIED, train={"warmup_steps": 0}),
            spec("recipe", m, t, lr, "untied, no clipping", params=UNTIED, train={"grad_clip": None}),
            spec("recipe", m, t, lr, "untied, constant lr", params=UNTIED, hook="constant_lr"),
            spec("recipe", m, t, lr, "untied, decay every param", params=UNTIED, hook="wd_all"),
        ]
    return out


def g_positions() -> list[dict[str, Any]]:
    """Transformer on recall, harness.train: tying under every common position scheme."""
    m, t = "transformer", "associative_recall"
    out = []
    for pos in ("sinusoidal", "rope", "learned", "none"):
        comps = {"position": pos}
        out += [spec("recipe", m, t, 1e-3, f"{pos}, tied", components=comps),
                spec("recipe", m, t, 1e-3, f"{pos}, untied", params=UNTIED, components=comps)]
    return out


GROUPS = {"tying": g_tying, "recipe": g_recipe, "positions": g_positions}


def metric_cell(row: dict[str, Any], task: str) -> str:
    name, _ = compare.primary(task)
    v = row["metrics"].get(name, math.nan)
    return "diverged" if v is None or math.isnan(v) else f"{v:.3f}"


def tables(cache: dict[str, Any], groups: list[str]) -> str:
    parts = []
    for g in groups:
        specs = GROUPS[g]()
        lrs = sorted({s["lr"] for s in specs})
        labels: dict[tuple[str, str, str], dict[float, str]] = {}
        for s in specs:
            s.setdefault("model_params", {})
            row = cache.get(compare.key(s))
            cell = metric_cell(row, s["task"]) if row else "–"
            labels.setdefault((s["model"], s["task"], s["label"]), {})[s["lr"]] = cell
        doc = (GROUPS[g].__doc__ or g).strip()
        head = ("| model | task | variant | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " |\n"
                "|---|---|---|" + "---|" * len(lrs) + "\n")
        rows = [f"| {m} | {t} | {label} | " + " | ".join(cells.get(lr, "") for lr in lrs) + " |"
                for (m, t, label), cells in labels.items()]
        parts.append(f"**{g}**: {doc}\n\n" + head + "\n".join(rows) + "\n")
    return "\n".join(parts)


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
                compare.run(s, cache)
    text = tables(cache, list(GROUPS))
    print(text)
    write_doc(text)
    print(f"({(time.perf_counter() - t0) / 60:.1f} min)")


if __name__ == "__main__":
    main()
