"""Compute budgets: a run's steps from its training FLOPs or tokens (``train.max_flops``,
``train.max_tokens``), measured before anything is recorded.

:func:`probe` builds the run's task and a fresh copy of its model (under a forked RNG, so the
run itself is untouched), collates the first ``batch_size`` training examples (tokens per
step: input tokens, padding included, as ``cost/train_tokens_per_s`` counts them) and runs
one forward, loss and backward pass on the first few of them under ``FlopCounterMode``: the
same counter as :class:`harness.run.meters.StepProbe`, so the budget and the realised compute
(``cost/train_flops`` = ``cost/flops_per_token`` x ``cost/train_tokens``) use one convention.

What the counter counts: matrix products (``mm``, ``bmm``, ``addmm``, ``baddbmm``, the
fused attention kernels, convolutions), 2 FLOPs per multiply-add, forward and backward; for
a Transformer that is exactly 6N + 14·layers·d·L per token (N: the weights of matrix
products, the tied or untied output head included, embedding lookups excluded; L: the
context, the causal mask not discounted; 14 rather than the usual 12 because the fused
kernels' backward recomputes QK^T, which torch's formula counts): within 5% of the 6N +
12·layers·d·L convention while L is at most about the width (``tests/test_flops.py``). The
fused recurrent kernels (``nn.LSTM``/``nn.GRU``/``nn.RNN`` on oneDNN and cuDNN) are counted by
formula: 2 FLOPs per multiply-add of every gate matrix per token and direction, forward;
twice that backward (``RNN_KERNELS``); the unfused paths are matrix products already. A
module whose work runs where no counter sees it (a custom autograd function, a C++ or Triton
kernel) declares it: ``hidden_flops(inputs, output) -> float``, the forward and backward
FLOPs of one call, added to the count (:class:`FlopCount`). What it does not
count: element-wise work (activations, norms, gates, the softmax), recurrent scans written
as element-wise loops, ``cumsum``, and FFTs. ``probe(..., measure_uncounted=True)`` measures
that work (one FLOP per element an uncounted operation writes, 5·n·log2(n) per FFT of length
n) so docs/scaling.md can state each mixer's share (``benchmarks/uncounted_flops.py``), and
``train.flops_count: all`` adds it to what a FLOP budget counts (the realised compute then
adds the probe's uncounted FLOPs per token to the counted ones of the run).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from harness.errors import ConfigError

#: Operations that move, copy or create data without arithmetic (left out of the uncounted work).
MOVES = frozenset({
    "view", "_unsafe_view", "reshape", "_reshape_alias", "expand", "expand_as", "t", "transpose",
    "permute", "slice", "select", "narrow", "unsqueeze", "squeeze", "detach", "alias",
    "as_strided", "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
    "zeros", "zeros_like", "new_zeros", "ones", "ones_like", "full", "fill_", "zero_", "clone",
    "copy_", "_to_copy", "contiguous", "embedding", "index", "index_select", "cat", "stack",
    "split", "split_with_sizes", "unbind", "arange", "lift_fresh", "scalar_tensor", "gather",
    "scatter", "tril", "triu", "flip", "roll", "constant_pad_nd", "repeat", "_local_scalar_dense",
    "select_backward", "slice_backward", "lt", "gt", "le", "ge", "eq", "ne", "logical_not",
    "argmax", "masked_fill", "where", "_fft_c2c_out", "view_as_real", "view_as_complex",
})
#: How many training examples the FLOP count runs on (FLOPs per token do not depend on it).
PROBE_EXAMPLES = 4


@dataclass(frozen=True)
class StepCost:
    """What one training step of a run costs."""

    flops_per_token: float  # counted matrix-product FLOPs (forward + backward) per input token
    tokens_per_step: float  # input tokens of one batch (padding included)
    uncounted_per_token: float = 0.0  # element-wise and FFT work the counter misses (if measured)

    def steps_for_flops(self, flops: float, *, count_all: bool = False) -> float:
        per_token = self.flops_per_token + (self.uncounted_per_token if count_all else 0.0)
        return flops / (per_token * self.tokens_per_step)

    def steps_for_tokens(self, tokens: float) -> float:
        return tokens / self.tokens_per_step


def _sdpa_cpu(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    from torch.utils.flop_counter import sdpa_flop_count

    return int(sdpa_flop_count(query, key, value))


def _sdpa_cpu_backward(grad_out: Any, query: Any, key: Any, value: Any, *args: Any,
                       out_shape: Any = None, **kwargs: Any) -> int:
    from torch.utils.flop_counter import sdpa_backward_flop_count

    return int(sdpa_backward_flop_count(grad_out, query, key, value))


def _numel(shape: Any) -> int:
    return math.prod(int(n) for n in shape)


def _rnn_tokens(input_shape: Any) -> int:
    """Positions an RNN kernel runs over: (L, B, I), (B, L, I) or packed (tokens, I)."""
    return _numel(input_shape[:-1])


def _rnn_weights(shapes: Any) -> int:
    """Multiply-adds per position of the matrices among ``shapes`` (biases are 1-D)."""
    return sum(_numel(s) for s in shapes if s is not None and len(s) >= 2)


def rnn_layer_flops(input: Any, weight0: Any, weight1: Any, *args: Any, out_shape: Any = None,
                    **kwargs: Any) -> int:
    """oneDNN's fused layer (one layer, one direction; ``weight0`` input-to-hidden,
    ``weight1`` hidden-to-hidden): 2 FLOPs per multiply-add per position."""
    return 2 * _rnn_tokens(input) * _rnn_weights((weight0, weight1))


def rnn_layer_backward_flops(input: Any, weight1: Any, weight2: Any, *args: Any,
                             out_shape: Any = None, **kwargs: Any) -> int:
    """Its backward: the gradients of the inputs and of the weights, each as costly as the
    forward."""
    return 4 * _rnn_tokens(input) * _rnn_weights((weight1, weight2))


def cudnn_rnn_flops(input: Any, weight: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    """cuDNN's fused RNN (every layer and direction; ``weight``: their matrices and biases)."""
    return 2 * _rnn_tokens(input) * _rnn_weights(weight)


