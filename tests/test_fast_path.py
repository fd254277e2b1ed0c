"""The mixers' fast path (harness.nn.fast_path) on the CPU: the argument mapping proven, the
selection rules, the refusal of ``train.kernels: fla`` off CUDA, the recorded tag.

FLA's Triton kernels need a GPU, but FLA ships pure-PyTorch reference functions of the same
recurrences (``fla/ops/*/naive.py``, ``recurrent_naive.py``) that run on the CPU. The
mapping tests run each mixer twice on the same input: the reference (our chunked form),
and the fast path with only the kernel call swapped for FLA's naive function on exactly
the arguments the kernel would get (layout, scale, log gates, state). Equal outputs and
gradients prove the mapping; the kernels themselves are proven only by
``tests/test_fast_path_gpu.py`` on a GPU.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from mlflow.tracking import MlflowClient
from text import flat

from harness.errors import ConfigError
from harness.nn import fast_path
from harness.report.collect import implementation_words

pytest.importorskip("fla")
pytest.importorskip("triton")
pytestmark = pytest.mark.filterwarnings("ignore:Triton is not supported", "ignore:.*Triton.*CPU")


#: FLA's arguments with a time axis (flattened into one row with ``cu_seqlens``)
TIMED = ("q", "k", "v", "g", "beta", "r", "w")


def naive(call: fast_path.Call) -> tuple[torch.Tensor, torch.Tensor | None]:
    """FLA's own pure-PyTorch recurrence for ``call``'s op, on ``call``'s arguments, in the
    op's layout: (B, T, H, V) out. FLA's naive functions take no ``cu_seqlens``: with them,
    each sequence the offsets mark is run on its own from a zero state, as FLA's varlen
    kernels define it, and the outputs concatenated (final states stacked, one per sequence)."""
    a = dict(call.args)
    cu = a.pop("cu_seqlens", None)
    a.pop("cu_seqlens_cpu", None)
    if cu is None:
        return naive_one(call.op, a)
    assert a["initial_state"] is None and cu[0] == 0 and cu[-1] == a[TIMED_OF[call.op]].shape[1]
    outs, finals = [], []
    for start, end in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        out, final = naive_one(call.op, {n: t[:, start:end] if n in TIMED else t for n, t in a.items()})
        outs.append(out)
        finals.append(final)
    return torch.cat(outs, dim=1), None if finals[0] is None else torch.cat(finals)


TIMED_OF = {"chunk_rwkv6": "r"} | dict.fromkeys(("chunk_gla", "chunk_simple_gla", "chunk_delta_rule",
                                                "fused_recurrent_delta_rule", "chunk_gated_delta_rule"), "q")


def naive_one(op: str, a: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One sequence (or a batch of equal ones). Where a naive function fixes its scale at
    Dk^-1/2 or is head-first, the adaptation is written here, in the open."""
    from fla.ops.delta_rule.naive import delta_rule_recurrence
    from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule
    from fla.ops.gla.naive import naive_recurrent_gla
    from fla.ops.rwkv6.recurrent_naive import naive_recurrent_rwkv6
    from fla.ops.simple_gla.naive import naive_recurrent_simple_gla

    state = {"initial_state": a["initial_state"], "output_final_state": a["output_final_state"]}
    dk = a["k"].shape[-1]
    fixed = a["scale"] * dk**0.5  # for functions that always scale q by Dk^-1/2

    def heads_first(t: torch.Tensor) -> torch.Tensor:
        return t.transpose(1, 2)

    if op == "chunk_gla":
        return naive_recurrent_gla(a["q"] * fixed, a["k"], a["v"], a["g"], **state)
    if op == "chunk_simple_gla":
        g = a.get("g")
        if g is None:  # a decay fixed per head (g_gamma (H,)), the same at every token
            g = a["g_gamma"].view(1, 1, -1).expand(a["q"].shape[:3])
        return naive_recurrent_simple_gla(a["q"], a["k"], a["v"], g, scale=a["scale"], **state)
    if op in ("chunk_delta_rule", "fused_recurrent_delta_rule"):
        o, h = delta_rule_recurrence(*(heads_first(t) for t in (a["q"] * fixed, a["k"], a["v"], a["beta"])),
                                     **state)
        return heads_first(o), h
    if op == "chunk_gated_delta_rule":
        return naive_recurrent_gated_delta_rule(q=a["q"], k=a["k"], v=a["v"], beta=a["beta"], g=a["g"],
                                                scale=a["scale"], **state)
    if op == "chunk_rwkv6":
        o, h = naive_recurrent_rwkv6(*(heads_first(a[n]) for n in ("r", "k", "v", "w")), a["u"],
                                     scale=a["scale"], **state)
        return heads_first(o), h
    raise AssertionError(f"no naive function for {op}")


