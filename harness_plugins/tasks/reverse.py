"""``reverse``: output a random sequence of symbols in reverse order.

Source: ``length`` symbols drawn uniformly from ``vocab`` symbols; target: the same symbols
last to first. Unlike ``copy``, the first output depends on the last input, so the model
must carry the whole source to the point where it starts writing: the classic probe for
encoder-decoder models without attention (Sutskever et al., 2014) and the task where
attention makes the largest difference. Decoder-only models see ``src SEP tgt``.
Validation also reports ``greedy_exact``, the exact-match rate of free-running greedy
decoding (``decode_eval: false`` skips it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from harness.plugin import (  # a list of names, not logic: other plugins list many of the same
    Example,
    Ge,
    IntRange,
    Task,
    TaskConfig,
    TaskSpec,
    Vocab,
    greedy,
    hookimpl,
)


@dataclass
class ReverseConfig(TaskConfig):
    vocab: Annotated[int, Ge(1), IntRange(2, 64, log=True)] = 8  # distinct symbols
    # also decode every validation source freely and report ``greedy_exact``
    decode_eval: bool = True


class ReverseTask(Task):
    """Reverse a random symbol sequence (decoder-only: src SEP tgt)."""

    task_kind = "seq2seq"
    config: ReverseConfig
    #: the metrics :meth:`extra_metrics` adds (logged when ``decode_eval`` is on): a study may optimise them
    extra_metric_names = ("greedy_exact",)

    def __init__(self, config: ReverseConfig, *, seed: int) -> None:
        symbols = tuple(f"s{i}" for i in range(config.vocab))
        super().__init__(config, seed=seed, vocab=Vocab(symbols))

    def generate(self, split: str, length: int) -> list[Example]:
        return self.transduction_examples(split, length, lambda src: src[::-1])

    def extra_metrics(self, model: Any, batch: dict[str, Any], fmt: Any) -> dict[str, tuple[float, float]]:
        """``greedy_exact``: the share of sources reversed exactly when the model decodes
        freely (its own outputs fed back), stricter than teacher-forced accuracy."""
        if not self.config.decode_eval:
            return {}
        examples = batch["examples"]
        outputs = greedy(model, examples, fmt)
        right = sum(out == list(e["tgt"]) for out, e in zip(outputs, examples, strict=True))
        return {"greedy_exact": (float(right), float(len(examples)))}


@hookimpl
def harness_register_task(register: Any) -> None:
    register(TaskSpec(name="reverse", build=ReverseTask))