def cudnn_rnn_backward_flops(input: Any, weight: Any, *args: Any, out_shape: Any = None,
                             **kwargs: Any) -> int:
    """Its backward: the inputs' and the weights' gradients (``output_mask``, the last
    argument: which of input, hx, cx, weights are asked for)."""
    mask = args[-1] if args and isinstance(args[-1], (list, tuple)) else kwargs.get("output_mask")
    passes = 2 if mask is None else int(bool(mask[0])) + int(bool(mask[3]))
    return 2 * passes * _rnn_tokens(input) * _rnn_weights(weight)


#: The fused kernels counted by formula (aten name -> formula over the arguments' shapes).
RNN_KERNELS = {
    "mkldnn_rnn_layer": rnn_layer_flops,
    "mkldnn_rnn_layer_backward": rnn_layer_backward_flops,
    "_cudnn_rnn": cudnn_rnn_flops,
    "_cudnn_rnn_backward": cudnn_rnn_backward_flops,
    "miopen_rnn": cudnn_rnn_flops,
    "miopen_rnn_backward": cudnn_rnn_backward_flops,
}


def _counter_mode() -> Any:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    aten = torch.ops.aten
    mapping = {}
    for name, formula in (("_scaled_dot_product_flash_attention_for_cpu", _sdpa_cpu),
                          ("_scaled_dot_product_flash_attention_for_cpu_backward", _sdpa_cpu_backward),
                          *RNN_KERNELS.items()):
        op = getattr(aten, name, None)
        if op is not None:
            mapping[op] = formula
    return FlopCounterMode(display=False, custom_mapping=mapping)


def skipped_rnn_flops(module: Any, inputs: Any) -> float:
    """What the decomposition of a torch recurrent layer into matrix products (``nn.GRU`` and
    ``nn.RNN`` on the CPU, any of them in float64) leaves out of the fused kernels' count of
    one training step (``RNN_KERNELS``: 2 FLOPs per multiply-add of every gate matrix per
    position and direction forward, twice that backward): the gradient of the initial state
    when it needs none (the zero state: one hidden-to-hidden product per layer, direction and
    sequence) and, when the input needs no gradient, the first layer's input gradient. Added
    back, every recurrent layer counts 6 FLOPs per gate weight per token, whichever path ran
    (a 2-layer ``nn.GRU`` on 64 tokens of an input without gradient counted 8.6% less). Nothing without
    gradients (evaluation)."""
    import torch
    from torch.nn.utils.rnn import PackedSequence

    if not torch.is_grad_enabled() or not any(p.requires_grad for p in module.parameters()):
        return 0.0
    x = inputs[0] if inputs else None
    hx = inputs[1] if len(inputs) > 1 else None
    if isinstance(x, PackedSequence):
        data, batch, tokens = x.data, int(x.batch_sizes[0]), int(x.data.shape[0])
    elif isinstance(x, torch.Tensor) and x.dim() == 3:
        data, batch, tokens = x, int(x.shape[0 if module.batch_first else 1]), int(x.shape[0] * x.shape[1])
    elif isinstance(x, torch.Tensor):
        data, batch, tokens = x, 1, int(x.shape[0])
    else:
        return 0.0
    sides = ("", "_reverse") if module.bidirectional else ("",)
    h0 = hx[0] if isinstance(hx, tuple) else hx
    out = 0.0
    if not isinstance(h0, torch.Tensor) or not h0.requires_grad:
        out += 2.0 * batch * sum(getattr(module, f"weight_hh_l{layer}{side}").numel()
                                 for layer in range(module.num_layers) for side in sides)
    if not data.requires_grad:
        out += 2.0 * tokens * sum(getattr(module, f"weight_ih_l0{side}").numel() for side in sides)
    return out


