"""``common_words`` and ``frequent_words``: RULER's aggregation tasks (Hsieh et al. 2024,
arXiv:2404.06654, "CWE" and "FWE"): the answer summarises the whole context, so no depth.

**common_words.** A list of words in which ``num_common`` words appear ``freq_common`` times
each and every other word ``freq_uncommon`` times, shuffled; as many uncommon words as the
length holds. The answer is the common words, in the order of their first appearance
(RULER asks for "the 10 most common words"; at its lengths under 4K: 6 and 1 repeats).

**frequent_words.** Words drawn with Zipf frequencies: the word of rank ``k`` appears
``floor(n k^-alpha / zeta(alpha))`` times (``alpha`` = 2 as in RULER), ``n`` as large as the
length holds; the rank-1 word is noise (RULER writes it ``....``) and the answer is the words
of ranks 2 to ``1 + num_answers``, the most frequent first. A length too short to make those
counts strictly decreasing is refused.

**Symbols** (no ``path``): the words are ``w0 w1 ...`` (``words`` of them; the noise word is
``...``), the question ``? :`` and the answer the words separated by ``,``. **Text**
(``path``): made-up words written through the corpus's tokenizer, RULER's questions; a text
example holds at most ``length`` inputs (whole words only). See :mod:`.ruler.base` for the score.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass
from typing import Annotated, Any

from harness.plugin import Example, Ge, Gt, Le, TaskSpec, hookimpl

from .ruler.base import RulerConfig, RulerTask, Tail, units_of

MARKERS = ("...", "?", ":", ",")


@dataclass
class CommonWordsConfig(RulerConfig):
    words: Annotated[int, Ge(2)] = 512  # symbols: distinct words w0, w1, ... (a length-L list needs about L)
    num_common: Annotated[int, Ge(1)] = 4  # words asked for (RULER: 10)
    freq_common: Annotated[int, Ge(2)] = 6  # repeats of each common word (RULER under 4K: 6)
    freq_uncommon: Annotated[int, Ge(1)] = 1  # repeats of every other word (RULER under 4K: 1)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.freq_uncommon >= self.freq_common:
            raise ValueError(f"freq_uncommon ({self.freq_uncommon}) must be below freq_common "
                             f"({self.freq_common}), or no word is more common than another.")


@dataclass
class FrequentWordsConfig(RulerConfig):
    num_answers: Annotated[int, Ge(1)] = 3  # words asked for (RULER: 3)
    alpha: Annotated[float, Gt(1.0), Le(8.0)] = 2.0  # Zipf exponent (RULER: 2)


@functools.cache
def zeta(alpha: float) -> float:
    """Riemann's zeta at ``alpha`` > 1: the sum to 10^5 and the integral of the rest."""
    return math.fsum(k ** -alpha for k in range(1, 100_000)) + 100_000 ** (1 - alpha) / (alpha - 1)


def zipf_counts(n: int, alpha: float, z: float) -> list[int]:
    """Occurrences of the words of rank 1, 2, ...: ``floor(n k^-alpha / zeta(alpha))`` while
    at least one."""
    out: list[int] = []
    k = 1
    while (count := int(n * k ** -alpha / z)) > 0:
        out.append(count)
        k += 1
    return out


class WordsTask(RulerTask):
    """The shared part of the two word-list tasks: words, question and answer."""

    def __init__(self, config: RulerConfig, *, seed: int) -> None:
        super().__init__(config, seed=seed, symbols=MARKERS)

    def word_list(self, rng: random.Random, count: int) -> list[str]:
        """``count`` distinct words: symbols ``w<i>`` or made-up text words."""
        if not self.text:
            if count > self.config.words:
                raise ValueError(f"this length needs {count} distinct words, more than words="
                                 f"{self.config.words}; raise words.")
            return [f"w{i}" for i in rng.sample(range(self.config.words), count)]
        out: list[str] = []
        seen: set[str] = set()
        while len(out) < count:
            word = self.made_up_word(rng, 2 + rng.randrange(2))
            if word not in seen:
                seen.add(word)
                out.append(word)
        return out

    def word(self, w: str) -> list[int]:
        if w in ("...", "...."):  # the noise word
            return self.encode(" ....") if self.text else self.sym("...")
        return self.encode(" " + w) if self.text else self.sym(w)

    def tail(self, question: str, answer: list[str]) -> Tail:
        pieces: Tail = [(self.encode(question) if self.text else self.sym("?", ":"), False)]
        separator, end = (self.encode(","), self.encode(".")) if self.text else (self.sym(","), [])
        return pieces + self.answer([self.word(w) for w in answer], separator, end)

    def fit(self, length: int, make: Any, size: int) -> Example:
        """``make(size)``: an example of a context of ``size`` words; the largest size up to
        ``size`` whose example holds at most ``length`` inputs (text words differ in tokens:
        a bisection, each try drawn afresh from the same generator)."""

        def build(n: int) -> Example:
            context, tail = make(n)
            tokens = [t for w in context for t in w]
            scored = [False] * len(tokens)
            for piece, score in tail:
                tokens += piece
                scored += [score] * len(piece)
            return {"tokens": tokens, "loss_mask": scored[1:]}

        best, low, high = None, 0, max(size, 0)
        mid = high  # symbols fit at once
        while low <= high:
            try:
                example = build(mid)
            except ValueError:  # too few words for the answer to be unique: more
                low = mid + 1
            else:
                if len(example["tokens"]) <= length + 1:
                    if mid == high:
                        return example
                    best, low = example, mid + 1
                else:
                    high = mid - 1
            mid = (low + high) // 2
        if best is None:
            raise ValueError(f"length {length} cannot hold {type(self).__name__}'s question, "
                             f"answer and the words it needs; raise length.")
        return best


