"""``seq2seq_pairs``: map the sources of your own files to their targets (translation,
normalisation, transliteration, summaries of short texts, ...).

Records come from ``.jsonl`` / ``.json`` / ``.csv`` / ``.parquet`` files (or folders, or globs):
``source_field`` holds the input text, ``target_field`` the output text. Splits, caps,
memory and the tokenizer are those of every labelled task (:mod:`harness.data.labelled`):
``train`` is required; ``val`` and ``test`` are files, or else cut from ``train`` by a hash of
the source (``val_fraction``, ``test_fraction``). One tokenizer serves sources and targets
(``chars`` and ``bpe:VOCAB`` are trained on both fields of the train split).

* Length: ``length`` is the number of source tokens the model reads; ``target_length`` the
  number of target tokens it is trained to write, then EOS. Longer texts are truncated (a
  warning counts them); a truncated target is the reference too. An evaluation length n >
  ``length`` reads the same val sources truncated at n tokens instead.
* Metrics from greedy free-running decoding (``harness.plugin.greedy``) of every validation
  batch, on the decoded text: ``exact_match`` (the share of outputs equal to the reference
  string), ``chrf`` (chrF, character 6-grams, beta 2) and ``bleu`` (BLEU-4, ``13a``
  tokenization), both on sacrebleu's 0-100 scale and equal to ``sacrebleu.corpus_chrf`` /
  ``corpus_bleu`` over the whole set: the sentence statistics sacrebleu sums are summed
  over batches (and devices) and scored once. ``decode_eval: false`` skips them.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Annotated, Any

from harness.plugin import (
    EOS,
    SPLITS,
    Example,
    Ge,
    LabelledConfig,
    LazyExamples,
    Task,
    TaskSpec,
    TokenColumn,
    cached_read,
    empty_split_error,
    encoded,
    greedy,
    hookimpl,
    keep_smallest_hashes,
    key_fraction,
    note_truncated,
    stream_splits,
    tokenizer_for,
    train_texts,
    vocab_of,
)

#: sacrebleu's sentence statistics: chrF (char_order 6, word_order 0: 3 counts per order)
#: and BLEU-4 (hypothesis and reference lengths, then matches and totals per order)
CHRF_STATS, BLEU_STATS = 18, 10


@dataclass
class Seq2SeqPairsConfig(LabelledConfig):
    num_val: Annotated[int, Ge(1)] = 1_000  # at most this many val (and test) pairs: each is decoded at every validation
    source_field: str = field(default="source", metadata={"doc": "the records' field holding the input text"})
    target_field: str = field(default="target", metadata={"doc": "the records' field holding the output text"})
    target_length: Annotated[int, Ge(1)] = 128  # target tokens kept (then EOS); longer targets are truncated
    # decode every validation source freely and report exact_match / chrf / bleu (false: skip)
    decode_eval: bool = True


class Seq2SeqPairsTask(Task):
    """Map the sources of your own files to their targets (exact match, chrF, BLEU)."""

    task_kind = "seq2seq"
    config: Seq2SeqPairsConfig

    @property
    def extra_metric_names(self) -> tuple[str, ...]:
        """What metrics_from_statistics logs: the decoded metrics, unless decode_eval is off."""
        return ("exact_match", "chrf", "bleu") if self.config.decode_eval else ()

    def __init__(self, config: Seq2SeqPairsConfig, *, seed: int) -> None:
        config.require_train()
        self.tokenizer, self.src, self.tgt = cached_read(config, partial(read_pairs, config))
        super().__init__(config, seed=seed, vocab=vocab_of(self.tokenizer))

    def split_size(self, split: str) -> int:
        return len(self.src[split])

    def generate(self, split: str, length: int) -> LazyExamples:
        return LazyExamples(partial(self._example, split, length), self.split_size(split))

    def _example(self, split: str, length: int, i: int) -> Example:
        return {"src": self.src[split].row(i, length), "tgt": self.tgt[split].row(i) + [EOS]}

    def text(self, ids: list[int]) -> str:
        """Token ids as text (the tokenizer drops special ids)."""
        return str(self.tokenizer.decode(ids))

    def statistics(self, model: Any, batch: dict[str, Any], fmt: Any, logits: Any) -> dict[str, float]:
        """Exact matches and sacrebleu's chrF and BLEU sentence statistics, summed."""
        if not self.config.decode_eval:
            return {}
        examples = batch["examples"]
        hyps = [self.text(h) for h in greedy(model, examples, fmt,
                                              max_len=max(len(e["tgt"]) for e in examples) + 4)]
        refs = [self.text(e["tgt"][:-1]) for e in examples]
        return text_statistics(hyps, refs)

    def metrics_from_statistics(self, totals: dict[str, float]) -> dict[str, float]:
        return text_metrics(totals) if totals else {}


