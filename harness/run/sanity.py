"""Settings that are legal but meaningless: warned about before training, and recorded.

Each value below passes its bounds, yet the run it configures cannot show what the user
meant: a warm-up longer than the training, a batch larger than the training set, a time cap
that ends the run before its first step, label smoothing that leaves little to learn, a
learning rate or weight decay far outside what any optimiser trains with. Components add
their own (a RoPE ``scale`` that ``scaling: none`` ignores, a ``copy`` vocabulary of one
symbol) through an optional method of their config dataclass::

    def meaningless(self) -> list[str]:
        return ["scale is ignored with scaling: none"] if ... else []

:func:`meaningless` collects them; the pipeline prints each (``warning: ...``) and records
them on the run as the tag ``harness.warnings``. Nothing here refuses a run: a setting that
cannot work at all is a bound (:mod:`harness.params`) or a config error instead.
"""

from __future__ import annotations

from typing import Any

from harness.run.plan import Plan
from harness.runtime.threads import usable_cores

#: the largest learning rate and weight decay a run is trained with without a warning
MAX_SENSIBLE_LR = 1.0
MAX_SENSIBLE_WEIGHT_DECAY = 1.0
#: label smoothing at or above this puts half of every target's probability on wrong tokens
MAX_SENSIBLE_SMOOTHING = 0.5
#: passes over a prepared corpus's train split a run may make without a warning
MAX_SENSIBLE_PASSES = 4
#: a wall-clock cap below this ends the training before its first step
MIN_SENSIBLE_TIME_S = 1.0


def corpus_passes(task_params: Any, steps: int, batch_size: int) -> tuple[float, int] | None:
    """How many times ``steps`` of ``batch_size`` windows read a prepared corpus's train split
    over, and its tokens: for a streaming task whose params know the split's size
    (``train_split_tokens``, from the manifest where prepared), else None."""
    count = getattr(task_params, "train_split_tokens", None)
    length = getattr(task_params, "length", None)
    tokens = count() if callable(count) else None
    if not tokens or not isinstance(length, int):
        return None
    return steps * batch_size * length / tokens, tokens  # per process: several devices read more


def _passes_over_the_corpus(p: Plan) -> list[str]:
    """A prepared corpus read more than :data:`MAX_SENSIBLE_PASSES` times over: the budget
    outgrew the corpus."""
    t = p.config.train
    passes = corpus_passes(p.task.params, t.max_steps, t.batch_size)
    if passes is None or passes[0] <= MAX_SENSIBLE_PASSES:
        return []
    times, tokens = passes
    return [f"this run trains on {round(times * tokens):,} tokens, {times:.1f} times the corpus's "
            f"train split ({tokens:,} tokens): past a few passes the loss also measures how well a "
            f"model memorises a small text. Prepare a larger corpus for this budget (harness data "
            f"prepare ...; task.params.path)"]


def meaningless(p: Plan) -> list[str]:
    """The warnings of a plan: the training settings', then each component's own."""
    t = p.config.train
    out: list[str] = []
    if "warmup_steps" in t.model_fields_set and t.warmup_steps >= t.max_steps:  # not the default's
        out.append(f"train.warmup_steps ({t.warmup_steps}) >= train.max_steps ({t.max_steps}): the "
                   f"learning rate never reaches train.lr")
    num_train = getattr(p.task.params, "num_train", None)
    if isinstance(num_train, int) and t.batch_size > num_train:
        out.append(f"train.batch_size ({t.batch_size}) is larger than the training set "
                   f"(task.params.num_train={num_train}): every batch is the whole set")
    out += _passes_over_the_corpus(p)
    if t.max_time_s is not None and t.max_time_s < MIN_SENSIBLE_TIME_S:
        out.append(f"train.max_time_s ({t.max_time_s:g} s) ends the training before it can take "
                   f"a step")
    if t.num_threads is not None and t.num_threads > usable_cores():
        out.append(f"train.num_threads ({t.num_threads}) is more than the {usable_cores()} usable "
                   f"cores: the run uses {usable_cores()}")
    if t.label_smoothing >= MAX_SENSIBLE_SMOOTHING:
        out.append(f"train.label_smoothing ({t.label_smoothing:g}) puts at least half of every "
                   f"target's probability on other tokens: there is little left to learn")
    if t.lr > MAX_SENSIBLE_LR:
        out.append(f"train.lr ({t.lr:g}) is above {MAX_SENSIBLE_LR:g}: training almost surely "
                   f"diverges")
    if t.weight_decay > MAX_SENSIBLE_WEIGHT_DECAY:
        out.append(f"train.weight_decay ({t.weight_decay:g}) is above "
                   f"{MAX_SENSIBLE_WEIGHT_DECAY:g}: the weights decay faster than they learn")
    for role, comp in p.components().items():
        own = getattr(comp.params, "meaningless", None)
        if callable(own):
            out += [f"{_where(role)}.params: {text}" for text in own()]
    return out


def _where(role: str) -> str:
    """The config path of a component's role (``attention.cross`` -> model.attention_roles.cross)."""
    if role in ("task", "model"):
        return role
    if role.startswith("attention."):
        return "model.attention_roles." + role.split(".", 1)[1]
    return "model." + role
