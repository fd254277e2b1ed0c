"""The fast path's document boundaries (FLA's ``cu_seqlens``), RetNet's fixed decay (``g_gamma``)
and the FLOPs the kernels compute (``hidden_flops``), on the CPU.

As in tests/test_fast_path.py, the kernel call is swapped for FLA's own pure-PyTorch naive
recurrence on exactly the arguments the kernel would get; with ``cu_seqlens`` each marked
sequence runs on its own from a zero state (FLA's varlen definition). Equal outputs and
gradients to the reference mixer given the same document starts prove the flattening, the
offsets and the unflattening; the Triton kernels themselves need a GPU.
"""

from __future__ import annotations

import copy

import pytest
import torch

from harness.nn import fast_path

pytest.importorskip("fla")
pytest.importorskip("triton")
pytestmark = pytest.mark.filterwarnings("ignore:Triton is not supported", "ignore:.*Triton.*CPU")

from test_fast_path import mixers, naive  # noqa: E402  (after the importorskip)


def plant(monkeypatch, calls: list[fast_path.Call]) -> None:
    def run(call: fast_path.Call):
        calls.append(call)
        return naive(call)

    monkeypatch.setattr(fast_path, "use_fla", lambda kernel, x, resets=None: kernel != "reference")
    monkeypatch.setattr(fast_path.Call, "run", run)


def document_starts() -> torch.Tensor:
    """Row 0: documents at 0, 7 and 15; row 1: one begins at 5 (its first tokens continue a
    document from before the window: a row's start is a sequence's start too)."""
    starts = torch.zeros(2, 21, dtype=torch.bool)
    starts[0, [0, 7, 15]] = True
    starts[1, 5] = True
    return starts


def test_varlen_offsets_mark_every_document_and_row_start():
    varlen = fast_path.Varlen.of(document_starts())
    assert varlen.cu_cpu.tolist() == [0, 7, 15, 21, 26, 42]
    assert varlen.last.tolist() == [2, 4]  # each row's last sequence: its final state
    x = torch.arange(2 * 21 * 3).view(2, 21, 3)
    assert torch.equal(varlen.unflat(varlen.flat(x)), x) and varlen.flat(x).shape == (1, 42, 3)


@pytest.mark.parametrize("name", sorted(mixers()))
def test_documents_on_the_fast_path_match_the_reference_through_cu_seqlens(name, monkeypatch):
    torch.manual_seed(1)
    mixer = mixers()[name]()
    with torch.no_grad():
        for p in mixer.parameters():
            p.add_(0.05 * torch.randn_like(p))
    fast = copy.deepcopy(mixer)
    mixer.kernel, fast.kernel = "reference", "fla"
    starts = document_starts()
    x = torch.randn(2, 21, 32)
    x_ref, x_fast = x.clone().requires_grad_(), x.clone().requires_grad_()
    ref = mixer(x_ref, document_starts=starts)[0]
    calls: list[fast_path.Call] = []
    plant(monkeypatch, calls)
    out = fast(x_fast, document_starts=starts)[0]
    assert calls and all(c.args["cu_seqlens"].tolist() == [0, 7, 15, 21, 26, 42] for c in calls)
    assert all(c.args["initial_state"] is None for c in calls)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    # and the boundaries matter: without them the fast path computes something else
    assert (fast(x)[0] - ref).abs().max() > 1e-3
    w = torch.randn_like(ref)
    (ref * w).sum().backward()
    (out * w).sum().backward()
    torch.testing.assert_close(x_fast.grad, x_ref.grad, rtol=1e-3, atol=1e-5)


def test_retnet_hands_its_fixed_decay_as_g_gamma_never_as_a_gate(monkeypatch):
    """FLA's own retention layer passes g_gamma: the kernels then never take the gated
    backward that fla-core 0.6 refuses on Hopper with Triton 3.4 to 3.7.0 (FLA #640)."""
    from harness_plugins.mixers.retnet import retention_decays

    calls: list[fast_path.Call] = []
    plant(monkeypatch, calls)
    mixer = mixers()["retnet"]()
    mixer.kernel = "fla"
    mixer(torch.randn(2, 9, 32))
    (call,) = calls
    assert call.op == "chunk_simple_gla" and "g" not in call.args
    torch.testing.assert_close(call.args["g_gamma"], torch.tensor(retention_decays(2), dtype=torch.float32))


def counted(model: torch.nn.Module, x: torch.Tensor) -> float:
    from harness.run.flops import flop_counter

    with flop_counter(model) as counter:
        model(x)[0].square().mean().backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("name", sorted(mixers()))
def test_the_fast_path_declares_the_flops_of_the_recurrence_the_counter_cannot_see(name, monkeypatch):
    """Counted FLOPs of one forward and backward, chunk 64, L 256: the reference (its products
    visible) and the fast path (the kernel invisible, its recurrence declared), which without
    the declaration would count only the projections. The decayed linear attentions (GLA,
    RetNet, Mamba-2, RWKV-6) compute the same products as their references: within 5% (1-4%
    measured). The delta rules differ by what runs: FLA's WY form (3CK + 2CV + C²/3 + 3KV
    multiply-adds per token) against a reference whose triangular solve
    (torch.linalg.solve_triangular) the counter does not count (Gated DeltaNet: 1.23x
    measured), and in float32 FLA's fused recurrent kernel, which computes less (DeltaNet:
    0.73x): within 30%."""
    torch.manual_seed(0)
    mixer = mixers()[name]()
    for attr in ("chunk", "chunk_size"):
        if hasattr(mixer, attr):
            setattr(mixer, attr, 64)
    fast = copy.deepcopy(mixer)
    mixer.kernel, fast.kernel = "reference", "fla"
    x = torch.randn(2, 256, 32, requires_grad=True)
    reference = counted(mixer, x)
    plant(monkeypatch, [])
    monkeypatch.setattr(fast, "hidden_flops", lambda inputs, output: 0.0)
    hidden = counted(fast, x)  # what the counter sees of the fast path without the declaration
    monkeypatch.undo()
    plant(monkeypatch, [])
    declared = counted(fast, x)
    recurrence = reference - hidden
    assert recurrence > 0.2 * reference  # the recurrence is a real share of the work here
    tolerance = 0.3 if "delta" in name else 0.05
    assert declared == pytest.approx(reference, rel=tolerance), (name, reference, hidden, declared)
