"""The mixers' fast path: flash-linear-attention's Triton kernels on CUDA, one place.

The pure-PyTorch chunked forms (:mod:`harness.nn.linear_recurrence`, ``rwkv6.wkv6``,
``mamba2.ssd``) are the reference: they run everywhere, in float32, and define what every
mixer computes. On a CUDA device with ``fla`` (the ``fla-core`` package, extra ``.[gpu]``)
and ``triton`` importable, the mixers that declare FLA ops (:attr:`Mixer.fast_path_ops`)
hand the same recurrence to FLA's chunked kernels instead. Which one runs is the run's
``train.kernels``:

* ``auto`` (default): FLA on CUDA when it is importable, the reference otherwise;
* ``fla``: FLA, or the run is refused before anything is built (:func:`require_fla`);
* ``reference``: always the reference.

Never on the CPU: FLA's kernels need a GPU (``TRITON_INTERPRET=1`` fails with "0 active
drivers"), so :func:`use_fla` is False for any tensor not on CUDA, whatever is asked.

**The mapping** (each ``*_call`` below builds the arguments of one FLA op from a mixer's
tensors; ``tests/test_fast_path.py`` runs FLA's own pure-PyTorch ``naive`` functions on
those arguments on the CPU and compares with the reference mixer, which proves the layout,
scale and gates but not the Triton kernels, whose parity test needs a GPU,
``tests/test_fast_path_gpu.py``):

* layout: ours is head-first (B, H, L, D); FLA 0.6's ops take (B, T, H, D) (no
  ``head_first`` argument any more), and return (B, T, H, V);
* scale: our mixers scale q or k themselves before the recurrence, so every op gets
  ``scale=1.0`` (FLA's default would be Dk^-1/2 on top);
* gates in log space, as ours: GLA ``g`` (B, T, H, Dk) = log α (``chunk_gla``); one decay
  per head (RetNet's log γ, Mamba-2's Δ·A) ``g`` (B, T, H) (``chunk_simple_gla``); the
  delta rule's ``beta`` (B, T, H) after the sigmoid, and Gated DeltaNet's log α (B, T, H)
  (``chunk_delta_rule``, in float32 ``fused_recurrent_delta_rule``: FLA 0.6's chunked delta
  rule asserts a 16-bit dtype; ``chunk_gated_delta_rule``); RWKV-6's log w (B, T, H, K) and
  bonus u (H, K) (``chunk_rwkv6``);
* state: (N, H, Dk, Dv), key-first (FLA's default ``state_v_first=False``), as ours;
  Mamba-2 keeps h as (H, P, N), i.e. value-first, so it is transposed in and out.

**Precision**: without autocast the kernels get float32 tensors, as the reference computes;
under autocast (bf16-mixed) q, k, v and beta are handed over in the autocast dtype, as
FLA's own layers do (the kernels accumulate in float32), while gates stay float32. float64
never takes the fast path.

**Document resets** (per-token sequence starts): the fast path does not take them yet
(FLA's ``cu_seqlens`` needs the batch flattened into one row); when a mixer is given
resets it runs the reference (:func:`use_fla` with ``resets``).

FLA's Triton kernels are invisible to ``FlopCounterMode`` (it counts ATen ops): a FLOP
budget counted on a CUDA run with the fast path misses the recurrence's FLOPs.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from harness.errors import ConfigError

KERNELS = ("auto", "fla", "reference")
FLA = "fla"
REFERENCE = "reference"
#: the implementation tag of a model whose sequence layers have no mixer (attention: PyTorch)
PYTORCH = "pytorch"


_found: list[bool] = []  # filled once: a plain global, which torch.compile reads as a constant


def fla_importable() -> bool:
    """``fla`` and ``triton`` are installed (found, not imported: importing FLA's ops on a
    machine without a GPU warns). Looked up once per process (:func:`select` does it before
    any forward pass, so a compiled forward never calls ``find_spec``)."""
    if not _found:
        _found.append(all(importlib.util.find_spec(name) is not None for name in ("fla", "triton")))
    return _found[0]


def use_fla(kernel: str, x: Tensor, *, resets: Tensor | None = None) -> bool:
    """Whether a mixer set to ``kernel`` runs FLA on ``x``: never on the CPU, never for
    float64, never with ``resets`` (the reference handles them), never for ``reference``."""
    return (kernel != REFERENCE and x.device.type == "cuda" and x.dtype != torch.float64
            and resets is None and fla_importable())


def resolve(kernels: str, mixer: type | None, device: Any, *, resets: bool = False) -> str:
    """The implementation a run with ``train.kernels`` on ``device`` uses for its mixer
    class (None: no mixer): ``fla``, ``reference`` or ``pytorch`` (no mixer). The same rule
    as :func:`use_fla`, known before anything is built: the run's ``harness.kernel`` tag.
    ``resets``: the run keeps documents apart; a mixer that resets its state itself
    (``Mixer.resets``) is then given the starts, which the fast path does not take."""
    if mixer is None:
        return PYTORCH
    if kernels == REFERENCE or not getattr(mixer, "fast_path_ops", ()):
        return REFERENCE
    if resets and getattr(mixer, "resets", False):
        return REFERENCE
    return FLA if device.type == "cuda" and fla_importable() else REFERENCE


def require_fla(mixer: type | None, name: str, device: Any) -> None:
    """Refuse ``train.kernels: fla`` where it cannot run (exit 2, before anything is built)."""
    where = "train.kernels is 'fla'"
    if device.type != "cuda" or not torch.cuda.is_available():
        raise ConfigError(f"{where}, which needs a CUDA device, but this run trains on "
                          f"'{device.type}': FLA's Triton kernels do not run there. Set "
                          f"train.kernels to 'auto' (FLA on CUDA, the reference elsewhere) or 'reference'.")
    if mixer is None or not getattr(mixer, "fast_path_ops", ()):
        what = f"mixer '{name}'" if mixer is not None else "this model, which has no mixer,"
        raise ConfigError(f"{where}, but {what} has no FLA kernel (mixers with one: gla, retnet, "
                          f"deltanet, gated_deltanet, rwkv6, mamba2). Set train.kernels to 'auto' "
                          f"or 'reference'.")
    if not fla_importable():
        raise ConfigError(f"{where}, but flash-linear-attention is not installed here. Install "
                          f"the extra (pip install 'attention-harness[gpu]': fla-core and triton) "
                          f"or set train.kernels to 'auto' or 'reference'.")


def select(model: nn.Module, kernels: str) -> None:
    """Set every mixer of ``model`` that has a fast path to ``kernels``."""
    if kernels not in KERNELS:
        raise ConfigError(f"train.kernels is '{kernels}'; it must be one of {', '.join(KERNELS)}.")
    fla_importable()
    for module in model.modules():
        if getattr(module, "fast_path_ops", ()):
            module.kernel = kernels  # type: ignore[assignment]


# -- the mapping: our tensors -> one FLA op's arguments ------------------------------------------
@dataclass
class Call:
    """One FLA op (``fla.ops.<package>.<op>``) and its keyword arguments, in FLA's layout."""

    package: str
    op: str
    args: dict[str, Any] = field(default_factory=dict)

    def run(self) -> tuple[Tensor, Tensor | None]:
        """Call the kernel (CUDA only): the output (B, T, H, V) and the final state or None."""
        fn = getattr(importlib.import_module(f"fla.ops.{self.package}"), self.op)
        out, final = fn(**self.args)
        return out, final