class FlopCount:
    """``FlopCounterMode`` (see :func:`flop_counter`) plus what the modules of ``model``
    declare: each call of a module with ``hidden_flops(inputs, output)`` adds that many."""

    def __init__(self, model: Any = None) -> None:
        self.mode = _counter_mode()
        self.flop_registry = self.mode.flop_registry
        self.model = model
        self.declared = 0.0
        self._hooks: list[Any] = []
        self._fused_before = 0.0

    def _add(self, module: Any, inputs: Any, output: Any) -> None:
        self.declared += float(module.hidden_flops(inputs, output))

    def _fused_so_far(self) -> float:
        """FLOPs counted so far in the fused recurrent kernels (``RNN_KERNELS``)."""
        counts = self.mode.get_flop_counts().get("Global", {})
        return float(sum(v for op, v in counts.items() if str(op).split(".")[-1] in RNN_KERNELS))

    def _rnn_before(self, module: Any, inputs: Any) -> None:
        self._fused_before = self._fused_so_far()

    def _rnn_after(self, module: Any, inputs: Any, output: Any) -> None:
        if self._fused_so_far() == self._fused_before:  # decomposed: matrix products, some skipped
            self.declared += skipped_rnn_flops(module, inputs)

    def __enter__(self) -> FlopCount:
        if self.model is not None:
            import torch

            self._hooks = [m.register_forward_hook(self._add) for m in self.model.modules()
                           if callable(getattr(m, "hidden_flops", None))]
            for m in self.model.modules():
                if isinstance(m, torch.nn.RNNBase):
                    self._hooks += [m.register_forward_pre_hook(self._rnn_before),
                                    m.register_forward_hook(self._rnn_after)]
        self.mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.mode.__exit__(*exc)
        finally:
            for hook in self._hooks:
                hook.remove()
            self._hooks = []

    def get_total_flops(self) -> float:
        return float(self.mode.get_total_flops()) + self.declared

    def get_flop_counts(self) -> Any:
        return self.mode.get_flop_counts()


def flop_counter(model: Any = None) -> FlopCount:
    """``FlopCounterMode`` with the fused CPU attention kernels counted (torch registers the
    CUDA kernels' formulas only, so without these a CPU run's attention counted 0 FLOPs: a
    2-layer d_model-64 Transformer at 64 tokens, 13% of its FLOPs), the fused recurrent
    kernels counted (``RNN_KERNELS``: without them a float32 ``nn.LSTM`` on the CPU counted
    0), and the ``hidden_flops`` the modules of ``model`` declare."""
    return FlopCount(model)


class _Uncounted:
    """A dispatch mode adding up the work FlopCounterMode leaves out (see module)."""

    def __init__(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        registry = flop_counter().flop_registry

        owner = self

        class Mode(TorchDispatchMode):  # type: ignore[misc]
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                out = func(*args, **(kwargs or {}))
                owner.add(func, args, out, registry)
                return out

        self.mode = Mode()
        self.flops = 0.0

    def add(self, func: Any, args: Any, out: Any, registry: Any) -> None:
        import torch

        packet = getattr(func, "overloadpacket", func)
        if packet in registry:
            return
        name = str(packet).split(".")[-1]
        if name.startswith(("_fft", "fft")):
            x = args[0] if args else None
            if isinstance(x, torch.Tensor) and x.numel():
                dims = args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else [-1]
                n = max(int(x.shape[d]) for d in dims) if dims else int(x.shape[-1])
                self.flops += 5.0 * x.numel() * math.log2(max(n, 2))
            return
        if name in MOVES:
            return
        for t in out if isinstance(out, (list, tuple)) else [out]:
            if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()):
                self.flops += float(t.numel()) * (2.0 if t.is_complex() else 1.0)


