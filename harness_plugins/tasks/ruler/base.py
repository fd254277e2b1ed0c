"""What the RULER-style tasks share: the haystack, the two ways of writing an example, the
token budget, and the score (RULER's ``string_match_all``, per depth).

**Two ways of writing.** Without ``path`` a task is a *symbol task*: its vocabulary is its
own symbols (haystack words ``w0 w1 ...``, keys, values, a few markers) and every key, value
and marker is one token, small enough to train a model from scratch on a CPU. With ``path``
(a folder written by ``harness data prepare``) the task writes English in RULER's templates
through that corpus's tokenizer: its vocabulary is the corpus's, so a model trained on the
corpus (``corpus_lm``) reads it zero-shot (``harness probe``), and a model can also be trained
on it. ``haystack: corpus`` then fills the context with the corpus's own text (the split of
the example: train, val or test), ``haystack: random`` with random tokens of the vocabulary.

**Lengths.** ``length`` counts the model's inputs (the example holds ``length + 1`` tokens;
its last is only a target): haystack, needles, question and answer together, so the answer
is always inside the context. An example whose needles and question do not fit is refused
with the length it needs. Symbol tasks fill it exactly; a text task fills it to within a
token or two (the haystack is cut at token boundaries).

**Depth.** A needle at depth ``d`` (percent) starts after ``d``% of the haystack's tokens: 0
is the start of the context, 100 right before the question. Validation and test examples
cycle through ``depths`` (example ``i`` at ``depths[i % len(depths)]``, so each depth gets
``num_val / len(depths)`` examples) and carry it as the example's ``depth``; training
examples draw the depth uniformly from [0, 100].

**Score.** Only the answer is scored (the loss mask). The answer is a list of *units*
(values, variable names, words) separated by unscored separators; ``recall`` is the share
of units whose every token is predicted right, averaged over examples: RULER's
``string_match_all``. Teacher-forced and greedy agree here: greedy decoding writes a unit
exactly when every one of its tokens is the argmax given the ones before. The answer lists
its units in a fixed order (in the order they appear in the context, or by frequency),
where RULER accepts any order. Logged per evaluation length: ``recall`` and, for tasks with
depths, ``recall_depth<d>`` for every depth (MLflow: ``val/recall_depth25_len256``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from harness.plugin import (
    ConfigError,
    Example,
    Ge,
    IntRange,
    Task,
    TaskConfig,
    Vocab,
    open_corpus,
)

#: Pieces of a question and answer: tokens, and whether they are scored.
Tail = list[tuple[list[int], bool]]
#: The depths of RULER's figures, in percent of the haystack.
DEFAULT_DEPTHS = (0, 25, 50, 75, 100)
#: Syllables of the made-up words a text task uses as keys and list words (RULER draws
#: English words from ``wonderwords``; made-up ones cannot be guessed from the corpus).
SYLLABLES = ("ba", "ko", "mi", "ru", "te", "lo", "fa", "ne", "di", "su", "pa", "go", "vi",
             "ze", "ha", "tu", "ri", "mo", "ka", "le", "bu", "ni", "so", "da")


@dataclass
class RulerConfig(TaskConfig):
    length: Annotated[int, Ge(8), IntRange(32, 4096, log=True)] = 64  # model inputs per example
    num_train: Annotated[int, Ge(1)] = 20_000
    num_val: Annotated[int, Ge(1)] = 500  # per evaluation length, spread over the depths
    path: str = ""  # a prepared corpus: write English through its tokenizer (empty: symbols)
    haystack: Literal["random", "corpus"] = "random"  # corpus: the prepared corpus's text (needs path)
    words: Annotated[int, Ge(2)] = 64  # symbol tasks: haystack (or list) words w0, w1, ...

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.haystack == "corpus" and not self.path:
            raise ValueError("haystack 'corpus' reads a prepared corpus: set path to a folder written "
                             "by `harness data prepare` (or use haystack: random).")


def check_depths(depths: Sequence[int], num_val: int) -> None:
    if not depths or any(not 0 <= d <= 100 for d in depths) or len(set(depths)) != len(depths):
        raise ValueError(f"depths must be distinct percents from 0 to 100, got {list(depths)}.")
    if num_val < len(depths):  # example i is at depths[i % len(depths)]: the last ones get none
        raise ValueError(f"num_val {num_val} is fewer than the {len(depths)} depths {list(depths)}: "
                         f"depths {list(depths[num_val:])} would get no example and no score. Raise "
                         f"num_val to at least {len(depths)} (a multiple of it spreads them evenly), "
                         f"or give fewer depths.")


class RulerTask(Task):
    """A RULER-style task: symbols or text, a haystack, answers scored by units (see module)."""

    task_kind = "lm"
    config: RulerConfig
    #: whether the task places needles at depths (needle, variable tracking) or not (word lists)
    has_depths = False

    def __init__(self, config: RulerConfig, *, seed: int, symbols: tuple[str, ...] = ()) -> None:
        self.corpus = open_corpus(config.path) if config.path else None
        if self.corpus is not None:
            tok = self.tokenizer = self.corpus.tokenizer
            self.text_ids = [i for i, n in enumerate(tok.token_bytes()) if n > 0 and i != tok.eod_id]
            vocab = Vocab(tuple(f"<{i}>" for i in range(4, self.corpus.vocab_size)))
        else:
            vocab = Vocab(tuple(f"w{i}" for i in range(config.words)) + symbols)
        super().__init__(config, seed=seed, vocab=vocab)
        self.ids = {s: vocab.first_symbol + i for i, s in enumerate(vocab.symbols)}
        depths = self.depths
        self.extra_metric_names = ("recall", *(f"recall_depth{d}" for d in depths))

    @property
    def depths(self) -> tuple[int, ...]:
        return tuple(getattr(self.config, "depths", ())) if self.has_depths else ()

    @property
    def text(self) -> bool:
        return self.corpus is not None

    # -- writing ---------------------------------------------------------------------------
    def sym(self, *names: str) -> list[int]:
        return [self.ids[n] for n in names]

    def encode(self, text: str) -> list[int]:
        """Text through the corpus's tokenizer, refused where it cannot spell it."""
        ids = [int(i) for i in self.tokenizer.encode(text)]
        if self.tokenizer.decode(ids) != text:
            raise ConfigError(f"the tokenizer of {self.config.path} ({self.tokenizer.name}) cannot "
                              f"spell {text.strip()[:60]!r} (characters its corpus never had): this "
                              f"task's text cannot be written in it.")
        return ids

    def made_up_word(self, rng: random.Random, syllables: int = 3) -> str:
        return "".join(rng.choice(SYLLABLES) for _ in range(syllables))

    def filler(self, rng: random.Random, split: str, count: int) -> list[int]:
        """``count`` haystack tokens: random words (symbols), random tokens of the vocabulary,
        or a window of the corpus's ``split`` at a random offset."""
        if count <= 0:
            return []
        if self.corpus is None:
            first = self.vocab.first_symbol
            return [first + rng.randrange(self.config.words) for _ in range(count)]
        if self.config.haystack == "random":
            return [rng.choice(self.text_ids) for _ in range(count)]
        data = self.corpus.require(split, count, f"a haystack of {count} tokens")
        start = rng.randrange(data.tokens - count + 1)
        return [int(t) for t in data.read(start, count)]

    def boundary(self, hay: list[int], at: int) -> int:
        """Text: move an insertion point back to just before a space or a newline (within 24
        tokens), so that a needle (which starts with a space) does not split a word of the
        corpus's text."""
        if self.corpus is None or self.config.haystack != "corpus":
            return at
        for back in range(min(at, 24) + 1):
            if at - back >= len(hay) or self.tokenizer.decode([hay[at - back]])[:1] in (" ", "\n"):
                return at - back
        return at

    def assemble(self, rng: random.Random, split: str, length: int,
                 needles: list[tuple[float, list[int]]], tail: Callable[[list[int]], Tail],
                 depth: int | None) -> Example:
        """An example of ``length + 1`` tokens: haystack with ``needles`` (share of the haystack
        before each, tokens) inserted, then ``tail(order)``: the pieces of question and answer
        (each scored or not), given the order in which the needles ended up (indices)."""
        inserted = sum(len(t) for _, t in needles)
        tail_tokens = sum(len(t) for t, _ in tail(list(range(len(needles)))))
        room = length + 1 - inserted - tail_tokens
        if room < 0:
            raise ValueError(f"length {length} cannot hold this task's needles and question "
                             f"({inserted + tail_tokens - 1} inputs before any haystack); raise "
                             f"length (and eval_lengths) to at least {inserted + tail_tokens - 1}.")
        hay = self.filler(rng, split, room)
        points = sorted((self.boundary(hay, round(share * room)), i) for i, (share, _) in enumerate(needles))
        tokens: list[int] = []
        last = 0
        for at, i in points:
            tokens += hay[last:at] + needles[i][1]
            last = at
        tokens += hay[last:]
        scored = [False] * len(tokens)
        for piece, score in tail([i for _, i in points]):
            tokens += piece
            scored += [score] * len(piece)
        example: Example = {"tokens": tokens, "loss_mask": scored[1:]}
        if depth is not None:
            example["depth"] = depth
        return example

    def examples_at(self, split: str, length: int, make: Any) -> list[Example]:
        """The split's examples at ``length``: ``make(rng, depth)`` with each validation and test
        example's depth cycling through ``depths``; a training example's depth (None: drawn)."""
        rng = random.Random(self.split_seed(split, length))
        out = []
        for i in range(self.split_size(split)):
            depth = self.depths[i % len(self.depths)] if split != "train" and self.depths else None
            out.append(make(rng, depth))
        return out

    def generate(self, split: str, length: int) -> list[Example]:
        return self.examples_at(split, length, lambda rng, depth: self.example(rng, split, length, depth))

    def example(self, rng: random.Random, split: str, length: int, depth: int | None) -> Example:
        raise NotImplementedError

    def answer(self, units: list[list[int]], separator: list[int], end: list[int]) -> Tail:
        """Tail pieces of an answer: each unit scored, the separators between them and ``end``
        not (each unscored run parts two units: the score counts scored runs)."""
        pieces: Tail = []
        for i, unit in enumerate(units):
            if i:
                pieces.append((separator, False))
            pieces.append((unit, True))
        if end:
            pieces.append((end, False))
        return pieces

    # -- scoring ---------------------------------------------------------------------------
    def statistics(self, model: Any, batch: dict[str, Any], fmt: Any, logits: Any) -> dict[str, float]:
        right = ((logits.argmax(-1) == batch["targets"]) | ~batch["loss_mask"]).cpu().tolist()
        masks = batch["loss_mask"].cpu().tolist()
        groups = [str(d) for d in self.depths] or ["all"]
        out = {f"{kind}_{g}": 0.0 for g in groups for kind in ("recall", "examples")}
        for i, example in enumerate(batch["examples"]):
            share = unit_recall(masks[i], right[i])
            if share is None:
                continue
            group = str(example.get("depth", "all")) if self.depths else "all"
            if group in groups:
                out[f"recall_{group}"] += share
                out[f"examples_{group}"] += 1
        return out

    def metrics_from_statistics(self, totals: dict[str, float]) -> dict[str, float]:
        groups = [str(d) for d in self.depths] or ["all"]
        examples = sum(totals.get(f"examples_{g}", 0.0) for g in groups)
        if not examples:
            return {}
        out = {"recall": sum(totals.get(f"recall_{g}", 0.0) for g in groups) / examples}
        for g in groups if self.depths else ():
            n = totals.get(f"examples_{g}", 0.0)
            if n:
                out[f"recall_depth{g}"] = totals[f"recall_{g}"] / n
        return out


def unit_recall(mask: Sequence[bool], right: Sequence[bool]) -> float | None:
    """The share of scored runs (maximal runs of True in ``mask``) whose every position is
    right; None where nothing is scored (a padded row)."""
    runs = correct = 0
    inside = False
    ok = True
    for scored, good in zip(mask, right, strict=False):
        if scored and not inside:
            runs, inside, ok = runs + 1, True, True
        if scored:
            ok = ok and bool(good)
        elif inside:
            correct, inside = correct + ok, False
    if inside:
        correct += ok
    return correct / runs if runs else None


def units_of(example: Example) -> list[list[int]]:
    """The answer units of an example: the targets of each scored run (for references)."""
    targets = example["tokens"][1:]
    units: list[list[int]] = []
    inside = False
    for token, scored in zip(targets, example["loss_mask"], strict=True):
        if scored and not inside:
            units.append([])
        if scored:
            units[-1].append(token)
        inside = scored
    return units
