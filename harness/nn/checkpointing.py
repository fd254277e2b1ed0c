"""Activation checkpointing per residual block, for any model without writing code
(``train.activation_checkpointing: true``).

:func:`checkpoint_blocks` finds a model's blocks and makes each one recompute its activations
in the backward pass (``torch.utils.checkpoint``, non-reentrant, the random state preserved:
dropout draws the same masks twice) instead of keeping them from the forward pass. What
stays in memory between forward and backward is then each block's input, not everything
inside it: for a Transformer the attention scores, the MLP's hidden activations and the
norms' outputs. It costs one more forward pass of every block (about a third more compute).

**The blocks** are every :class:`~harness.nn.blocks.TransformerBlock` in the model and each
entry of the model's own ``nn.ModuleList`` attributes (a model that stacks its own block
class, as the MLP-Mixer does). A model with neither (the recurrent GRU and LSTM models, whose
layers are one cuDNN call) is left as it is, and :func:`checkpoint_blocks` says so by
returning 0.

**Nothing else changes.** The block keeps its class, parameters, state-dict keys and
attributes (only its ``forward`` is replaced on the instance), so checkpoints, saved weights
and resumes are the same with and without it, and :func:`uncheckpoint_blocks` undoes it.
Checkpointing applies only where it can save memory: in training mode with gradients
enabled and without a decoding cache (generation and evaluation run the block as it is).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from torch import is_grad_enabled, nn
from torch.utils.checkpoint import checkpoint

from harness.nn.blocks import TransformerBlock


def _checkpointed(block: nn.Module, forward: Any, *args: Any, **kwargs: Any) -> Any:
    if block.training and is_grad_enabled() and kwargs.get("cache") is None:
        return checkpoint(forward, block, *args, use_reentrant=False, **kwargs)
    return forward(block, *args, **kwargs)


def blocks(model: nn.Module) -> list[nn.Module]:
    """The residual blocks of ``model`` (see the module), in order, each once."""
    found: list[nn.Module] = []
    seen: set[int] = set()
    for child in model.children():
        if isinstance(child, nn.ModuleList):
            for entry in child:
                if id(entry) not in seen:
                    seen.add(id(entry))
                    found.append(entry)
    inside = {id(m) for b in found for m in b.modules()}
    for module in model.modules():
        if isinstance(module, TransformerBlock) and id(module) not in inside:
            inside.update(id(m) for m in module.modules())
            found.append(module)
    return found


def checkpoint_blocks(model: nn.Module) -> int:
    """Make every block of ``model`` checkpoint its activations; returns how many."""
    found = blocks(model)
    for block in found:
        if "forward" not in vars(block):
            block.forward = partial(_checkpointed, block, type(block).forward)  # type: ignore[method-assign]
    return len(found)


def uncheckpoint_blocks(model: nn.Module) -> None:
    """Undo :func:`checkpoint_blocks`."""
    for module in model.modules():
        forward = vars(module).get("forward")
        if isinstance(forward, partial) and forward.func is _checkpointed:
            del module.forward
