"""``corpus_lm``: language modelling on a prepared corpus (your own text), streamed from disk.

``path`` is a folder written by ``harness data prepare`` (docs/data.md), used as it is. When
it is not prepared (or not given) and ``source`` names files, the task prepares them on first
use, as ``harness data prepare SOURCE --tokenizer TOKENIZER --out PATH`` would (reused while
the source is unchanged); ``source: shakespeare`` is the text the project ships
(``data/shakespeare.txt.bz2``, blank-line-separated speeches as documents). Without ``path``
the folder is ``<cache>/corpora/<source name>-<hash of its path>-<tokenizer>`` (the harness's cache folder:
``$HARNESS_CACHE_DIR``, else ``~/.cache/harness``); with neither, the task is Shakespeare in
bytes. ``length`` is in tokens of the corpus's tokenizer.

* **train**: streamed (``Task.streams``). Every step draws fresh windows of ``length + 1``
  tokens at random offsets of the train split's token stream (documents packed with an
  end-of-document token, so windows span documents); no list of examples is built and an
  epoch is not needed. The windows depend on the task seed, the run's seed and the step;
  the processes of a multi-device run read disjoint windows
  (:func:`harness.data.corpus.window_starts`). ``num_train`` is not used.
* **val / test**: ``eval_tokens`` consecutive tokens of the split, from an offset drawn from
  the task seed (``train.data_seed``) past the first ``max(eval_lengths)`` tokens, are scored
  at *every* evaluation length and by both protocols: the same text for every candidate and
  every length. A split with fewer than ``eval_tokens + 1 + max(eval_lengths)`` tokens is
  scored whole past its first ``max(eval_lengths)`` (a warning and the tag
  ``harness.warnings`` say so); it needs at least one window of the longest length. Protocols as ``char_lm``: ``windows`` (consecutive
  windows, all scored) or ``sliding`` (windows advancing by ``score_last``, scoring their last
  ``score_last`` tokens; context before the scored text is read, unscored).
* **documents**: ``packed`` (the default): a window is one stream, so attention reads the
  previous document and a recurrent state carries it over ``<eod>``. ``separate``: each
  ``<eod>`` starts a document the model keeps apart, in training and evaluation alike
  (attention masked block-diagonally, recurrent and mixer state reset; positions not
  restarted; see ``harness.nn.documents`` and docs/data.md, "Document boundaries"). Nothing
  else changes: every target is still scored. A model that cannot keep documents apart is
  refused before training; a study sets it once for every candidate.
* **metrics**: loss, perplexity and bits per token (``bpc``), and bits per byte (``bpb``: the
  scored tokens' bits over the UTF-8 bytes they spell), which compares runs whose corpora
  were prepared with different tokenizers.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np

from harness.plugin import (
    Choice,
    ConfigError,
    Example,
    Ge,
    IntRange,
    Task,
    TaskConfig,
    TaskSpec,
    Vocab,
    cache_dir,
    hookimpl,
    lm_windows,
    open_corpus,
    prepare_corpus,
    window_starts,
)

#: ``source`` names of texts the project ships.
SHIPPED = {"shakespeare": "shakespeare.txt.bz2"}
#: Training windows in the inspection sample ``examples("train", n)`` (never trained on).
SAMPLE = 16


@dataclass
class CorpusLMConfig(TaskConfig):
    length: Annotated[int, Ge(1), IntRange(16, 4096, log=True)] = 128  # tokens read per window
    path: str = ""  # a prepared folder (harness data prepare); empty: <cache>/corpora/<source>-<tokenizer>
    source: str = ""  # prepare from these files on first use ("shakespeare": the shipped text)
    tokenizer: str = "bytes"  # with source: bytes, chars, bpe:VOCAB or a tokenizer.json
    eval_tokens: Annotated[int, Ge(1)] = 16_384  # tokens scored per evaluation length and split
    eval_protocol: Annotated[str, Choice(("windows", "sliding"))] = "windows"
    score_last: Annotated[int, Ge(1)] = 32  # sliding protocol: tokens scored per window
    documents: Literal["packed", "separate"] = "packed"  # separate: <eod> starts a document kept apart

    def separate_documents(self) -> bool:
        return self.documents == "separate"

    def train_split_tokens(self) -> int | None:
        """Tokens of the train split where it is already prepared (from its manifest, nothing
        opened or prepared), else None: what the run's sanity check compares a budget with."""
        manifest = folder_and_source(self)[0] / "manifest.json"
        try:
            shards = json.loads(manifest.read_text())["splits"]["train"]["shards"]
            return sum(int(shard["tokens"]) for shard in shards)
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def meaningless(self) -> list[str]:
        """A val or test split shorter than ``eval_tokens`` (read from the manifest where the
        corpus is prepared): the whole split is scored instead (:func:`scored_tokens`)."""
        manifest = folder_and_source(self)[0] / "manifest.json"
        try:
            splits = json.loads(manifest.read_text())["splits"]
            held = {s: sum(int(x["tokens"]) for x in splits[s]["shards"]) for s in ("val", "test")}
        except (OSError, ValueError, KeyError, TypeError):
            return []
        room = max((self.length, *self.eval_lengths))
        short = {split: (tokens, scored_tokens(self.eval_tokens, tokens, room))
                 for split, tokens in held.items()}
        short = {k: v for k, v in short.items() if room <= v[1] < self.eval_tokens}
        if not short:
            return []
        return [f"eval_tokens {self.eval_tokens:,} is more than the "
                f"{' and '.join(short)} split{'s' if len(short) > 1 else ''} of {manifest.parent} "
                f"hold{'' if len(short) > 1 else 's'} ("
                + ", ".join(f"{split} {tokens:,} tokens" for split, (tokens, _) in short.items())
                + f", {room:,} of them kept as context): the whole split is scored ("
                + ", ".join(f"{split} {n:,} tokens" for split, (_, n) in short.items()) + ")"]

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.eval_protocol not in ("windows", "sliding"):
            raise ValueError(f"eval_protocol must be 'windows' or 'sliding', got {self.eval_protocol!r}")
        if self.eval_protocol == "sliding" and self.score_last > self.length:
            raise ValueError(f"score_last={self.score_last} must lie in [1, {self.length}] (the "
                             f"training length): a sliding window cannot score more than it reads.")
        longest = max((self.length, *self.eval_lengths))
        if longest > self.eval_tokens:
            raise ValueError(f"evaluation length {longest} is longer than the scored text "
                             f"(eval_tokens = {self.eval_tokens}); raise eval_tokens.")


