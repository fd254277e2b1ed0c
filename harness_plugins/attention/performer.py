"""``performer``: FAVOR+ attention with positive orthogonal random features.

Choromanski, Likhosherstov, Dohan, Song, Gane, Sarlos, Hawkins, Davis, Mohiuddin, Kaiser,
Belanger, Colwell, Weller, "Rethinking Attention with Performers", ICLR 2021,
arXiv:2009.14794.

The softmax kernel exp(qᵀk) (q, k scaled by d^(-1/4), so that it is exp(qᵀk / √d)) is
estimated without bias by positive random features (the paper's Lemma 1)::

    φ(x) = m^(-1/2) · exp(ω_jᵀx - |x|²/2),  j = 1..m,   E[φ(q)ᵀφ(k)] = exp(qᵀk)

with ω_1..ω_m drawn as blocks of orthogonal rows (QR of Gaussian matrices), each row
rescaled to the norm of a Gaussian vector (FAVOR+'s orthogonal random features: the
marginals stay Gaussian, the variance drops). The QR factor's columns are sign-corrected
(so that R has a positive diagonal): only then are the directions uniformly distributed.
The reference implementations take Q as LAPACK returns it, whose Householder sign
convention makes every block's first direction point into the half-space x_1 <= 0 (and
biases the others); with many features their estimate converges to a biased kernel. Attention becomes linear attention with this
feature map::

    out_i = φ(q_i)ᵀ Σ_j φ(k_j) v_jᵀ  /  φ(q_i)ᵀ Σ_j φ(k_j)

* Bidirectional (and cross-attention): one sum over all keys; padded keys are dropped.
* Causal: prefix sums, in blocks of ``chunk`` positions (running sums across blocks, a
  chunk x chunk triangle within one), as ``linear`` does; ``chunk = 1`` is the recurrence.
* Decoding: the running sums Σφ(k)vᵀ (m x d_v per head), Σφ(k) (m) and one stabiliser
  per head; O(1) time and memory per token. Cached cross-attention keeps the memory's sums
  (computed on the first step) in the cross cache.

Numerics. exp() is taken in log space and stabilised by subtracting constants that cancel
between numerator and denominator: per query, the largest of its m log-features; for keys,
the largest log-feature over every key a query can see. In the causal and decoding forms
that key stabiliser is a running maximum, raised block by block (the sums are rescaled by
exp(old - new) when it rises): a constant common to all keys of a query, so the result is
exactly the formula above, with no dependence on later positions. The reference
implementations add ε = 1e-4 to every feature and stabilise keys by a maximum over the
whole sequence; here ε = 0 (so the estimator stays unbiased, and a running maximum stays
exact), and a query whose features vanish against every key gets a zero output instead of
dividing by zero. Features, sums and divisions run in at least float32 (bf16 autocast).
The constant m^(-1/2) cancels and is left out.

Redrawing. ``redraw_every``: the feature matrix is redrawn every that many training
forward passes (the reference's ``feature_redraw_interval``); 0 keeps it fixed. Evaluation
and decoding never redraw. The matrix is a buffer, saved with the model, shared by the
layer's heads (as in the reference).

Position hooks: rotations (RoPE) act on queries and keys before φ. An additive score bias
(ALiBi, T5, Shaw) cannot be applied: no score is ever formed. Dropout drops whole keys per
head during training (there are no weights to drop), as ``linear`` does. Attention weights
(``need_weights``) are formed explicitly, for logging only.

Checked against ``lucidrains/performer-pytorch`` (``performer_pytorch/performer_pytorch.py``:
``softmax_kernel``, ``gaussian_orthogonal_random_matrix``, ``linear_attention``,
``causal_linear_attention_noncuda``, ``ProjectionUpdater``), itself transcribed from
``google-research/google-research: performer/fast_attention/jax/fast_attention.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import torch
from torch import Tensor

from harness.plugin import (  # a list of names, not logic: other plugins list many of the same
    AttentionConfig,
    AttentionSpec,
    Ge,
    IntRange,
    Le,
    RunningSumAttention,
    causal_block,
    hookimpl,
    kernel_weights,
    qk_changed,
    qk_scale,
    ratio_or_zero,
)

WHY_NOT_BIAS = (
    "Performer never forms the score matrix (it sums φ(k)vᵀ over keys with random features), "
    "so there is no score to add a bias to"
)
#: a floor for the key stabiliser: finite, so exp(floor - floor) is 1 where no key was seen
FLOOR = -1e30


@dataclass
class PerformerConfig(AttentionConfig):
    #: random features m per layer (the paper's m; d·ln d is its theoretical minimum)
    features: Annotated[int, Ge(1), Le(65536), IntRange(16, 256, log=True)] = 64
    #: training forward passes between feature redraws (0: fixed features)
    redraw_every: Annotated[int, Ge(0)] = 1000
    #: block length of the causal prefix sums (speed only, same result)
    chunk: Annotated[int, Ge(1)] = 64


def orthogonal_gaussian(rows: int, cols: int, *, device: Any = None, dtype: Any = None) -> Tensor:
    """(rows, cols): blocks of ``cols`` orthogonal directions, each row rescaled to the norm
    of an independent Gaussian vector (so each row is marginally N(0, I))."""
    blocks = []
    for _ in range(-(-rows // cols)):
        q, r = torch.linalg.qr(torch.randn(cols, cols, device=device, dtype=torch.float32))
        blocks.append((q * torch.sign(r.diagonal())).T)  # sign-corrected: Haar-distributed
    directions = torch.cat(blocks)[:rows]
    norms = torch.randn(rows, cols, device=device, dtype=torch.float32).norm(dim=1, keepdim=True)
    return (directions * norms).to(dtype or torch.float32)


def _wide(t: Tensor) -> Tensor:
    return t.to(torch.promote_types(t.dtype, torch.float32))


class PerformerAttention(RunningSumAttention):  # same shape as linear.py by design: one file per variant
    """Performer (FAVOR+): softmax attention estimated with positive orthogonal random features; O(L), O(1) decoding."""

    label = "performer"
    why_not = {"bias": WHY_NOT_BIAS}

    def __init__(self, config: PerformerConfig, *, d_model: int, num_heads: int) -> None:
        super().__init__(d_model, num_heads, dropout=config.dropout, bias=config.bias)
        self.num_features = config.features
        self.redraw_every = config.redraw_every
        self.chunk = config.chunk
        self.register_buffer("features", orthogonal_gaussian(config.features, self.qk_dim))
        self.training_calls = 0

    @torch.no_grad()
    def redraw(self) -> None:
        """Draw a fresh feature matrix (on the buffer's device, from torch's generator)."""
        self.features.copy_(orthogonal_gaussian(*self.features.shape, device=self.features.device))

    @torch.compiler.disable
    def count_training_call(self) -> None:
        """Count a training forward pass and redraw when due. A Python counter, so it runs
        outside compiled graphs: under ``torch.compile`` that is one graph break per layer,
        where tracing it would recompile the layer at every step (the counter is a constant
        to dynamo) until the recompile limit turned compilation off."""
        self.training_calls += 1
        if self.redraw_every and self.training_calls % self.redraw_every == 0:
            self.redraw()

    def state_size(self, length: int) -> int:
        """Σφ(k)vᵀ (m x d_v), Σφ(k) (m) and the key stabiliser (1), per head."""
        return 0 if length == 0 else self.num_heads * (self.num_features * (self.v_dim + 1) + 1)

    def log_features(self, x: Tensor) -> Tensor:
        """log φ(x) + log √m: ωᵀx' - |x'|²/2 with x' = x · d^(-1/4), in at least float32."""
        d = x.shape[-1]  # each side's share of the scale: 1/d under μP (qk_scale)
        x = _wide(x) * (qk_scale(self, d, None) ** 0.5 if qk_changed(self, d) else d**-0.25)
        return x @ self.features.to(x.dtype).T - (x * x).sum(dim=-1, keepdim=True) / 2

    def query_features(self, q: Tensor) -> Tensor:
        lq = self.log_features(q)
        return torch.exp(lq - lq.amax(dim=-1, keepdim=True).detach())

    def attend(self, q, k, v, *, q_pos, k_pos, causal, key_padding_mask, bias, need_weights,  # type: ignore[no-untyped-def]
               state=None, cross=False):
        self.check_call(bias=bias, need_weights=need_weights, state=state, cross=cross)
        if self.training and state is None:
            self.count_training_call()
        dropping = self.training and bool(self.dropout)
        fq = self.query_features(q)
        memo = state if (cross and state is not None and not dropping) else None
        if memo is not None and "kv" in memo and not need_weights:
            return self._read(fq, memo, v.dtype), None
        lk = self.log_features(k)
        keep = self.kept_keys(key_padding_mask, lk, dropping)
        if keep is not None:
            lk = lk.masked_fill(~keep, float("-inf"))
        vw = _wide(v)
        if causal:
            if q.shape[2] != k.shape[2]:
                raise ValueError("causal performer attention needs one key per query position.")
            out = self._prefix_sums(fq, lk, vw, state)
        elif state is not None and not cross:
            raise ValueError("cached (incremental) self-attention is causal; call it with causal=True.")
        else:
            sums = self._sums(lk, vw)
            if memo is not None:
                memo.update(sums)
            out = self._read(fq, sums, v.dtype)
        weights = self._weights(fq, lk, q_pos, k_pos, causal).to(v.dtype) if need_weights else None
        return out.to(v.dtype), weights

    @staticmethod
    def _sums(lk: Tensor, v: Tensor) -> dict[str, Tensor]:
        """Σ φ(k) vᵀ and Σ φ(k) over all keys, under one stabiliser per head."""
        m = lk.amax(dim=(-2, -1), keepdim=True).clamp(min=FLOOR).detach()
        fk = torch.exp(lk - m)
        return {"kv": fk.transpose(-2, -1) @ v, "z": fk.sum(dim=-2), "m": m}

    @staticmethod
    def _read(fq: Tensor, sums: dict[str, Tensor], dtype: torch.dtype) -> Tensor:
        return ratio_or_zero(fq @ sums["kv"], fq @ sums["z"].unsqueeze(-1)).to(dtype)

    def _prefix_sums(self, fq: Tensor, lk: Tensor, v: Tensor, state: dict[str, Any] | None) -> Tensor:
        """Query i sees keys j <= i: running sums across blocks, a triangle within one; the
        key stabiliser is the running maximum, raised block by block."""
        b, h, n, f = fq.shape
        if state and "kv" in state:
            kv, z, m = state["kv"], state["z"], state["m"]
        else:
            kv, z = fq.new_zeros(b, h, f, v.shape[-1]), fq.new_zeros(b, h, f)
            m = fq.new_full((b, h, 1, 1), FLOOR)
        c = self.chunk
        later = torch.ones(c, c, dtype=torch.bool, device=fq.device).triu(1)
        outs = []
        # blocks by split, not by slicing (a sliced block's gradient is a zero tensor of the
        # whole sequence: O(L² / chunk) in the backward pass)
        for qc, lkc, vc in zip(fq.split(c, 2), lk.split(c, 2), v.split(c, 2), strict=True):
            new_m = torch.maximum(m, lkc.amax(dim=(-2, -1), keepdim=True)).detach()
            rescale = torch.exp(m - new_m)
            kv, z, m = kv * rescale, z * rescale[..., 0], new_m
            kc = torch.exp(lkc - m)
            out, kv, z = causal_block(qc, kc, vc, kv, z, later)
            outs.append(out)
        if state is not None:
            state["kv"], state["z"], state["m"] = kv, z, m
        return torch.cat(outs, dim=2)

    @staticmethod
    def _weights(fq: Tensor, lk: Tensor, q_pos: Tensor, k_pos: Tensor, causal: bool) -> Tensor:
        """φ(q_i)·φ(k_j) / Σ_j' (for logging; forms the full matrix)."""
        kernel = fq @ torch.exp(lk - lk.amax(dim=(-2, -1), keepdim=True).clamp(min=FLOOR)).transpose(-2, -1)
        return kernel_weights(kernel, q_pos, k_pos, causal)


@hookimpl
def harness_register_attention(register: Any) -> None:
    register(AttentionSpec(name="performer", build=PerformerAttention))

