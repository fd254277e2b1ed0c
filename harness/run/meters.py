"""What a run measures about its own cost while Lightning trains and evaluates it.

* :class:`Throughput`: training tokens/s (input tokens, padding included) over the steps
  after the first ``skip`` (warm-up, compilation, the probed step), and the share of training
  time spent waiting for data, read from :class:`DataWait`. Time is read in windows of
  :data:`WINDOW` training batches on a GPU (one per batch on the CPU), the device
  synchronised only where a window opens and closes (and around validations, which no window
  spans): the steps in between are queued without waiting for the host. Step time is the
  windows' time less the data wait inside them.
* :class:`DataWait`: a Lightning profiler that times only the training loader's ``next``
  and the batch's transfer to the device: ``cost/data_wait_share`` is that time over itself
  plus the steps' time.
* :class:`StepProbe`: one training step (the second, so the optimiser state exists, or the
  only one) run under ``FlopCounterMode`` (FLOPs of forward, loss and backward, per input
  token; the fused CPU attention kernels counted too: :func:`harness.run.flops.flop_counter`) and, on the CPU, under :class:`harness.runtime.memory.TensorMemory` (the step's peak tensor
  memory). A compiled model runs that step eagerly (``torch.compiler.set_stance``), which
  the counters need; its FLOPs are the same and its peak memory an upper bound of the
  compiled step's. On a GPU the allocator's high-water mark is then restarted, so that
  ``cost/peak_gpu_mem_mb`` covers the compiled steps only.
* :class:`EvalThroughput`: tokens/s of validation, timed from the first validation batch's
  start to the last one's end (synchronised there only), reset at each validation: after
  the final evaluation it holds ``cost/eval_tokens_per_s``.

Results go where Lightning sends them back from ``ddp_spawn`` workers
(``trainer.callback_metrics``), as plain ``str`` keys from :class:`harness.keys.Metric`.
Callbacks are top-level classes, so a run pickles.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import lightning as L
import torch
from lightning.pytorch.profilers import Profiler

from harness.keys import Metric
from harness.runtime import devices
from harness.runtime.memory import TensorMemory, tensors_in

_NOTHING = contextlib.nullcontext()


class DataWait(Profiler):
    """Times the training loader's ``next`` and the training batch's transfer (see module)."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds = 0.0
        self.counting = False
        self._training = False
        self._started: dict[str, float] = {}
        self._timed: dict[str, bool] = {}  # action name: timed (see profile)

    def profile(self, action_name: str) -> Any:
        """Lightning wraps every hook of every step in this: only a loader's ``next`` and a
        batch's transfer are timed, every other action gets a context that does nothing."""
        timed = self._timed.get(action_name)
        if timed is None:  # a few dozen distinct names, each met every step
            timed = self._timed[action_name] = action_name.endswith(("_next", ".batch_to_device"))
        return super().profile(action_name) if timed else _NOTHING

    def start(self, action_name: str) -> None:
        if action_name.endswith("_next"):  # which loop fetches: the transfer that follows is its
            self._training = action_name.endswith("train_dataloader_next")
        if self.counting and self._training and (
                action_name.endswith("_next") or action_name.endswith(".batch_to_device")):
            self._started[action_name] = time.perf_counter()

    def stop(self, action_name: str) -> None:
        started = self._started.pop(action_name, None)
        if started is not None:
            self.seconds += time.perf_counter() - started

    def summary(self) -> str:
        return ""  # nothing to print at the end of fitting


def _put(trainer: Any, key: str, value: float, module: Any, reduce: str | None = None) -> None:
    """A result in ``callback_metrics`` (summed or averaged over devices when asked; a
    reduction runs on the module's device, which the collective backend needs)."""
    tensor = torch.tensor(float(value), dtype=torch.float64)
    if reduce and trainer.world_size > 1:
        tensor = trainer.strategy.reduce(tensor.to(module.device), reduce_op=reduce)
    trainer.callback_metrics[key] = tensor


#: Training batches per timing window on a GPU (see the module).
WINDOW = 50


