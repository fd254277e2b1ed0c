"""``rwkv``: RWKV-4 time mixing, a linear RNN with per-channel exponential decay.

Peng, Alcaide, Anthony, Albalak, Arcadinho, Biderman, Cao, Cheng, Chung, Grella, GV, He,
Hou, Kazienko, Kocon, Kong, Koptyra, Lau, Mantri, Mom, Saito, Song, Tang, Wang, Wind,
Wozniak, Zhang, Zhao, Zhou, Zhu, Zhu, "RWKV: Reinventing RNNs for the Transformer Era",
Findings of EMNLP 2023, arXiv:2305.13048.

Per channel (no heads; ``num_heads`` is not used), with token shift (the paper's eqs. 11-13)::

    r_t = W_r (μ_r ⊙ x_t + (1 - μ_r) ⊙ x_{t-1})      (k_t, v_t likewise with μ_k, μ_v)
    wkv_t = ( Σ_{i<t} e^{-(t-1-i)w + k_i} ⊙ v_i + e^{u + k_t} ⊙ v_t )
          / ( Σ_{i<t} e^{-(t-1-i)w + k_i}       + e^{u + k_t} )
    o_t = W_o ( σ(r_t) ⊙ wkv_t )

with the decay w = exp(w_param) > 0 per channel (the reference stores ``time_decay`` and
uses -exp(time_decay) as the log-decay) and the bonus u (``time_first``) for the current
token. x_0 = 0 (the reference's zero-padded time shift). Channel mixing, RWKV's
feed-forward half, is the block's MLP in this harness (the transformer's ``mlp`` option);
this module is the time-mixing half only.

Forms (both exact, both numerically stable: exponentials are taken relative to a running
maximum, as the reference's RNN form does with its state ``p``; computed in at least
float32, also under bf16 autocast):

* recurrent (decoding): the state per channel is (a, b, p, x_prev): a = Σ e^{…-p} v, b =
  Σ e^{…-p}, their common exponent p, and the previous input for the token shift; 4 ·
  d_model numbers per sequence, O(1) per token.
* parallel (training): the sequence is cut into chunks of ``chunk`` positions; within a
  chunk the weights e^{-(t-1-i)w + k_i} are formed in log space as a chunk x chunk x
  d_model block (each row normalised by its own maximum, together with the state carried
  in from earlier chunks), and the state is carried from chunk to chunk by the same
  recurrence. Time and memory O(L · chunk · d_model), linear in L; no L x L tensor.
  ``step`` runs the same function from a cached state, so a chunk of new tokens decodes in
  one call.

Initialisation follows the reference's layer-dependent "fancy init" (decay speeds
-5 + 8 (h/(D-1))^(0.7 + 1.3 ρ), ``time_first`` log 0.3 plus a zigzag, mix coefficients
(i/D)^(1-ρ')) taken at a middle layer (ρ = ρ' = 0.5): the build context has no layer index.

Position hooks: token embeddings only; the recurrence is itself positional (decay with
distance) and forms no queries and keys to rotate and no scores to bias.

Checked against ``BlinkDL/RWKV-LM``: ``RWKV-v4/src/model.py`` (``RWKV_TimeMix``: token
shift, mix coefficients, initialisation, the receptance gate) and
``RWKV-v4neo/src/model_run.py`` (``SA``: the stable recurrent form with state aa, bb, pp).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

import torch
from torch import Tensor, nn

from harness.plugin import Complexity, Ge, Mixer, MixerSpec, hookimpl

#: the exponent of an empty state: finite (so max() and differences never form inf - inf)
EMPTY = -1e38
NO_QK = "RWKV forms no queries and keys to rotate: its position information is the decay"
NO_BIAS = "RWKV forms no attention scores to add a bias to"


@dataclass
class RWKVConfig:
    #: positions per block of the parallel form (memory L x chunk x d_model; same result)
    chunk: Annotated[int, Ge(1)] = 16


def wkv(w: Tensor, u: Tensor, k: Tensor, v: Tensor, state: dict[str, Any], chunk: int) -> Tensor:
    """The WKV of k, v (B, L, D) continuing from ``state`` (a, b, p; updated in place).

    ``w`` (D,) > 0 is the decay per step, ``u`` (D,) the bonus of the current token.
    Runs in the dtype of ``k`` (the caller widens it)."""
    bsz, n, d = k.shape
    a = state.get("a", k.new_zeros(bsz, d))
    b = state.get("b", k.new_zeros(bsz, d))
    p = state.get("p", k.new_full((bsz, d), EMPTY))
    idx = torch.arange(chunk, device=k.device, dtype=k.dtype)
    lag = idx[:, None] - 1 - idx[None, :]  # t - 1 - i
    earlier = (lag >= 0)[None, :, :, None]
    same = torch.eye(chunk, dtype=torch.bool, device=k.device)[None, :, :, None]
    outs = []
    # chunks by split, not by slicing: a sliced chunk's gradient is a zero tensor of the whole
    # sequence, which made the backward pass O(L² / chunk)
    for kc, vc in zip(k.split(chunk, 1), v.split(chunk, 1), strict=True):
        c = kc.shape[1]
        # log weight of key i for query t within the chunk (B, t, i, D)
        inside = kc[:, None] - lag[:c, :c, None] * w
        inside = torch.where(earlier[:, :c, :c], inside,
                             torch.where(same[:, :c, :c], (u + kc)[:, None], float("-inf")))
        carried = p[:, None] - idx[:c, None] * w  # the state's exponent at each t (B, t, D)
        top = torch.maximum(inside.amax(dim=2), carried).detach()
        e = torch.exp(inside - top[:, :, None])
        ec = torch.exp(carried - top)
        num = torch.einsum("btid,bid->btd", e, vc) + ec * a[:, None]
        den = e.sum(dim=2) + ec * b[:, None]
        outs.append(num / den)
        # the state for the position after the chunk
        logs = kc - (c - 1 - idx[:c])[:, None] * w
        old = p - c * w
        p_new = torch.maximum(old, logs.amax(dim=1)).detach()
        scale, ek = torch.exp(old - p_new), torch.exp(logs - p_new[:, None])
        a = scale * a + (ek * vc).sum(dim=1)
        b = scale * b + ek.sum(dim=1)
        p = p_new
    state["a"], state["b"], state["p"] = a, b, p
    return torch.cat(outs, dim=1)


def token_shift(x: Tensor, state: dict[str, Any]) -> Tensor:
    """x_{t-1} for every t of ``x`` (B, L, D): the previous call's last input from ``state``
    (zero at the start, like the reference's zero-padded time shift); keeps x's last input."""
    prev = state.get("x", torch.zeros_like(x[:, 0]))
    state["x"] = x[:, -1]
    return torch.cat([prev[:, None].to(x.dtype), x[:, :-1]], dim=1)


class RWKV(Mixer):
    """RWKV-4 time mixing: token shift, per-channel decaying WKV with a bonus for the current token, sigmoid receptance gate."""

    complexity = Complexity(time="L", memory="L", decode="1", state="1")
    why_not = {"qk": NO_QK, "bias": NO_BIAS}

    def __init__(self, config: RWKVConfig, *, d_model: int, num_heads: int) -> None:
        super().__init__(d_model, num_heads)
        self.chunk = config.chunk
        d, rho = d_model, 0.5
        h = torch.arange(d, dtype=torch.float32)
        self.time_decay = nn.Parameter(-5 + 8 * (h / max(d - 1, 1)) ** (0.7 + 1.3 * rho))
        zigzag = ((h + 1) % 3 - 1) * 0.5
        self.time_first = nn.Parameter(torch.full((d,), math.log(0.3)) + zigzag)
        ramp = h / d
        self.time_mix_k = nn.Parameter(ramp ** (1 - rho))
        self.time_mix_v = nn.Parameter(ramp ** (1 - rho) + 0.3 * rho)
        self.time_mix_r = nn.Parameter(ramp ** (0.5 * (1 - rho)))
        self.key = nn.Linear(d, d, bias=False)
        self.value = nn.Linear(d, d, bias=False)
        self.receptance = nn.Linear(d, d, bias=False)
        self.output = nn.Linear(d, d, bias=False)

    def state_size(self, length: int) -> int:
        """a, b, p and the previous input, one each per channel."""
        return 0 if length == 0 else 4 * self.d_model

    def mix(self, x: Tensor, *, causal: bool, key_padding_mask: Tensor | None, position: Any) -> Tensor:
        return self.step(x, {}, positions=torch.arange(x.shape[1], device=x.device), position=position)

    def step(self, x: Tensor, state: dict[str, Any], *, positions: Tensor, position: Any) -> Tensor:
        shifted = token_shift(x, state)

        def mixed(mu: Tensor) -> Tensor:
            return x * mu + shifted * (1 - mu)

        k, v = self.key(mixed(self.time_mix_k)), self.value(mixed(self.time_mix_v))
        r = self.receptance(mixed(self.time_mix_r))
        wide = torch.promote_types(k.dtype, torch.float32)
        sums = {name: state[name] for name in ("a", "b", "p") if name in state}
        out = wkv(torch.exp(self.time_decay.to(wide)), self.time_first.to(wide),
                  k.to(wide), v.to(wide), sums, self.chunk)
        state.update(sums)
        return self.output(torch.sigmoid(r) * out.to(r.dtype))  # type: ignore[no-any-return]


@hookimpl
def harness_register_mixer(register: Any) -> None:
    register(MixerSpec(name="rwkv", build=RWKV))