def scored_tokens(eval_tokens: int, split_tokens: int, context: int) -> int:
    """Tokens a split scores: ``eval_tokens``, or all the split holds after ``context`` tokens
    of room (and the one token the last prediction reads) when it holds fewer."""
    return max(0, min(eval_tokens, split_tokens - 1 - context))


def _tokenizer_words(tok: dict[str, Any]) -> str:
    """The tokenizer a manifest names: its spec, and the vocabulary it learned when that is
    smaller than the spec asked (``bpe:373, asked for bpe:70000``)."""
    spec, name = str(tok.get("spec", "?")), str(tok.get("name", ""))
    if spec.startswith("bpe:") and name.startswith("bpe:") and name != spec:
        return f"{name}, asked for {spec}"
    return spec


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("._") or "corpus"


def folder_and_source(config: CorpusLMConfig) -> tuple[Path, str]:
    """Where a config's prepared corpus is (or goes), and the source to prepare it from (empty:
    ``path`` is used as it is)."""
    path = Path(config.path).expanduser() if config.path else None
    if path is not None and (path / "manifest.json").is_file():
        return path, ""  # prepared (open_corpus validates it); source is not read
    source = config.source or ("" if path is not None else "shakespeare")
    if path is None:  # one cache folder per source (its absolute path) and tokenizer
        name = source if source in SHIPPED else \
            f"{_safe(Path(source).name)}-{hashlib.sha256(str(Path(source).resolve()).encode()).hexdigest()[:8]}"
        path = cache_dir() / "corpora" / f"{name}-{_safe(config.tokenizer)}"
    return path, source


def corpus_folder(config: CorpusLMConfig) -> Path:
    """The prepared folder of a config: ``path`` as it is when prepared; otherwise prepared
    (or reused) from ``source`` into ``path`` or the cache folder."""
    path, source = folder_and_source(config)
    if not source:
        return path  # prepared, or not: open_corpus says how to
    if source in SHIPPED:
        with resources.as_file(resources.files(__package__).joinpath("data", SHIPPED[source])) as f:
            prepare_corpus([f], path, tokenizer=config.tokenizer, progress=False)
    else:
        prepare_corpus([source], path, tokenizer=config.tokenizer, progress=False)
    return path


def symbols(tokenizer: Any, vocab_size: int) -> tuple[str, ...]:
    """A readable, unique name for every id past the harness's four specials."""
    names: list[str] = []
    seen: set[str] = set()
    for i in range(4, vocab_size):
        name = "<eod>" if i == tokenizer.eod_id else tokenizer.decode([i])
        if not name or "\ufffd" in name or name in seen:
            name = f"<{i}>"
            while name in seen:  # a token that spells "<i>" itself came first
                name += "'"
        seen.add(name)
        names.append(name)
    return tuple(names)