class Throughput(L.Callback):
    """Training tokens/s and the data-wait share, skipping the first ``skip`` steps."""

    def __init__(self, fmt: Any, wait: DataWait, skip: int = 3, window: int | None = None) -> None:
        self.fmt, self.wait, self.skip = fmt, wait, skip
        self.window = window  # batches per window; None: WINDOW on a GPU, 1 on the CPU
        self.tokens, self.seconds = 0, 0.0  # in closed windows
        self.all_tokens = 0  # every step's, for the realised compute
        self._open: tuple[float, float, int, int] | None = None  # start, wait then, tokens, batches

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, idx: int) -> None:
        if self._open is None and trainer.global_step >= self.skip:
            devices.synchronize(module.device)
            self._open = (time.perf_counter(), self.wait.seconds, 0, 0)

    def on_train_batch_end(self, trainer: Any, module: Any, out: Any, batch: Any, idx: int) -> None:
        tokens = self.fmt.tokens(batch)
        self.all_tokens += tokens
        if self._open is not None:
            started, wait, counted, batches = self._open
            self._open = (started, wait, counted + tokens, batches + 1)
            window = self.window or (1 if module.device.type == "cpu" else WINDOW)
            if batches + 1 >= window:
                self.close(module)
        self.wait.counting = trainer.global_step >= self.skip  # the next step's fetch counts

    def close(self, module: Any) -> None:
        """End the open window (the device synchronised): its step time and tokens count."""
        if self._open is None:
            return
        devices.synchronize(module.device)
        started, wait, counted, _ = self._open
        self._open = None
        self.seconds += time.perf_counter() - started - (self.wait.seconds - wait)
        self.tokens += counted

    def on_validation_start(self, trainer: Any, module: Any) -> None:
        self.close(module)

    def on_train_end(self, trainer: Any, module: Any) -> None:
        """Total tokens/s of every device; the data-wait share averaged over devices."""
        self.close(module)
        _put(trainer, Metric.TOKENS_PER_S, self.tokens / self.seconds if self.seconds > 0 else 0.0,
             module, "sum")
        if self.seconds > 0:
            _put(trainer, Metric.DATA_WAIT_SHARE, self.wait.seconds / (self.wait.seconds + self.seconds),
                 module, "mean")
        _put(trainer, Metric.TRAIN_STEPS, trainer.global_step, module)
        _put(trainer, Metric.TRAIN_TOKENS, self.all_tokens, module, "sum")


class StepProbe(L.Callback):
    """FLOPs per token and (CPU) peak tensor memory of one training step (see module)."""

    def __init__(self, fmt: Any, step: int, compiled: bool) -> None:
        self.fmt, self.step, self.compiled = fmt, step, compiled
        self._stack: contextlib.ExitStack | None = None
        self._flops: Any = None
        self._memory: TensorMemory | None = None

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, idx: int) -> None:
        if trainer.global_step != self.step or self._stack is not None:
            return
        from harness.run.flops import flop_counter

        stack = self._stack = contextlib.ExitStack()
        if self.compiled:
            stack.enter_context(torch.compiler.set_stance("force_eager"))
        self._flops = stack.enter_context(flop_counter(module))
        if module.device.type == "cpu":
            memory = self._memory = TensorMemory("cpu")
            memory.add(step_state(module, trainer.optimizers, batch))
            stack.enter_context(memory)

    def on_train_batch_end(self, trainer: Any, module: Any, out: Any, batch: Any, idx: int) -> None:
        if self._stack is None or self._flops is None:
            return
        self._stack.close()
        self._flops, flops = None, self._flops.get_total_flops()
        _put(trainer, Metric.FLOPS_PER_TOKEN, flops / max(self.fmt.tokens(batch), 1), module)
        if self._memory is not None:
            _put(trainer, Metric.PEAK_TENSOR_MB, self._memory.peak / 2**20, module, "max")
        elif self.compiled and trainer.global_step < trainer.max_steps:
            devices.reset_peak(module.device)  # the compiled steps' peak, not the eager one's

    def on_exception(self, trainer: Any, module: Any, exception: BaseException) -> None:
        if self._stack is not None:
            self._stack.close()


def step_state(module: Any, optimizers: list[Any], batch: Any) -> list[Any]:
    """The tensors alive when a training step starts: parameters, gradients, buffers,
    optimiser state and the batch."""
    tensors = list(module.parameters()) + list(module.buffers())
    tensors += [p.grad for p in module.parameters() if p.grad is not None]
    for opt in optimizers:
        tensors += list(tensors_in(list(opt.state.values())))
    return tensors + list(tensors_in(batch))


class EvalThroughput(L.Callback):
    """Validation tokens/s of the latest validation (every length)."""

    def __init__(self, fmt: Any) -> None:
        self.fmt = fmt
        self.tokens, self.seconds, self._t0 = 0, 0.0, 0.0

    def on_validation_start(self, trainer: Any, module: Any) -> None:
        self.tokens, self.seconds, self._t0 = 0, 0.0, 0.0

    def on_validation_batch_start(self, trainer: Any, module: Any, batch: Any, idx: int,
                                  dataloader_idx: int = 0) -> None:
        if not self._t0:
            devices.synchronize(module.device)
            self._t0 = time.perf_counter()

    def on_validation_batch_end(self, trainer: Any, module: Any, out: Any, batch: Any, idx: int,
                                dataloader_idx: int = 0) -> None:
        self.tokens += self.fmt.tokens(batch)

    def on_validation_end(self, trainer: Any, module: Any) -> None:
        if self._t0:
            devices.synchronize(module.device)
            self.seconds = time.perf_counter() - self._t0
        if self.seconds > 0 and not trainer.sanity_checking:
            _put(trainer, Metric.EVAL_TOKENS_PER_S, self.tokens / self.seconds, module, "sum")
