"""``harness data prepare``: the command line of :mod:`harness.data.prepare`.

Only argparse at import time (``harness --help`` stays fast); the handler imports numpy and
the tokenizers, never torch.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from harness.errors import ConfigError

#: ``--workers``'s default, in words (the rule is :func:`harness.data.prepare._tokenized`'s and
#: ``FEW_CHUNKS * CHUNK_BYTES``); docs/data.md says the same (a test checks both)
WORKERS_DEFAULT = ("every usable core for bpe and tokenizer files; one for bytes and chars "
                   "(they encode faster than a chunk travels to a worker and back) and for "
                   "sources under 16 MB")


def _fractions(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected train,val,test fractions such as 0.9,0.05,0.05, "
                                         f"got {text!r}") from None


def cmd_prepare(args: argparse.Namespace) -> int:
    from harness.data.prepare import DEFAULT_FRACTIONS, prepare

    if args.workers is not None and args.workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {args.workers}.")
    result = prepare(args.sources, args.out, tokenizer=args.tokenizer, field=args.field,
                     split_fractions=args.split_fractions or DEFAULT_FRACTIONS, workers=args.workers,
                     progress=not args.quiet, command=" ".join(["harness", *sys.argv[1:]]) if sys.argv[1:2] == ["data"] else None)
    print(result.summary())
    return 0


def add_parsers(sub: Any) -> None:
    data = sub.add_parser("data", help="prepare your own corpus for the corpus_lm task",
                          description="Work with your own data: `harness data prepare` turns text "
                                      "files into a prepared corpus (docs/data.md).")
    inner = data.add_subparsers(dest="data_command", metavar="SUBCOMMAND")
    p = inner.add_parser(
        "prepare", help="tokenise files into a prepared corpus folder",
        description="Read SOURCE files, folders or globs (.txt: blank-line-separated documents; "
                    ".jsonl, .json, .csv, .parquet; a datasets.save_to_disk folder; .gz/.bz2/.xz "
                    "text files), split documents into train/val/test by a hash of their text, "
                    "tokenise them in parallel and write token shards, the tokenizer and a "
                    "manifest to --out. Re-running on unchanged sources reuses the folder.")
    p.add_argument("sources", nargs="+", metavar="SOURCE")
    p.add_argument("--tokenizer", required=True, metavar="T",
                   help="bytes, chars, bpe:VOCAB (e.g. bpe:8192, trained on the train split) or a "
                        "tokenizer.json file")
    p.add_argument("--out", required=True, metavar="DIR", help="the folder to create")
    p.add_argument("--field", default="text", help="the field that holds the text (default: text)")
    p.add_argument("--split-fractions", type=_fractions, default=None, metavar="TRAIN,VAL,TEST",
                   help="fractions of documents per split (default 0.9,0.05,0.05)")
    p.add_argument("--workers", type=int, default=None,
                   help=f"tokenising processes (default: {WORKERS_DEFAULT})")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.set_defaults(handler=cmd_prepare)

    def no_subcommand(_args: argparse.Namespace) -> int:
        data.print_help()
        return 0

    data.set_defaults(handler=no_subcommand)
