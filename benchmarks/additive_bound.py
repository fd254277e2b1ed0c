"""What bounds ``additive`` attention on a CPU: its element-wise work against this CPU's
measured element-wise throughput.

    python benchmarks/additive_bound.py [--lengths 256 512 1024] [--batch 2] [--d-model 64]

Bahdanau's score vᵀ tanh(W_q q_i + W_k k_j) has no matrix product to hide in: every
(query, key) pair needs its own d_att-wide hidden vector. With P = B x heads x L x L x d_att
hidden units, one forward + backward pass of the memory-bounded form
(``harness_plugins/attention/additive.py``: blocks recomputed under checkpointing) streams P-sized
tensors through these element-wise kernels:

    forward            add (q_i + k_j), tanh, the v-weighted sum over d_att (a reduction)
    backward: recompute add, tanh, reduction (checkpointing: the block is not kept)
    backward: proper   grad ⊗ v (broadcast product), tanh_backward g (1 - h²), the sums
                       over keys (dq) and over queries (dk), h x grad summed for dv

The bound is the sum over these kernels of P ÷ (that kernel's measured rate on a 2^24-element
block of this CPU, one thread, float32, writing into a preallocated tensor): the time the pass would take if it did nothing
but its unavoidable element-wise work at the speed torch's own kernels reach here. The
script measures the rates, the pass (``harness.bench.attention``'s worker, one thread),
and prints pass ÷ bound; results are appended to ``benchmarks/additive_bound.md`` with the
machine, its load and the command. Lower than 2 means within a factor of two of the bound.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from harness.bench import common  # noqa: E402

BLOCK = 2**24  # hidden units per block: the plugin's default 64 MB chunk of float32


def best_of(fn, repeats: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def kernel_rates(n: int = BLOCK) -> dict[str, float]:
    """Elements per second of each kernel on an n-element block (broadcast shapes as in the
    plugin: rows x keys x d_att)."""
    a = 64
    rows = max(1, n // (256 * a))
    q = torch.randn(1, 1, rows, 1, a)
    k = torch.randn(1, 1, 1, 256, a)
    h = torch.randn(1, 1, rows, 256, a).tanh()
    g = torch.randn(1, 1, rows, 256)
    v = torch.randn(a)
    m = h.numel()
    out = torch.empty_like(h)  # written in place: no allocation, no page faults (the strict bound)
    kernels = {
        "add (broadcast)": lambda: torch.add(q, k, out=out),
        "tanh": lambda: torch.tanh(h, out=out),
        "reduction over d_att (h @ v)": lambda: h @ v,
        "product grad ⊗ v (broadcast)": lambda: torch.mul(g.unsqueeze(-1), v, out=out),
        "tanh_backward": lambda: torch.ops.aten.tanh_backward.grad_input(h, h, grad_input=out),
        "sum over keys": lambda: h.sum(3),
        "sum over queries": lambda: h.sum(2),
        "h x grad summed (dv)": lambda: (g.reshape(1, -1) @ h.reshape(-1, a)),
    }
    return {name: m / best_of(fn) for name, fn in kernels.items()}


#: Kernels one forward + backward streams over the P hidden units (recompute included).
PASS = ["add (broadcast)", "tanh", "reduction over d_att (h @ v)",          # forward
        "add (broadcast)", "tanh", "reduction over d_att (h @ v)",          # recompute
        "product grad ⊗ v (broadcast)", "tanh_backward", "sum over keys", "sum over queries",
        "h x grad summed (dv)"]


def measure_pass(length: int, batch: int, d_model: int) -> float:
    """Seconds of one forward + backward of ``additive`` (default hyper-parameters), median of
    the benchmark's timed passes, in a fresh worker process."""
    from harness.bench import attention

    settings = attention.Settings(lengths=(length,), batch=batch, d_model=d_model, heads=4, device="cpu",
                                  threads=1, variants=("additive",), min_time_s=1.0, timeout_s=1800)
    m = attention.run_one(settings, "additive", length)
    if m.ms is None:
        raise SystemExit(f"additive at {length}: {m.status}")
    return m.ms / 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--out", default=str(Path(__file__).with_suffix(".md")))
    args = ap.parse_args()
    torch.set_num_threads(1)
    load = common.load_line()
    rates = kernel_rates()
    d_att = args.d_model  # one head of width d_model (the plugin's defaults)
    rows = []
    for length in args.lengths:
        p = args.batch * length * length * d_att
        bound = sum(p / rates[k] for k in PASS)
        took = measure_pass(length, args.batch, args.d_model)
        rows.append(f"| {length} | {p / 1e6:.0f} | {1000 * bound:.0f} | {1000 * took:.0f} | {took / bound:.2f} |")
    common.append_record(args.out, "", f"python benchmarks/additive_bound.py --lengths "
                         f"{' '.join(map(str, args.lengths))} --batch {args.batch} --d-model {args.d_model}", load, [
        "One torch thread, float32.",
        "",
        "Measured element-wise rates (elements/s, 2^24-element blocks, outputs preallocated):",
        "",
        *[f"- {name}: {rate / 1e9:.2f} G/s" for name, rate in rates.items()],
        "",
        "| L | hidden units P (M) | bound (ms) | fwd+bwd (ms) | pass ÷ bound |",
        "|---|---|---|---|---|",
        *rows,
    ])


if __name__ == "__main__":
    sys.exit(main())