class CommonWordsTask(WordsTask):
    """Common words extraction (RULER CWE): name the words a list repeats most."""

    config: CommonWordsConfig

    def __init__(self, config: CommonWordsConfig, *, seed: int) -> None:  # the spec reads the config class here
        super().__init__(config, seed=seed)

    def example(self, rng: random.Random, split: str, length: int, depth: int | None) -> Example:
        c = self.config
        question = (f"\nQuestion: What are the {c.num_common} most common words in the above "
                    f"list? Answer: The top {c.num_common} words that appear most often are:")
        common_tokens = c.num_common * c.freq_common

        def make(uncommon: int) -> tuple[list[list[int]], Tail]:
            words = self.word_list(rng, c.num_common + uncommon)
            common = words[: c.num_common]
            listed = common * c.freq_common + words[c.num_common:] * c.freq_uncommon
            rng.shuffle(listed)
            answer = sorted(common, key=listed.index)  # by first appearance
            return [self.word(w) for w in listed], self.tail(question, answer)

        tail = sum(len(p) for p, _ in make(0)[1])
        uncommon = (length + 1 - tail - common_tokens) // c.freq_uncommon  # one token a word at most
        if uncommon < 0:
            raise ValueError(f"length {length} cannot hold {c.num_common} words repeated "
                             f"{c.freq_common} times and the question; raise length or lower "
                             f"num_common or freq_common.")
        return self.fit(length, make, uncommon)


class FrequentWordsTask(WordsTask):
    """Frequent words extraction (RULER FWE): name the most frequent words of a Zipf text."""

    config: FrequentWordsConfig

    def __init__(self, config: FrequentWordsConfig, *, seed: int) -> None:
        super().__init__(config, seed=seed)

    def example(self, rng: random.Random, split: str, length: int, depth: int | None) -> Example:
        c = self.config
        question = (f"\nQuestion: What are the {c.num_answers} most frequently appeared words in "
                    f"the above coded text? Answer: According to the coded text above, the "
                    f"{c.num_answers} most frequently appeared words are:")
        z = zeta(c.alpha)
        probe = self.tail(question, ["...."] * c.num_answers)
        room = length + 1 - sum(len(p) for p, _ in probe)
        n = max(room, 1)
        while sum(zipf_counts(n + 1, c.alpha, z)) <= room:
            n += 1
        counts = zipf_counts(n, c.alpha, z)
        top = counts[: c.num_answers + 2]  # the noise word, the answers and the next word
        if len(top) < c.num_answers + 2 or any(a <= b for a, b in zip(top[1:], top[2:], strict=False)):
            raise ValueError(f"length {length} is too short for {c.num_answers} words of strictly "
                             f"decreasing Zipf counts (alpha {c.alpha}); raise length.")
        words = self.word_list(rng, len(counts) - 1)

        def make(scale: int) -> tuple[list[list[int]], Tail]:
            kept = counts if scale >= n else zipf_counts(scale, c.alpha, z)
            if len(kept) < c.num_answers + 2 or kept[c.num_answers] <= kept[c.num_answers + 1]:
                raise ValueError(f"length {length} is too short for {c.num_answers} words of "
                                 f"strictly decreasing Zipf counts in this tokenizer; raise length.")
            listed = [w for w, k in zip(["...."] + words, kept, strict=False) for _ in range(k)]
            rng.shuffle(listed)
            return [self.word(w) for w in listed], self.tail(question, words[: c.num_answers])

        return self.fit(length, make, n)


def reference(task: WordsTask, example: Example) -> bool:
    """Recomputed from the tokens (symbols): count the words before the question; the answer
    is the most frequent ones (common words: the group repeated most, by first appearance;
    frequent words: by count, the noise word left out)."""
    tokens = example["tokens"]
    if task.text:  # the same over the words of the text before its question
        text = task.tokenizer.decode(tokens)
        context: list[Any] = text[: text.rindex("\nQuestion: What are the ")].split()
        noise: Any = "...."
        got = [task.tokenizer.decode(u).strip() for u in units_of(example)]
    else:
        ask, noise = task.sym("?", "...")
        context = tokens[: tokens.index(ask)]
        got = units_of(example)
    counts = {t: context.count(t) for t in context if t != noise}
    if isinstance(task, CommonWordsTask):
        top = max(counts.values())
        expected = [t for t in dict.fromkeys(context) if counts.get(t) == top]
    else:
        expected = sorted(counts, key=lambda t: -counts[t])[: task.config.num_answers]
    if isinstance(task, FrequentWordsTask) and len(set(counts.values())) < len(counts):
        ties = sorted(counts.values(), reverse=True)[: task.config.num_answers + 1]
        if len(set(ties)) < len(ties):
            return False  # the answer would not be unique
    return got == (expected if task.text else [[t] for t in expected]) and len(tokens) - 1 <= max(task.eval_lengths)


def _spec(name: str, build: Any) -> TaskSpec:
    return TaskSpec(name=name, build=build, reference=reference)


@hookimpl
def harness_register_task(register: Any) -> None:
    register(_spec("common_words", CommonWordsTask))
    register(_spec("frequent_words", FrequentWordsTask))

