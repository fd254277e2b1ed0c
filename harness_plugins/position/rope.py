"""``rope``: rotary position embeddings (Su et al., 2021), with context-extension options.

Queries and keys of every head are rotated in D/2 planes; plane i turns by m·θ_i at
position m, θ_i = base^(-2i/D), so q_m · k_n depends only on the offset m - n. Planes pair
dimension i with i + D/2 (the "rotate half" layout of GPT-NeoX / Llama; the paper pairs
2i with 2i+1, which is the same up to a fixed permutation of the projection outputs).

Context extension by a scale factor s (``scaling``), for evaluating at lengths beyond the
original length L (``original_length``; 0 means the training length this scheme was built
for):

* ``pi``   Position Interpolation (Chen et al., 2023): positions m -> m / s, i.e. θ_i / s.
* ``ntk``  NTK-aware scaling: base -> base · s^(D/(D-2)).
* ``yarn`` YaRN (Peng et al., 2023): with r_i = L / λ_i, λ_i = 2π/θ_i and the ramp
  γ(r) = clamp((r - α)/(β - α), 0, 1), θ_i -> (1 - γ(r_i)) · θ_i / s + γ(r_i) · θ_i: planes
  that turn fewer than α times over L are interpolated, those that turn more than β times
  are kept, a linear blend between. Plus the attention temperature: the paper divides the
  logits by t with sqrt(1/t) = 0.1 ln s + 1. As in the reference implementation (which
  multiplies its cos/sin tables by this "mscale"), queries and keys are each multiplied by
  0.1 ln s + 1, so every dot-product score is multiplied by 1/t = (0.1 ln s + 1)^2 whatever
  the attention variant's own scaling, and it happens inside ``rotate`` so every variant
  gets it. (For scores that are not a q·k dot product, e.g. additive attention, it is
  only an input rescaling.) α and β are hyper-parameters: the paper's α = 1, β = 32 were
  tuned for Llama's 2k-4k contexts and do not transfer to short training lengths, where
  few planes complete 32 turns.

``apply`` says when the extension acts: ``always`` (train and evaluate with it: the
"with further training" setting) or ``past_train_length`` (plain RoPE until an input is
longer than L, then extended: "without further training", for models trained plainly).
``dynamic`` replaces the fixed s by s = max(1, n / L) for an input of n positions, so each
evaluation length gets the factor that maps it onto the original length (at n <= L it is
plain RoPE). Every method reduces to plain RoPE at s = 1. With ``past_train_length`` or
``dynamic``, cached decoding that grows past L mixes keys rotated with different factors;
evaluate such models with full passes (as the harness does).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

import torch
from torch import Tensor

from harness.plugin import Choice, FloatRange, Ge, Gt, PositionScheme, PositionSpec, hookimpl

SCALINGS = ("none", "pi", "ntk", "yarn")
APPLY_MODES = ("always", "past_train_length")


@dataclass
class RopeConfig:
    base: Annotated[float, Gt(1.0), FloatRange(100.0, 1_000_000.0, log=True)] = 10_000.0
    scaling: Annotated[str, Choice(SCALINGS)] = "none"
    # s, the context extension factor (ignored when "none")
    scale: Annotated[float, Ge(1.0), FloatRange(1.0, 16.0, log=True)] = 1.0
    yarn_alpha: Annotated[float, Gt(0.0), FloatRange(0.25, 4.0, log=True)] = 1.0
    yarn_beta: Annotated[float, Gt(0.0), FloatRange(4.0, 64.0, log=True)] = 32.0  # > yarn_alpha
    apply: str = "always"  # or "past_train_length"
    dynamic: bool = False  # s = max(1, input length / L) instead of ``scale``
    original_length: Annotated[int, Ge(0)] = 0  # L; 0: the training length the scheme is built for

    def meaningless(self) -> list[str]:
        """Legal settings this scheme ignores (warned about by the harness)."""
        if self.scaling == "none" and (self.scale != 1.0 or self.dynamic):
            what = [f"scale={self.scale:g}"] * (self.scale != 1.0) + ["dynamic=true"] * self.dynamic
            return [f"{' and '.join(what)} {'is' if len(what) == 1 else 'are'} ignored with "
                    f"scaling: none (choose linear, ntk or yarn)"]
        return []

    def __post_init__(self) -> None:
        if self.scaling not in SCALINGS:
            raise ValueError(f"scaling must be one of {', '.join(SCALINGS)} (got {self.scaling!r}).")
        if self.apply not in APPLY_MODES:
            raise ValueError(f"apply must be one of {', '.join(APPLY_MODES)} (got {self.apply!r}).")
        if not self.yarn_alpha < self.yarn_beta:
            raise ValueError(
                f"YaRN needs 0 < yarn_alpha < yarn_beta (got {self.yarn_alpha}, {self.yarn_beta})."
            )


def rope_frequencies(dim: int, config: RopeConfig, original_length: int, scale: float) -> Any:
    """θ_i for the D/2 planes (float64), extended by the factor ``scale`` (s; 1: plain)."""
    base, s = config.base, scale
    if config.scaling == "ntk":
        base = base * s ** (dim / (dim - 2))
    theta = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    if config.scaling in ("none", "ntk"):
        return theta
    if config.scaling == "pi":
        return theta / s
    turns = original_length * theta / (2 * math.pi)  # r = L / wavelength
    gamma = ((turns - config.yarn_alpha) / (config.yarn_beta - config.yarn_alpha)).clamp(0, 1)
    return (1 - gamma) * theta / s + gamma * theta


def yarn_mscale(scale: float) -> float:
    """sqrt(1/t) = 0.1 ln s + 1: the factor applied to queries and keys each."""
    return 0.1 * math.log(scale) + 1.0


def rotate_half(x: Tensor) -> Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


class Rotary(PositionScheme):
    """Rotary embeddings; base, PI / NTK-aware / YaRN context extension."""

    def __init__(self, config: RopeConfig, *, head_dim: int, max_length: int, **context: Any) -> None:
        if head_dim % 2:
            raise ValueError(f"RoPE rotates pairs of dimensions: head_dim ({head_dim}) must be even.")
        if config.scaling == "ntk" and head_dim <= 2:
            raise ValueError("NTK-aware scaling needs head_dim > 2 (base · s^(D/(D-2))).")
        super().__init__()
        self.config, self.original_length = config, config.original_length or max_length
        self._theta: dict[tuple[int, float, Any], Tensor] = {}

    def scale(self, q_pos: Any, k_pos: Any) -> float:
        """The factor s of this call: 1 where the extension does not act."""
        cfg = self.config
        if cfg.scaling == "none":
            return 1.0
        if cfg.apply == "always" and not cfg.dynamic:
            return cfg.scale
        longest = int(torch.maximum(q_pos.max(), k_pos.max())) + 1
        if cfg.apply == "past_train_length" and longest <= self.original_length:
            return 1.0
        return max(1.0, longest / self.original_length) if cfg.dynamic else cfg.scale

    def theta(self, dim: int, scale: float, device: Any) -> Any:
        key = (dim, scale, device)
        theta = self._theta.get(key)
        if theta is None:
            theta = rope_frequencies(dim, self.config, self.original_length, scale)
            theta = theta.to(device=device, dtype=torch.float32)
            if not self.config.dynamic or scale == 1.0:  # dynamic factors vary per length
                self._theta[key] = theta
        return theta

    def _rotate(self, x: Any, positions: Any, theta: Any) -> Any:
        angles = positions.float()[:, None] * theta[None, :]  # (L, D/2)
        angles = torch.cat([angles, angles], dim=-1)
        return x * angles.cos().to(x.dtype) + rotate_half(x) * angles.sin().to(x.dtype)

    def rotate(self, q: Any, k: Any, q_pos: Any, k_pos: Any) -> tuple[Any, Any]:
        scale = self.scale(q_pos, k_pos)
        theta = self.theta(q.shape[-1], scale, q.device)
        q, k = self._rotate(q, q_pos, theta), self._rotate(k, k_pos, theta)
        if self.config.scaling == "yarn" and scale > 1:
            mscale = yarn_mscale(scale)
            q, k = q * mscale, k * mscale
        return q, k


@hookimpl
def harness_register_position(register: Any) -> None:
    register(PositionSpec(name="rope", build=Rotary))
