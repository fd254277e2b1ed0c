"""What keeping documents apart (``corpus_lm``'s ``documents: separate``) costs on the CPU:
the time of a training step's forward and backward pass, packed and separate, per sequence
layer, and how each layer keeps documents apart (mask, native reset, or one document per row).

    python benchmarks/documents_cpu.py [--length 256] [--mean-doc 64] [--layers a,b] [--out benchmarks/documents_cpu.md]

A 2-block ``transformer`` (d_model 64, 4 heads, float32, one thread) on a batch of 8 windows
whose documents have geometric lengths of mean ``--mean-doc`` tokens (a Shakespeare speech
is about 300 bytes), timed with ``harness.bench.common.timed`` (median of the passes). A layer
run one document per row pays for the padded batch of documents (its width: the longest
document of the batch) and a host sync for its shape.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

EOD = 4


def windows(batch: int, length: int, mean_doc: int, vocab: int) -> Any:
    import torch

    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(EOD + 1, vocab, (batch, length), generator=g)
    starts = torch.rand(batch, length, generator=g) < 1.0 / mean_doc
    return tokens.masked_fill(starts, EOD)


def how(layer: Any) -> str:
    from harness.nn import documents
    from harness.nn.attention import Attention, masks_documents
    from harness.nn.mixer import Mixer

    if isinstance(layer, Attention) and documents.takes_starts(type(layer)) and masks_documents(type(layer)):
        return "mask"
    if isinstance(layer, Mixer) and documents.takes_starts(type(layer)) and layer.resets:
        return "native reset"
    return "one document per row"


def measure(registry: Any, kind: str, name: str, tokens: Any, min_time: float) -> dict[str, Any]:
    import torch

    from harness.bench.common import median, timed
    from harness.config import ComponentConfig, ModelConfig
    from harness.data.tasks import TaskInfo
    from harness.run.build import build_model_from
    from harness.run.plan import resolve_model

    out: dict[str, Any] = {"layer": name}
    for mode in ("packed", "separate"):
        parts = resolve_model(registry, ModelConfig(name="transformer", params={"d_model": 64, "heads": 4, "layers": 2},
                                                    **{kind: ComponentConfig(name=name)}))
        info = TaskInfo(format="lm", vocab_size=64, max_length=tokens.shape[1],
                        document_token=EOD if mode == "separate" else None)
        torch.manual_seed(0)
        model = build_model_from(parts, info)

        def step(model: Any = model) -> None:
            model.zero_grad(set_to_none=True)
            model(tokens).float().square().mean().backward()

        step()  # warm-up
        out[mode] = median(timed(step, min_time))
        out["how"] = how(model.blocks[0].self_attn)
    return out


def main() -> None:
    import datetime

    import torch

    import harness
    from harness.bench.common import append_record, load_line

    ap = argparse.ArgumentParser()
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--mean-doc", type=int, default=64)
    ap.add_argument("--layers", default="")
    ap.add_argument("--min-time", type=float, default=1.0)
    ap.add_argument("--out", default="benchmarks/documents_cpu.md")
    args = ap.parse_args()
    torch.set_num_threads(1)
    registry = harness.load_plugins()
    chosen = set(filter(None, args.layers.split(",")))
    jobs = [("attention", s.name) for s in registry.specs("attention") if "causal" in (s.directions or ())]
    jobs += [("mixer", s.name) for s in registry.specs("mixer")]
    jobs = [(k, n) for k, n in sorted(jobs) if not chosen or n in chosen]
    tokens = windows(8, args.length, args.mean_doc, 64)
    docs = int((tokens == EOD).sum()) + tokens.shape[0]
    load = load_line()
    started = datetime.datetime.now(datetime.UTC)
    rows = ["| layer | at a start | packed ms | separate ms | ratio |", "|---|---|---|---|---|"]
    for kind, name in jobs:
        r = measure(registry, kind, name, tokens, args.min_time)
        rows.append(f"| {name} | {r['how']} | {r['packed'] * 1e3:.1f} | {r['separate'] * 1e3:.1f} | "
                    f"{r['separate'] / r['packed']:.2f} |")
        print(rows[-1], flush=True)
    seconds = (datetime.datetime.now(datetime.UTC) - started).total_seconds()
    append_record(args.out, "forward + backward, packed vs separate documents",
                  "python " + " ".join(sys.argv), load,
                  [f"Batch 8 x {args.length} tokens, {docs} documents (mean {args.mean_doc} tokens, "
                   f"geometric), 2-block transformer d_model 64, float32, 1 thread; median of passes "
                   f"over at least {args.min_time:g} s per cell; {seconds:.0f} s in all.", "", *rows])


if __name__ == "__main__":
    main()
