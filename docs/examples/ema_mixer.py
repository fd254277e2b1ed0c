"""``ema``: a sequence mixer that keeps an exponential moving average of its inputs, one
learned decay per channel (the recurrence at the heart of S4D, Mega and RetNet, without
their extras)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

import torch
from harness.plugin import Complexity, FloatRange, Gt, Lt, Mixer, MixerSpec, hookimpl
from torch import Tensor, nn


@dataclass
class EmaConfig:
    init_decay: Annotated[float, Gt(0.0), Lt(1.0), FloatRange(0.5, 0.99)] = 0.9


class EmaMixer(Mixer):
    """Exponential moving average per channel: h_t = a h_(t-1) + (1 - a) W_in x_t, y_t = W_out h_t."""

    # the parallel form below forms an (L, L) decay matrix; decoding keeps one vector
    complexity = Complexity(time="L^2", memory="L^2", decode="1", state="1")
    why_not = {"qk": "an average has no queries and keys to rotate",
               "bias": "an average forms no attention scores to add a bias to"}

    def __init__(self, config: EmaConfig, *, d_model: int, num_heads: int) -> None:
        super().__init__(d_model, num_heads)
        self.inp = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)
        logit = math.log(config.init_decay / (1.0 - config.init_decay))
        self.decay_logit = nn.Parameter(torch.full((d_model,), logit))

    def mix(self, x: Tensor, *, causal: bool, key_padding_mask: Tensor | None, position: Any) -> Tensor:
        """Parallel form: h_t = sum over s <= t of (1 - a) a^(t - s) u_s, all t at once."""
        u, a = self.inp(x), torch.sigmoid(self.decay_logit)
        t = torch.arange(x.shape[1], device=x.device)
        gap = (t[:, None] - t[None, :])[..., None]  # (L, L, 1): t - s
        weights = ((1 - a) * a ** gap.clamp(min=0)).masked_fill(gap < 0, 0.0)  # (L, L, D)
        return self.out(torch.einsum("tsd,bsd->btd", weights.to(u.dtype), u))

    def step(self, x: Tensor, state: dict[str, Any], *, positions: Tensor, position: Any) -> Tensor:
        """Recurrent form: continue from state["h"] (B, D) over the new positions."""
        u, a = self.inp(x), torch.sigmoid(self.decay_logit)
        h = state.get("h", torch.zeros_like(u[:, 0]))
        outs = []
        for i in range(u.shape[1]):
            h = a * h + (1 - a) * u[:, i]
            outs.append(h)
        state["h"] = h
        return self.out(torch.stack(outs, dim=1))

    def state_size(self, length: int) -> int:
        return self.d_model  # one average per channel, whatever the length


def ema_reference(layer: EmaMixer, x: Tensor, *, causal: bool) -> Tensor:
    """float64 from the recurrence, one position at a time."""
    a = 1.0 / (1.0 + torch.exp(-layer.decay_logit))
    u = x @ layer.inp.weight.T + layer.inp.bias
    h = torch.zeros_like(u[:, 0])
    ys = []
    for t in range(x.shape[1]):
        h = a * h + (1.0 - a) * u[:, t]
        ys.append(h @ layer.out.weight.T + layer.out.bias)
    return torch.stack(ys, dim=1)


@hookimpl
def harness_register_mixer(register):
    register(MixerSpec(name="ema", build=EmaMixer, reference=ema_reference))
