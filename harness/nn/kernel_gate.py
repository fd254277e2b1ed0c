"""The kernel gate: before a run trains on the fast path, each FLA kernel it would use is
checked against the reference, once per (mixer, shapes, dtype, device, torch, triton, fla).

FLA's Triton kernels are new code on every GPU, compiler and library version: fla-core 0.6
raises on purpose in the gated backward on Hopper with Triton >= 3.4 and < 3.7.1 (FLA issue
#640), and FLA's tracker has reports of crashes and wrong values on some Triton versions
(#734, #52). A run must not learn from a wrong kernel, nor die of one, so
:func:`check` runs a copy of the mixer (its parameters moved off their initial values, so
that every input matters) forward and backward on a small input (batch 2, 150 positions:
three of FLA's 64-token chunks, the last ragged) with the reference and with the fast path,
in the run's dtype (autocast for a mixed precision), and compares, relative to the
reference's largest magnitude:

* float32: outputs within 5e-3, every gradient (input and parameters) within 2e-2 (the GPU
  test's tolerances: the kernels may use TF32 inside their products);
* bfloat16 / float16 autocast: outputs within 5e-2, gradients within 1e-1 (16-bit q, k, v).

Anything else (a larger difference, a non-finite value, an exception such as fla-core's
refusal above) fails the gate: the run falls back to the reference (``train.kernels:
auto``), or is refused (``fla``). The gate does not know FLA's refusals in advance: their
rules live in FLA's code (and depend on e.g. whether tilelang is installed), and the check
meets them as the run would, once, then remembers.

Verdicts are cached as JSON under the harness's cache folder
(``$HARNESS_CACHE_DIR/kernel_gate/``, :func:`harness.runtime.cache.cache_dir`), keyed by a
hash of :func:`key`; out-of-memory is never cached. Delete the folder to check again.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib.metadata
import json
import os
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor, nn

from harness.nn import fast_path
from harness.runtime.cache import cache_dir

#: (output, gradient) tolerances relative to the reference's largest magnitude, per dtype
TOLERANCES = {torch.float32: (5e-3, 2e-2), torch.bfloat16: (5e-2, 1e-1), torch.float16: (5e-2, 1e-1)}
BATCH, LENGTH = 2, 150
_memo: dict[str, Verdict] = {}


@dataclass(frozen=True)
class Verdict:
    passed: bool
    reason: str  # one line: the errors measured, or why it failed
    cached: bool = False

    def tag(self) -> str:
        return f"{'passed' if self.passed else 'failed'}: {self.reason}" + (" (cached)" if self.cached else "")


def dtype_of(precision: str) -> torch.dtype:
    """The dtype a run's resolved ``train.precision`` computes the mixers' inputs in."""
    if precision.startswith("bf16"):
        return torch.bfloat16
    if precision.startswith("16"):
        return torch.float16
    return torch.float32


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def key(mixer: nn.Module, dtype: torch.dtype, device: torch.device) -> dict[str, Any]:
    """What a verdict depends on: the mixer's class and parameter shapes, the dtype, the
    device (name and compute capability), torch, triton and fla-core."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        where = f"{torch.cuda.get_device_name(index)} sm{''.join(map(str, torch.cuda.get_device_capability(index)))}"
    else:
        where = device.type
    return {"mixer": f"{type(mixer).__module__}.{type(mixer).__qualname__}",
            "shapes": sorted([n, list(p.shape)] for n, p in mixer.named_parameters()),
            "dtype": str(dtype).removeprefix("torch."), "device": where, "torch": torch.__version__,
            "triton": _version("triton"), "fla": _version("fla-core")}


def _error(got: Tensor | None, want: Tensor | None) -> float:
    if got is None or want is None:
        return 0.0 if got is None and want is None else float("inf")
    if not torch.isfinite(got).all():
        return float("inf")
    return float((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-6))


