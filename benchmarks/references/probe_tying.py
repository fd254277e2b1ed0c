"""Why tied embeddings stall recall: what a freshly built model predicts at the scored positions.

    python benchmarks/references/probe_tying.py      # a few seconds, no training

For the harness's decoder-only models (and the reference), on one batch of the recall
task, at initialisation and after ``--steps`` plain-loop steps: the mean loss at the scored
(answer) positions, how often the argmax there is the *current input token* (the key that
is being queried), and the mean logit margin of that input token over the mean logit.
A tied head reads the residual stream with the very vectors the embedding wrote into it
(x sqrt(d) larger), so before any learning the model predicts "the token I just read".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compare  # noqa: E402
import loop  # noqa: E402
import torch  # noqa: E402


@torch.no_grad()
def probe(module: torch.nn.Module, batch: dict) -> dict[str, float]:
    module.eval()
    logits = loop.call(module, batch, "lm")
    module.train()
    mask = batch["loss_mask"]
    scored = logits[mask]  # (N, V)
    current = batch["tokens"][mask]  # the input token at each scored position (the key)
    loss = torch.nn.functional.cross_entropy(scored, batch["targets"][mask]).item()
    self_logit = scored.gather(1, current[:, None]).squeeze(1)
    return {"loss": loss,
            "argmax_is_input": (scored.argmax(-1) == current).float().mean().item(),
            "input_logit_margin": (self_logit - scored.mean(-1)).mean().item(),
            "logit_std": scored.std(-1).mean().item()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    task = compare.get_task("associative_recall")
    length = compare.max_length(task, "lm")
    batch = next(loop.batches(task, "lm", 256, seed=123))
    variants = [
        ("reference (untied, N(0,1))", "transformer", "ref", {}, ""),
        ("transformer tied (default)", "transformer", "module", {}, ""),
        ("transformer tied, no x sqrt(d)", "transformer", "module", {}, "embed_unscaled"),
        ("transformer untied", "transformer", "module", {"tie_embeddings": False}, ""),
        ("mlp_mixer tied (default)", "mlp_mixer", "module", {}, ""),
        ("mlp_mixer untied", "mlp_mixer", "module", {"tie_embeddings": False}, ""),
    ]
    print("| model | when | answer loss | argmax = input token | input-token logit margin | logit std |\n"
          "|---|---|---|---|---|---|")
    for name, model, side, params, patch in variants:
        torch.manual_seed(0)
        if side == "ref":
            module = compare.build_reference(model, task.vocab.size, length)
        else:
            module = compare.build_harness(model, task.vocab.size, length, "lm", params, {})
            for part in filter(None, patch.split("+")):
                compare.PATCHES[part](module)
        for when in ("init", f"{args.steps} steps"):
            if when != "init":
                loop.train(module, task, "lm", steps=args.steps, batch_size=32, lr=args.lr, seed=0)
            r = probe(module, batch)
            print(f"| {name} | {when} | {r['loss']:.2f} | {r['argmax_is_input']:.2f} | "
                  f"{r['input_logit_margin']:.2f} | {r['logit_std']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
