"""Refuse, before anything is allocated, a run that cannot fit in the device's memory.

The check builds the model on PyTorch's ``meta`` device (shapes only, no storage: instant
even for ``d_model=1e12``) and compares a **lower bound** of what training needs with the
memory available now:

    parameters x 4 bytes x (1 weights + 1 gradients + optimiser state: 2 for Adam(W),
    1 for SGD with momentum)  +  2 x the logits of one batch (batch x length x vocabulary x
    4 bytes, and their gradient)

A lower bound, not a guess: a run refused here could never have trained, and a run that
might fit is never refused (refusing on an over-estimate would handicap the larger
architectures of a comparison). What the bound leaves out (other activations, the
allocator's slack) can still run out during training; that fails cleanly
(:mod:`harness.run.failure`).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.data.tasks import TaskInfo
from harness.errors import HarnessError, OutOfMemory, shorten
from harness.run.accumulate import accumulation
from harness.run.failure import configuration, is_out_of_memory
from harness.run.plan import Plan

GiB = 2**30


@dataclass(frozen=True)
class Estimate:
    parameters: int
    state_bytes: int  # weights, gradients, optimiser state
    logits_bytes: int  # logits of one batch and their gradient (or of one evaluation batch, if more)
    pass_examples: int = 0  # the examples of that batch
    pass_length: int = 0  # its input length
    evaluating: bool = False  # the larger batch is an evaluation's (a longer eval_lengths)

    @property
    def total(self) -> int:
        return self.state_bytes + self.logits_bytes


def available_bytes(device: Any) -> int | None:
    """Memory a run can still allocate on ``device``; None where unknown."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    available = None
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        with contextlib.suppress(OSError, ValueError), open(limit_file) as f:
            limit = int(f.read().strip())  # "max" (no limit) raises ValueError
            usage_file = limit_file.replace("memory.max", "memory.current").replace(
                "limit_in_bytes", "usage_in_bytes")
            with open(usage_file) as g:
                room = limit - int(g.read().strip())
            available = room if available is None else min(available, room)
    return available


def _optimizer_factor(p: Plan) -> int:
    t = p.config.train
    if t.optimizer in ("adam", "adamw"):
        return 2
    return 1 if t.momentum else 0


def estimate(p: Plan, info: TaskInfo, build_model: Callable[[Plan, TaskInfo], Any]) -> Estimate | None:
    """The lower bound of a run's training memory; None if the model cannot be built on the
    meta device (then it is built for real, and a failed allocation is still reported)."""
    import torch

    try:
        with warnings.catch_warnings(), torch.device("meta"):
            warnings.simplefilter("ignore")
            model = build_model(p, info)
    except (MemoryError, OverflowError) as exc:  # the plugin allocated host memory itself
        raise OutOfMemory(f"the model cannot be built with {configuration(p)}: {type(exc).__name__} "
                          f"({shorten(str(exc), 300)}). Nothing was trained or recorded. Lower the model's size.") from None
    except HarnessError:
        return None  # a config error: the real build reports it
    except Exception as exc:  # a plugin that needs real tensors to build (not meta-safe)
        if is_out_of_memory(exc) or "overflow" in str(exc).lower():  # ... and asked for too much
            raise OutOfMemory(f"the model cannot be built with {configuration(p)}: {type(exc).__name__}: "
                              f"{str(exc).strip().splitlines()[0][:300]}. Nothing was trained or "
                              f"recorded. Lower the model's size.") from None
        return None
    params = sum(t.numel() for t in model.parameters() if t.requires_grad)
    buffers = sum(t.numel() for t in model.buffers())
    state = 4 * (params * (2 + _optimizer_factor(p)) + buffers)
    width = info.num_classes if info.num_classes else info.vocab_size
    length = 1 if info.format in ("classification", "seq2seq") else info.max_length
    micro = accumulation(p.config.train)[0]
    logits = 2 * 4 * micro * length * width  # one micro-batch's
    longest, rows = eval_pass(p, length)
    if rows * longest > micro * length:  # validation at a longer eval_lengths: one full batch's
        return Estimate(params, state, 2 * 4 * rows * longest * width, rows, longest, True)
    return Estimate(params, state, logits, micro, length)


def eval_pass(p: Plan, length: int) -> tuple[int, int]:
    """The longest input an evaluation reads (``length`` scaled as the task's longest
    ``eval_lengths`` is to its training length) and the examples of its batch (the training
    batch, at most ``num_val``): validation runs every evaluation length, not only ``length``."""
    c = p.task.params
    try:
        train, longest = int(c.length), max((int(n) for n in getattr(c, "eval_lengths", ()) or ()), default=0)
        rows = min(int(p.config.train.batch_size), int(c.num_val))
    except (AttributeError, TypeError, ValueError):
        return length, 0
    if longest <= train or length <= 1:
        return length, 0
    return length * longest // train, rows


