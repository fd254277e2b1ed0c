"""Reading a prepared corpus: the loader's tokens/s against what the default Transformer
consumes, and the share of training spent waiting for data.

    python benchmarks/data_loader.py [--mb 50] [--steps 60] [--length 128] [--batch 32]

Prepares a generated corpus (``benchmarks/data_prepare.py``'s generator, ``bytes``
tokenizer), then measures in this process:

- memory-map reads: the train split read front to back (MB/s; the page cache is warm after
  preparing, as it is for a corpus used again) and random windows (what ``corpus_lm`` reads:
  ``--batch`` windows of ``--length + 1`` tokens per step from ``train_batches``, tokens/s);
- the loader alone as training sees it: ``StreamBatches`` (windows to torch tensors), tokens/s;
- a ``harness.train`` run of the default Transformer (``transformer`` at its default
  parameters, ``--steps`` steps, batch ``--batch``, one CPU thread) on ``corpus_lm`` at
  ``--length``: ``cost/train_tokens_per_s`` and ``cost/data_wait_share``.

The issue's bars: the loader delivers at least 20x the tokens/s the model consumes, and
``cost/data_wait_share`` is below 1%. Appended to ``benchmarks/data.md`` with the machine,
its load and the command.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from harness.bench import common  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from data_prepare import generate  # noqa: E402


def rate(fn, min_s: float = 3.0) -> float:  # type: ignore[no-untyped-def]
    """Units per second of ``fn`` (which returns the units it did), repeated for ``min_s``."""
    done, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < min_s:
        done += fn()
    return done / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=50)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--out", default="benchmarks/data.md")
    args = parser.parse_args()
    load_before = common.load_line()
    scratch = Path(tempfile.mkdtemp(prefix="harness-loader-bench-"))
    os.environ.setdefault("HARNESS_HOME", str(scratch / "home"))
    try:
        import torch

        import harness
        from harness.data.corpus import open_corpus
        from harness.data.prepare import prepare
        from harness.run.batches import StreamBatches

        torch.set_num_threads(1)
        (scratch / "raw").mkdir()
        prepare(generate(scratch / "raw", args.mb), scratch / "corpus", tokenizer="bytes", progress=False)
        shutil.rmtree(scratch / "raw")
        train = open_corpus(scratch / "corpus").split("train")
        itemsize = train.shards[0].dtype.itemsize

        t0 = time.perf_counter()
        checksum = 0
        for shard in train.shards:  # every page read once, in blocks of 16 M tokens
            for at in range(0, len(shard), 1 << 24):
                checksum += int(shard[at: at + (1 << 24)].sum(dtype=np.int64))
        scan_mb_s = train.tokens * itemsize / 1e6 / (time.perf_counter() - t0)
        assert checksum > 0

        registry = harness.load_plugins()
        task = harness.create_task("corpus_lm", registry=registry, path=str(scratch / "corpus"),
                                   length=args.length)
        windows = task.train_batches(args.length, args.batch, seed=0)
        window_rate = rate(lambda: next(windows).size)
        stream = iter(StreamBatches(task, args.batch, 0, torch.device("cpu")))
        loader_rate = rate(lambda: next(stream)["tokens"].numel())

        result = harness.train({
            "task": {"name": "corpus_lm", "params": {"path": str(scratch / "corpus"), "length": args.length}},
            "model": {"name": "transformer"},
            "train": {"max_steps": args.steps, "batch_size": args.batch, "val_every": args.steps,
                      "accelerator": "cpu", "devices": 1, "num_threads": 1, "progress": False,
                      "log_attention": False},
            "tracking": {"experiment": "data-loader-bench"}}, registry=registry)
        model_rate = result.metrics["cost/train_tokens_per_s"]
        wait = result.metrics["cost/data_wait_share"]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    rows = [
        f"Corpus: {args.mb} MB generated, `bytes` tokenizer, {train.tokens:,} train tokens "
        f"({itemsize * 8}-bit), windows of {args.length} + 1 tokens, batch {args.batch}.", "",
        "| what | measured |", "|---|---|",
        f"| memory map, train split front to back | {scan_mb_s:,.0f} MB/s |",
        f"| random windows (`corpus_lm.train_batches`) | {window_rate:,.0f} tokens/s |",
        f"| loader as training sees it (`StreamBatches`, torch tensors) | {loader_rate:,.0f} tokens/s |",
        f"| default Transformer training ({args.steps} steps, 1 thread) | {model_rate:,.0f} tokens/s |",
        f"| loader / model | {loader_rate / model_rate:,.0f}x (bar: 20x) |",
        f"| `cost/data_wait_share` | {100 * wait:.2f}% (bar: 1%) |",
    ]
    command = "python " + " ".join(sys.argv)
    common.append_record(args.out, "corpus_lm loader against the default Transformer", command, load_before, rows)


if __name__ == "__main__":
    main()
