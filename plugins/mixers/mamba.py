"""``mamba``: the mixer of the Mamba block, a selective state-space model (S6).

Gu & Dao, "Mamba: Linear-Time Sequence Modeling with Selective State Spaces", 2023,
arXiv:2312.00752. Checked against the reference implementation ``state-spaces/mamba``:
``mamba_ssm/modules/mamba_simple.py`` (``Mamba``: the block, its initialisation and its
``step``), ``mamba_ssm/ops/selective_scan_interface.py`` (``selective_scan_ref``: the scan
and its discretisation) and ``mamba_ssm/ops/triton/selective_state_update.py``
(``selective_state_update_ref``: one decoding step).

What it computes, for an input u (B, L, d_model), with E·d = ``expand`` · d_model channels
and N = ``d_state``::

    x, z  = in_proj(u)                                  two branches of E·d channels
    x     = SiLU(conv1d(x))                             causal depthwise conv, width d_conv
    Δ     = softplus(W_Δ (W_r x) + b_Δ)                 per channel; low rank r = dt_rank
    B, C  = W_B x, W_C x                                (B, L, N), shared by all channels
    A     = -exp(A_log)                                 (E·d, N), S4D-Real init A_dn = -(n+1)
    h_t   = exp(Δ_t A) ⊙ h_{t-1} + (Δ_t x_t) ⊗ B_t      h: (E·d, N) per sequence
    y_t   = h_t C_t + D ⊙ x_t
    out   = out_proj(y ⊙ SiLU(z))

The discretisation is the reference's: zero-order hold for A (exp(Δ A)), the Euler step Δ B
for B. Initialisation as in the reference: b_Δ is the inverse softplus of Δ drawn
log-uniformly in [dt_min, dt_max], W_Δ uniform in ±dt_rank^-1/2, D = 1. (The reference's
whole-model init, zero Linear biases and out_proj rescaled by 1/sqrt(layers), belongs to the
model, not the mixer.) The Mamba block has no MLP: ``transformer`` with ``mlp: none``
reproduces the paper's stack of (norm, mixer) residual blocks; with an MLP it is a hybrid.

Parallel form (training): the sequence is cut into chunks of ``chunk_size`` positions. The
recurrence is linear in h, so within a chunk it is an inclusive scan under the associative
operator (a, b) ∘ (a', b') = (a a', a' b + b') of the pairs (exp(Δ_t A), Δ_t x_t B_t),
computed in log2(chunk_size) parallel steps (Hillis-Steele); the state at the chunk's end
is carried into the next chunk. The forward pass keeps only the outputs and the state
entering each chunk; the backward pass recomputes one chunk at a time from its entering state
(as the reference's fused kernel recomputes), so training memory is linear in L:
O(L (E·d + N) + (L / chunk_size) E·d N) plus one chunk's work space, never (B, L, E·d, N). Time O(L E·d N log chunk_size). The scan runs in float32 (float64 for
float64 inputs), outside autocast.

Recurrent form (decoding): the cache keeps the conv state (the last d_conv - 1 inputs of the
conv, E·d each) and the SSM state h (E·d × N); each token costs O(1) in L, and a chunk of
new tokens runs the same chunked scan from the cached state. State per sequence:
E·d · (d_conv - 1 + N) elements, independent of L.

Position: Mamba takes the position of a token from its causal recurrence; an embedding
scheme (``embedding``) applies to its input. It forms no queries and keys to rotate (``qk``)
and no scores to bias (``bias``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from harness.nn.selective import CausalDepthwiseConv, full_precision, scan_dtype, step_size_bias
from harness.plugin import Choice, Complexity, Ge, Gt, IntRange, Mixer, MixerSpec, hookimpl

WHY_NOT = {
    "qk": "Mamba forms no queries and keys to rotate: B and C are input-dependent write and "
          "read vectors of a recurrence whose order already encodes position",
    "bias": "Mamba forms no attention scores, so there is no score to add a bias to",
}


@dataclass
class MambaConfig:
    d_state: Annotated[int, Ge(1), Choice((8, 16, 32, 64))] = 16  # N
    expand: Annotated[int, Ge(1), Choice((1, 2, 4))] = 2  # E: inner channels = E * d_model
    d_conv: Annotated[int, Ge(1), IntRange(2, 4)] = 4  # width of the causal depthwise conv
    dt_rank: Annotated[int | None, Ge(1)] = None  # rank of the Δ projection; None: ceil(d_model / 16)
    dt_min: Annotated[float, Gt(0.0)] = 0.001  # initial Δ is log-uniform in [dt_min, dt_max]
    dt_max: Annotated[float, Gt(0.0)] = 0.1
    conv_bias: bool = True
    bias: bool = False  # biases of in_proj and out_proj
    chunk_size: Annotated[int, Ge(1)] = 64  # positions per chunk of the scan (speed/memory only)

    def __post_init__(self) -> None:
        if self.dt_min > self.dt_max:
            raise ValueError(f"dt_min ({self.dt_min}) must not exceed dt_max ({self.dt_max}).")


def scan_chunk(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, h0: Tensor) -> tuple[Tensor, Tensor]:
    """The selective scan over one chunk of T positions, from the state ``h0`` (b, d, n).

    u, delta: (b, T, d); A: (d, n); B, C: (b, T, n). Returns y_t = C_t h_t (b, T, d) and h_T.
    """
    decay = torch.exp(delta.unsqueeze(-1) * A)  # exp(Δ_t A): (b, T, d, n)
    drive = (delta * u).unsqueeze(-1) * B.unsqueeze(2)  # Δ_t x_t B_t: (b, T, d, n)
    span = 1
    while span < decay.shape[1]:  # after the loop: drive_t = h_t from h0 = 0, decay_t = Π_{s<=t}
        drive = torch.cat([drive[:, :span], decay[:, span:] * drive[:, :-span] + drive[:, span:]], dim=1)
        decay = torch.cat([decay[:, :span], decay[:, span:] * decay[:, :-span]], dim=1)
        span *= 2
    h = drive + decay * h0.unsqueeze(1)
    return torch.einsum("btdn,btn->btd", h, C), h[:, -1].clone()


class SelectiveScan(torch.autograd.Function):
    """The chunked scan with a backward pass that recomputes one chunk at a time.

    Forward (no graph): each chunk's output is written into one (b, L, d) buffer and the
    state entering each chunk into one (chunks, b, d, n) buffer; nothing else is kept.
    Backward: chunks in reverse order, each recomputed from its entering state with autograd
    and differentiated at once; the gradient of its entering state is passed to the chunk
    before it. Memory: the inputs, L / chunk_size states and one chunk's work space.
    """

    @staticmethod
    def forward(ctx: Any, u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, h0: Tensor,
                chunk_size: int) -> tuple[Tensor, Tensor]:
        starts = range(0, u.shape[1], chunk_size)
        y = u.new_empty(u.shape)
        entering = u.new_empty(len(starts), *h0.shape)
        h = h0
        for i, start in enumerate(starts):
            part = slice(start, start + chunk_size)
            entering[i] = h
            y[:, part], h = scan_chunk(u[:, part], delta[:, part], A, B[:, part], C[:, part], h)
        ctx.save_for_backward(u, delta, A, B, C, entering)
        ctx.chunk_size = chunk_size
        return y, h

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, gy: Tensor | None, gh: Tensor | None) -> tuple[Tensor | None, ...]:
        u, delta, A, B, C, entering = ctx.saved_tensors
        gu, gdelta, gB, gC = (torch.zeros_like(t) for t in (u, delta, B, C))
        gA = torch.zeros_like(A)
        gy = torch.zeros_like(u) if gy is None else gy
        gh = torch.zeros_like(entering[0]) if gh is None else gh
        with torch.enable_grad(), full_precision(u.device):
            for i in reversed(range(len(entering))):
                part = slice(i * ctx.chunk_size, (i + 1) * ctx.chunk_size)
                inputs = [t.detach().requires_grad_() for t in
                          (u[:, part], delta[:, part], A, B[:, part], C[:, part], entering[i])]
                y, h = scan_chunk(*inputs)
                grads = torch.autograd.grad((y, h), inputs, (gy[:, part], gh))
                for buffer, g in zip((gu, gdelta, gB, gC), (grads[0], grads[1], grads[3], grads[4]), strict=True):
                    buffer[:, part] = g
                gA += grads[2]
                gh = grads[5]
        return gu, gdelta, gA, gB, gC, gh, None


def selective_scan(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, h0: Tensor | None,
                   chunk_size: int) -> tuple[Tensor, Tensor]:
    """y_t = C_t h_t with h_t = exp(Δ_t A) h_{t-1} + Δ_t x_t B_t, chunk by chunk.

    u, delta: (b, L, d); A: (d, n); B, C: (b, L, n); h0: (b, d, n) or None (zeros).
    Returns y (b, L, d) and the last state (b, d, n).
    """
    h = h0 if h0 is not None else u.new_zeros(u.shape[0], u.shape[2], A.shape[1])
    return SelectiveScan.apply(u, delta, A, B, C, h, chunk_size)  # type: ignore[no-any-return]


class Mamba(Mixer):
    """Mamba (Gu & Dao, 2023): a gated selective state-space model whose step size and input
    and output projections depend on the token (use with ``mlp: none`` for the paper's stack)."""

    complexity = Complexity(time="L", memory="L", decode="1", state="1")
    position_hooks = frozenset({"embedding"})
    why_not = WHY_NOT

    def __init__(self, config: MambaConfig, *, d_model: int, num_heads: int) -> None:
        super().__init__(d_model, num_heads)
        self.d_inner = config.expand * d_model
        self.d_state = config.d_state
        self.d_conv = config.d_conv
        self.dt_rank = config.dt_rank or math.ceil(d_model / 16)
        self.chunk_size = config.chunk_size
        self.in_proj = nn.Linear(d_model, 2 * self.d_inner, bias=config.bias)
        self.conv1d = CausalDepthwiseConv(self.d_inner, config.d_conv, bias=config.conv_bias)
        self.x_proj = nn.Linear(self.d_inner, self.dt_rank + 2 * self.d_state, bias=False)
        self.dt_proj = nn.Linear(self.dt_rank, self.d_inner, bias=True)
        bound = self.dt_rank ** -0.5
        nn.init.uniform_(self.dt_proj.weight, -bound, bound)
        with torch.no_grad():
            self.dt_proj.bias.copy_(step_size_bias(self.d_inner, config.dt_min, config.dt_max))
        s4d_real = torch.arange(1, self.d_state + 1, dtype=torch.float32).repeat(self.d_inner, 1)
        self.A_log = nn.Parameter(torch.log(s4d_real))  # A = -exp(A_log) = -(1, 2, ..., N) per channel
        self.D = nn.Parameter(torch.ones(self.d_inner))
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=config.bias)

    def mix(self, x: Tensor, *, causal: bool, key_padding_mask: Tensor | None, position: Any) -> Tensor:
        return self._run(x, {})

    def step(self, x: Tensor, state: dict[str, Any], *, positions: Tensor, position: Any) -> Tensor:
        return self._run(x, state)

    def _run(self, x: Tensor, state: dict[str, Any]) -> Tensor:
        """Continue from ``state`` (``conv``, ``ssm``; empty: a sequence's start) over x."""
        xs, z = self.in_proj(x).chunk(2, dim=-1)
        u, state["conv"] = self.conv1d(xs, state.get("conv"))
        u = F.silu(u)
        dt, B, C = self.x_proj(u).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        dt = F.linear(dt, self.dt_proj.weight)  # its bias is added in full precision below
        f = scan_dtype(x.dtype)
        with full_precision(x.device):
            u = u.to(f)
            delta = F.softplus(dt.to(f) + self.dt_proj.bias.to(f))
            A = -torch.exp(self.A_log.to(f))
            y, state["ssm"] = selective_scan(u, delta, A, B.to(f), C.to(f), state.get("ssm"), self.chunk_size)
            y = (y + u * self.D.to(f)) * F.silu(z.to(f))
        return self.out_proj(y.to(x.dtype))  # type: ignore[no-any-return]

    def state_size(self, length: int) -> int:
        return self.d_inner * (self.d_conv - 1 + self.d_state)


@hookimpl
def harness_register_mixer(register: Any) -> None:
    register(MixerSpec(name="mamba", build=Mamba))
