"""``listops``: Long Range Arena's ListOps, generated offline from the seed.

Nangia & Bowman (2018), "ListOps: A Diagnostic Dataset for Latent Tree Learning", as
re-generated for the Long Range Arena (Tay et al., ICLR 2021, arXiv:2011.04006) by its
``lra_benchmarks/data/listops.py``, whose grammar and sampling this task follows (written
from its description, not copied). An example is a prefix expression over the digits 0-9::

    [MAX 2 9 [MIN 4 7 ] 0 ]        -> 9

with four operators: ``[MAX``, ``[MIN``, ``[MED`` (the median; of an even count, the mean of
the two middle values rounded down, as LRA's ``int(np.median(...))``) and ``[SM`` (the sum
modulo 10). The label, 10 classes, is the expression's value.

Sampling (as LRA's ``generate_tree``): a node at depth d < ``max_depth`` (the root is at depth
1) is an operator with probability 0.25, else a digit drawn uniformly; at ``max_depth`` it is
always a digit. An operator is drawn uniformly from the four and takes k arguments, k uniform
in 2..``max_args``, each a node one level deeper. A tree is kept only when its token count
(operators, digits and closing brackets; LRA's ``length``) lies in
[``min_length``, ``length``]; others are redrawn. Trees are distinct within a split, and no
split repeats a tree of another (LRA draws one set of distinct trees and cuts it into
splits).

LRA's defaults: ``max_depth`` 10, ``max_args`` 10, 500 < tokens < 2,000, 96,000 / 2,000 /
2,000 examples (here ``length`` 2000, ``min_length`` 500, ``num_train`` 96000, ``num_val``
2000: every evaluation length gets ``num_val`` validation and ``num_val`` test trees). Two
differences of form, none of distribution beyond the bounds: LRA keeps 500 < n < 2000 (strict)
where this task keeps 500 <= n <= 2000; and LRA writes parentheses around each (operator,
argument) pair in its TSV, which carry nothing the brackets do not, and tokenizes that text
with ``tfds``' default ``Tokenizer`` (alphanumeric tokens only, so its models never see the
closing bracket). Here the closing bracket is a token, as in the original ListOps.

``length`` is the longest example in tokens. An evaluation length n > ``length`` draws trees
of ``min_length`` to n tokens (longer expressions, same grammar). Short lengths: any
``min_length`` >= 1 works; trees of one token are single digits.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Annotated, Any

from harness.plugin import Example, Ge, IntRange, Task, TaskConfig, TaskSpec, Vocab, hookimpl
from harness_plugins.tasks.lra import memo

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
DIGITS = tuple(str(d) for d in range(10))
CLOSE = "]"
OPERATOR_P = 0.25  # LRA's VALUE_P: a node above max_depth is an operator with this probability
#: draws of trees per wanted example before giving up (the bounds admit almost no tree)
MAX_DRAWS_PER_EXAMPLE = 20_000


@dataclass
class ListOpsConfig(TaskConfig):
    length: Annotated[int, Ge(1), IntRange(64, 4096, log=True)] = 2000  # most tokens per example
    min_length: Annotated[int, Ge(1)] = 500  # fewest tokens per example
    max_depth: Annotated[int, Ge(1), IntRange(2, 20)] = 10  # the root is depth 1
    max_args: Annotated[int, Ge(2), IntRange(2, 10)] = 10  # arguments per operator: 2..max_args
    num_train: Annotated[int, Ge(1)] = 96_000
    num_val: Annotated[int, Ge(1)] = 2_000

    def __post_init__(self) -> None:
        super().__post_init__()  # evaluation lengths are >= length
        if self.min_length > self.length:
            raise ValueError(f"min_length ({self.min_length}) is longer than length ({self.length}); "
                             f"lower min_length or raise length.")
        if self.min_length > 1 and self.max_depth < 2:
            raise ValueError(f"max_depth 1 allows only single digits (1 token), shorter than "
                             f"min_length {self.min_length}; raise max_depth.")


def evaluate(op: str, args: list[int]) -> int:
    """The value of one operator over its argument values."""
    if op == "[MIN":
        return min(args)
    if op == "[MAX":
        return max(args)
    if op == "[SM":
        return sum(args) % 10
    s, n = sorted(args), len(args)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) // 2  # [MED


class _TooLong(Exception):  # noqa: N818 (control flow: the tree passed the length bound)
    pass


class _Tree:
    """One draw of a tree: its tokens (symbol indices) and value, abandoned once too long."""

    def __init__(self, rng: random.Random, cfg: ListOpsConfig, limit: int) -> None:
        self.rng, self.cfg, self.limit = rng, cfg, limit
        self.tokens: list[str] = []

    def node(self, depth: int) -> int:
        rng, cfg = self.rng, self.cfg
        if depth >= cfg.max_depth or rng.random() > OPERATOR_P:
            digit = rng.randrange(10)
            self.emit(DIGITS[digit])
            return digit
        k = rng.randint(2, cfg.max_args)
        at = len(self.tokens)
        self.emit("")  # the operator's place: LRA draws it after the arguments
        values = [self.node(depth + 1) for _ in range(k)]
        op = rng.choice(OPERATORS)
        self.tokens[at] = op
        self.emit(CLOSE)
        return evaluate(op, values)

    def emit(self, token: str) -> None:
        self.tokens.append(token)
        if len(self.tokens) > self.limit:
            raise _TooLong


class ListOpsTask(Task):
    """LRA ListOps: the value (0-9) of a nested MAX/MIN/MED/SUM_MOD expression."""

    task_kind = "classification"
    config: ListOpsConfig

    def __init__(self, config: ListOpsConfig, *, seed: int) -> None:
        super().__init__(config, seed=seed, vocab=Vocab((*DIGITS, *OPERATORS, CLOSE)), num_classes=10)
        self.ids = {s: i for i, s in enumerate(self.vocab.symbols, self.vocab.first_symbol)}

    def draw(self, rng: random.Random, length: int) -> tuple[list[str], int] | None:
        """One tree drawn as LRA does: (tokens, value), or None when outside the bounds."""
        tree = _Tree(rng, self.config, length)
        try:
            value = tree.node(1)
        except _TooLong:
            return None
        return (tree.tokens, value) if len(tree.tokens) >= self.config.min_length else None

    def generate(self, split: str, length: int) -> list[Example]:
        return memo.split(self, split, length, lambda: self._generate(split, length))

    def _generate(self, split: str, length: int) -> list[Example]:
        rng = random.Random(self.split_seed(split, length))
        seen: set[tuple[int, ...]] = set()
        earlier = {"train": (), "val": ("train",), "test": ("train", "val")}[split]
        for other in earlier:  # never repeat a tree of an earlier split
            n = self.train_length if other == "train" else length
            seen |= {tuple(e["tokens"]) for e in self.examples(other, n)}
        want = self.split_size(split)
        out: list[Example] = []
        for _ in range(want * MAX_DRAWS_PER_EXAMPLE):
            drawn = self.draw(rng, length)
            if drawn is None:
                continue
            tokens = [self.ids[t] for t in drawn[0]]
            key = tuple(tokens)
            if key in seen:
                continue
            seen.add(key)
            out.append({"tokens": tokens, "label": drawn[1]})
            if len(out) == want:
                return out
        raise ValueError(
            f"listops found only {len(out)} of {want} distinct {split} trees of "
            f"{self.config.min_length}..{length} tokens with max_depth={self.config.max_depth}, "
            f"max_args={self.config.max_args}: widen the length range (min_length, length), "
            f"raise max_depth or max_args, or ask for fewer examples."
        )


def reference(task: ListOpsTask, example: Example) -> bool:
    """True when the label is the value of the expression (a stack evaluation, independent
    of the generator's recursion) and the tokens lie in the task's bounds."""
    symbols = [task.vocab.token(i) for i in example["tokens"]]
    stack: list[list[Any]] = []
    value: int | None = None
    for s in symbols:
        if s in OPERATORS:
            stack.append([s])
        elif s == CLOSE:
            op, *args = stack.pop()
            value = evaluate(op, args)
            if stack:
                stack[-1].append(value)
        else:
            value = int(s)
            if stack:
                stack[-1].append(value)
    n = len(symbols)
    return not stack and value == example["label"] and task.config.min_length <= n


@hookimpl
def harness_register_task(register: Any) -> None:
    register(TaskSpec(name="listops", build=ListOpsTask, reference=reference))
