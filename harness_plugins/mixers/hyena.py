"""``hyena``: the Hyena operator, gated implicit long convolutions.

Paper: Michael Poli, Stefano Massaroli, Eric Nguyen, Daniel Y. Fu, Tri Dao, Stephen Baccus,
Yoshua Bengio, Stefano Ermon, Christopher Ré, "Hyena Hierarchy: Towards Larger Convolutional
Language Models", ICML 2023, arXiv:2302.10866. Reference implementation read and checked
against: ``HazyResearch/safari`` ``src/models/sequence/hyena.py`` (``HyenaOperator``,
``HyenaFilter``, ``PositionalEmbedding``, ``ExponentialModulation``, ``Sin``, ``fftconv_ref``)
and ``standalone_hyena.py``; defaults from its ``configs/model/layer/hyena.yaml`` and the
associative-recall experiment ``configs/experiment/synthetics/associative_recall/``.

Order N (``order``, default 2), width d = d_model:

    (x^0, x^1, ..., x^{N-1}, v) = split(ShortConv(W_in u))      N+1 streams, depthwise causal
                                                                conv of length ``short_conv``
    z = v
    for n = N-1, ..., 1:    w = x^n ⊙ z;   z_t = Σ_{s<=t} h^n_{t-s} w_s + b^n ⊙ w_t
    y = W_out (x^0 ⊙ z)

with N-1 implicit long filters (one per channel each), as in the reference implementation
(the paper's first filter h^1 is played by the short convolution)::

    h^n_t = FFN(PE(t)) · exp(-|δ_c| t / T)
    PE(t) = (t/T, cos(2π f_j t/T), -sin(2π f_j t/T))_{j < (pos_dim-1)/2},  f_j = linspace(1e-4, J-1)
    FFN   = Linear -> Sin -> (Linear -> Sin) x filter_layers -> Linear,  Sin(x) = sin(ω ⊙ x), ω learned

δ_c spaced linearly per channel so the window falls to ``decay_target`` between
``fast_decay`` T and ``slow_decay`` T positions. T = ``time_scale`` is the length the
positional encoding's time axis is measured in (the reference's ``l_max``). Here PE is a
fixed function of the lag t rather than the reference's table of ``l_max`` learned
positions (learned there at a learning rate of 1e-5, i.e. nearly fixed): the filter is
generated for every length asked for, so the layer runs on sequences of any length and a
prefix's outputs never depend on how long the rest of the sequence is.

* Parallel form (training): the filters for lags 0..L-1 (an FFN over L positions), the long
  convolutions by FFT of size 2L (O(L log L)), O(L) memory; nothing of size L².
* Cached form (decoding): an implicit long convolution has no finite recurrence in general,
  so the cache keeps, per sequence, the last ``short_conv``-1 projected inputs (for the short
  convolution) and the whole history of every long convolution's input w (N-1 streams of d
  channels); a new token's output is the direct sum Σ_s h_{t-s} w_s: O(L d) per token, state
  (N+1) d (short_conv - 1) + (N-1) d L numbers (``state_size``). A chunk of several tokens is
  convolved with the history by FFT. The filter values are generated once per decoding
  (extended by doubling as the context grows), not per token, when no gradient is recorded.
* Causal only. Position hooks: ``embedding`` only; Hyena forms no queries, keys or scores
  (order comes from the causal filters, whose positional encoding is internal).
* Dtype: the filter FFN (sines of arguments up to ω times its pre-activations), the window,
  the FFT convolutions and the gating chain run in float32 (float64 for a float64 layer)
  under any autocast; the input/output projections and the short convolution follow it.
* Not implemented from the reference: multiple heads / ``outer_mixing`` / ``post_order_ffn``
  (its defaults are off; ``num_heads`` is not used), filter dropout (not implemented there
  either), ``inner_factor`` > 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

import torch
from torch import Tensor, nn

from harness.plugin import (
    Choice,
    Complexity,
    FloatRange,
    Ge,
    Gt,
    IntRange,
    Le,
    Lt,
    Mixer,
    MixerSpec,
    causal_fft_conv,
    compute_dtype,
    hookimpl,
)

WHY_NOT = {
    "qk": "Hyena forms no queries or keys to rotate (it gates and convolves projected streams)",
    "bias": "Hyena forms no attention scores to add a bias to",
}
FIRST_FILTER_CACHE = 64  # positions generated at the start of a decoding (then doubled)


@dataclass
class HyenaConfig:
    order: Annotated[int, Ge(2), Le(8), IntRange(2, 3)] = 2  # N: N+1 streams, N-1 long filters
    filter_width: Annotated[int, Ge(1), Le(4096), IntRange(16, 128, log=True)] = 64  # FFN width
    filter_layers: Annotated[int, Ge(0), Le(8), IntRange(1, 3)] = 2  # inner Linear -> Sin layers
    pos_dim: Annotated[int, Ge(3), Le(257), Choice((3, 5, 9, 17, 33))] = 5  # odd: t, cos, sin bands
    sine_freq: Annotated[float, Gt(0), Le(1000), FloatRange(1.0, 20.0, log=True)] = 10.0  # ω at init
    short_conv: Annotated[int, Ge(1), Le(64), IntRange(2, 5)] = 3
    time_scale: Annotated[int, Ge(1), Le(1 << 24), IntRange(64, 4096, log=True)] = 1024  # T
    fast_decay: Annotated[float, Gt(0), Le(100)] = 0.3  # the fastest window reaches decay_target at 0.3 T
    slow_decay: Annotated[float, Gt(0), Le(100)] = 1.5  # the slowest at 1.5 T
    decay_target: Annotated[float, Gt(0), Lt(1)] = 1e-2
    dropout: Annotated[float, Ge(0), Lt(1), FloatRange(0.0, 0.3)] = 0.0  # on each gated stream


class Sine(nn.Module):
    """sin(ω ⊙ x) with a learned frequency per feature (the reference's ``Sin``)."""

    def __init__(self, width: int, freq: float) -> None:
        super().__init__()
        self.freq = nn.Parameter(torch.full((width,), freq))

    def forward(self, x: Tensor) -> Tensor:
        return torch.sin(self.freq * x)


class HyenaFilter(nn.Module):
    """The implicit long filters: h_t = FFN(PE(t)) · exponential window, for lags t >= 0."""

    def __init__(self, config: HyenaConfig, channels: int) -> None:
        super().__init__()
        if config.pos_dim % 2 == 0:
            raise ValueError(f"pos_dim ({config.pos_dim}) must be odd: t plus a cosine and a sine per band")
        self.time_scale = config.time_scale
        bands = (config.pos_dim - 1) // 2
        self.register_buffer("bands", torch.linspace(1e-4, bands - 1, bands), persistent=False)
        sine = Sine(config.filter_width, config.sine_freq)  # one ω shared by every layer, as there
        layers: list[nn.Module] = [nn.Linear(config.pos_dim, config.filter_width), sine]
        for _ in range(config.filter_layers):
            layers += [nn.Linear(config.filter_width, config.filter_width), sine]
        layers.append(nn.Linear(config.filter_width, channels, bias=False))
        self.ffn = nn.Sequential(*layers)
        target = math.log(config.decay_target)
        decays = torch.linspace(target / config.slow_decay, target / config.fast_decay, channels)
        self.register_buffer("decays", decays, persistent=False)

    def forward(self, length: int, device: torch.device) -> Tensor:
        """(channels, length): the filter at lags 0 .. length-1, in float32 (float64)."""
        dtype = compute_dtype(self.decays.dtype)
        t = torch.arange(length, device=device, dtype=dtype).unsqueeze(-1) / self.time_scale
        angle = 2 * math.pi * self.bands.to(dtype) * t
        pe = torch.cat([t, torch.cos(angle), -torch.sin(angle)], dim=-1)
        with torch.autocast(device.type, enabled=False):  # sines of large arguments: float32
            h = self.ffn(pe.to(self.ffn[0].weight.dtype)).to(dtype)
        return (h * torch.exp(-t * self.decays.to(dtype).abs())).transpose(0, 1)


class Hyena(Mixer):
    """Hyena: gated implicit long convolutions (FFN-generated filters with a decaying window) by FFT."""

    complexity = Complexity(time="L log L", memory="L", decode="L", state="L")
    #: the filter network runs once per position, not per token of the batch (the FLOP check)
    sequence_weights = ("filter",)
    why_not = WHY_NOT

    def __init__(self, config: HyenaConfig, *, d_model: int, num_heads: int) -> None:
        super().__init__(d_model, num_heads)
        self.order, self.kernel_size = config.order, config.short_conv
        streams = (config.order + 1) * d_model
        self.in_proj = nn.Linear(d_model, streams)
        self.short = nn.Conv1d(streams, streams, config.short_conv, groups=streams)  # padded causally
        self.filter = HyenaFilter(config, (config.order - 1) * d_model)
        self.filter_bias = nn.Parameter(torch.randn((config.order - 1) * d_model))  # b^n
        self.dropout = nn.Dropout(config.dropout)
        self.out_proj = nn.Linear(d_model, d_model)
        self._filters: Tensor | None = None  # generated filter values during a decoding

    def _streams(self, x: Tensor, past: Tensor) -> tuple[list[Tensor], Tensor]:
        """(x^0 .. x^{N-1}, v), each (B, d, l) in the compute dtype, and the last short_conv-1
        projected inputs; ``past`` holds the ones before x."""
        u = torch.cat([past.to(x.dtype), self.in_proj(x).transpose(1, 2).to(x.dtype)], dim=-1)
        streams = self.short(u).to(compute_dtype(x.dtype))
        return list(streams.split(self.d_model, dim=1)), u[..., u.shape[-1] - (self.kernel_size - 1):]

    def _gates(self, streams: list[Tensor], convolve: Any) -> Tensor:
        """z = v; for n = N-1 .. 1: w = x^n ⊙ z, z = convolve(n', w) + b ⊙ w; returns x^0 ⊙ z."""
        *gates, z = streams
        bias = self.filter_bias.view(self.order - 1, self.d_model, 1)
        for o, gate in enumerate(reversed(gates[1:])):
            w = self.dropout(gate * z)
            z = convolve(o, w) + bias[o].to(w.dtype) * w
        return gates[0] * z

    def _finish(self, y: Tensor, x: Tensor) -> Tensor:
        return self.out_proj(y.transpose(1, 2).to(x.dtype))

    def filters(self, length: int, device: torch.device) -> Tensor:
        """h (N-1, d, length): the long filters at lags 0 .. length-1."""
        return self.filter(length, device).view(self.order - 1, self.d_model, length)

    def mix(self, x: Tensor, *, causal: bool, key_padding_mask: Tensor | None, position: Any) -> Tensor:
        streams, _ = self._streams(x, x.new_zeros(x.shape[0], self.in_proj.out_features, self.kernel_size - 1))
        h = self.filters(x.shape[1], x.device)
        return self._finish(self._gates(streams, lambda o, w: causal_fft_conv(w, h[o])), x)

    def _decoding_filters(self, length: int, device: torch.device) -> Tensor:
        """The filters for a decoding step; without autograd, generated once per decoding for a
        doubling number of lags instead of at every token."""
        if torch.is_grad_enabled():
            return self.filters(length, device)
        cached = self._filters
        if cached is None or cached.shape[-1] < length or cached.device != device:
            grown = max(length, FIRST_FILTER_CACHE, 2 * (0 if cached is None else cached.shape[-1]))
            self._filters = cached = self.filters(grown, device)
        return cached[..., :length]

    def step(self, x: Tensor, state: dict[str, Any], *, positions: Tensor, position: Any) -> Tensor:
        b, n = x.shape[:2]
        if "inputs" not in state:
            self._filters = None  # a new decoding: the parameters may have changed since the last
            state["inputs"] = x.new_zeros(b, self.in_proj.out_features, self.kernel_size - 1)
            state["history"] = x.new_zeros(b, self.order - 1, self.d_model, 0, dtype=compute_dtype(x.dtype))
        streams, state["inputs"] = self._streams(x, state["inputs"])
        seen = state["history"].shape[-1]
        total = seen + n
        h = self._decoding_filters(total, x.device)
        histories: list[Tensor] = []

        def convolve(o: int, w: Tensor) -> Tensor:
            history = torch.cat([state["history"][:, o], w], dim=-1)  # (B, d, total)
            histories.append(history)
            if n == 1:  # the direct sum Σ_s h_{t-s} w_s: O(L d) per token
                return (history * h[o].flip(-1)).sum(-1, keepdim=True)
            return causal_fft_conv(history, h[o])[..., seen:]

        y = self._gates(streams, convolve)
        state["history"] = torch.stack(histories, dim=1)
        return self._finish(y, x)

    def train(self, mode: bool = True) -> Hyena:
        self._filters = None
        return super().train(mode)

    def state_size(self, length: int) -> int:
        return (self.order + 1) * self.d_model * (self.kernel_size - 1) + (self.order - 1) * self.d_model * length


@hookimpl
def harness_register_mixer(register: Any) -> None:
    register(MixerSpec(name="hyena", build=Hyena))
