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
operator (a, b) ∘ (a', b') = (a a', a' b + b') of the pairs (exp(Δ_t A), Δ_t x_t B_t):
on accelerators in log2(chunk_size) parallel steps (Hillis-Steele), on CPU one fused
multiply-add per position on cache-sized slices (faster there); the state at the chunk's
end is carried into the next chunk. The forward pass keeps only the outputs and the state
entering each chunk; the backward pass recomputes one chunk at a time from its entering state
and runs the reversed recurrence of the gradient in closed form (as the reference's fused
kernel recomputes), so training memory is linear in L: O(L (E·d + N) + (L / chunk_size) E·d N)
plus one chunk's work space, never (B, L, E·d, N). Time O(L E·d N) (times log2(chunk_size)
for the parallel in-chunk scan). The scan runs in float32 (float64 for float64 inputs),
outside autocast.

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

from harness.plugin import Choice, Complexity, Ge, MixerSpec, hookimpl, selective

# same shape as mamba2.py by design: each variant says why it takes no qk or bias hook
WHY_NOT = {
    "qk": "Mamba forms no queries and keys to rotate: B and C are input-dependent write and "
          "read vectors of a recurrence whose order already encodes position",
    "bias": "Mamba forms no attention scores, so there is no score to add a bias to",
}


@dataclass
class MambaConfig(selective.SelectiveConfig):  # + expand, d_conv, dt range, biases, chunk_size
    d_state: Annotated[int, Ge(1), Choice((8, 16, 32, 64))] = 16  # N
    dt_rank: Annotated[int | None, Ge(1)] = None  # rank of the Δ projection; None: ceil(d_model / 16)


def linear_scan_(step: Tensor, drive: Tensor, parallel: bool | None = None, *, reverse: bool = False) -> None:
    """In place along dim 1: drive_t <- step_t · drive_{t-1} + drive_t, the inclusive scan of
    the linear recurrence h_t = step_t h_{t-1} + drive_t from h = 0 (runs under no_grad).
    ``reverse``: the recurrence run backwards, drive_t <- step_{t+1} · drive_{t+1} + drive_t.

    ``parallel``: Hillis-Steele, log2(T) whole-tensor steps (few kernel launches: the choice
    on GPUs); otherwise one fused multiply-add per position on (b, d, n) slices that stay in
    cache (on CPU about 3-30 times faster than the parallel form, which streams the whole
    (b, T, d, n) block through memory 4 log2(T) times). Default: parallel except on CPU.
    """
    T = drive.shape[1]
    if not (drive.device.type != "cpu" if parallel is None else parallel):
        for t in (range(T - 2, -1, -1) if reverse else range(1, T)):
            drive[:, t].addcmul_(step[:, t + 1 if reverse else t], drive[:, t + 1 if reverse else t - 1])
        return
    if reverse:  # the forward scan of the reversed sequence, whose step t is step_{T-t}
        flipped = drive.flip(1)
        linear_scan_(torch.cat([step[:, :1], step[:, 1:].flip(1)], dim=1), flipped, True)
        drive.copy_(flipped.flip(1))
        return
    decay, span = step.clone(), 1
    while span < T:
        drive[:, span:] += decay[:, span:] * drive[:, :-span]  # the product is a new tensor
        if 2 * span < T:
            decay[:, span:] = decay[:, span:] * decay[:, :-span]
        span *= 2


