"""Tasks: the base class every task plugin subclasses, its config, vocabularies and what a
model factory learns about its task.

A task is plain Python (no torch at import): it generates or loads examples as lists of
token ids, deterministically from its seed. The examples' form is fixed by the task kind
(see :mod:`harness.data.formats`, which turns them into batches).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from annotated_types import Ge

from harness.data.vocab import PAD, Example, Vocab
from harness.params import IntRange

if TYPE_CHECKING:
    from harness.data.formats import BatchFormat

@dataclass
class TaskConfig:
    """Fields every task config has; a task's config subclasses this one."""

    length: Annotated[int, Ge(1), IntRange(4, 4096, log=True)] = 16  # training length
    eval_lengths: tuple[Annotated[int, Ge(1)], ...] = ()  # evaluated too, each >= length
    num_train: Annotated[int, Ge(1)] = 10_000  # training examples
    num_val: Annotated[int, Ge(1)] = 500  # validation (and test) examples per length

    def separate_documents(self) -> bool | None:
        """Whether the task keeps the documents of a window apart (``Task.document_token``),
        which the model must support (``ModelSpec.separates_documents``): known before the
        task is built, so that the plan refuses a model that cannot. None (the default): the
        task's sequences are not windows of packed documents; False: they are, packed."""
        return None

    def __post_init__(self) -> None:
        shorter = sorted({n for n in self.eval_lengths if n < self.length})
        if shorter:
            raise ValueError(
                f"eval_lengths {shorter} are shorter than the training length ({self.length}): "
                f"evaluation lengths measure how a model extrapolates past the length it was "
                f"trained at, which is always evaluated. Drop them from eval_lengths, or lower "
                f"length."
            )


class Task:
    """Base class of tasks. Subclasses set ``task_kind``, ``vocab`` and implement ``generate``.

    ``length`` is the training length in the task's own unit (symbols to copy, characters
    of context, ...); ``eval_lengths`` are the lengths evaluated after training (the
    training length is always included).
    """

    #: lm, seq2seq, classification or tagging: fixes the examples' form (see the module docs)
    task_kind: ClassVar[str] = "lm"
    #: Log perplexity and bits per token (language-modelling tasks).
    report_perplexity: ClassVar[bool] = False
    #: What a model factory learns from the task beyond its format (``TaskInfo.extra``), e.g.
    #: ``{"two_tower": True}``: each input is ``doc1 SEP doc2`` (``lra_retrieval``).
    model_hints: ClassVar[dict[str, Any]] = {}
    #: Streams its training data from :meth:`train_batches` (task kind ``lm``) instead of a
    #: list of ``num_train`` examples: a run draws fresh windows every step and never builds
    #: the training split; ``examples("train", n)`` is then only a small sample (for checks
    #: and inspection), never trained on.
    streams: ClassVar[bool] = False
    #: Per token id, the UTF-8 bytes of text it stands for (0 for special tokens), or None.
    #: When set, validation also logs bits per byte (``bpb``): the scored tokens' total bits
    #: over the bytes of the text they spell, comparable across tokenizers.
    token_bytes: Sequence[int] | None = None
    #: Keep the documents of a window apart: the token starting each one (the model learns
    #: it as ``TaskInfo.document_token``); None: windows are one stream. A task whose config
    #: asks for it says so in ``TaskConfig.separate_documents``, before it is built.
    document_token: int | None = None
    #: Text to token ids and back (:class:`harness.data.tokenizers.Tokenizer`) for a task over
    #: text (``corpus_lm``), or None: what ``harness generate`` and ``harness eval`` read text with.
    tokenizer: Any = None
    #: The params :meth:`data_summary` states (where the data came from): a report names the
    #: data actually read in their place, not the values the config gave.
    data_params: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: TaskConfig, *, seed: int, vocab: Vocab, num_classes: int | None = None):
        self.config = config
        self.seed = seed
        self.vocab = vocab
        self.num_classes = num_classes
        self._cache: dict[tuple[str, int], Sequence[Example]] = {}

    @property
    def train_length(self) -> int:
        return self.config.length

    @property
    def eval_lengths(self) -> tuple[int, ...]:
        return tuple(sorted({self.config.length, *self.config.eval_lengths}))

    def split_size(self, split: str) -> int:
        return self.config.num_train if split == "train" else self.config.num_val

    def split_seed(self, split: str, length: int) -> int:
        """A seed per (task seed, split, length): splits never share a random stream."""
        return self.seed * 1_000_003 + {"train": 1, "val": 2, "test": 3}[split] * 10_007 + length

    def data_summary(self) -> str | None:
        """What the task read, in one line, for a task on the user's files (a prepared
        corpus: its folder, sources, tokenizer, tokens per split and its manifest's hash);
        recorded on the run (tag ``harness.data``) and quoted by a study's report. Default:
        None (generated data: the params say it all)."""
        return None

    def data_identity(self) -> dict[str, str]:
        """What the task read, as digests a later use of the run compares with the data as it
        is then (:mod:`harness.run.identity`): ``data_sha256`` (a prepared corpus: its
        manifest's SHA-256) and ``data`` (where, in words). Default: none (generated data:
        the params say it all; the vocabulary and tokenizer are compared for every task)."""
        return {}

    def examples(self, split: str, length: int) -> Sequence[Example]:
        """The examples of ``split`` ("train", "val" or "test") at ``length`` (cached)."""
        key = (split, length)
        if key not in self._cache:
            self._cache[key] = self.generate(split, length)
        return self._cache[key]

    def generate(self, split: str, length: int) -> Sequence[Example]:
        raise NotImplementedError

    def train_batches(self, length: int, batch_size: int, *, seed: int, rank: int = 0,
                      world: int = 1) -> Iterator[Any]:
        """A streaming task's training data (``streams = True``): an endless iterator of
        integer arrays of shape ``(batch_size, length + 1)``, each row a window of token ids
        whose every next token is scored. Process ``rank`` of ``world`` gets its own
        windows: no two processes read the same window in one step. ``seed`` is the run's
        training seed (the order of the data), the task's own seed its data."""
        raise NotImplementedError(f"{type(self).__name__} does not stream (streams = False)")

    def transduction_examples(self, split: str, length: int,
                              target: Callable[[list[int]], list[int]]) -> list[Example]:
        """Seq2seq examples of a symbol task (copy, reverse, sort): each source is ``length``
        symbols drawn uniformly from the vocabulary's symbols, its target ``target(source)``."""
        rng = random.Random(self.split_seed(split, length))
        first, n = self.vocab.first_symbol, len(self.vocab.symbols)
        out = []
        for _ in range(self.split_size(split)):
            src = [first + rng.randrange(n) for _ in range(length)]
            out.append({"src": src, "tgt": target(src)})
        return out

    def extra_metrics(self, model: Any, batch: dict[str, Any], fmt: BatchFormat) -> dict[str, tuple[float, float]]:
        """Task-specific metrics on one validation batch, as (sum, count) pairs that are
        summed over batches. Default: none. (Greedy-decoding metrics such as phoneme error
        rate go here.)"""
        return {}

    def statistics(self, model: Any, batch: dict[str, Any], fmt: BatchFormat, logits: Any) -> dict[str, float]:
        """Counts from one validation batch (``logits``: the model's output on it), summed over
        the whole validation set and over devices, then turned into metrics by
        :meth:`metrics_from_statistics`: for metrics that are not a ratio of two sums
        (macro-F1 from per-class counts, chrF and BLEU from n-gram counts). Every batch must
        return the same names (devices sum them name by name). Default: none."""
        return {}

    def metrics_from_statistics(self, totals: dict[str, float]) -> dict[str, float]:
        """Metrics from the :meth:`statistics` summed over a validation set (empty when the
        task has none). Default: none."""
        return {}