def mixers() -> dict[str, Any]:
    from harness_plugins.mixers import deltanet, gated_deltanet, gla, mamba2, retnet, rwkv6

    d, h = 32, 2
    return {
        "gla": lambda: gla.GLA(gla.GLAConfig(chunk=8), d_model=d, num_heads=h),
        "retnet": lambda: retnet.RetNet(retnet.RetNetConfig(chunk=8), d_model=d, num_heads=h),
        "deltanet": lambda: deltanet.DeltaNet(deltanet.DeltaNetConfig(chunk=8), d_model=d, num_heads=h),
        "gated_deltanet": lambda: gated_deltanet.GatedDeltaNet(
            gated_deltanet.GatedDeltaNetConfig(chunk=8), d_model=d, num_heads=h),
        "rwkv6": lambda: rwkv6.RWKV6(rwkv6.RWKV6Config(chunk=8), d_model=d, num_heads=h),
        # two groups of heads sharing B and C: proves each head reads its group's
        "mamba2": lambda: mamba2.Mamba2(mamba2.Mamba2Config(headdim=16, d_state=8, ngroups=2, chunk_size=8),
                                        d_model=d, num_heads=h),
    }


@pytest.mark.parametrize("name", sorted(mixers()))
def test_the_fast_path_mapping_matches_the_reference_through_fla_naive_functions(name, monkeypatch):
    torch.manual_seed(0)
    mixer = mixers()[name]()
    with torch.no_grad():  # move the zero-initialised low-rank maps so every input matters
        for p in mixer.parameters():
            p.add_(0.05 * torch.randn_like(p))
    fast = copy.deepcopy(mixer)
    mixer.kernel = "reference"
    fast.kernel = "fla"
    x = torch.randn(2, 21, 32)  # not a multiple of any chunk
    x_ref, x_fast = x.clone().requires_grad_(), x.clone().requires_grad_()
    ref = mixer(x_ref)[0]

    calls: list[str] = []

    def run(call: fast_path.Call) -> tuple[torch.Tensor, torch.Tensor | None]:
        calls.append(call.op)
        return naive(call)

    monkeypatch.setattr(fast_path, "use_fla", lambda kernel, x, resets=None: kernel != "reference")
    monkeypatch.setattr(fast_path.Call, "run", run)
    out = fast(x_fast)[0]
    assert calls and all(f"fla.ops.{fast_path_package(op)}.{op}" in type(fast).fast_path_ops for op in calls)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)  # float32 recurrent vs chunked
    w = torch.randn_like(ref)
    (ref * w).sum().backward()
    (out * w).sum().backward()
    torch.testing.assert_close(x_fast.grad, x_ref.grad, rtol=1e-3, atol=1e-5)
    for (pname, p_ref), p_fast in zip(mixer.named_parameters(), fast.parameters(), strict=True):
        if p_ref.grad is not None:
            torch.testing.assert_close(p_fast.grad, p_ref.grad, rtol=1e-3, atol=1e-5, msg=pname)


def fast_path_package(op: str) -> str:
    return {"chunk_gla": "gla", "chunk_simple_gla": "simple_gla", "chunk_delta_rule": "delta_rule",
            "fused_recurrent_delta_rule": "delta_rule",
            "chunk_gated_delta_rule": "gated_delta_rule", "chunk_rwkv6": "rwkv6"}[op]


