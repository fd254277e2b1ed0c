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

**Fixed decays**: RetNet's decay is one constant per head; it is handed over as FLA's own
retention layer does, ``g_gamma`` (H,) to ``chunk_simple_gla``, not as a per-token ``g``:
the kernels then never take the gated backward (``chunk_bwd_dqkwg`` with ``g``), which
fla-core 0.6 refuses on Hopper with Triton >= 3.4 and < 3.7.1 (FLA issue #640).

**Document boundaries** (``documents: separate``, per-token starts (B, L)): the batch is
flattened into one row of B·L tokens and FLA's ``cu_seqlens`` mark where each document and
each row begins (:class:`Varlen`), as FLA's varlen API expects; each sequence starts from a
zero state, which is the reference's reset. Outputs are unflattened; a final state is each
row's last document's. Finding the boundaries reads them on the host once per batch (the
one-entry cache below shares it between the layers of a forward pass).

**FLOPs**: FLA's Triton kernels are invisible to ``FlopCounterMode`` (it counts ATen ops).
Each kernel call adds the FLOPs of the recurrence it computes (:func:`recurrence_flops`:
the matrix products of the chunked form at FLA's chunk of 64, forward, x3 with the backward)
to an account that the mixer declares as ``hidden_flops`` (:mod:`harness.run.flops`), so a
FLOP budget and MFU count the same work whichever implementation runs.
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
    float64, never for ``reference``. ``resets`` (document starts) are taken by FLA's
    ``cu_seqlens`` (:class:`Varlen`), so they no longer decide."""
    return kernel != REFERENCE and x.device.type == "cuda" and x.dtype != torch.float64 and fla_importable()


def resolve(kernels: str, mixer: type | None, device: Any, *, resets: bool = False) -> str:
    """The implementation a run with ``train.kernels`` on ``device`` uses for its mixer
    class (None: no mixer): ``fla``, ``reference`` or ``pytorch`` (no mixer). The same rule
    as :func:`use_fla`, known before anything is built: the run's ``harness.kernel`` tag.
    ``resets``: the run keeps documents apart (the fast path takes them as ``cu_seqlens``)."""
    if mixer is None:
        return PYTORCH
    if kernels == REFERENCE or not getattr(mixer, "fast_path_ops", ()):
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


# -- document boundaries: the batch as one row of sequences -------------------------------------
@dataclass
class Varlen:
    """A (B, L) batch with document starts as FLA's variable-length form: one row of B·L
    tokens, ``cu`` (N + 1,) the offsets where each of its N sequences begins (a document's
    start or a row's), ``last`` the index of each row's last sequence."""

    cu: Tensor
    cu_cpu: Tensor
    rows: int
    length: int
    last: Tensor

    @staticmethod
    def of(starts: Tensor) -> Varlen:
        hit = _varlen_cache.get("starts")
        if hit is not None and hit[0] is starts:
            return hit[1]  # type: ignore[no-any-return]
        rows, length = starts.shape
        begins = starts.clone()
        begins[:, 0] = True  # every row begins a sequence
        flat = begins.reshape(-1).nonzero().squeeze(-1).cpu()  # the one read on the host
        cu_cpu = torch.cat([flat, torch.tensor([rows * length])]).long()
        per_row = begins.sum(dim=1).cpu()
        varlen = Varlen(cu_cpu.to(starts.device), cu_cpu, rows, length, per_row.cumsum(0) - 1)
        _varlen_cache["starts"] = (starts, varlen)
        return varlen

    def flat(self, t: Tensor) -> Tensor:
        """(B, L, ...) -> (1, B·L, ...), contiguous."""
        return t.reshape(1, self.rows * self.length, *t.shape[2:]).contiguous()

    def unflat(self, t: Tensor) -> Tensor:
        return t.reshape(self.rows, self.length, *t.shape[2:])


_varlen_cache: dict[str, tuple[Tensor, Varlen]] = {}


# -- the mapping: our tensors -> one FLA op's arguments ------------------------------------------
@dataclass
class Call:
    """One FLA op (``fla.ops.<package>.<op>``) and its keyword arguments, in FLA's layout;
    ``varlen``: the arguments are flattened into one row (document boundaries)."""

    package: str
    op: str
    args: dict[str, Any] = field(default_factory=dict)
    varlen: Varlen | None = None

    def run(self) -> tuple[Tensor, Tensor | None]:
        """Call the kernel (CUDA only): the output (B, T, H, V) and the final state or None."""
        fn = getattr(importlib.import_module(f"fla.ops.{self.package}"), self.op)
        out, final = fn(**self.args)
        return out, final

    def finish(self) -> tuple[Tensor, Tensor | None]:
        """Run it (counting its FLOPs, :func:`recurrence_flops`) and undo the flattening:
        (B, T, H, V) out, and each row's final state (B, ...) or None."""
        account(self)
        out, final = self.run()
        if self.varlen is None:
            return out, final
        return self.varlen.unflat(out), None if final is None else final[self.varlen.last.to(final.device)]


def time_major(x: Tensor) -> Tensor:
    """(B, H, L, ...) -> (B, L, H, ...), contiguous (the kernels read strided blocks)."""
    return x.transpose(1, 2).contiguous()


def kernel_dtype(x: Tensor) -> torch.dtype:
    """The dtype of q, k, v (and beta) handed to the kernel: the autocast dtype under
    autocast on x's device, else float32."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return torch.float32


def sequences(call: Call, starts: Tensor | None, state: Tensor | None, *names: str,
              no_cpu_copy: bool = False) -> Call:
    """With document ``starts``, flatten ``names`` of the call's arguments into one row and
    add FLA's ``cu_seqlens`` (each sequence from a zero state: ``state`` must be None or
    zeros, and is dropped)."""
    if starts is None:
        return call
    varlen = Varlen.of(starts)
    for name in names:
        call.args[name] = varlen.flat(call.args[name])
    call.args.update(cu_seqlens=varlen.cu, initial_state=None)
    if not no_cpu_copy:
        call.args["cu_seqlens_cpu"] = varlen.cu_cpu
    call.varlen = varlen
    return call


def linear_attention_call(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor,
                          state: Tensor | None = None, *, gamma: Tensor | None = None,
                          starts: Tensor | None = None) -> Call:
    """S_t = diag(a_t) S_{t-1} + k_tᵀ v_t, o_t = q_t S_t (q, k, v (B, H, L, ·), ``log_decay``
    (B, H, L, Dk) per key dimension or (B, H, L, 1) per head): ``chunk_gla`` or
    ``chunk_simple_gla``; ``gamma`` (H,): a decay fixed per head (RetNet), handed over as
    ``g_gamma`` instead of ``g``; ``starts`` (B, L): document starts (``cu_seqlens``)."""
    dt = kernel_dtype(q)
    args: dict[str, Any] = {"q": time_major(q.to(dt)), "k": time_major(k.to(dt)),
                            "v": time_major(v.to(dt)), "scale": 1.0,
                            "initial_state": state, "output_final_state": state is not None}
    if gamma is not None:
        args["g_gamma"] = gamma.float().contiguous()
        return sequences(Call("simple_gla", "chunk_simple_gla", args), starts, state, "q", "k", "v")
    if log_decay.shape[-1] == 1 and q.shape[-1] != 1:
        args["g"] = time_major(log_decay[..., 0].float())
        return sequences(Call("simple_gla", "chunk_simple_gla", args), starts, state, "q", "k", "v", "g")
    args["g"] = time_major(log_decay.float().expand_as(q))
    return sequences(Call("gla", "chunk_gla", args), starts, state, "q", "k", "v", "g")


def delta_rule_call(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_decay: Tensor | None,
                    state: Tensor | None = None, *, starts: Tensor | None = None) -> Call:
    """S_t = a_t (I - b_t k_t k_tᵀ) S_{t-1} + b_t k_t v_tᵀ, o_t = q_t S_t (``beta``,
    ``log_decay`` (B, H, L)): ``chunk_delta_rule`` (``fused_recurrent_delta_rule`` in float32,
    which the chunked one refuses) or ``chunk_gated_delta_rule``."""
    dt = kernel_dtype(q)
    args: dict[str, Any] = {"q": time_major(q.to(dt)), "k": time_major(k.to(dt)),
                            "v": time_major(v.to(dt)), "beta": time_major(beta.to(dt)),
                            "scale": 1.0, "initial_state": state,
                            "output_final_state": state is not None}
    names = ("q", "k", "v", "beta")
    if log_decay is None:  # FLA's chunked delta rule refuses float32: its fused recurrent kernel
        recurrent = dt == torch.float32
        call = Call("delta_rule", "fused_recurrent_delta_rule" if recurrent else "chunk_delta_rule", args)
        return sequences(call, starts, state, *names, no_cpu_copy=recurrent)
    args["g"] = time_major(log_decay.float())
    return sequences(Call("gated_delta_rule", "chunk_gated_delta_rule", args), starts, state, *names, "g")


def rwkv6_call(r: Tensor, k: Tensor, v: Tensor, log_w: Tensor, u: Tensor, state: Tensor, *,
               starts: Tensor | None = None) -> Call:
    """y_t = r_t (diag(u) k_tᵀ v_t + S_{t-1}), S_t = diag(w_t) S_{t-1} + k_tᵀ v_t (r, k,
    ``log_w`` (B, H, L, K), v (B, H, L, V), u (H, K), state (B, H, K, V)): ``chunk_rwkv6``."""
    dt = kernel_dtype(r)
    call = Call("rwkv6", "chunk_rwkv6", {
        "r": time_major(r.to(dt)), "k": time_major(k.to(dt)), "v": time_major(v.to(dt)),
        "w": time_major(log_w.float()), "u": u.to(dt), "scale": 1.0,
        "initial_state": state.float(), "output_final_state": True})
    return sequences(call, starts, state, "r", "k", "v", "w")


def ssd_call(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, h0: Tensor | None, *,
             starts: Tensor | None = None) -> Call:
    """Mamba-2's SSD, h_t = exp(Δ_t A) h_{t-1} + Δ_t x_t ⊗ B_t, y_t = h_t C_t, is simple GLA
    with q = C, k = B (each head reads its group's), v = Δ x, g = Δ A, scale 1, and the
    state transposed (FLA's (N, P) is our hᵀ). x (b, L, H, P), Δ (b, L, H), A (H,), B, C
    (b, L, G, N), h0 (b, H, P, N) or None."""
    heads, groups = x.shape[2], B.shape[2]
    kd = kernel_dtype(x)

    def per_head(t: Tensor) -> Tensor:
        return t.repeat_interleave(heads // groups, dim=2).to(kd).contiguous()

    call = Call("simple_gla", "chunk_simple_gla", {
        "q": per_head(C), "k": per_head(B), "v": (x * dt.unsqueeze(-1)).to(kd).contiguous(),
        "g": (dt * A).float().contiguous(), "scale": 1.0,
        "initial_state": None if h0 is None else h0.transpose(-1, -2).float().contiguous(),
        "output_final_state": True})
    return sequences(call, starts, h0, "q", "k", "v", "g")


# -- the FLOPs the kernels compute, which no counter sees ------------------------------------------
#: FLA's chunk length (its ``BT``) in the chunked kernels
CHUNK = 64
_uncounted = [0.0]  # FLOPs of the kernel calls since the running mixer's forward began


def recurrence_flops(call: Call) -> float:
    """Forward FLOPs of one kernel call: the chunked form's matrix products (2 per
    multiply-add), per head and chunk of C = min(64, T) tokens with key width K and value
    width V: scores q kᵀ (C²K), scores·v (C²V), the carried state read q S and written
    kᵀ v (2·C·K·V); the delta rule adds its WY form (k kᵀ, the triangular solve's C³/3, its
    products with k and v, C²(2K + V)) and the state's correction (C·K·V). FLA's fused
    recurrent delta rule computes it token by token (3·K·V per token: the state read at k,
    its rank-one correction, the output read at q)."""
    a = call.args
    q: Tensor = a["q"] if "q" in a else a["r"]
    v: Tensor = a["v"]
    tokens, heads, k_width = q.shape[1], q.shape[2], q.shape[3]
    v_width = v.shape[3]
    batch = q.shape[0]
    if call.op == "fused_recurrent_delta_rule":
        per_token = 3.0 * k_width * v_width
    else:
        c = min(CHUNK, tokens)
        per_token = c * (k_width + v_width) + 2.0 * k_width * v_width
        if "beta" in a:
            per_token += c * c / 3.0 + c * (2 * k_width + v_width) + k_width * v_width
    return 2.0 * per_token * batch * tokens * heads


def account(call: Call) -> None:
    """Add ``call``'s FLOPs (x3 when a backward will follow) to the running mixer's account
    (eager only: a FLOP count runs eagerly; compiled steps are not counted)."""
    if torch.compiler.is_compiling():
        return
    grads = torch.is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad for t in call.args.values())
    _uncounted[0] += recurrence_flops(call) * (3.0 if grads else 1.0)


def begin_uncounted() -> None:
    """A mixer's forward begins: its account starts at zero."""
    if not torch.compiler.is_compiling():
        _uncounted[0] = 0.0


def take_uncounted() -> float:
    """The FLOPs the kernels computed in this mixer's forward (and backward), once."""
    flops, _uncounted[0] = _uncounted[0], 0.0
    return flops


# -- the calls the mixers make ------------------------------------------------------------------
def linear_attention(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, *, gamma: Tensor | None = None,
                     starts: Tensor | None = None) -> Tensor:
    """:func:`harness.nn.linear_recurrence.chunked_linear_attention`'s outputs, by FLA."""
    out, _ = linear_attention_call(q, k, v, log_decay, gamma=gamma, starts=starts).finish()
    return out.transpose(1, 2).to(q.dtype)


def delta_rule(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_decay: Tensor | None, *,
               starts: Tensor | None = None) -> Tensor:
    """:func:`harness.nn.linear_recurrence.chunked_delta_rule`'s outputs, by FLA."""
    out, _ = delta_rule_call(q, k, v, beta, log_decay, starts=starts).finish()
    return out.transpose(1, 2).to(q.dtype)


def rwkv6(r: Tensor, k: Tensor, v: Tensor, log_w: Tensor, u: Tensor, state: Tensor, *,
          starts: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``rwkv6.wkv6``'s outputs (B, H, L, V) and final state, by FLA."""
    out, final = rwkv6_call(r, k, v, log_w, u, state, starts=starts).finish()
    assert final is not None
    return out.transpose(1, 2).to(r.dtype), final.to(state.dtype)


def ssd(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, h0: Tensor | None, *,
        starts: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``mamba2.ssd``'s y (b, L, H, P) and last state (b, H, P, N), by FLA."""
    out, final = ssd_call(x, dt, A, B, C, h0, starts=starts).finish()
    assert final is not None
    return out.to(x.dtype), final.transpose(-1, -2).to(x.dtype)
