"""The kernel gate (harness.nn.kernel_gate) on the CPU: FLA's kernels do not run here, so a
"kernel" is planted in their place (FLA's own naive recurrence on the kernel's arguments:
right; the same, skewed or raising: wrong) and the gate is made to believe the fast path
would run. A wrong kernel falls back to the reference, tagged with the reason; a right one
passes; verdicts are cached by what they depend on."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pytest
import torch
from mlflow.tracking import MlflowClient

from harness.errors import ConfigError
from harness.keys import Tag
from harness.nn import fast_path, kernel_gate

pytest.importorskip("fla")
pytest.importorskip("triton")
pytestmark = pytest.mark.filterwarnings("ignore:Triton is not supported", "ignore:.*Triton.*CPU")

from test_fast_path import RUN, mixers, naive  # noqa: E402  (after the importorskip)

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(kernel_gate, "_memo", {})
    return tmp_path / "cache" / "kernel_gate"


def plant(monkeypatch, kernel) -> list[fast_path.Call]:
    calls: list[fast_path.Call] = []

    def run(call: fast_path.Call):
        calls.append(call)
        return kernel(call)

    monkeypatch.setattr(fast_path, "use_fla", lambda kernel, x, resets=None: kernel != "reference")
    monkeypatch.setattr(fast_path.Call, "run", run)
    return calls


def skewed(call: fast_path.Call):
    """A wrong kernel: the right recurrence, reading each token's value one position late
    (an off-by-one in its time indexing). (A kernel wrong by a constant factor would not do:
    the mixers' output norms undo it, for the run as for the gate.)"""
    shifted = fast_path.Call(call.package, call.op, {**call.args, "v": call.args["v"].roll(1, dims=1)})
    return naive(shifted)


def refusing(call: fast_path.Call):
    raise RuntimeError("Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect results for "
                       "gated chunk_bwd_dqkwg (see #640).\nsecond line")


@pytest.mark.parametrize("name", ["gla", "deltanet", "mamba2"])
def test_a_right_kernel_passes_and_a_wrong_one_fails_saying_by_how_much(name, monkeypatch):
    mixer = mixers()[name]()
    plant(monkeypatch, naive)
    right = kernel_gate.probe(mixer, torch.float32, CPU)
    assert right.passed, right.reason
    plant(monkeypatch, skewed)
    wrong = kernel_gate.probe(mixer, torch.float32, CPU)
    assert not wrong.passed
    error = float(wrong.reason.split("float32 output ")[1].split()[0])
    assert error > 5e-3 and "(tolerance 5e-03), gradients" in wrong.reason


def test_an_exception_fails_the_gate_with_its_first_line(monkeypatch):
    plant(monkeypatch, refusing)
    verdict = kernel_gate.probe(mixers()["gated_deltanet"](), torch.bfloat16, CPU)
    assert not verdict.passed and verdict.reason.startswith("RuntimeError: Triton >= 3.4.0")
    assert "#640" in verdict.reason and "second line" not in verdict.reason


def test_the_gate_leaves_the_runs_random_streams_untouched(monkeypatch):
    plant(monkeypatch, naive)
    mixer = mixers()["gla"]()
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    kernel_gate.probe(mixer, torch.float32, CPU)
    assert torch.equal(torch.rand(3), expected)


def test_verdicts_are_cached_by_mixer_shapes_dtype_device_and_versions(monkeypatch, fresh_cache):
    calls = plant(monkeypatch, skewed)
    mixer = mixers()["gla"]()
    first = kernel_gate.check(mixer, torch.float32, CPU)
    assert not first.passed and not first.cached and calls
    (saved,) = fresh_cache.glob("*.json")
    record = json.loads(saved.read_text())
    assert record["key"]["triton"] and record["key"]["fla"] and record["key"]["dtype"] == "float32"
    assert record["passed"] is False
    calls.clear()
    monkeypatch.setattr(kernel_gate, "_memo", {})  # a new process: the file answers
    again = kernel_gate.check(copy.deepcopy(mixer), torch.float32, CPU)
    assert again.cached and again.reason == first.reason and not calls
    kernel_gate.check(mixer, torch.bfloat16, CPU)  # another dtype: checked anew
    assert calls and len(list(fresh_cache.glob("*.json"))) == 2
    monkeypatch.setattr(kernel_gate, "_version", lambda name: "9.9" if name == "triton" else "x")
    calls.clear()
    kernel_gate.check(mixer, torch.float32, CPU)  # another triton: checked anew
    assert calls


def test_gate_sets_only_the_failing_mixers_to_the_reference(monkeypatch, fresh_cache):
    plant(monkeypatch, skewed)
    model = torch.nn.ModuleList([mixers()["gla"](), mixers()["gla"](), mixers()["retnet"]()])
    for m in model:
        m.kernel = "auto"
    verdicts = kernel_gate.gate(model, torch.float32, CPU)
    assert set(verdicts) == {"GLA", "RetNet"} and not any(v.passed for v in verdicts.values())
    assert [m.kernel for m in model] == ["reference"] * 3
    plant(monkeypatch, naive)  # another kernel for the same key: forget the verdicts first
    monkeypatch.setattr(kernel_gate, "_memo", {})
    for saved in fresh_cache.glob("*.json"):
        saved.unlink()
    fine = torch.nn.ModuleList([mixers()["gla"]()])
    assert kernel_gate.gate(fine, torch.float32, CPU)["GLA"].passed and fine[0].kernel == "auto"


def test_kernels_fla_is_refused_when_its_kernel_fails(monkeypatch):
    from harness.run.build import gate_kernels

    plant(monkeypatch, refusing)
    model = torch.nn.ModuleList([mixers()["gla"]()])
    model[0].kernel = "fla"
    train = SimpleNamespace(precision="bf16-mixed", kernels="fla")
    built = SimpleNamespace(model=model, kernel_tags={}, kernel_warning=None)
    with pytest.raises(ConfigError, match="train.kernels is 'fla', but the FLA kernel failed.*#640"):
        gate_kernels(SimpleNamespace(config=SimpleNamespace(train=train)), built, CPU)


def train_with(monkeypatch, kernel, registry) -> tuple[object, dict[str, str]]:
    import harness
    from harness.store import tracking

    plant(monkeypatch, kernel)
    result = harness.train(copy.deepcopy(RUN), registry=registry)
    assert result.status == "FINISHED"
    return result, MlflowClient(tracking.tracking_uri()).get_run(result.run_id).data.tags


def test_a_run_whose_kernel_fails_trains_on_the_reference_tagged_and_warned(monkeypatch, registry,
                                                                            harness_home, capsys):
    _, tags = train_with(monkeypatch, skewed, registry)
    err = " ".join(capsys.readouterr().err.split())
    assert err.count("warning: the FLA kernel failed its check against the reference") == 1
    assert "this run trains on the reference implementation" in err
    assert tags[Tag.KERNEL] == "reference"
    assert tags[Tag.KERNEL_GATE].startswith("GLA failed: float32 output")
    assert "FLA kernel failed" in tags[Tag.WARNINGS]


def test_a_run_whose_kernel_passes_says_so_in_its_tag(monkeypatch, registry, harness_home, capsys):
    _, tags = train_with(monkeypatch, naive, registry)
    assert tags[Tag.KERNEL_GATE].startswith("GLA passed: float32 output")
    assert "warning: the FLA kernel" not in capsys.readouterr().err


def test_a_run_resumed_where_the_gate_decides_otherwise_is_the_same_run():
    """A run that fell back on one device may continue on another whose kernel passes (or the
    CPU): the implementation is not what the run is, so resuming compares it no more than the
    torch version."""
    from harness.run.resume import component_differences

    recorded = {Tag.KERNEL: "reference", Tag.KERNEL_GATE: "GLA failed: ...", "harness.mixer": "gla"}
    assert component_differences(recorded, {Tag.KERNEL: "fla", "harness.mixer": "gla"}) == []
    assert component_differences(recorded, {"harness.mixer": "retnet"}) == ["harness.mixer was gla, now retnet"]
