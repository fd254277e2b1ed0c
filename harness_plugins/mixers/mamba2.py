"""``mamba2``: the mixer of the Mamba-2 block, a selective state-space model with scalar
decay per head computed by the state-space-duality (SSD) chunked algorithm.

Dao & Gu, "Transformers are SSMs: Generalized Models and Efficient Algorithms Through
Structured State Space Duality", ICML 2024, arXiv:2405.21060. Checked against the reference
implementation ``state-spaces/mamba``: ``mamba_ssm/modules/ssd_minimal.py``
(``ssd_minimal_discrete``, Listing 1 of the paper: the chunked algorithm and ``segsum``),
``mamba_ssm/modules/mamba2_simple.py`` (``Mamba2Simple``: the block and its initialisation)
and ``mamba_ssm/modules/mamba2.py`` (``Mamba2.step``: one decoding step; the gated RMSNorm
normalised per group of B/C).

What it computes, for an input u (B, L, d_model), with E·d = ``expand`` · d_model channels
split into H = E·d / P heads of P = ``headdim`` channels, G = ``ngroups`` groups of heads
sharing B and C, N = ``d_state``::

    z, xBC, dt = in_proj(u)                             E·d, E·d + 2·G·N, H channels
    x, B, C    = SiLU(conv1d(xBC))                      causal depthwise conv over x, B and C
    Δ          = softplus(dt + dt_bias)                 one step size per head
    A          = -exp(A_log)                            one scalar per head, init -U(1, 16)
    h_t        = exp(Δ_t A) h_{t-1} + Δ_t x_t ⊗ B_t     per head: h (P, N), B of the head's group
    y_t        = h_t C_t + D x_t                        D: one scalar per head
    out        = out_proj(RMSNorm(y ⊙ SiLU(z)))         norm per group, after the gate

SSD, the parallel form (training): the sequence is cut into chunks of Q = ``chunk_size``
positions (the last one padded with Δ = 0, which leaves the state unchanged). Within a
chunk, the output is the "attention-like" quadratic form y = (C Bᵀ ∘ M) (Δ x), with the
decay mask M_ts = exp(Σ_{s<k<=t} Δ_k A) for s <= t and 0 above the diagonal, computed from
segment sums of Δ A (the stable ``segsum`` of the reference). Each chunk also yields its
own end state Σ_s exp(Σ_{s<k<=Q} Δ_k A) Δ_s x_s ⊗ B_s; the states are passed from chunk to
chunk by h ← exp(Σ_chunk Δ A) h + state (a loop over L/Q chunks, not the reference's
(L/Q)² decay matrix), and each chunk reads its incoming state through C, decayed by
exp(cumsum Δ A). Time O(L Q H (P + N)), memory O(L (Q H + E·d + N) + (L/Q) E·d N): linear in L,
with a Q × Q block per chunk and head. The scan runs in float32 (float64 for float64
inputs), outside autocast.

Recurrent form (decoding): the cache keeps the conv state (the last d_conv - 1 inputs of the
conv over x, B and C) and the SSM state (H × P × N); each token costs O(1) in L, and a chunk
of new tokens runs SSD from the cached state. State per sequence:
(E·d + 2·G·N) · (d_conv - 1) + E·d · N elements, independent of L.

Defaults follow the reference (d_state 64, A init range (1, 16), Δ in [0.001, 0.1], d_conv 4,
expand 2, one group) except ``headdim`` 32 (the paper's 64) and ``chunk_size`` 64 (256),
scaled to small models. The Mamba-2 block has no MLP: ``transformer`` with ``mlp: none``
reproduces the paper's stack.

Position: an embedding scheme (``embedding``) applies to the input; position otherwise comes
from the causal recurrence. C and B play the roles of queries and keys in the dual form, but
the architecture does not rotate them (``qk``) and forms no softmax scores to bias (``bias``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.plugin import (
    Choice,
    Complexity,
    Ge,
    Gt,
    MixerSpec,
    documents,
    fast_path,
    hookimpl,
    selective,
)

# same shape as mamba.py by design: each variant says why it takes no qk or bias hook
WHY_NOT = {
    "qk": "Mamba-2's C and B act as queries and keys only in its dual (attention-like) form; "
          "the architecture does not rotate them, and its recurrence already encodes position",
    "bias": "Mamba-2 forms no softmax scores, so there is no score to add a bias to",
}


@dataclass
class Mamba2Config(selective.SelectiveConfig):  # + expand, d_conv, dt range, biases, chunk_size
    d_state: Annotated[int, Ge(1), Choice((16, 32, 64, 128))] = 64  # N
    headdim: Annotated[int, Ge(1), Choice((16, 32, 64))] = 32  # P; heads = E * d_model / P
    ngroups: Annotated[int, Ge(1)] = 1  # G: groups of heads sharing B and C
    A_init_min: Annotated[float, Gt(0.0)] = 1.0  # -A is initialised uniform in [min, max]
    A_init_max: Annotated[float, Gt(0.0)] = 16.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.A_init_min > self.A_init_max:
            raise ValueError(f"A_init_min ({self.A_init_min}) must not exceed A_init_max ({self.A_init_max}).")


def segsum(a: Tensor) -> Tensor:
    """(..., T) -> (..., T, T): out[..., t, s] = Σ_{s<k<=t} a_k for s <= t, -inf above the
    diagonal; by cumulative sums of masked copies, not differences of prefix sums (stable)."""
    T = a.shape[-1]
    ones = torch.ones(T, T, dtype=torch.bool, device=a.device)
    strict = a.unsqueeze(-1).expand(*a.shape, T).masked_fill(~torch.tril(ones, -1), 0)
    return torch.cumsum(strict, dim=-2).masked_fill(~torch.tril(ones), float("-inf"))


def ssd(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, h0: Tensor | None,
        chunk_size: int, starts: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """y_t = C_t h_t with h_t = exp(Δ_t A) h_{t-1} + Δ_t x_t ⊗ B_t per head, by SSD.

    x: (b, L, H, P); dt (= Δ): (b, L, H); A: (H,); B, C: (b, L, G, N); h0: (b, H, P, N) or
    None (zeros). Returns y (b, L, H, P) and the last state (b, H, P, N). ``starts`` (b, L)
    bool: document starts, where exp(Δ_t A) is 0: every decay factor spanning one is zeroed
    (``harness.nn.documents.chunk_counts``).
    """
    b, L, H, P = x.shape
    G, N = B.shape[2:]
    Q = max(1, min(chunk_size, L))
    pad = -L % Q
    if pad:  # Δ = 0 on the padding: decay 1, input 0, the state passes through unchanged
        x, dt, B, C = (F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad)) for t in (x, dt, B, C))
    c, R = (L + pad) // Q, H // G
    # heads as (group, head in group); chunks as (chunk, position in chunk)
    X = (x * dt.unsqueeze(-1)).view(b, c, Q, G, R, P).permute(0, 3, 4, 1, 2, 5)  # (b, G, R, c, Q, P)
    dA = (dt * A).view(b, c, Q, G, R).permute(0, 3, 4, 1, 2)  # (b, G, R, c, Q)
    Bc = B.view(b, c, Q, G, N).permute(0, 3, 1, 2, 4).unsqueeze(2)  # (b, G, 1, c, Q, N)
    Cc = C.view(b, c, Q, G, N).permute(0, 3, 1, 2, 4).unsqueeze(2)
    cum = torch.cumsum(dA, dim=-1)
    pair, to_end, total, from_start = torch.exp(segsum(dA)), torch.exp(cum[..., -1:] - cum), \
        torch.exp(cum[..., -1]), torch.exp(cum)
    if starts is not None:  # (b, 1, 1, c, Q) starts at or before each position of its chunk
        n = documents.chunk_counts(starts, Q)[:, None, None]
        pair = pair * (n.unsqueeze(-1) == n.unsqueeze(-2))
        to_end, total = to_end * (n[..., -1:] == n), total * (n[..., -1] == 0)
        from_start = from_start * (n == 0)
    # 1. within each chunk: (C Bᵀ ∘ M) X
    y = ((Cc @ Bc.transpose(-1, -2)) * pair) @ X
    # 2. each chunk's own end state
    states = (X * to_end.unsqueeze(-1)).transpose(-1, -2) @ Bc  # (b, G, R, c, P, N)
    # 3. pass the states across chunks: h_in of chunk i
    h = x.new_zeros(b, G, R, P, N) if h0 is None else h0.reshape(b, G, R, P, N)
    incoming = []
    # chunks by unbind, not by index (an indexed chunk's gradient is a zero tensor of every chunk)
    for total_i, state_i in zip(total.unbind(-1), states.unbind(3), strict=True):
        incoming.append(h)
        h = total_i[..., None, None] * h + state_i
    # 4. each chunk reads its incoming state through C, decayed to each position
    y = y + (Cc @ torch.stack(incoming, dim=3).transpose(-1, -2)) * from_start.unsqueeze(-1)
    y = y.permute(0, 3, 4, 1, 2, 5).reshape(b, c * Q, H, P)[:, :L]
    return y, h.reshape(b, H, P, N)


class GatedRMSNorm(nn.Module):
    """RMSNorm(y ⊙ SiLU(z)) · weight, normalised per group of ``group_size`` channels (the
    reference's ``RMSNormGated`` with ``norm_before_gate=False``)."""

    def __init__(self, dim: int, group_size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.group_size = group_size
        self.eps = eps

    def forward(self, y: Tensor, z: Tensor) -> Tensor:
        y = y * F.silu(z)
        groups = y.unflatten(-1, (-1, self.group_size))
        groups = groups * torch.rsqrt(groups.square().mean(-1, keepdim=True) + self.eps)
        return groups.flatten(-2) * self.weight.to(y.dtype)


class Mamba2(selective.SelectiveMixer):  # same shape as mamba.py by design: one file per variant
    """Mamba-2 (Dao & Gu, 2024): a selective state-space model with one scalar decay per head,
    computed chunk-wise by state-space duality (use with mlp: none for the paper's stack)."""

    complexity = Complexity(time="L", memory="L", decode="1", state="1")
    position_hooks = frozenset({"embedding"})
    why_not = WHY_NOT
    fast_path_ops = ("fla.ops.simple_gla.chunk_simple_gla",)  # SSD as simple GLA (harness.nn.fast_path)

    def __init__(self, config: Mamba2Config, *, d_model: int, num_heads: int) -> None:
        super().__init__(d_model, num_heads)
        self.d_inner = config.expand * d_model
        if self.d_inner % config.headdim:
            raise ValueError(
                f"mamba2: headdim ({config.headdim}) must divide expand * d_model "
                f"({config.expand} * {d_model} = {self.d_inner}); set model.mixer.params.headdim to one of its divisors")
        self.headdim = config.headdim
        self.nheads = self.d_inner // config.headdim
        if self.nheads % config.ngroups:
            raise ValueError(
                f"mamba2: ngroups ({config.ngroups}) must divide the number of heads "
                f"({self.nheads} = expand * d_model / headdim); set model.mixer.params.ngroups to one of its divisors")
        self.ngroups, self.d_state, self.d_conv = config.ngroups, config.d_state, config.d_conv
        self.chunk_size = config.chunk_size
        self.conv_dim = self.d_inner + 2 * self.ngroups * self.d_state
        self.in_proj = nn.Linear(d_model, self.d_inner + self.conv_dim + self.nheads, bias=config.bias)
        self.conv1d = selective.CausalDepthwiseConv(self.conv_dim, config.d_conv, bias=config.conv_bias)
        self.dt_bias = nn.Parameter(selective.step_size_bias(self.nheads, config.dt_min, config.dt_max))
        minus_A = torch.empty(self.nheads, dtype=torch.float32).uniform_(config.A_init_min, config.A_init_max)
        self.A_log = nn.Parameter(torch.log(minus_A))
        self.D = nn.Parameter(torch.ones(self.nheads))
        self.norm = GatedRMSNorm(self.d_inner, self.d_inner // self.ngroups)
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=config.bias)

    def run(self, x: Tensor, state: dict[str, Any], starts: Tensor | None = None) -> Tensor:
        """Continue from ``state`` (``conv``, ``ssm``; empty: a sequence's start) over x;
        ``starts``: document starts, where the state is forgotten (a full pass)."""
        b, length = x.shape[:2]
        z, xBC, dt = self.in_proj(x).split([self.d_inner, self.conv_dim, self.nheads], dim=-1)
        xBC, state["conv"] = self.conv1d(xBC, state.get("conv"), starts)
        gn = self.ngroups * self.d_state
        xs, B, C = F.silu(xBC).split([self.d_inner, gn, gn], dim=-1)
        f = selective.scan_dtype(x.dtype)
        with selective.full_precision(x.device):
            xs = xs.to(f).view(b, length, self.nheads, self.headdim)
            delta = F.softplus(dt.to(f) + self.dt_bias.to(f))
            A = -torch.exp(self.A_log.to(f))
            groups = (b, length, self.ngroups, self.d_state)
            if length > 1 and fast_path.use_fla(self.kernel, x, resets=starts):
                y, state["ssm"] = fast_path.ssd(xs, delta, A, B.to(f).view(groups), C.to(f).view(groups),
                                                state.get("ssm"), starts=starts)
            else:  # one token, the CPU: the reference
                y, state["ssm"] = ssd(xs, delta, A, B.to(f).view(groups), C.to(f).view(groups),
                                      state.get("ssm"), self.chunk_size, starts)
            y = y + xs * self.D.to(f).unsqueeze(-1)
            y = self.norm(y.flatten(-2), z.to(f))
        return self.out_proj(y.to(x.dtype))  # type: ignore[no-any-return]

    def state_size(self, length: int) -> int:
        return self.conv_dim * (self.d_conv - 1) + self.d_inner * self.d_state


@hookimpl
def harness_register_mixer(register: Any) -> None:
    register(MixerSpec(name="mamba2", build=Mamba2))