class CorpusLMTask(Task):
    """Language modelling on a prepared corpus, training windows streamed from disk."""

    task_kind = "lm"
    report_perplexity = True
    streams = True
    data_params = ("path", "source", "tokenizer")
    config: CorpusLMConfig

    def __init__(self, config: CorpusLMConfig, *, seed: int) -> None:
        self.corpus = open_corpus(corpus_folder(config))
        tok = self.tokenizer = self.corpus.tokenizer
        super().__init__(config, seed=seed, vocab=Vocab(symbols(tok, self.corpus.vocab_size)))
        self.token_bytes = [int(b) for b in tok.token_bytes()]
        self.document_token = self.corpus.eod_id if config.separate_documents() else None
        self.train = self.corpus.require("train", config.length + 1, f"a training window ({config.length} + 1 tokens)")
        # room before the scored text for the sliding protocol's context, kept by both
        # protocols so that they score the same text
        self.context = context = max(self.eval_lengths)
        #: tokens scored per split: eval_tokens, or the whole split when it is smaller
        #: (CorpusLMConfig.meaningless says so); never less than one window of the longest length
        self.scored: dict[str, int] = {}
        for split in ("val", "test"):
            self.corpus.require(split, context + 1 + context,
                                f"the scored text (at least one window of {context} tokens + 1, "
                                f"after {context} tokens of room for context)")
            self.scored[split] = scored_tokens(config.eval_tokens, self.corpus.split(split).tokens,
                                               context)

    def eval_start(self, split: str) -> int:
        """Where the scored text of ``split`` starts: drawn from the task seed, the same at
        every length."""
        tokens = self.corpus.split(split).tokens
        rng = random.Random(self.split_seed(split, 0))
        return rng.randrange(self.context, tokens - self.scored[split])

    def manifest_sha256(self) -> str:
        """The SHA-256 of the prepared folder's manifest (it changes whenever the folder is
        prepared again: new sources, options or tokenizer)."""
        return hashlib.sha256((self.corpus.root / "manifest.json").read_bytes()).hexdigest()

    def data_identity(self) -> dict[str, str]:
        return {"data_sha256": self.manifest_sha256(), "data": f"prepared corpus {self.corpus.root.resolve()}"}

    def data_summary(self) -> str:
        """The prepared folder's manifest in one line: folder, sources, tokenizer, tokens per
        split and the manifest's SHA-256 (which changes whenever the folder is prepared
        again)."""
        m = self.corpus.manifest
        digest = self.manifest_sha256()[:12]
        sources = m.get("sources") or []
        names = [Path(str(s.get("path", "?"))).name for s in sources[:3]]
        if len(sources) > 3:
            names.append(f"{len(sources) - 3} more")
        size = sum(int(s.get("size", 0)) for s in sources)
        tok = m.get("tokenizer") or {}
        splits = m.get("splits") or {}
        counts = "/".join(f"{int((splits.get(s) or {}).get('tokens', 0)):,}" for s in ("train", "val", "test"))
        return (f"prepared corpus {self.corpus.root.resolve()} (manifest sha256 {digest}): "
                f"{len(sources)} source file(s), {size:,} bytes ({', '.join(names)}); tokenizer "
                f"{_tokenizer_words(tok)} ({tok.get('vocab_size', '?')} tokens); train/val/test "
                f"{counts} tokens")

    def generate(self, split: str, length: int) -> list[Example]:
        if split == "train":  # a sample for inspection and checks; training streams
            starts = window_starts(self.train.tokens, length, SAMPLE, seed=self.split_seed("train", length), step=0)
            return [{"tokens": self.train.read(int(s), length + 1).tolist()} for s in starts]
        data = self.corpus.split(split)
        start, budget = self.eval_start(split), self.scored[split]
        if self.config.eval_protocol == "windows":
            return lm_windows(data.read(start, budget + 1).tolist(), length)
        k = self.config.score_last
        before = length - k
        return lm_windows(data.read(start - before, budget + 1 + before).tolist(), length, score_last=k)

    def train_batches(self, length: int, batch_size: int, *, seed: int, rank: int = 0,
                      world: int = 1) -> Iterator[np.ndarray]:
        if length + 1 > self.train.tokens:
            raise ConfigError(f"a training window of {length} + 1 tokens is longer than the train "
                              f"split of {self.corpus.root} ({self.train.tokens} tokens).")
        offsets = np.arange(length + 1)
        single = self.train.shards[0] if len(self.train.shards) == 1 else None
        step = 0
        while True:
            starts = window_starts(self.train.tokens, length, batch_size, seed=(self.seed, seed),
                                   step=step, rank=rank, world=world)
            if single is not None:
                yield np.asarray(single[starts[:, None] + offsets], dtype=np.int64)
            else:
                yield np.stack([self.train.read(int(s), length + 1) for s in starts])
            step += 1


@hookimpl
def harness_register_task(register: Any) -> None:
    register(TaskSpec(name="corpus_lm", build=CorpusLMTask))
