"""Chunked linear recurrences with decay, shared by the linear-attention mixers
(``retnet``, ``gla``, ``deltanet``, ``gated_deltanet``).

Two recurrences over a matrix state ``S`` (Dk x Dv) per head, each with its chunked form
(training, full passes) and its one-step form (decoding):

* **decayed linear attention** (RetNet, GLA)::

      S_t = diag(a_t) S_{t-1} + k_tᵀ v_t,     o_t = q_t S_t

  with ``log_decay`` = log a_t either per key dimension (GLA, shape (..., Dk)) or one scalar
  per head (RetNet, shape (..., 1));

* **the (gated) delta rule** (DeltaNet, Gated DeltaNet)::

      S_t = a_t (I - b_t k_t k_tᵀ) S_{t-1} + b_t k_t v_tᵀ,     o_t = q_t S_t

  with a scalar decay a_t per head (``log_decay=None``: a_t = 1, plain DeltaNet) and the
  writing strength b_t (``beta``).

Chunked form: the sequence is cut into chunks of C positions (the last one padded with
k = v = 0, log a = 0, b = 0, which leave the state unchanged). With B_t the cumulative log
decay inside a chunk (B_t = Σ_{s<=t} log a_s), every decay factor is exp(B_t - B_s) for
s <= t, exp(B_t) from the chunk's start, or exp(B_C - B_s) to its end: all exponents are
<= 0, so nothing overflows however strong the decay (the factors of positions s > t are
masked to -inf before the exponential). Inside a chunk everything is matrix products over
all chunks at once; only the state is carried from chunk to chunk, by a loop over the L/C
chunks. Time O(L·C·D), memory O(L·C) (+ O(L·C·Dk) for per-dimension decays): linear in L.

* Linear attention, chunk of queries/keys t, s: o_t = (q_t ⊙ e^{B_t}) S_0 +
  Σ_{s<=t} (Σ_d q_td k_sd e^{B_td - B_sd}) v_s, and S_C = e^{B_C} ⊙ S_0 + Σ_s (k_s ⊙ e^{B_C - B_s})ᵀ v_s.
* Delta rule (Yang et al., 2024, the WY / UT representation): writing S_t = e^{B_t} S_0 +
  Σ_{s<=t} e^{B_t - B_s} k_s u_sᵀ, the pseudo-values u solve the unit lower-triangular
  system (I + A) U = diag(b) V - diag(b e^{B}) K S_0 with A_ts = b_t e^{B_t - B_s} k_t·k_s
  (s < t). So U = U_v - W S_0, where U_v and W (one triangular solve per chunk, all chunks at
  once) do not depend on the state; then o_t = e^{B_t} q_t S_0 + Σ_{s<=t} e^{B_t - B_s} (q_t·k_s) u_s.

Numerics run in float32 (float64 stays float64) with autocast disabled, whatever the input
dtype; outputs are cast back. A chunk of C >= L is the fully parallel form.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.nn import documents, fast_path
from harness.nn.mixer import Mixer
from harness.nn.parametrization import qk_scale

ChunkFn = Callable[..., tuple[Tensor, Tensor]]


def head_width(d_model: int, expand: float, num_heads: int, *, even: bool = False) -> int:
    """Per-head width d_model * expand / num_heads, rounded to an integer >= 1 (``even``: to
    an even number >= 2, so that rotations, which turn pairs of dimensions, apply)."""
    width = d_model * expand / num_heads
    return 2 * max(1, round(width / 2)) if even else max(1, round(width))


def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """(B, L, H·D) -> (B, H, L, D)."""
    b, n, _ = x.shape
    return x.view(b, n, num_heads, -1).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """(B, H, L, D) -> (B, L, H·D)."""
    b, h, n, d = x.shape
    return x.transpose(1, 2).reshape(b, n, h * d)


def compute_dtype(x: Tensor) -> torch.dtype:
    """float64 stays float64; everything else (bf16, fp16, fp32) runs in float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _chunks(x: Tensor, chunk: int) -> Tensor:
    """(B, H, L, D) -> (B, H, N, C, D), zero-padded at the end to N·C positions."""
    b, h, n, d = x.shape
    pad = -n % chunk
    if pad:
        x = F.pad(x, (0, 0, 0, pad))
    return x.view(b, h, -1, chunk, d)