def time_major(x: Tensor) -> Tensor:
    """(B, H, L, ...) -> (B, L, H, ...), contiguous (the kernels read strided blocks)."""
    return x.transpose(1, 2).contiguous()


def kernel_dtype(x: Tensor) -> torch.dtype:
    """The dtype of q, k, v (and beta) handed to the kernel: the autocast dtype under
    autocast on x's device, else float32."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return torch.float32


def linear_attention_call(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor,
                          state: Tensor | None = None) -> Call:
    """S_t = diag(a_t) S_{t-1} + k_tᵀ v_t, o_t = q_t S_t (q, k, v (B, H, L, ·), ``log_decay``
    (B, H, L, Dk) per key dimension or (B, H, L, 1) per head): ``chunk_gla`` or
    ``chunk_simple_gla``."""
    dt = kernel_dtype(q)
    args: dict[str, Any] = {"q": time_major(q.to(dt)), "k": time_major(k.to(dt)),
                            "v": time_major(v.to(dt)), "scale": 1.0,
                            "initial_state": state, "output_final_state": state is not None}
    if log_decay.shape[-1] == 1 and q.shape[-1] != 1:
        args["g"] = time_major(log_decay[..., 0].float())
        return Call("simple_gla", "chunk_simple_gla", args)
    args["g"] = time_major(log_decay.float().expand_as(q))
    return Call("gla", "chunk_gla", args)


def delta_rule_call(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_decay: Tensor | None,
                    state: Tensor | None = None) -> Call:
    """S_t = a_t (I - b_t k_t k_tᵀ) S_{t-1} + b_t k_t v_tᵀ, o_t = q_t S_t (``beta``,
    ``log_decay`` (B, H, L)): ``chunk_delta_rule`` (``fused_recurrent_delta_rule`` in float32,
    which the chunked one refuses) or ``chunk_gated_delta_rule``."""
    dt = kernel_dtype(q)
    args: dict[str, Any] = {"q": time_major(q.to(dt)), "k": time_major(k.to(dt)),
                            "v": time_major(v.to(dt)), "beta": time_major(beta.to(dt)),
                            "scale": 1.0, "initial_state": state,
                            "output_final_state": state is not None}
    if log_decay is None:  # FLA's chunked delta rule refuses float32: its fused recurrent kernel
        return Call("delta_rule", "chunk_delta_rule" if dt != torch.float32 else "fused_recurrent_delta_rule",
                    args)
    args["g"] = time_major(log_decay.float())
    return Call("gated_delta_rule", "chunk_gated_delta_rule", args)


def rwkv6_call(r: Tensor, k: Tensor, v: Tensor, log_w: Tensor, u: Tensor, state: Tensor) -> Call:
    """y_t = r_t (diag(u) k_tᵀ v_t + S_{t-1}), S_t = diag(w_t) S_{t-1} + k_tᵀ v_t (r, k,
    ``log_w`` (B, H, L, K), v (B, H, L, V), u (H, K), state (B, H, K, V)): ``chunk_rwkv6``."""
    dt = kernel_dtype(r)
    return Call("rwkv6", "chunk_rwkv6", {
        "r": time_major(r.to(dt)), "k": time_major(k.to(dt)), "v": time_major(v.to(dt)),
        "w": time_major(log_w.float()), "u": u.to(dt), "scale": 1.0,
        "initial_state": state.float(), "output_final_state": True})


def ssd_call(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, h0: Tensor | None) -> Call:
    """Mamba-2's SSD, h_t = exp(Δ_t A) h_{t-1} + Δ_t x_t ⊗ B_t, y_t = h_t C_t, is simple GLA
    with q = C, k = B (each head reads its group's), v = Δ x, g = Δ A, scale 1, and the
    state transposed (FLA's (N, P) is our hᵀ). x (b, L, H, P), Δ (b, L, H), A (H,), B, C
    (b, L, G, N), h0 (b, H, P, N) or None."""
    heads, groups = x.shape[2], B.shape[2]
    kd = kernel_dtype(x)

    def per_head(t: Tensor) -> Tensor:
        return t.repeat_interleave(heads // groups, dim=2).to(kd).contiguous()

    return Call("simple_gla", "chunk_simple_gla", {
        "q": per_head(C), "k": per_head(B), "v": (x * dt.unsqueeze(-1)).to(kd).contiguous(),
        "g": (dt * A).float().contiguous(), "scale": 1.0,
        "initial_state": None if h0 is None else h0.transpose(-1, -2).float().contiguous(),
        "output_final_state": True})


# -- the calls the mixers make ------------------------------------------------------------------
def linear_attention(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor) -> Tensor:
    """:func:`harness.nn.linear_recurrence.chunked_linear_attention`'s outputs, by FLA."""
    out, _ = linear_attention_call(q, k, v, log_decay).run()
    return out.transpose(1, 2).to(q.dtype)


def delta_rule(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_decay: Tensor | None) -> Tensor:
    """:func:`harness.nn.linear_recurrence.chunked_delta_rule`'s outputs, by FLA."""
    out, _ = delta_rule_call(q, k, v, beta, log_decay).run()
    return out.transpose(1, 2).to(q.dtype)


def rwkv6(r: Tensor, k: Tensor, v: Tensor, log_w: Tensor, u: Tensor, state: Tensor
          ) -> tuple[Tensor, Tensor]:
    """``rwkv6.wkv6``'s outputs (B, H, L, V) and final state, by FLA."""
    out, final = rwkv6_call(r, k, v, log_w, u, state).run()
    assert final is not None
    return out.transpose(1, 2).to(r.dtype), final.to(state.dtype)


def ssd(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, h0: Tensor | None
        ) -> tuple[Tensor, Tensor]:
    """``mamba2.ssd``'s y (b, L, H, P) and last state (b, H, P, N), by FLA."""
    out, final = ssd_call(x, dt, A, B, C, h0).run()
    assert final is not None
    return out.to(x.dtype), final.transpose(-1, -2).to(x.dtype)
