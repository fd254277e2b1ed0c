"""One ablation beside the width record: μP's Transformer at width 256 with its heads held at 4
(head dimension 64, so μP's 1/d scale is sqrt(16)/64, half the standard 1/sqrt(64)) instead of
grown to 16 at head dimension 16; the record's setup otherwise, lr 2^-7 (the base-tuned), the
seeds given (default 0).

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/mup_width/ablation_heads.py 0 1 2
"""
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch  # noqa: E402
from mup_transfer import train_one  # noqa: E402

import harness  # noqa: E402

torch.set_num_threads(1)
cfg = {"task": {"name": "char_lm", "params": {"length": 32, "num_train": 8000, "num_val": 512}},
       "model": {"name": "transformer", "params": {"layers": 2, "d_model": 256, "heads": 4},
                 "attention": {"name": "multi_head"}, "position": {"name": "rope"},
                 "parametrization": "mup", "base": {"d_model": 64}},
       "train": {"max_steps": 500, "batch_size": 16, "lr": 2.0**-7, "warmup_steps": 50, "seed": 0}}
registry = harness.load_plugins()
for seed in [int(a) for a in sys.argv[1:]] or [0]:
    cfg["train"]["seed"] = seed
    out = train_one(cfg, registry)
    row = {"what": "mup, heads held at 4", "width": 256, "lr": 2.0**-7, "seed": seed, **out,
           "load": os.getloadavg()[0], "finished": time.time()}
    with (Path(__file__).parent / "ablation.jsonl").open("a") as f:
        f.write(json.dumps(row) + "\n")
    print(row, flush=True)