def read_pairs(config: Seq2SeqPairsConfig) -> tuple[Any, dict[str, TokenColumn], dict[str, TokenColumn]]:
    """The tokenizer and per split the token columns of sources and targets (see the module
    docstring)."""
    fields = (config.source_field, config.target_field)
    tokenizer = tokenizer_for(config, train_texts(config, fields, config.source_field, fields))
    keep = config.longest
    src = {s: TokenColumn() for s in SPLITS}
    tgt = {s: TokenColumn() for s in SPLITS}
    keys = {s: array("d") for s in SPLITS}  # hash fractions of the keys
    long_src, long_tgt = dict.fromkeys(SPLITS, 0), dict.fromkeys(SPLITS, 0)
    stream = stream_splits(config, fields, config.source_field)
    for split, record, (source, target) in encoded(tokenizer, stream, fields):
        long_src[split] += len(source) > config.length
        long_tgt[split] += len(target) > config.target_length
        src[split].append(source[:keep])
        tgt[split].append(target[: config.target_length])
        keys[split].append(key_fraction(record.values[config.source_field]))
    caps = {"train": config.num_train, "val": config.num_val, "test": config.num_val}
    totals = {s: len(src[s]) for s in SPLITS}
    kept_src: dict[str, TokenColumn] = {}
    kept_tgt: dict[str, TokenColumn] = {}
    for split in SPLITS:
        rows = keep_smallest_hashes(keys[split], caps[split])
        whole = len(rows) == len(src[split])
        kept_src[split] = src[split] if whole else src[split].take(rows)
        kept_tgt[split] = tgt[split] if whole else tgt[split].take(rows)
    if not len(kept_src["val"]):
        raise empty_split_error("val", config)
    note_truncated("seq2seq_pairs sources", long_src, totals, str(config.length))
    note_truncated("seq2seq_pairs targets", long_tgt, totals, f"target_length={config.target_length}")
    return tokenizer, kept_src, kept_tgt


def text_statistics(hyps: list[str], refs: list[str]) -> dict[str, float]:
    """Summable statistics of hypotheses against one reference each: ``exact`` and
    ``count``, then sacrebleu's chrF (``chrf:i``) and BLEU (``bleu:i``) sentence statistics
    summed over the sentences (what ``corpus_score`` sums before scoring)."""
    from sacrebleu.metrics import BLEU, CHRF

    out: dict[str, float] = {"exact": float(sum(h == r for h, r in zip(hyps, refs, strict=True))),
                             "count": float(len(refs))}
    for name, metric, size in (("chrf", CHRF(), CHRF_STATS), ("bleu", BLEU(), BLEU_STATS)):
        sums = array("d", [0.0] * size)
        for sentence in metric._extract_corpus_statistics(hyps, [refs]):
            for i, v in enumerate(sentence):
                sums[i] += v
        out.update({f"{name}:{i}": sums[i] for i in range(size)})
    return out


def text_metrics(totals: dict[str, float]) -> dict[str, float]:
    """``exact_match``, ``chrf`` and ``bleu`` from summed :func:`text_statistics`."""
    from sacrebleu.metrics import BLEU, CHRF

    def counts(name: str, size: int) -> list[int]:
        return [round(totals[f"{name}:{i}"]) for i in range(size)]

    return {
        "exact_match": totals["exact"] / max(totals["count"], 1.0),
        "chrf": float(CHRF()._compute_score_from_stats(counts("chrf", CHRF_STATS)).score),
        "bleu": float(BLEU()._compute_score_from_stats(counts("bleu", BLEU_STATS)).score),
    }


@hookimpl
def harness_register_task(register: Any) -> None:
    sample = Path(__file__).parent / "data" / "labelled_pairs.jsonl"  # made up: harness_plugins/tasks/data/README.md
    register(TaskSpec(name="seq2seq_pairs", build=Seq2SeqPairsTask, exempt={
        "seeds_differ": "a fixed dataset (your files, split by hash): the task seed changes "
                        "nothing, every seed sees the same pairs",
    }, check_params={"train": str(sample), "val_fraction": 0.25, "tokenizer": "chars", "length": 4, "eval_lengths": [8]}))