def _pass(module: nn.Module, x: Tensor, w: Tensor, dtype: torch.dtype) -> tuple[Tensor, list[Tensor | None]]:
    x = x.clone().requires_grad_()
    with torch.autocast(x.device.type, dtype=dtype, enabled=dtype != torch.float32):
        out = module(x)[0].float()
    (out * w).sum().backward()
    return out.detach(), [x.grad] + [p.grad for p in module.parameters()]


def probe(mixer: nn.Module, dtype: torch.dtype, device: torch.device) -> Verdict:
    """Run the check of the module documentation (no cache)."""
    out_tol, grad_tol = TOLERANCES.get(dtype, TOLERANCES[torch.float32])
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):  # the run's random streams stay untouched
        torch.manual_seed(0)
        ref = copy.deepcopy(mixer).to(device=device, dtype=torch.float32).train(False)
        with torch.no_grad():
            for p in ref.parameters():
                p.add_(0.05 * torch.randn_like(p))
        fast = copy.deepcopy(ref)
        ref.kernel, fast.kernel = fast_path.REFERENCE, fast_path.FLA  # type: ignore[assignment]
        x = torch.randn(BATCH, LENGTH, int(mixer.d_model), device=device)  # type: ignore[arg-type]
        w = torch.randn_like(x)  # a mixer maps (B, L, d_model) to the same shape
        try:
            want, want_grads = _pass(ref, x, w, dtype)
            got, got_grads = _pass(fast, x, w, dtype)
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as exc:  # the kernel's exception is the gate's finding
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            return Verdict(False, f"{type(exc).__name__}: {first}".rstrip(": "))
    out_err = _error(got, want)
    grad_err = max((_error(g, r) for g, r in zip(got_grads, want_grads, strict=True)), default=0.0)
    said = (f"{str(dtype).removeprefix('torch.')} output {out_err:.1e} (tolerance {out_tol:.0e}), "
            f"gradients {grad_err:.1e} (tolerance {grad_tol:.0e}) relative to the reference")
    return Verdict(out_err <= out_tol and grad_err <= grad_tol, said)


def check(mixer: nn.Module, dtype: torch.dtype, device: torch.device) -> Verdict:
    """The cached verdict for ``mixer``'s fast path in ``dtype`` on ``device``, or a fresh one."""
    k = key(mixer, dtype, device)
    digest = hashlib.sha256(json.dumps(k, sort_keys=True).encode()).hexdigest()[:24]
    if digest in _memo:
        return _memo[digest]
    path = cache_dir() / "kernel_gate" / f"{digest}.json"
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        found = json.loads(path.read_text())
        if found["key"] == k:
            verdict = Verdict(bool(found["passed"]), str(found["reason"]), cached=True)
            _memo[digest] = verdict
            return verdict
    verdict = probe(mixer, dtype, device)
    _memo[digest] = verdict
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"key": k, **asdict(verdict)}, indent=1) + "\n")
        os.replace(tmp, path)  # atomic: processes checking together never read half a file
    return verdict


def gate(model: nn.Module, dtype: torch.dtype, device: torch.device) -> dict[str, Verdict]:
    """Check each kind of mixer of ``model`` that would take the fast path on ``device``;
    every mixer whose check fails is set to the reference. Returns {mixer class: verdict}."""
    probe_x = torch.empty(0, device=device, dtype=torch.float32)
    verdicts: dict[str, Verdict] = {}
    seen: dict[str, Verdict] = {}
    for module in model.modules():
        if not getattr(module, "fast_path_ops", ()) or not fast_path.use_fla(getattr(module, "kernel", "auto"), probe_x):
            continue
        name = type(module).__name__
        shape_key = json.dumps(key(module, dtype, device))
        if shape_key not in seen:
            seen[shape_key] = check(module, dtype, device)
            if name not in verdicts or verdicts[name].passed:
                verdicts[name] = seen[shape_key]
        if not seen[shape_key].passed:
            module.kernel = fast_path.REFERENCE  # type: ignore[assignment]
    return verdicts