def chunk_states(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, h0: Tensor,
                 parallel: bool | None = None, keep: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The states h_t (b, T, d, n) over one chunk from ``h0`` (b, d, n), and the per-step
    decays exp(Δ_t A). u, delta: (b, T, d); A: (d, n); B: (b, T, n); ``keep`` (b, T): 0 at a
    document start, whose decay (the carried state's factor) is then 0."""
    step = torch.exp(delta.unsqueeze(-1) * A)
    if keep is not None:
        step = step * keep[:, :, None, None]
    h = (delta * u).unsqueeze(-1) * B.unsqueeze(2)  # Δ_t x_t B_t
    h[:, 0] += step[:, 0] * h0
    linear_scan_(step, h, parallel)
    return h, step


class SelectiveScan(torch.autograd.Function):
    """The chunked selective scan with its gradient in closed form, one chunk at a time.

    Forward: chunk by chunk, y_t = C_t h_t written into one (b, L, d) buffer; the state
    entering each chunk is kept in one (chunks, b, d, n) buffer, nothing else.
    Backward, chunks in reverse order, each chunk's states recomputed from its entering
    state: the gradient G_t of h_t obeys the reversed recurrence
    G_t = C_t ⊗ gy_t + exp(Δ_{t+1} A) G_{t+1} (the same scan, run backwards), and then
    ∂/∂(Δ_t A) = G_t ⊙ h_{t-1} ⊙ exp(Δ_t A), ∂/∂(Δ_t x_t B_t) = G_t, ∂/∂C_t = gy_t h_t,
    and the entering state gets exp(Δ_1 A) G_1, passed on to the chunk before.
    Memory: the inputs, L / chunk_size states and one chunk's work space.
    """

    @staticmethod
    def forward(ctx: Any, u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, h0: Tensor,
                chunk_size: int, parallel: bool | None, keep: Tensor | None = None) -> tuple[Tensor, Tensor]:
        starts = range(0, u.shape[1], chunk_size)
        y = u.new_empty(u.shape)
        entering = u.new_empty(len(starts), *h0.shape)
        h = h0
        for i, start in enumerate(starts):
            part = slice(start, start + chunk_size)
            entering[i] = h
            states, _ = chunk_states(u[:, part], delta[:, part], A, B[:, part], h, parallel,
                                     None if keep is None else keep[:, part])
            y[:, part] = (states @ C[:, part].unsqueeze(-1)).squeeze(-1)
            h = states[:, -1].clone()
        ctx.save_for_backward(u, delta, A, B, C, entering)
        ctx.chunk_size, ctx.parallel, ctx.keep = chunk_size, parallel, keep
        return y, h

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, gy: Tensor | None, g_last: Tensor | None) -> tuple[Tensor | None, ...]:
        u, delta, A, B, C, entering = ctx.saved_tensors
        gu, gdelta, gB, gC = (torch.zeros_like(t) for t in (u, delta, B, C))
        gA = torch.zeros_like(A)
        gy = torch.zeros_like(u) if gy is None else gy
        gh = torch.zeros_like(entering[0]) if g_last is None else g_last  # gradient of the state leaving a chunk
        with selective.full_precision(u.device):
            for i in reversed(range(len(entering))):
                part = slice(i * ctx.chunk_size, (i + 1) * ctx.chunk_size)
                uc, dc, Bc, Cc, gyc = u[:, part], delta[:, part], B[:, part], C[:, part], gy[:, part]
                h, step = chunk_states(uc, dc, A, Bc, entering[i], ctx.parallel,
                                       None if ctx.keep is None else ctx.keep[:, part])
                G = gyc.unsqueeze(-1) * Cc.unsqueeze(2)
                G[:, -1] += gh
                linear_scan_(step, G, ctx.parallel, reverse=True)
                g_dA = G * step  # the gradient of Δ_t A: G_t ⊙ exp(Δ_t A) ⊙ h_{t-1}
                g_dA[:, 1:] *= h[:, :-1]
                g_dA[:, 0] *= entering[i]
                gh = step[:, 0] * G[:, 0]
                # contractions as matmuls and reductions (einsum's permuted bmm is slow on CPU)
                GB = (G @ Bc.unsqueeze(-1)).squeeze(-1)
                gu[:, part] = dc * GB
                gdelta[:, part] = uc * GB + (g_dA * A).sum(-1)
                gA += (g_dA * dc.unsqueeze(-1)).sum((0, 1))
                gB[:, part] = ((dc * uc).unsqueeze(-2) @ G).squeeze(-2)
                gC[:, part] = (gyc.unsqueeze(-2) @ h).squeeze(-2)
        return gu, gdelta, gA, gB, gC, gh, None, None, None


def selective_scan(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, h0: Tensor | None,
                   chunk_size: int, parallel: bool | None = None,
                   starts: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """y_t = C_t h_t with h_t = exp(Δ_t A) h_{t-1} + Δ_t x_t B_t, chunk by chunk.

    u, delta: (b, L, d); A: (d, n); B, C: (b, L, n); h0: (b, d, n) or None (zeros).
    Returns y (b, L, d) and the last state (b, d, n). ``parallel``: see :func:`linear_scan_`.
    ``starts`` (b, L) bool: document starts, where the carried state is multiplied by 0.
    """
    h = h0 if h0 is not None else u.new_zeros(u.shape[0], u.shape[2], A.shape[1])
    keep = None if starts is None else (~starts).to(u.dtype)
    return SelectiveScan.apply(u, delta, A, B, C, h, chunk_size, parallel, keep)  # type: ignore[no-any-return]


class Mamba(selective.SelectiveMixer):  # same shape as mamba2.py by design: one file per variant
    """Mamba (Gu & Dao, 2023): a gated selective state-space model whose step size and input
    and output projections depend on the token (use with mlp: none for the paper's stack)."""

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
        self.conv1d = selective.CausalDepthwiseConv(self.d_inner, config.d_conv, bias=config.conv_bias)
        self.x_proj = nn.Linear(self.d_inner, self.dt_rank + 2 * self.d_state, bias=False)
        self.dt_proj = nn.Linear(self.dt_rank, self.d_inner, bias=True)
        bound = self.dt_rank ** -0.5
        nn.init.uniform_(self.dt_proj.weight, -bound, bound)
        with torch.no_grad():
            self.dt_proj.bias.copy_(selective.step_size_bias(self.d_inner, config.dt_min, config.dt_max))
        s4d_real = torch.arange(1, self.d_state + 1, dtype=torch.float32).repeat(self.d_inner, 1)
        self.A_log = nn.Parameter(torch.log(s4d_real))  # A = -exp(A_log) = -(1, 2, ..., N) per channel
        self.D = nn.Parameter(torch.ones(self.d_inner))
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=config.bias)

    def run(self, x: Tensor, state: dict[str, Any], starts: Tensor | None = None) -> Tensor:
        """Continue from ``state`` (``conv``, ``ssm``; empty: a sequence's start) over x;
        ``starts``: document starts, where the state is forgotten (a full pass)."""
        xs, z = self.in_proj(x).chunk(2, dim=-1)
        u, state["conv"] = self.conv1d(xs, state.get("conv"), starts)
        u = F.silu(u)
        dt, B, C = self.x_proj(u).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        dt = F.linear(dt, self.dt_proj.weight)  # its bias is added in full precision below
        f = selective.scan_dtype(x.dtype)
        with selective.full_precision(x.device):
            u = u.to(f)
            delta = F.softplus(dt.to(f) + self.dt_proj.bias.to(f))
            A = -torch.exp(self.A_log.to(f))
            y, state["ssm"] = selective_scan(u, delta, A, B.to(f), C.to(f), state.get("ssm"), self.chunk_size,
                                               starts=starts)
            y = (y + u * self.D.to(f)) * F.silu(z.to(f))
        return self.out_proj(y.to(x.dtype))  # type: ignore[no-any-return]

    def state_size(self, length: int) -> int:
        return self.d_inner * (self.d_conv - 1 + self.d_state)


@hookimpl
def harness_register_mixer(register: Any) -> None:
    register(MixerSpec(name="mamba", build=Mamba))