def probe(p: Any, *, measure_uncounted: bool = False, task: Any = None) -> StepCost:
    """One training step's FLOPs per token and tokens per step for the plan ``p`` (see
    module); ``measure_uncounted`` also runs the step under :class:`_Uncounted`. ``task``:
    the run's task if already built (from ``train.data_seed``)."""
    import lightning as L
    import torch

    from harness.run.build import build_model, build_task, task_info
    from harness.run.system import HarnessSystem, masked_stats

    t = p.config.train
    task = task if task is not None else build_task(p, seed=t.data_seed)
    info = task_info(p, task)
    examples = task.examples("train", task.train_length)
    batch = p.fmt.collate(examples[: t.batch_size], task.task_kind)
    tokens_per_step = float(p.fmt.tokens(batch)) * t.batch_size / max(min(t.batch_size, len(examples)), 1)
    small = p.fmt.collate(examples[:PROBE_EXAMPLES], task.task_kind)
    with torch.random.fork_rng(devices=[]):
        L.seed_everything(t.seed, workers=False, verbose=False)
        model = build_model(p, info)
        system = HarnessSystem(model, task, p.fmt, t)
        system.train()
        with flop_counter(system) as counter:
            masked_stats(system(small), small)["loss"].backward()
        counted = float(counter.get_total_flops())
        extra = 0.0
        if measure_uncounted:
            model.zero_grad(set_to_none=True)
            mode = _Uncounted()
            with mode.mode:
                masked_stats(system(small), small)["loss"].backward()
            extra = mode.flops
    tokens = max(p.fmt.tokens(small), 1)
    return StepCost(counted / tokens, tokens_per_step, extra / tokens)


def estimate(p: Any, task: Any = None, info: Any = None) -> StepCost:
    """An analytic estimate without running anything: 6 x the parameters of the model built
    on the ``meta`` device (no memory, no initialisation), embedding tables excluded, and
    the tokens of one batch. Good to a factor well under 2 for every registered model; used
    to skip the measured probe where a budget buys thousands of steps either way."""
    import torch

    from harness.run.build import build_model, build_task, task_info

    t = p.config.train
    task = task if task is not None else build_task(p, seed=t.data_seed)
    info = info if info is not None else task_info(p, task)
    examples = task.examples("train", task.train_length)
    batch = p.fmt.collate(examples[: t.batch_size], task.task_kind)
    tokens_per_step = float(p.fmt.tokens(batch)) * t.batch_size / max(min(t.batch_size, len(examples)), 1)
    with torch.device("meta"):
        model = build_model(p, info)
    lookups = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    n = sum(q.numel() for q in model.parameters() if q.requires_grad and id(q) not in lookups)
    return StepCost(6.0 * n, tokens_per_step)


def resolve_steps(p: Any, cost: StepCost | None = None) -> int:
    """The steps a compute-budgeted run trains (``train.max_flops`` or ``train.max_tokens``),
    rounded to the nearest step; a ConfigError if the budget buys less than one step."""
    t = p.config.train
    if t.max_flops is None and t.max_tokens is None:
        return int(t.max_steps)
    count_all = t.flops_count == "all"
    cost = cost or probe(p, measure_uncounted=count_all)
    if t.max_flops is not None:
        if cost.flops_per_token <= 0:
            raise ConfigError(
                "train.max_flops: the model of this run does no counted matrix products "
                "(FLOPs per token: 0), so a FLOP budget cannot set its steps; use "
                "train.max_tokens or train.max_steps.")
        steps = cost.steps_for_flops(t.max_flops, count_all=count_all)
        what = f"train.max_flops = {t.max_flops:.3g}"
        per_token = cost.flops_per_token + (cost.uncounted_per_token if count_all else 0.0)
        one = per_token * cost.tokens_per_step
        unit = f"one step costs {one:.3g} FLOPs ({per_token:.3g} per token x " \
               f"{cost.tokens_per_step:.0f} tokens)"
    else:
        steps, what = cost.steps_for_tokens(float(t.max_tokens or 0)), f"train.max_tokens = {t.max_tokens}"
        unit = f"one step trains {cost.tokens_per_step:.0f} tokens"
    if steps < 1:
        raise ConfigError(f"{what} is smaller than one training step: {unit}. Raise the budget "
                          f"to at least one step, or lower train.batch_size or the model's size.")
    return max(1, round(steps))
