"""``rwkv6``: RWKV-6 "Finch" time mixing: data-dependent decay and a matrix-valued state per head.

Peng, Goldstein, Anthony, Albalak, Alcaide, Biderman, Cheah, Du, Ferdinan, Hou, Kazienko, GV,
Kocon, Koptyra, Krishna, McClelland, Muennighoff, Obeid, Saito, Song, Tu, Wozniak, Zhang,
Zhao, Zhao, Zhou, Zhu, Zhu, "Eagle and Finch: RWKV with Matrix-Valued States and Dynamic
Recurrence", 2024, arXiv:2404.05892.

Per token (the paper's section 4.2), with Δx_t = x_{t-1} - x_t (x_{-1} = 0):

    data-dependent token shift (ddlerp): for ◇ in {w, k, v, r, g}
        m_◇ = (tanh((x_t + μ_x ⊙ Δx_t) A) B_◇)            (one low-rank map, rank ``mix_rank``)
        x◇_t = x_t + Δx_t ⊙ (μ_◇ + m_◇)
    r_t = W_r xr_t,  k_t = W_k xk_t,  v_t = W_v xv_t,  g_t = SiLU(W_g xg_t)
    data-dependent decay: d_t = d + tanh(xw_t C) D       (rank ``decay_rank``),  w_t = exp(-exp(d_t))
    per head (head size K = d_model / heads), with a K x K state S:
        y_t = r_t (diag(u) k_tᵀ v_t + S_{t-1})
        S_t = diag(w_t) S_{t-1} + k_tᵀ v_t
    o_t = W_o (GroupNorm_heads(y_t) ⊙ g_t)

Channel mixing, RWKV's feed-forward half, is the block's MLP in this harness (the
transformer's ``mlp`` option); this module is the time-mixing half only.

Forms (both exact):

* recurrent (decoding): the state is x_{t-1} (d_model) and S (heads x K x K): d_model · (1 + K)
  numbers per sequence, O(1) per token.
* parallel (training): chunks of ``chunk`` positions. With the cumulative log-decay b_t =
  Σ_{s<=t} log w_s inside a chunk, a query sees the state carried in through exp(b_{t-1}) and
  the chunk's earlier keys through exp(b_{t-1} - b_i), both at most 1 (formed per key channel
  as a chunk x chunk x K block: no exponential ever grows); the state is carried from chunk to
  chunk. Time and memory O(L · chunk · d_model), linear in L. The decay, sums and products
  run in at least float32 (also under bf16 autocast).

Initialisation follows the reference's "fancy init" (mix coefficients 1 - (i/D)^ρ', decay
speeds -6 + 5 (n/(D-1))^(0.7 + 1.3 ρ), bonus u with a zigzag, low-rank maps zero / ±0.01)
at a middle layer (ρ = ρ' = 0.5): the build context has no layer index. The low-rank widths
default to half the reference's (32 and 64 there) for the small models of this harness.

Position hooks: token embeddings only: the decay carries the position information, and the
paper rotates neither r nor k and adds no score bias.

Checked against ``BlinkDL/RWKV-LM``: ``RWKV-v5/rwkv_v6_demo.py`` (``RWKV_Tmix_x060``: ddlerp,
LoRA decay, GroupNorm ``ln_x`` with eps 1e-5 · 8², gate; the RNN form ``time_mixing``) and
``RWKV-v5/cuda/wkv6_cuda.cu`` (the operator: y = r · (u ⊙ kvᵀ + S), S = w ⊙ S + kvᵀ).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.plugin import Choice, Complexity, Ge, IntRange, Mixer, MixerSpec, fast_path, hookimpl
from harness_plugins.mixers.rwkv import NO_BIAS, token_shift

NO_QK = ("RWKV-6 carries position information in its decay; the paper rotates neither r nor k, "
         "so a rotary scheme has nothing to act on")


@dataclass
class RWKV6Config:
    #: rank of the low-rank map behind the data-dependent token shift (reference: 32)
    mix_rank: Annotated[int, Ge(1), Choice((8, 16, 32))] = 16
    #: rank of the low-rank map behind the data-dependent decay (reference: 64)
    decay_rank: Annotated[int, Ge(1), Choice((16, 32, 64))] = 32
    #: positions per block of the parallel form (memory L x chunk x d_model; same result)
    chunk: Annotated[int, Ge(1), IntRange(8, 64, log=True)] = 16


def wkv6(r: Tensor, k: Tensor, v: Tensor, log_w: Tensor, u: Tensor, state: Tensor, chunk: int,
         starts: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """y_t = r_t (diag(u) k_tᵀ v_t + S_{t-1}), S_t = diag(w_t) S_{t-1} + k_tᵀ v_t, by chunks.

    ``r, k, log_w`` (B, H, L, K), ``v`` (B, H, L, V), ``u`` (H, K), ``state`` (B, H, K, V).
    ``starts`` (B, L) bool: document starts, where S_{t-1} is forgotten (every decay factor
    spanning a start is 0: kept where the chunk's counts of starts agree).
    Returns y (B, H, L, V) and the final state."""
    ys = []
    flags = (r.new_zeros(r.shape[0], 1, r.shape[2], 1) if starts is None
             else starts[:, None, :, None].to(r.dtype))
    # chunks by split, not by slicing (a sliced chunk's gradient is a zero tensor of the whole
    # sequence: O(L² / chunk) in the backward pass)
    for rc, kc, vc, lw, fc in zip(*(t.split(chunk, 2) for t in (r, k, v, log_w, flags)), strict=True):
        c = rc.shape[2]
        incl = lw.cumsum(dim=2)  # b_t
        excl = incl - lw  # b_{t-1}
        carried, last = excl.exp(), incl[:, :, -1:]  # b at the chunk's end
        lag = excl[:, :, :, None] - incl[:, :, None, :]  # (B, H, t, i, K): log Π_{i<s<t} w_s
        earlier = torch.ones(c, c, dtype=torch.bool, device=r.device).tril(-1)[:, :, None]
        decay = lag.masked_fill(~earlier, float("-inf")).exp()
        whole, to_end = last.exp(), (last - incl).exp()
        if starts is not None:
            n = fc.cumsum(dim=2)  # (B, 1, c, 1) starts at or before t
            end = n[:, :, -1:]
            carried, whole, to_end = carried * (n == 0), whole * (end == 0), to_end * (end == n)
            decay = decay * (n[:, :, :, None] == n[:, :, None, :])
        y = (rc * carried) @ state  # what the carried state contributes
        scores = torch.einsum("bhtj,bhij,bhtij->bhti", rc, kc, decay)
        bonus = (rc * u[:, None] * kc).sum(dim=-1, keepdim=True)
        ys.append(y + scores @ vc + bonus * vc)
        state = whole.transpose(-2, -1) * state + (to_end * kc).transpose(-2, -1) @ vc
    return torch.cat(ys, dim=2), state


class RWKV6(Mixer):
    """RWKV-6 (Finch) time mixing: data-dependent token shift and decay (low-rank), matrix-valued state per head, GroupNorm and SiLU gate."""

    complexity = Complexity(time="L", memory="L", decode="1", state="1")
    fast_path_ops = ("fla.ops.rwkv6.chunk_rwkv6",)  # on CUDA (harness.nn.fast_path)
    why_not = {"qk": NO_QK, "bias": NO_BIAS}

    def __init__(self, config: RWKV6Config, *, d_model: int, num_heads: int) -> None:
        super().__init__(d_model, num_heads)
        if d_model % num_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by heads ({num_heads}): "
                             f"RWKV-6 splits its state into heads of d_model / heads channels.")
        d, rho = d_model, 0.5
        self.head_size, self.chunk = d // num_heads, config.chunk
        ramp = torch.arange(d, dtype=torch.float32) / d
        self.time_maa_x = nn.Parameter(1 - ramp ** (1 - rho))
        self.time_maa = nn.Parameter(torch.stack([  # w, k, v, r, g
            1 - ramp ** (1 - rho), 1 - ramp ** (1 - rho), 1 - (ramp ** (1 - rho) + 0.3 * rho),
            1 - ramp ** (0.5 * (1 - rho)), 1 - ramp ** (0.5 * (1 - rho))]))
        self.time_maa_w1 = nn.Parameter(torch.zeros(d, 5 * config.mix_rank))
        self.time_maa_w2 = nn.Parameter(torch.empty(5, config.mix_rank, d).uniform_(-0.01, 0.01))
        n = torch.arange(d, dtype=torch.float32) / max(d - 1, 1)
        self.time_decay = nn.Parameter(-6 + 5 * n ** (0.7 + 1.3 * rho))
        self.time_decay_w1 = nn.Parameter(torch.zeros(d, config.decay_rank))
        self.time_decay_w2 = nn.Parameter(torch.empty(config.decay_rank, d).uniform_(-0.01, 0.01))
        zigzag = ((torch.arange(d) + 1) % 3 - 1) * 0.1
        self.time_faaaa = nn.Parameter((rho * (1 - n) + zigzag).view(num_heads, self.head_size))
        self.receptance, self.key, self.value, self.gate, self.output = (
            nn.Linear(d, d, bias=False) for _ in range(5))
        self.ln_x = nn.GroupNorm(num_heads, d, eps=1e-5 * 8 ** 2)

    def state_size(self, length: int) -> int:
        """The previous input (d_model) and one K x K state per head."""
        return 0 if length == 0 else self.d_model * (1 + self.head_size)

    resets = True  # mix takes document_starts: the state and the token shift start afresh

    def mix(self, x: Tensor, *, causal: bool, key_padding_mask: Tensor | None, position: Any,
            document_starts: Tensor | None = None) -> Tensor:
        return self.step(x, {}, positions=torch.arange(x.shape[1], device=x.device), position=position,
                         starts=document_starts)

    def step(self, x: Tensor, state: dict[str, Any], *, positions: Tensor, position: Any,
             starts: Tensor | None = None) -> Tensor:
        b, n, d = x.shape
        previous = token_shift(x, state)
        if starts is not None:  # a document's first token shifts in zeros, as a sequence's does
            previous = previous.masked_fill(starts[..., None], 0.0)
        delta = previous - x
        lora = torch.tanh((x + delta * self.time_maa_x) @ self.time_maa_w1)
        lora = torch.einsum("blmr,mrd->mbld", lora.unflatten(-1, (5, -1)), self.time_maa_w2)
        xw, xk, xv, xr, xg = (x + delta * (mu + m) for mu, m in zip(self.time_maa, lora, strict=True))
        wide = torch.promote_types(x.dtype, torch.float32)
        decay = self.time_decay + torch.tanh(xw @ self.time_decay_w1) @ self.time_decay_w2
        log_w = -torch.exp(decay.to(wide))

        def heads(t: Tensor) -> Tensor:
            return t.to(wide).view(b, n, self.num_heads, self.head_size).transpose(1, 2)

        s = state.get("S")
        if s is None:
            s = x.new_zeros(b, self.num_heads, self.head_size, self.head_size, dtype=wide)
        args = (heads(self.receptance(xr)), heads(self.key(xk)), heads(self.value(xv)), heads(log_w),
                self.time_faaaa.to(wide), s)
        if n > 1 and fast_path.use_fla(self.kernel, x, resets=starts):
            y, state["S"] = fast_path.rwkv6(*args, starts=starts)
        else:  # one token, the CPU: the reference
            y, state["S"] = wkv6(*args, self.chunk, starts)
        y = self.ln_x(y.transpose(1, 2).reshape(b * n, d).to(x.dtype)).view(b, n, d)
        return self.output(y * F.silu(self.gate(xg)))  # type: ignore[no-any-return]


@hookimpl
def harness_register_mixer(register: Any) -> None:
    register(MixerSpec(name="rwkv6", build=RWKV6, exempt={
        "gradients": "as in the reference (RWKV-v5/v6 src/model.py), the data-dependent LoRAs start "
                     "with a zero input matrix (time_maa_w1, time_decay_w1), so at initialisation no "
                     "gradient reaches time_maa_x, time_maa_w2 or time_decay_w2; it does after the "
                     "first update of the zero matrices",
    }))
