"""Where μP loses to the standard parametrization at CPU size: one μP ingredient at a time
switched back to the standard one, for one model at one width and lr, with the setup of
``benchmarks/mup_transfer.py`` (its ``run_config`` and ``train_one``)::

    OMP_NUM_THREADS=1 python benchmarks/mup_readout_diag.py --width 256 --log2-lr -6

Variants: ``mup`` (as shipped); ``qk_standard`` (attention scores 1/sqrt(d) instead of 1/d);
``readout_standard`` (no 1/m readout multiplier, the readout initialised as the standard
parametrization does); ``vectors_scaled`` (every vector-like parameter's Adam lr / m too, as
the hidden matrices'). Prints one line per variant: the validation loss.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import types
from pathlib import Path
from typing import Any


def variant(name: str) -> None:
    """Switch one μP ingredient back (module-level patches: one variant per process)."""
    from harness.nn import parametrization as P
    from harness.nn import widths

    if name == "qk_standard":
        original = P._module_multipliers

        def without_qk(model: Any, base: Any) -> None:
            original(model, base)
            for module in model.modules():
                if hasattr(module, "mup_qk_base"):
                    del module.mup_qk_base
        P._module_multipliers = without_qk
    elif name == "readout_standard":
        P._readout_multipliers = lambda model: None
        P.TARGET_EXPONENT[P.READOUT] = -0.5
    elif name == "vectors_scaled":
        groups = widths.mu_groups

        def scaled(given: Any, optimizer: str) -> Any:
            out = groups(given, optimizer)
            for g in out:
                if g["params"] and g["params"][0].infshape.ninf() == 1:
                    g["lr"] /= g["params"][0].infshape.width_mult()
            return out
        widths.mu_groups = scaled


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="transformer")
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--log2-lr", type=int, default=-6)
    ap.add_argument("--variant", choices=["mup", "qk_standard", "readout_standard", "vectors_scaled"])
    args = ap.parse_args()
    if args.variant is None:  # each variant in its own process (the patches are global)
        import subprocess

        for name in ("mup", "qk_standard", "readout_standard", "vectors_scaled"):
            subprocess.run([sys.executable, __file__, "--model", args.model, "--width", str(args.width),
                            "--log2-lr", str(args.log2_lr), "--variant", name], check=True)
        return 0
    spec = importlib.util.spec_from_file_location("mup_transfer", Path(__file__).with_name("mup_transfer.py"))
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    import torch

    import harness

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    variant(args.variant)
    setup = types.SimpleNamespace(length=32, steps=120, batch=16, val=64, warmup=12, seed=0)
    cfg = bench.run_config(args.model, args.width, "mup", 32, 2.0**args.log2_lr, setup)
    out = bench.train_one(cfg, harness.load_plugins())
    print(f"{args.model} w={args.width} lr=2^{args.log2_lr} {args.variant:17s} val {out['val_loss']:.4f} "
          f"({out['seconds']:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
