"""μP's base-width hyper-parameters besides the learning rate: ``model.mup`` (Yang et al. 2022,
"Tensor Programs V", arXiv:2203.03466: section 4 and appendix F, the ``mup`` package's
``MuReadout(output_mult=...)``, and the GPT-3 experiments' output and attention multipliers,
embedding multiplier, initial std and zero readout).

A model given μP (:mod:`harness.nn.parametrization`) has its roles; these multipliers are tuned
at the base width and held fixed as the model widens, and with every one of them 1 the model
is μP as before (at the base width, the standard model bit for bit). For any model, found
from the roles and shapes alone:

=================  =================================================================
``output_mult``    alpha_out: a readout's input (an ``nn.Linear`` whose fan-in grows and
                   fan-out does not) times alpha_out x base/width: the logits are
                   alpha_out W x / m, ``MuReadout``'s ``output_mult``
``attn_mult``      alpha_attn: every query-key scale (a module with a ``qk_dim``:
                   :func:`harness.nn.parametrization.qk_scale`) times alpha_attn:
                   alpha_attn / sqrt(d) at the base width, alpha_attn sqrt(d_base) / d beyond
``input_mult``     alpha_in: the output of every *input layer* (an ``nn.Embedding`` whose
                   embedding dimension grows and vocabulary does not, or an ``nn.Linear``
                   whose fan-out grows and fan-in does not) times alpha_in
``init_std_mult``  sigma: the initial values of every weight matrix (hidden matrices,
                   readouts, input layers' weights) times sigma, at every width
``zero_readout``   a readout's weight starts at zero (the paper's recommendation; refused for
                   a readout tied to an embedding, which would start the embedding at zero)
=================  =================================================================

A multiplier that would change nothing in a model (``attn_mult`` where no module has a
``qk_dim``; ``output_mult`` where nothing is a readout) is refused, naming the field.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from harness.errors import ConfigError
from harness.nn.parametrization import READOUT, InputMultiplier, readout_modules

#: the multipliers' defaults: μP without them
NEUTRAL = {"output_mult": 1.0, "attn_mult": 1.0, "input_mult": 1.0, "init_std_mult": 1.0, "zero_readout": False}


class OutputMultiplier:
    """A forward hook scaling a module's output (μP's input multiplier); a class, so that a
    model with it pickles."""

    def __init__(self, factor: float) -> None:
        self.factor = factor

    def __call__(self, module: nn.Module, args: tuple[Any, ...], output: Tensor) -> Tensor:
        return output * self.factor


def _grows(p: Tensor, dim: int) -> bool:
    return bool(p.infshape[dim].isinf())  # type: ignore[attr-defined]


def input_layers(model: nn.Module) -> list[nn.Module]:
    """The modules that map finite inputs to the width: an ``nn.Embedding`` whose embedding
    dimension grows and vocabulary does not, an ``nn.Linear`` whose fan-out grows and fan-in
    does not."""
    out: list[nn.Module] = []
    for module in model.modules():
        w = getattr(module, "weight", None)
        if not isinstance(w, Tensor) or not hasattr(w, "infshape") or w.dim() != 2:
            continue
        embedding = isinstance(module, nn.Embedding) and _grows(w, 1) and not _grows(w, 0)
        if embedding or (isinstance(module, nn.Linear) and _grows(w, 0) and not _grows(w, 1)):
            out.append(module)
    return out


def _refuse(field: str, why: str) -> ConfigError:
    return ConfigError(f"model.mup.{field}: {why}; remove it (or set it to 1) for this model.")


def apply(model: nn.Module, mults: dict[str, Any]) -> None:
    """The multipliers ``mults`` (``model.mup``'s fields) on ``model``, just given μP by
    :func:`harness.nn.parametrization.apply` (see the module docs)."""
    import torch

    m = {**NEUTRAL, **mults}
    roles: dict[str, Any] = getattr(model, "mup_roles")  # noqa: B009  (set by parametrization.apply)
    readouts = readout_modules(model)
    name = type(model).__name__
    if m["output_mult"] != 1 and not readouts:
        raise _refuse("output_mult", f"model {name} has no readout (an nn.Linear whose fan-in grows "
                                     f"with width and fan-out does not) for alpha_out to scale")
    if m["output_mult"] != 1:
        for module in readouts:
            hook = next((h for h in module._forward_pre_hooks.values() if isinstance(h, InputMultiplier)), None)
            if hook is None:  # at the base width: no 1/m hook yet
                module.register_forward_pre_hook(InputMultiplier(float(m["output_mult"])))
            else:
                hook.factor *= float(m["output_mult"])
    attention = [mod for mod in model.modules() if isinstance(getattr(mod, "qk_dim", None), int)]
    if m["attn_mult"] != 1:
        if not attention:
            raise _refuse("attn_mult", f"model {name} has no attention-like scores (no module with a "
                                       f"qk_dim) for alpha_attn to scale")
        for mod in attention:
            mod.mup_attn_mult = float(m["attn_mult"])  # type: ignore[assignment]  # read by qk_scale
    inputs = input_layers(model)
    if m["input_mult"] != 1:
        if not inputs:
            raise _refuse("input_mult", f"model {name} has no input layer (an embedding or linear layer "
                                        f"whose output grows with width and input does not)")
        for mod in inputs:
            mod.register_forward_hook(OutputMultiplier(float(m["input_mult"])))
    embedded = {id(mod.weight) for mod in inputs}
    if m["zero_readout"] and any(id(mod.weight) in embedded for mod in readouts):
        raise _refuse("zero_readout", f"model {name}'s readout is tied to its input embedding, which "
                                      f"would start at zero too (untie them, e.g. tie_embeddings: false)")
    with torch.no_grad():
        if m["init_std_mult"] != 1:
            weights: dict[int, Any] = {id(mod.weight): mod.weight for mod in inputs}
            params = dict(model.named_parameters())
            weights.update({id(params[n]): params[n] for n, r in roles.items() if r.role in ("hidden", READOUT)})
            for w in weights.values():
                w.mul_(float(m["init_std_mult"]))
        if m["zero_readout"]:
            for mod in readouts:
                mod.weight.zero_()
    model.mup_multipliers = dict(m)  # type: ignore[assignment]