@pytest.mark.parametrize("name", ["deltanet", "gated_deltanet", "gla"])
def test_under_bf16_autocast_the_kernels_get_bf16_inputs_and_float32_gates(name, monkeypatch):
    """bf16-mixed: q, k, v, beta in bf16 (as FLA's own layers feed them), gates float32; the
    plain delta rule takes the chunked kernel, which refuses float32."""
    torch.manual_seed(0)
    mixer = mixers()[name]()
    mixer.kernel = "fla"
    calls: list[fast_path.Call] = []

    def run(call: fast_path.Call) -> tuple[torch.Tensor, torch.Tensor | None]:
        calls.append(call)
        return naive(call)

    monkeypatch.setattr(fast_path, "use_fla", lambda kernel, x, resets=None: kernel != "reference")
    monkeypatch.setattr(fast_path.Call, "run", run)
    x = torch.randn(2, 21, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = mixer(x)[0]
    (call,) = calls
    assert call.op != "fused_recurrent_delta_rule"
    assert {call.args[n].dtype for n in ("q", "k", "v")} == {torch.bfloat16}
    assert call.args.get("beta", call.args["q"]).dtype == torch.bfloat16
    if "g" in call.args:
        assert call.args["g"].dtype == torch.float32
    mixer.kernel = "reference"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = mixer(x)[0]
    torch.testing.assert_close(out.float(), ref.float(), rtol=0.05, atol=0.02)  # bf16 inputs


@pytest.mark.parametrize("name", sorted(mixers()))
def test_on_the_cpu_the_fast_path_is_never_taken_whatever_is_asked(name, monkeypatch):
    mixer = mixers()[name]()
    mixer.kernel = "fla"

    def refuse(call: fast_path.Call) -> Any:
        raise AssertionError("an FLA kernel was called on the CPU")

    monkeypatch.setattr(fast_path.Call, "run", refuse)
    x = torch.randn(1, 9, 32)
    assert not fast_path.use_fla("fla", x) and not fast_path.use_fla("auto", x)
    assert mixer(x)[0].shape == x.shape


def test_use_fla_refuses_float64_and_reference_even_on_cuda_tensors():
    cuda_like = torch.empty(0, device="meta")  # neither CPU nor CUDA: the device test decides
    assert not fast_path.use_fla("auto", cuda_like)
    x = torch.empty(1, 2, 3)
    for kernel in fast_path.KERNELS:
        assert not fast_path.use_fla(kernel, x)
        assert not fast_path.use_fla(kernel, x.double(), resets=torch.zeros(1, 2, dtype=torch.bool))


def test_resolve_names_the_implementation_a_run_records():
    from harness_plugins.mixers.gla import GLA
    from harness_plugins.mixers.mamba import Mamba

    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert fast_path.resolve("auto", None, cpu) == "pytorch"
    assert fast_path.resolve("auto", GLA, cpu) == "reference"
    assert fast_path.resolve("fla", GLA, cpu) == "reference"  # never on the CPU
    assert fast_path.resolve("reference", GLA, cuda) == "reference"
    assert fast_path.resolve("auto", Mamba, cuda) == "reference"  # no kernel here: mamba-1
    assert fast_path.resolve("auto", GLA, cuda) == ("fla" if fast_path.fla_importable() else "reference")

    # documents kept apart: the kernels take them as cu_seqlens
    assert fast_path.resolve("auto", GLA, cuda, resets=True) == fast_path.resolve("auto", GLA, cuda)


def test_select_sets_only_the_mixers_with_a_fast_path():
    from harness_plugins.mixers.s4d import S4D, S4DConfig

    gla = mixers()["gla"]()
    s4d = S4D(S4DConfig(), d_model=32, num_heads=2)
    model = torch.nn.ModuleList([gla, s4d])
    fast_path.select(model, "reference")
    assert gla.kernel == "reference" and "kernel" not in vars(s4d)
    with pytest.raises(ConfigError, match="train.kernels"):
        fast_path.select(model, "triton")


def test_the_cost_table_names_the_implementation():
    assert implementation_words(["fla"]) == "FLA kernel"
    assert implementation_words(["reference"]) == "reference implementation"
    assert implementation_words(["fla", "reference"]) == "FLA kernel + reference implementation"
    assert implementation_words([]) == "–"


RUN = {"task": {"name": "copy", "params": {"length": 6, "vocab": 8, "num_train": 64, "num_val": 16,
                                          "eval_lengths": []}},
       "model": {"name": "transformer", "params": {"d_model": 16, "layers": 1, "heads": 2},
                 "mixer": {"name": "gla", "params": {"chunk": 4}}, "position": {"name": "none"}},
       "train": {"max_steps": 2, "batch_size": 8, "val_every": 2, "accelerator": "cpu", "devices": 1,
                 "num_threads": 1, "progress": False, "log_attention": False, "save_model": False},
       "tracking": {"experiment": "fast-path"}}


def test_kernels_fla_on_the_cpu_exits_2_before_anything_is_built(capsys, harness_home):
    from harness.cli.main import main

    code = main(["train", "--task", "copy", "--model", "transformer", "--max-steps", "1",
                 "--no-progress", "--set", "model.mixer.name=gla", "--set", "train.accelerator=cpu",
                 "--set", "train.kernels=fla"])
    err = flat(capsys.readouterr().err)
    assert code == 2 and "needs a CUDA device" in err and "train.kernels" in err
    assert "Traceback" not in err


def test_the_run_tags_name_the_implementation_before_anything_is_built(registry):
    from harness.config import parse_run_config
    from harness.run.plan import plan
    from harness.run.record import provenance_tags

    assert provenance_tags(plan(parse_run_config(copy.deepcopy(RUN)), registry))["harness.kernel"] == "reference"
    attention = copy.deepcopy(RUN)
    del attention["model"]["mixer"]
    attention["model"]["attention"] = {"name": "multi_head"}
    assert provenance_tags(plan(parse_run_config(attention), registry))["harness.kernel"] == "pytorch"


@pytest.mark.slow
def test_a_run_records_which_implementation_ran(registry, harness_home):
    import harness
    from harness.store import tracking

    result = harness.train(copy.deepcopy(RUN), registry=registry)
    assert result.status == "FINISHED"
    tags = MlflowClient(tracking.tracking_uri()).get_run(result.run_id).data.tags
    assert tags["harness.kernel"] == "reference"  # the CPU: the reference, whatever is installed
