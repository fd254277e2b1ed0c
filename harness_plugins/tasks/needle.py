"""``needle``: needle in a haystack, RULER's retrieval tasks (Hsieh et al. 2024,
arXiv:2404.06654, "NIAH"; the template of its ``niah`` generator).

``num_keys`` needles with distinct keys, each key with ``num_values`` values (each value its
own needle), are hidden in a haystack; ``num_queries`` of the keys are asked for, and the
answer to each is all its values. RULER's variants are settings of these three:

============  ========  ==========  ===========  =======================================
variant       num_keys  num_values  num_queries  what it adds
============  ========  ==========  ===========  =======================================
single        1         1           1            one needle (passkey retrieval)
multikey      4         1           1            three distractor needles, other keys
multivalue    1         4           1            four values of one key, all wanted
multiquery    4         1           4            four keys asked, every answer wanted
============  ========  ==========  ===========  =======================================

**Symbols** (no ``path``): a needle is ``k7 is v12`` (``value_length`` value symbols; keys
``k0 k1 ...``, values ``v0 v1 ...``), a question ``? k7 =`` followed by the answer, the
values of ``k7`` in the order their needles appear, separated by ``,``; the haystack is
random words ``w0 w1 ...`` (never a key, value or marker). **Text** (``path``): RULER's
sentence, "One of the special magic numbers for {key} is: {value}.", a made-up key word and a
``value_digits``-digit number, and the question "What is the special magic number for
{key}? The special magic number for {key} is:" (plural forms for several values) followed by
the answer. Several queries each get their own question and answer, one after another (RULER
asks them in one sentence; an answer in a fixed order is what a teacher-forced score needs).

**Depth** (``depths``, percent): the first needle of the first queried key sits at the
example's depth; every other needle (its other values, distractors, other queried keys) at
a depth drawn uniformly. See :mod:`.ruler.base` for lengths, haystacks and the score.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Annotated, Any

from harness.plugin import Example, Ge, TaskSpec, hookimpl

from .ruler.base import DEFAULT_DEPTHS, RulerConfig, RulerTask, Tail, check_depths, units_of

MARKERS = ("is", "?", "=", ",")


@dataclass
class NeedleConfig(RulerConfig):
    depths: tuple[Annotated[int, Ge(0)], ...] = field(default_factory=lambda: DEFAULT_DEPTHS)
    num_keys: Annotated[int, Ge(1)] = 1  # needles with distinct keys (those not asked: distractors)
    num_values: Annotated[int, Ge(1)] = 1  # values per key, each its own needle
    num_queries: Annotated[int, Ge(1)] = 1  # keys asked
    keys: Annotated[int, Ge(1)] = 64  # symbols: key symbols k0, k1, ...
    values: Annotated[int, Ge(1)] = 64  # symbols: value symbols v0, v1, ...
    value_length: Annotated[int, Ge(1)] = 1  # symbols: value symbols per value
    value_digits: Annotated[int, Ge(1)] = 7  # text: digits of each value (RULER: 7)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_depths(self.depths, self.num_val)
        if self.num_queries > self.num_keys:
            raise ValueError(f"num_queries ({self.num_queries}) asks for more keys than there are "
                             f"needles (num_keys {self.num_keys}); raise num_keys.")
        if not self.path and self.keys < self.num_keys:
            raise ValueError(f"keys={self.keys} symbols cannot give {self.num_keys} distinct keys.")


class NeedleTask(RulerTask):
    """Needle in a haystack (RULER NIAH): single, multi-key, multi-value, multi-query."""

    config: NeedleConfig
    has_depths = True

    def __init__(self, config: NeedleConfig, *, seed: int) -> None:
        symbols = tuple(f"k{i}" for i in range(config.keys)) + tuple(f"v{i}" for i in range(config.values))
        super().__init__(config, seed=seed, symbols=symbols + MARKERS)

    def _value(self, rng: random.Random) -> list[int]:
        if self.text:
            digits = self.config.value_digits
            return self.encode(" " + str(rng.randrange(10 ** (digits - 1), 10 ** digits)))
        return self.sym(*(f"v{rng.randrange(self.config.values)}" for _ in range(self.config.value_length)))

    def _keys(self, rng: random.Random) -> list[Any]:
        if self.text:
            words: list[str] = []
            while len(words) < self.config.num_keys:
                word = self.made_up_word(rng)
                if word not in words:
                    words.append(word)
            return words
        return [f"k{i}" for i in rng.sample(range(self.config.keys), self.config.num_keys)]

    def _needle(self, key: Any, value: list[int]) -> list[int]:
        if self.text:
            return (self.encode(f" One of the special magic numbers for {key} is:") + value
                    + self.encode("."))
        return self.sym(key, "is") + value

    def _question(self, key: Any) -> list[int]:
        if self.text:
            if self.config.num_values == 1:
                return self.encode(f"\nWhat is the special magic number for {key}? The special "
                                   f"magic number for {key} is:")
            return self.encode(f"\nWhat are all the special magic numbers for {key}? The special "
                               f"magic numbers for {key} are:")
        return self.sym("?", key, "=")

    def example(self, rng: random.Random, split: str, length: int, depth: int | None) -> Example:
        c = self.config
        keys = self._keys(rng)
        values = [[self._value(rng) for _ in range(c.num_values)] for _ in keys]
        asked = rng.sample(range(c.num_keys), c.num_queries)
        placed = (depth / 100) if depth is not None else rng.random()
        needles: list[tuple[float, list[int]]] = []
        owner: list[tuple[int, int]] = []  # (key, value index) of each needle
        for k, key in enumerate(keys):
            for v, value in enumerate(values[k]):
                share = placed if (k == asked[0] and v == 0) else rng.random()
                needles.append((share, self._needle(key, value)))
                owner.append((k, v))
        separator = self.encode(",") if self.text else self.sym(",")
        end = self.encode(".") if self.text else []

        def tail(order: list[int]) -> Tail:
            pieces: Tail = []
            for k in asked:  # each key's values in the order their needles appear
                found = [owner[i][1] for i in order if owner[i][0] == k]
                pieces.append((self._question(keys[k]), False))
                pieces += self.answer([values[k][v] for v in found], separator, end)
            return pieces

        return self.assemble(rng, split, length, needles, tail, depth)

def reference(task: NeedleTask, example: Example) -> bool:
    """Recomputed from the tokens alone (symbols): for every question ``? k =``, the answer's
    units are the values that follow each ``k is`` in the context, in order."""
    tokens = example["tokens"]
    if task.text:  # the same, from the text: every "magic numbers for KEY is: VALUE." in order
        text = task.tokenizer.decode(tokens)
        context = text[: re.search(r"\nWhat (is|are all) the special magic", text).start()]
        needles = re.findall(r"special magic numbers for (\w+) is: (\d+)\.", context)
        asked = re.findall(r"\nWhat (?:is|are all) the special magic numbers? for (\w+)\?", text)
        wanted = [[v for k, v in needles if k == key] for key in asked]
        return [task.tokenizer.decode(u).strip() for u in units_of(example)] == sum(wanted, [])
    is_, ask, eq = task.sym("is", "?", "=")
    first_question = tokens.index(ask) if ask in tokens else len(tokens)
    context = tokens[:first_question]
    width = task.config.value_length
    expected: list[list[int]] = []
    for i, t in enumerate(tokens):
        if t == ask and i + 2 < len(tokens) and tokens[i + 2] == eq:
            key = tokens[i + 1]
            expected += [context[j + 2: j + 2 + width] for j in range(len(context) - 1)
                         if context[j] == key and context[j + 1] == is_]
    return units_of(example) == expected and len(tokens) - 1 in (task.train_length, *task.eval_lengths)

@hookimpl
def harness_register_task(register: Any) -> None:
    register(TaskSpec(name="needle", build=NeedleTask, reference=reference))
