"""``harness generate`` and ``harness export``: use what a run trained
(:mod:`harness.run.trained`). Imports torch only when a command runs."""

from __future__ import annotations

import argparse
from typing import Any


def cmd_generate(args: argparse.Namespace) -> int:
    from harness.errors import ConfigError
    from harness.evaluation.text import codec_of
    from harness.run import trained as t

    t.check_sampling(args.max_new_tokens, args.temperature, args.top_k, args.top_p)
    t.check_seed(args.seed)
    model = _load(t, args.run, trust_plugins=args.trust_plugins)
    t.check_generates(model)  # a classifier is refused before its prompt is read
    codec = codec_of(model)  # the run's own tokenizer: text in, text out
    prompt = codec.encode(args.prompt)
    if not prompt:
        raise ConfigError("--prompt is empty; give the text to continue.")
    out = t.generate(model, prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                     top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    report = getattr(codec, "unknown_report", lambda: None)()
    if report is not None:
        from harness.errors import warning

        warning(f"--prompt: {report}")
    print(codec.decode(out))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from harness.runtime.paths import new_folder

    new_folder(args.out, "--out")  # before torch and Lightning are imported (a minute on some disks)
    from harness.run import trained as t

    if args.format == "hf":
        from harness.run.hub import export_hf

        target = export_hf(args.run, args.out, args.tracking_uri)
        print(f"exported {args.run} to {target} in the Hugging Face Hub layout (model.safetensors, "
              f"config.json, tokenizer.json, README.md); load it with "
              f"harness.load_model({str(target)!r}) or HubModel.from_pretrained (docs/evaluation.md)")
        return 0
    target = t.export(args.run, args.out)
    carried = f", {t.TOKENIZER_FILE}" if (target / t.TOKENIZER_FILE).is_file() else ""
    print(f"exported {args.run} to {target} ({t.WEIGHTS}, {t.META}{carried}); load it with "
          f"harness.load_model({str(target)!r})")
    return 0


def _load(t: Any, ref: str, trust_plugins: bool = False) -> Any:
    from harness.run.hub import load_any

    return load_any(ref, trust_plugins=trust_plugins)


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("generate", help="continue a prompt with a trained language-model run",
                       description="Generate from a trained run (a run id in the store, or a folder "
                                   "written by `harness export`) through the model's own decoding "
                                   "path (KV cache or recurrent state). The prompt is text, read and "
                                   "written through the run's own tokenizer (a corpus run: bytes, "
                                   "chars, BPE or its tokenizer.json); a symbol task's prompt is its "
                                   "symbols separated by spaces (characters for a character-level "
                                   "task). --temperature 0 (the default) is greedy.")
    p.add_argument("run", metavar="RUN_ID_OR_DIR")
    p.add_argument("--prompt", required=True, metavar="TEXT")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trust-plugins", action="store_true",
                   help="load a folder whose model.json names plugin files (imports and runs their "
                        "code: only for folders you trust)")
    p.set_defaults(handler=cmd_generate)

    p = sub.add_parser("export", help="write a run's weights (safetensors) and resolved config to a folder",
                       description="Write a run's final weights (model.safetensors) and its resolved "
                                   "config (model.json) into a new folder, so that "
                                   "harness.load_model(DIR) works without the store. The folder must "
                                   "not exist.")
    p.add_argument("run", metavar="RUN_ID")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--format", choices=("harness", "hf"), default="harness",
                   help="harness: model.safetensors + model.json; hf: the Hugging Face Hub layout "
                        "(config.json, tokenizer.json, a model card; from_pretrained/push_to_hub)")
    p.add_argument("--tracking-uri", default=None, help="hf: the store whose metrics go in the model card")
    p.set_defaults(handler=cmd_export)