@dataclass
class TaskInfo:
    """What a model factory learns about the task it will be trained on."""

    format: str  # the name of the batch format the model receives (lm, seq2seq, ...)
    vocab_size: int
    max_length: int  # the longest input the model sees at the training length
    num_classes: int | None = None
    pad_id: int = PAD
    extra: dict[str, Any] = field(default_factory=dict)
    #: keep documents apart: the token that starts each document of a window (``<eod>``,
    #: which ends the one before), where attention is masked and recurrent state reset
    #: (``harness.nn.documents``); None: a window is one stream (packed documents)
    document_token: int | None = None

    def record(self) -> dict[str, Any]:
        """Every field, as JSON: what a saved model keeps (``model.json``, a Hub folder's
        ``config.json``) so that the model built again from it is the model that trained.
        A field added here travels through every save and load without another change."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> TaskInfo:
        """The info :meth:`record` wrote (fields it does not know are ignored; missing ones
        take their defaults: :func:`harness.run.trained.info_of` fills those a model needs)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})




def lm_windows(
    stream: Sequence[int], length: int, count: int | None = None, score_last: int | None = None
) -> list[Example]:
    """Language-modelling examples cut from a token stream.

    ``score_last=None``: non-overlapping windows of ``length`` predicted tokens, all scored.
    ``score_last=k``: windows of ``length`` tokens advancing by ``k``, scoring only their
    last ``k`` tokens (the "sliding" protocol of Press et al., 2022): every scored token
    sees at least ``length - k`` tokens of context. ``count`` caps the number of windows.
    """
    stride = length if score_last is None else score_last
    if not 0 < stride <= length:
        raise ValueError(f"score_last must be in [1, {length}], got {score_last}")
    out: list[Example] = []
    start = 0
    while start + length + 1 <= len(stream) and (count is None or len(out) < count):
        tokens = list(stream[start: start + length + 1])
        mask = [True] * length if score_last is None else [i >= length - stride for i in range(length)]
        out.append({"tokens": tokens, "loss_mask": mask})
        start += stride
    return out