#: bytes a generated example holds per token, at least (one 8-byte list slot; the int objects
#: of small token ids are shared)
TOKEN_BYTES = 8


def data_tokens(p: Plan) -> int | None:
    """A lower bound of the tokens a task's data holds, from the sizes every task config has
    (``num_train`` examples at ``length``, unless the task streams its training data, and
    ``num_val`` validation examples at each evaluation length); None for a config without
    them."""
    c = p.task.params
    try:
        length, num_train, num_val = int(c.length), int(c.num_train), int(c.num_val)
        lengths = {length, *(int(n) for n in getattr(c, "eval_lengths", ()) or ())}
    except (AttributeError, TypeError, ValueError):
        return None
    if getattr(p.task.spec.build, "streams", False):  # draws its training windows as it trains
        num_train = 0
    return num_train * length + num_val * sum(lengths)


#: Bytes of one vocabulary symbol at least (a short Python str and its slot in a tuple).
SYMBOL_BYTES = 56
#: Bytes a trained parameter holds at least (fp32 weight and gradient, Adam's two moments).
TRAINED_PARAM_BYTES = 16


def vocab_bytes(p: Plan) -> int | None:
    """A lower bound of the memory a task's ``vocab`` parameter costs before anything else: its
    symbols, and the model's embedding of them (``vocab x d_model`` trained parameters)."""
    vocab = getattr(p.task.params, "vocab", None)
    if not isinstance(vocab, int) or isinstance(vocab, bool):
        return None
    width = getattr(p.model.params, "d_model", 1)
    width = width if isinstance(width, int) and width > 0 else 1
    return vocab * (SYMBOL_BYTES + TRAINED_PARAM_BYTES * width)


def check_vocab(p: Plan, room: int | None) -> None:
    """Raise :class:`OutOfMemory` before the task builds its vocabulary if the vocabulary alone
    cannot fit (``task.params.vocab=1000000000`` would otherwise build 10^9 symbols silently)."""
    need = vocab_bytes(p)
    width = getattr(p.model.params, "d_model", 1)
    if need is None or room is None or need <= room or (isinstance(width, int) and width >= p.task.params.vocab):  # type: ignore[attr-defined]
        return  # fits, or the width is the larger factor (the model's own check names it)
    raise OutOfMemory(
        f"task.params.vocab={p.task.params.vocab:,} needs at least {need / GiB:,.1f} GiB (its symbols, "  # type: ignore[attr-defined]
        f"{SYMBOL_BYTES} bytes each, and the model's embedding of them, vocab x d_model trained "
        f"parameters) but {room / GiB:,.1f} GiB of RAM is available. Nothing was built, trained or "
        f"recorded. Lower task.params.vocab.")


def check_data(p: Plan) -> None:
    """Raise :class:`OutOfMemory` before the task generates its data if that data alone cannot
    fit in RAM (``task.params.length=1000000000`` would otherwise run for hours, silently)."""
    tokens = data_tokens(p)
    room = available_bytes("cpu")
    check_vocab(p, room)
    if tokens is None or room is None or tokens * TOKEN_BYTES <= room:
        return
    c = p.task.params
    raise OutOfMemory(
        f"task '{p.task.name}' would hold at least {tokens:,} tokens of data ({tokens * TOKEN_BYTES / GiB:,.1f} "
        f"GiB) but {room / GiB:,.1f} GiB of RAM is available (task.params.num_train={c.num_train}, "
        f"length={c.length}, num_val={c.num_val}, eval_lengths={list(getattr(c, 'eval_lengths', ()))[:8]}). "
        f"Nothing was generated, trained or recorded. Lower them."
    )


def check_memory(p: Plan, info: TaskInfo, device: Any,
                 build_model: Callable[[Plan, TaskInfo], Any]) -> Estimate | None:
    """Raise :class:`OutOfMemory` if the run needs more than ``device`` has available."""
    est = estimate(p, info, build_model)
    room = available_bytes(device)
    if est is None or room is None or est.total <= room:
        return est
    where = "GPU" if getattr(device, "type", "cpu") == "cuda" else "RAM"
    fix = ("Lower the longest task.params.eval_lengths (or train.batch_size: validation reads "
           "batches of it)" if est.evaluating else
           "Lower the model's size, or set train.micro_batch_size below train.batch_size (gradient "
           "accumulation: the same optimizer batch in smaller passes)")
    raise OutOfMemory(
        f"the run needs at least {est.total / GiB:,.1f} GiB but {room / GiB:,.1f} GiB of {where} "
        f"is available: {est.parameters:,} parameters need {est.state_bytes / GiB:,.1f} GiB "
        f"(weights, gradients, {p.config.train.optimizer} state) and one "
        f"{'evaluation ' if est.evaluating else ''}batch's logits {est.logits_bytes / GiB:,.1f} GiB "
        f"({est.pass_examples} examples per pass, length {est.pass_length}, "
        f"{info.num_classes or info.vocab_size} classes). Nothing was trained or recorded. {fix}."
    )