def _decays(log_decay: Tensor, starts: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """From chunked log decays (B, H, N, C, G): e^{B_t} (B_t cumulative), e^{B_t - B_s} (s <= t,
    0 above the diagonal; (B, H, N, C, C, G)), e^{B_C - B_t} and e^{B_C}.

    ``starts`` (B, 1, N, C, 1), 1 at document starts: a start's decay is 0 (the state carried
    into it is forgotten), so every factor whose span crosses a start is exactly 0. With c_t
    the starts at or before t in the chunk: e^{B_t - B_s} is kept where c_t = c_s, e^{B_t}
    where c_t = 0, e^{B_C - B_t} where c_C = c_t, e^{B_C} where c_C = 0 (no -inf is summed)."""
    cum = log_decay.cumsum(-2)
    size = cum.shape[-2]
    causal = torch.ones(size, size, dtype=torch.bool, device=cum.device).tril()
    diff = cum.unsqueeze(-2) - cum.unsqueeze(-3)
    pair = diff.masked_fill(~causal[..., None], float("-inf")).exp()
    last = cum[..., -1:, :]
    start, to_end, whole = cum.exp(), (last - cum).exp(), last.exp()
    if starts is not None:
        c = starts.cumsum(-2)
        pair = pair * (c.unsqueeze(-2) == c.unsqueeze(-3))
        start, to_end, whole = start * (c == 0), to_end * (c[..., -1:, :] == c), whole * (c[..., -1:, :] == 0)
    return start, pair, to_end, whole


def _starts(starts: Tensor | None, chunk: int) -> Tensor | None:
    """(B, L) document starts -> (B, 1, N, C, 1) chunked, as floats (see :func:`_decays`)."""
    return None if starts is None else _chunks(starts[:, None, :, None].float(), chunk)


def _run(fn: ChunkFn, *args: Any, chunk: int, state: Tensor | None,
         starts: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Call ``fn`` in float32 (or float64) with autocast off; outputs in the input dtype,
    the state in the compute dtype."""
    q = args[0]
    dtype = compute_dtype(q)
    chunk = max(1, min(chunk, q.shape[-2]))
    with torch.autocast(device_type=q.device.type, enabled=False):
        cast = [a.to(dtype) if isinstance(a, Tensor) else a for a in args]
        out, new_state = fn(*cast, chunk=chunk, state=None if state is None else state.to(dtype),
                            starts=_starts(starts, chunk))
    return out.to(q.dtype), new_state


def chunked_linear_attention(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, *, chunk: int,
                             state: Tensor | None = None, starts: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Decayed linear attention over whole sequences: q, k (B, H, L, Dk), v (B, H, L, Dv),
    ``log_decay`` (B, H, L, Dk) or (B, H, L, 1); ``state`` S_0 (B, H, Dk, Dv) or None (zeros);
    ``starts`` (B, L) bool or None: document starts, where the carried state is multiplied
    by 0 (a_t = 0). Returns the outputs (B, H, L, Dv) and the final state."""
    return _run(_linear_attention, q, k, v, log_decay, chunk=chunk, state=state, starts=starts)


def _linear_attention(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, *, chunk: int,
                      state: Tensor | None, starts: Tensor | None = None) -> tuple[Tensor, Tensor]:
    b, h, length, dk = q.shape
    qc, kc, vc, gc = (_chunks(t, chunk) for t in (q, k, v, log_decay))
    from_start, pair, to_end, whole = _decays(gc, starts)
    if gc.shape[-1] == 1:  # one decay per head: (D ⊙ QKᵀ) V
        scores = (qc @ kc.transpose(-1, -2)) * pair[..., 0]
    else:  # per key dimension: Σ_d q_td k_sd e^{B_td - B_sd}
        scores = torch.einsum("...td,...tsd,...sd->...ts", qc, pair, kc)
    intra = scores @ vc
    q_in, k_out, carry = qc * from_start, kc * to_end, whole.transpose(-1, -2)
    s = state if state is not None else q.new_zeros(b, h, dk, v.shape[-1])
    outs = []
    # chunks by unbind, not by index: the gradient of an indexed chunk is a zero tensor of the
    # whole sequence, which made the backward pass O(L² / chunk)
    for intra_i, q_i, carry_i, k_i, v_i in zip(*(t.unbind(2) for t in (intra, q_in, carry, k_out, vc)),
                                                strict=True):
        outs.append(intra_i + q_i @ s)
        s = carry_i * s + k_i.transpose(-1, -2) @ v_i
    return torch.stack(outs, 2).flatten(2, 3)[:, :, :length], s


def linear_attention_step(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor,
                          state: Tensor | None) -> tuple[Tensor, Tensor]:
    """One position of decayed linear attention: q, k (B, H, Dk), v (B, H, Dv), ``log_decay``
    (B, H, Dk) or (B, H, 1); returns o (B, H, Dv) and the new state (B, H, Dk, Dv)."""
    dtype, out_dtype = compute_dtype(q), q.dtype
    with torch.autocast(device_type=q.device.type, enabled=False):
        q, k, v, g = (t.to(dtype) for t in (q, k, v, log_decay))
        s = state.to(dtype) if state is not None else q.new_zeros(*q.shape, v.shape[-1])
        s = g.exp().unsqueeze(-1) * s + k.unsqueeze(-1) * v.unsqueeze(-2)
        out = (q.unsqueeze(-2) @ s).squeeze(-2)
    return out.to(out_dtype), s


def chunked_delta_rule(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_decay: Tensor | None, *,
                       chunk: int, state: Tensor | None = None,
                       starts: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The (gated) delta rule over whole sequences: q, k (B, H, L, Dk), v (B, H, L, Dv),
    ``beta`` (B, H, L), ``log_decay`` (B, H, L) or None (no decay); ``state`` and ``starts``
    as in :func:`chunked_linear_attention` (a start: S_t = b_t k_t v_tᵀ)."""
    g = torch.zeros_like(beta) if log_decay is None else log_decay
    return _run(_delta_rule, q, k, v, beta, g, chunk=chunk, state=state, starts=starts)


def _delta_rule(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_decay: Tensor, *, chunk: int,
                state: Tensor | None, starts: Tensor | None = None) -> tuple[Tensor, Tensor]:
    b, h, length, dk = q.shape
    dv = v.shape[-1]
    qc, kc, vc = (_chunks(t, chunk) for t in (q, k, v))
    bc, gc = (_chunks(t.unsqueeze(-1), chunk) for t in (beta, log_decay))
    from_start, pair, to_end, whole = _decays(gc, starts)
    pair = pair[..., 0]
    strict = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril(-1)
    lower = (bc * (kc @ kc.transpose(-1, -2)) * pair).masked_fill(~strict, 0.0)
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    rhs = torch.cat([bc * vc, bc * from_start * kc], dim=-1)
    solved = torch.linalg.solve_triangular(eye + lower, rhs, upper=False, unitriangular=True)
    u_v, w = solved.split([dv, dk], dim=-1)
    scores = (qc @ kc.transpose(-1, -2)) * pair
    q_in, k_out = qc * from_start, kc * to_end
    s = state if state is not None else q.new_zeros(b, h, dk, dv)
    outs = []
    for uv_i, w_i, q_i, score_i, whole_i, k_i in zip(
            *(t.unbind(2) for t in (u_v, w, q_in, scores, whole, k_out)), strict=True):  # unbind: as above
        u = uv_i - w_i @ s
        outs.append(q_i @ s + score_i @ u)
        s = whole_i * s + k_i.transpose(-1, -2) @ u
    return torch.stack(outs, 2).flatten(2, 3)[:, :, :length], s


def delta_rule_step(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_decay: Tensor | None,
                    state: Tensor | None) -> tuple[Tensor, Tensor]:
    """One position of the (gated) delta rule: q, k (B, H, Dk), v (B, H, Dv), ``beta`` and
    ``log_decay`` (B, H) (or None); returns o (B, H, Dv) and the new state (B, H, Dk, Dv)."""
    dtype, out_dtype = compute_dtype(q), q.dtype
    with torch.autocast(device_type=q.device.type, enabled=False):
        q, k, v, beta = (t.to(dtype) for t in (q, k, v, beta))
        s = state.to(dtype) if state is not None else q.new_zeros(*q.shape, v.shape[-1])
        if log_decay is not None:
            s = log_decay.to(dtype).exp()[..., None, None] * s
        u = beta.unsqueeze(-1) * (v - (k.unsqueeze(-2) @ s).squeeze(-2))
        s = s + k.unsqueeze(-1) * u.unsqueeze(-2)
        out = (q.unsqueeze(-2) @ s).squeeze(-2)
    return out.to(out_dtype), s


class ShortConvolution(nn.Module):
    """Depthwise causal convolution over time (kernel K, no bias) followed by SiLU, as on the
    query, key and value paths of DeltaNet and Gated DeltaNet. Its decoding state is the last
    K - 1 inputs, (B, K - 1, channels)."""

    def __init__(self, channels: int, kernel: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(channels, channels, kernel, groups=channels, bias=False)
        self.kernel = kernel

    def forward(self, x: Tensor, state: dict[str, Any] | None = None, key: str = "conv",
                starts: Tensor | None = None) -> Tensor:
        """x (B, L, channels); with ``state``, continue from ``state[key]`` and update it.
        ``starts`` (B, L; no state): document starts, which no input before them reaches."""
        if starts is not None:
            return F.silu(documents.causal_conv(x, self.conv.weight[:, 0].to(x.dtype), starts))
        keep = self.kernel - 1
        prev = state.get(key) if state is not None else None
        if prev is None:
            prev = x.new_zeros(x.shape[0], keep, x.shape[2])
        padded = torch.cat([prev.to(x.dtype), x], dim=1)
        if state is not None and keep:
            state[key] = padded[:, padded.shape[1] - keep:]
        y = F.conv1d(padded.transpose(1, 2), self.conv.weight, groups=x.shape[2])
        return F.silu(y.transpose(1, 2))

    def state_size(self) -> int:
        return (self.kernel - 1) * self.conv.in_channels


def linear_attention(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, *, chunk: int,
                     state: dict[str, Any] | None, starts: Tensor | None = None,
                     kernel: str = "reference", gamma: Tensor | None = None) -> Tensor:
    """Decayed linear attention over the positions of q, k, v (B, H, l, ·): the chunked form
    from zeros (``state`` None; ``starts``: document starts, where the state is forgotten),
    else continued from ``state["S"]``, which is updated (one position: the recurrent step;
    several: the chunked form from that state). From zeros on CUDA, ``kernel`` may pick
    FLA's kernel (:mod:`harness.nn.fast_path`; ``starts`` as its ``cu_seqlens``; ``gamma``
    (H,): ``log_decay`` is this decay fixed per head, handed to FLA as ``g_gamma``)."""
    if state is None:
        if fast_path.use_fla(kernel, q, resets=starts):
            return fast_path.linear_attention(q, k, v, log_decay, gamma=gamma, starts=starts)
        return chunked_linear_attention(q, k, v, log_decay, chunk=chunk, starts=starts)[0]
    if q.shape[-2] == 1:
        out, state["S"] = linear_attention_step(q[..., 0, :], k[..., 0, :], v[..., 0, :],
                                                log_decay[..., 0, :], state.get("S"))
        return out.unsqueeze(-2)
    out, state["S"] = chunked_linear_attention(q, k, v, log_decay, chunk=chunk, state=state.get("S"))
    return out


def delta_rule(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_decay: Tensor | None, *, chunk: int,
               state: dict[str, Any] | None, starts: Tensor | None = None,
               kernel: str = "reference") -> Tensor:
    """The (gated) delta rule over the positions of q, k, v, as :func:`linear_attention`."""
    if state is None:
        if fast_path.use_fla(kernel, q, resets=starts):
            return fast_path.delta_rule(q, k, v, beta, log_decay, starts=starts)
        return chunked_delta_rule(q, k, v, beta, log_decay, chunk=chunk, starts=starts)[0]
    if q.shape[-2] == 1:
        g = None if log_decay is None else log_decay[..., 0]
        out, state["S"] = delta_rule_step(q[..., 0, :], k[..., 0, :], v[..., 0, :], beta[..., 0], g,
                                          state.get("S"))
        return out.unsqueeze(-2)
    out, state["S"] = chunked_delta_rule(q, k, v, beta, log_decay, chunk=chunk, state=state.get("S"))
    return out


class RecurrentMixer(Mixer):
    """A mixer whose parallel and cached forms are one computation, :meth:`run`, from a
    zero state (``state`` None) or continued from ``state`` over absolute ``positions``.
    ``starts`` (a full pass only): document starts, where the state is multiplied by 0
    (:mod:`harness.nn.documents`)."""

    resets = True

    def mix(self, x: Tensor, *, causal: bool, key_padding_mask: Tensor | None, position: Any,
            document_starts: Tensor | None = None) -> Tensor:
        return self.run(x, torch.arange(x.shape[1], device=x.device), position, None, starts=document_starts)

    def step(self, x: Tensor, state: dict[str, Any], *, positions: Tensor, position: Any) -> Tensor:
        return self.run(x, positions, position, state)

    def run(self, x: Tensor, positions: Tensor, position: Any, state: dict[str, Any] | None,
            starts: Tensor | None = None) -> Tensor:
        raise NotImplementedError


class DeltaRuleInputs(nn.Module):
    """Queries, keys, values and writing strengths of the delta-rule layers (DeltaNet, Gated
    DeltaNet): one projection to q, k, v (no bias), a short depthwise causal convolution with
    SiLU over all three, L2-normalised q and k (q also scaled by Dk^-1/2), a position
    scheme's rotation of q and k, and b = sigmoid(x W_b) per head. Its decoding state is the
    convolution's (``state["conv"]``)."""

    qk_normalized = True  # unit q and k: μP holds the Dk^-1/2 at its base-width value

    def __init__(self, d_model: int, num_heads: int, dk: int, dv: int, conv_size: int) -> None:
        super().__init__()
        self.num_heads, self.dk, self.dv = num_heads, dk, dv
        self.qk_dim = dk  # q / sqrt(Dk) on unit q and k: under μP held at its base value
        widths = [num_heads * dk, num_heads * dk, num_heads * dv]
        self.widths = widths
        self.qkv_proj = nn.Linear(d_model, sum(widths), bias=False)
        self.conv = ShortConvolution(sum(widths), conv_size)
        self.b_proj = nn.Linear(d_model, num_heads, bias=False)

    def forward(self, x: Tensor, positions: Tensor, position: Any, state: dict[str, Any] | None,
                starts: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        dtype = compute_dtype(x)
        q, k, v = (split_heads(t, self.num_heads).to(dtype)
                   for t in self.conv(self.qkv_proj(x), state, starts=starts).split(self.widths, dim=-1))
        q, k = F.normalize(q, dim=-1, eps=1e-6), F.normalize(k, dim=-1, eps=1e-6)
        if position is not None:
            q, k = position.rotate(q, k, positions, positions)
        beta = self.b_proj(x).to(dtype).sigmoid().transpose(1, 2)
        return q * qk_scale(self, self.dk, self.dk**-0.5), k, v, beta

    def state_size(self) -> int:
        return self.conv.state_size()
