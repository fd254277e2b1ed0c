"""A layer that runs a sequence chunk by chunk must not index or slice its chunks out of a
whole-sequence tensor inside the loop: autograd's gradient of each indexed chunk is a zero
tensor the size of the whole sequence, so the backward pass costs O(L² / chunk) however linear
the forward pass is (DeltaNet, Gated DeltaNet, GLA, RetNet, Mamba-2, RWKV-4, RWKV-6 and
Performer did; `harness bench mixer` measured L^1.4 to L^1.5 where L was declared). Checked on
the autograd graph of every layer declared below L^2: the elements of those zero tensors grow
like the sequence, not like its square. The test fails on the code before the fix (chunks
taken by index) for all eight."""

from __future__ import annotations

import math

import pytest
import torch

from harness.registry.loader import load

PER_CHUNK = ("SelectBackward0", "SliceBackward0", "IndexBackward0", "AsStridedBackward0")


def _zero_gradient_elements(out: torch.Tensor) -> int:
    """Elements of the zero tensors the backward pass allocates for indexing and slicing: each
    such node's gradient is a zero tensor the size of the tensor it cut from."""
    seen, stack, total = set(), [out.grad_fn], 0
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        sizes = getattr(fn, "_saved_self_sym_sizes", None)
        if type(fn).__name__ in PER_CHUNK and sizes is not None:
            total += math.prod(int(n) for n in sizes)
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    return total


def _linear_layers() -> list[tuple[str, str]]:
    """Every attention variant and mixer whose declared training time is below L^2."""
    from harness.nn.mixer import Complexity

    registry = load([])
    return [(kind, name) for kind in ("attention", "mixer") for name in registry.names(kind)
            if Complexity(time=registry.get(kind, name).complexity.time).exponent("time") < 2]


@pytest.mark.parametrize(("kind", "name"), _linear_layers())
def test_the_backward_pass_allocates_linearly_in_the_sequence(kind, name):
    registry = load([])
    spec = registry.get(kind, name)
    config = spec.config()
    if hasattr(config, "max_length"):
        import dataclasses

        config = dataclasses.replace(config, max_length=1024)
    torch.manual_seed(0)
    layer = spec.build(config, d_model=16, num_heads=2)
    causal = "causal" in getattr(layer, "directions", ("causal",))
    elements = {}
    for length in (256, 1024):
        x = torch.randn(1, length, 16, requires_grad=True)
        elements[length] = _zero_gradient_elements(layer(x, causal=causal)[0])
    # linear: 4 times the length, about 4 times the elements; chunks cut from whole-sequence
    # tensors in a loop: 16 times
    assert elements[1024] <= 6 * elements[256] + 1024, (
        f"{kind}:{name}: the backward pass's zero tensors grow faster than the sequence "
        f"(chunks indexed or sliced out of whole-sequence tensors in a loop: an O(L^2) "
        f"backward): {elements}")
