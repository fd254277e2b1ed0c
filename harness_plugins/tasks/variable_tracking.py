"""``variable_tracking``: chains of variable assignments, RULER's multi-hop tracing task
(Hsieh et al. 2024, arXiv:2404.06654, "VT").

``num_chains`` chains of ``num_hops + 1`` assignments each are hidden in a haystack: the
first binds a fresh variable to a number (``X1 = 12345``), each next one a fresh variable to
the one before (``X2 = X1``). The question names the first chain's number; the answer is
every variable of that chain, in the order they were assigned. The other chains (their own
numbers and variables) are distractors. Each chain's statements appear in order.

**Symbols** (no ``path``): ``x3 = n7`` and ``x9 = x3`` (variables ``x0 x1 ...``, numbers
``n0 n1 ...``; ``variables`` and ``numbers`` of each), the question ``? n7 :``, the answer
``x3 , x9 , ...``. **Text** (``path``): RULER's statements "VAR ABCDE = 12345." and "VAR FGHIJ
= VAR ABCDE." (five capital letters, a five-digit number), the question "Question: Which
variables are assigned the value 12345? Answer:" and the names separated by commas.

**Depth** (``depths``, percent): the asked chain's first assignment sits at the example's
depth, its later ones at depths drawn uniformly between it and the question (so the whole
chain lies past the depth); the other chains anywhere. See :mod:`.ruler.base` for the rest.
"""

from __future__ import annotations

import random
import re
import string
from dataclasses import dataclass, field
from typing import Annotated, Any

from harness.plugin import Example, Ge, TaskSpec, hookimpl

from .ruler.base import DEFAULT_DEPTHS, RulerConfig, RulerTask, Tail, check_depths, units_of

MARKERS = ("=", "?", ":", ",")


@dataclass
class VariableTrackingConfig(RulerConfig):
    depths: tuple[Annotated[int, Ge(0)], ...] = field(default_factory=lambda: DEFAULT_DEPTHS)
    num_chains: Annotated[int, Ge(1)] = 1  # chains of assignments (the others distract)
    num_hops: Annotated[int, Ge(0)] = 4  # assignments after the first in each chain (RULER: 4)
    variables: Annotated[int, Ge(1)] = 64  # symbols: variable symbols x0, x1, ...
    numbers: Annotated[int, Ge(1)] = 32  # symbols: number symbols n0, n1, ...

    def __post_init__(self) -> None:
        super().__post_init__()
        check_depths(self.depths, self.num_val)
        chains, names = self.num_chains, self.num_chains * (self.num_hops + 1)
        if not self.path and (self.variables < names or self.numbers < chains):
            raise ValueError(f"{chains} chain(s) of {self.num_hops + 1} variables need "
                             f"variables >= {names} and numbers >= {chains} symbols.")


class VariableTrackingTask(RulerTask):
    """Variable tracking (RULER VT): follow a chain of assignments back to a number."""

    config: VariableTrackingConfig
    has_depths = True

    def __init__(self, config: VariableTrackingConfig, *, seed: int) -> None:
        symbols = tuple(f"x{i}" for i in range(config.variables)) + tuple(f"n{i}" for i in range(config.numbers))
        super().__init__(config, seed=seed, symbols=symbols + MARKERS)

    def _names(self, rng: random.Random, count: int) -> list[str]:
        if not self.text:
            return [f"x{i}" for i in rng.sample(range(self.config.variables), count)]
        names: list[str] = []
        while len(names) < count:
            name = "".join(rng.choices(string.ascii_uppercase, k=5))
            if name not in names:
                names.append(name)
        return names

    def _numbers(self, rng: random.Random, count: int) -> list[str]:
        if not self.text:
            return [f"n{i}" for i in rng.sample(range(self.config.numbers), count)]
        return [str(n) for n in rng.sample(range(10_000, 100_000), count)]

    def _statement(self, name: str, source: str, first: bool) -> list[int]:
        if self.text:
            return self.encode(f" VAR {name} = {source}." if first else f" VAR {name} = VAR {source}.")
        return self.sym(name, "=", source)

    def example(self, rng: random.Random, split: str, length: int, depth: int | None) -> Example:
        c = self.config
        hops = c.num_hops + 1
        names = self._names(rng, c.num_chains * hops)
        numbers = self._numbers(rng, c.num_chains)
        start = (depth / 100) if depth is not None else rng.random()
        needles: list[tuple[float, list[int]]] = []
        for chain in range(c.num_chains):
            chain_names = names[chain * hops: (chain + 1) * hops]
            if chain == 0:  # the asked chain: its start at the depth, the rest after it
                shares = [start] + sorted(start + (1 - start) * rng.random() for _ in range(hops - 1))
            else:
                shares = sorted(rng.random() for _ in range(hops))
            for hop, share in enumerate(shares):
                source = numbers[chain] if hop == 0 else chain_names[hop - 1]
                needles.append((share, self._statement(chain_names[hop], source, hop == 0)))
        asked = names[:hops]
        if self.text:
            question = self.encode(f"\nQuestion: Which variables are assigned the value "
                                   f"{numbers[0]}? Answer:")
            units = [self.encode(" " + n) for n in asked]
            separator, end = self.encode(","), self.encode(".")
        else:
            question = self.sym("?", numbers[0], ":")
            units, separator, end = [self.sym(n) for n in asked], self.sym(","), []

        def tail(order: list[int]) -> Tail:  # a chain's statements keep their order
            return [(question, False), *self.answer(units, separator, end)]

        return self.assemble(rng, split, length, needles, tail, depth)


def reference(task: VariableTrackingTask, example: Example) -> bool:
    """Recomputed from the tokens (symbols): follow every ``a = b`` of the context from the
    asked number; the answer is the variables reached, in the order they were assigned."""
    tokens = example["tokens"]
    if task.text:  # the same, from the text's "VAR A = 12345." and "VAR B = VAR A."
        text = task.tokenizer.decode(tokens)
        context = text[: text.index("\nQuestion: Which variables are assigned")]
        value = re.search(r"assigned the value (\d+)\?", text)
        names = {value[1]} if value else set()
        expected = []
        for name, source in re.findall(r"VAR (\w+) = (?:VAR )?(\w+)\.", context):
            if source in names:
                names.add(name)
                expected.append(name)
        return [task.tokenizer.decode(u).strip() for u in units_of(example)] == expected
    eq, ask = task.sym("=", "?")
    q = tokens.index(ask)
    context = tokens[:q]
    reached = {tokens[q + 1]}
    chain: list[list[int]] = []
    for i in range(1, len(context) - 1):
        if context[i] == eq and context[i + 1] in reached:
            reached.add(context[i - 1])
            chain.append([context[i - 1]])
    return units_of(example) == chain and len(tokens) - 1 in (task.train_length, *task.eval_lengths)


@hookimpl
def harness_register_task(register: Any) -> None:
    register(TaskSpec(name="variable_tracking", build=VariableTrackingTask, reference=reference))
