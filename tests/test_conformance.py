"""The conformance kit (harness.testing) over every installed plugin, the reference's
examples, and deliberately broken plugins that must fail the named check.

Every registered component gets a test class (``Test_<kind>_<name>``) with one test per
check, so a plugin added later (built-in or third-party) is covered without editing this
file. ``PENDING`` lists checks a built-in fails today, with the reason, as strict xfails: a
fix makes the xfail pass, which fails the suite until its entry is removed.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import pytest
import torch
from text import flat

from harness import testing
from harness.errors import HarnessError
from harness.plugin import (
    Attention,
    AttentionConfig,
    AttentionSpec,
    Complexity,
    FloatRange,
    Gt,
    Lt,
    Mixer,
    MixerSpec,
    Task,
    TaskConfig,
    TaskSpec,
    Vocab,
)
from harness.registry.specs import KINDS
from harness.testing.core import EXEMPT, FAIL, PASS, run_checks

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "docs" / "examples").glob("*.py"))

#: hyper-parameters that exercise a built-in beyond its defaults
PARAMS: dict[tuple[str, str], dict[str, Any]] = {
    ("attention", "sliding_window"): {"window": 4, "block": 4},  # the window is shorter than the inputs
}

#: (kind, name, check) -> why a built-in fails it today
PENDING: dict[tuple[str, str, str], str] = {}


def _pending(test: Any, reason: str) -> Any:
    def pending(self: Any) -> None:
        test(self)

    pending.__name__ = test.__name__
    return pytest.mark.xfail(reason=reason, strict=True)(pending)


def _builtin_classes() -> dict[str, type]:
    classes = testing.test_classes(params=PARAMS)
    for (kind, name, check), reason in PENDING.items():
        cls = classes.get(f"Test_{kind}_{name}")
        if cls is not None:
            setattr(cls, f"test_{check}", _pending(getattr(cls, f"test_{check}"), reason))
    return classes


globals().update(_builtin_classes())


def test_every_kind_has_a_check_class():
    assert set(testing.CHECKS) == set(KINDS)


# -- the reference's examples pass the kit ----------------------------------------------------
def example_classes() -> dict[str, type]:
    from harness.registry.loader import import_file

    out = {}
    for path in EXAMPLES:
        module = import_file(path)
        registered: list[Any] = []
        for kind in KINDS:
            hook = getattr(module, f"harness_register_{kind}", None)
            if hook is not None:
                hook(registered.append)
        for spec in registered:
            name = f"TestExample_{spec.kind}_{spec.name}"
            out[name] = type(name, (testing.CHECKS[spec.kind],), {"spec": spec})
    return out


_examples = example_classes()
globals().update(_examples)


def test_each_kind_has_an_example_in_the_reference():
    assert {cls.kind for cls in _examples.values()} == set(KINDS)


def test_the_reference_shows_exactly_the_example_files():
    text = (ROOT / "docs" / "plugins.md").read_text()
    blocks = re.findall(r"<!-- example: (docs/examples/[\w.]+) -->\n```python\n(.*?)```\n", text, re.S)
    assert sorted(path for path, _ in blocks) == sorted(str(p.relative_to(ROOT)) for p in EXAMPLES)
    for path, code in blocks:
        assert code == (ROOT / path).read_text(), f"docs/plugins.md shows another version of {path}"


def test_the_reference_names_every_check():
    text = (ROOT / "docs" / "plugins.md").read_text()
    missing = {c for cls in testing.CHECKS.values() for c in cls.all_checks() if f"`{c}`" not in text}
    assert not missing


# -- broken plugins fail the named check -------------------------------------------------------
class LeakyAttention(Attention):
    """Claims to be causal but attends to every key."""

    def __init__(self, config: AttentionConfig, *, d_model: int, num_heads: int) -> None:
        super().__init__(d_model, num_heads, dropout=config.dropout, bias=config.bias)

    def score(self, q, k):
        return q @ k.transpose(-2, -1)

    def attend(self, q, k, v, *, causal, **kwargs):
        return super().attend(q, k, v, causal=False, **kwargs)


class RunningMean(Mixer):
    """Causal running mean of a projection (a correct mixer; the broken ones derive from it)."""

    complexity = Complexity(time="L", memory="L", decode="1", state="1")

    def __init__(self, config: Any, *, d_model: int, num_heads: int) -> None:
        super().__init__(d_model, num_heads)
        self.proj = torch.nn.Linear(d_model, d_model)

    def mix(self, x, *, causal, key_padding_mask, position):
        u = self.proj(x)
        return u.cumsum(1) / torch.arange(1, x.shape[1] + 1, dtype=x.dtype)[:, None]

    def step(self, x, state, *, positions, position):
        u = self.proj(x)
        total = state.get("sum", torch.zeros_like(u[:, 0]))[:, None] + u.cumsum(1)
        state["sum"] = total[:, -1]
        return total / (positions + 1).to(x.dtype)[:, None]

    def state_size(self, length):
        return self.d_model


class ForgetfulMean(RunningMean):
    """Its cached form forgets everything before the current chunk."""

    def step(self, x, state, *, positions, position):
        return self.mix(x, causal=True, key_padding_mask=None, position=None)


class MiscountedMean(RunningMean):
    """Declares a state that grows with the length; the cache keeps one vector."""

    def state_size(self, length):
        return self.d_model * length


class OutOfVocabulary(Task):
    """Emits the id one past the vocabulary's end."""

    task_kind = "lm"

    def __init__(self, config: TaskConfig, *, seed: int) -> None:
        super().__init__(config, seed=seed, vocab=Vocab(("a", "b")))

    def generate(self, split, length):
        first = self.vocab.first_symbol
        return [{"tokens": [first + (i + j) % 3 for j in range(length + 1)]} for i in range(self.split_size(split))]


def broken(kind: str, spec: Any) -> type:
    return type(f"Broken_{spec.name}", (testing.CHECKS[kind],), {"spec": spec})


@pytest.mark.parametrize(("kind", "spec", "check", "message"), [
    ("attention", AttentionSpec(name="leaky", build=LeakyAttention), "causality", "reads the future"),
    ("task", TaskSpec(name="oov", build=OutOfVocabulary), "vocabulary", "outside 1 .. 5"),
    ("mixer", MixerSpec(name="forgetful", build=ForgetfulMean), "cache_equals_full_pass",
     "differs from the full pass"),
    ("mixer", MixerSpec(name="miscounted", build=MiscountedMean), "state_size",
     "keeps 16 elements per sequence but state_size(5) = 80"),
    ("mixer", MixerSpec(name="typo", build=RunningMean, exempt={"causalty": "a typo"}), "exemptions",
     "unknown check 'causalty' (did you mean 'causality'?)"),
], ids=["non-causal attention", "out-of-vocabulary task", "diverging cache", "wrong state size",
        "unknown exemption"])
def test_a_broken_plugin_fails_the_named_check(kind, spec, check, message):
    outcomes = {o.check: o for o in run_checks(broken(kind, spec))}
    assert outcomes[check].status == FAIL and message in outcomes[check].detail, outcomes[check]
    cls = broken(kind, spec)
    with pytest.raises(AssertionError, match=re.escape(message)):
        getattr(cls(), f"test_{check}")()


def test_a_correct_mixer_passes_and_its_broken_variants_fail_only_their_check():
    spec = MixerSpec(name="mean", build=RunningMean)
    assert {o.status for o in run_checks(broken("mixer", spec))} <= {PASS, "n/a"}
    outcomes = {o.check: o.status for o in run_checks(broken("mixer", MixerSpec(name="m", build=MiscountedMean)))}
    assert [c for c, s in outcomes.items() if s == FAIL] == ["state_size"]


def test_an_exempt_check_is_skipped_with_its_reason_never_silently():
    spec = MixerSpec(name="quiet", build=ForgetfulMean,
                     exempt={"cache_equals_full_pass": "decodes with full passes only"})
    cls = broken("mixer", spec)
    outcomes = {o.check: o for o in run_checks(cls)}
    assert outcomes["cache_equals_full_pass"].status == EXEMPT
    assert outcomes["cache_equals_full_pass"].detail == "decodes with full passes only"
    with pytest.raises(pytest.skip.Exception, match="exempt: decodes with full passes only"):
        cls().test_cache_equals_full_pass()
    with pytest.raises(pytest.skip.Exception, match="not applicable: causal only"):
        cls().test_padding()


def test_a_class_that_names_no_component_says_how_to_fix_it():
    class TestNothing(testing.AttentionChecks):
        pass

    with pytest.raises(HarnessError, match='set `plugin = "<registered name>"`'):
        TestNothing().test_causality()


def test_a_check_class_is_used_in_two_lines_with_params():
    class TestWindow(testing.AttentionChecks):
        plugin, params = "sliding_window", {"window": 3}

    TestWindow().test_causality()
    assert TestWindow().config().window == 3


@dataclass
class TemperedConfig(AttentionConfig):
    temperature: Annotated[float, FloatRange(0.5, 2.0)] = 1.0  # no bounds
    gain: Annotated[float, Gt(0), Lt(10), FloatRange(0.5, 2.0)] = 1.0


class Tempered(LeakyAttention):
    def __init__(self, config: TemperedConfig, *, d_model: int, num_heads: int) -> None:
        super().__init__(config, d_model=d_model, num_heads=num_heads)


def test_a_numeric_hyper_parameter_without_bounds_is_named():
    outcome = {o.check: o for o in run_checks(broken("attention", AttentionSpec(name="t", build=Tempered)))}
    assert outcome["bounds"].status == FAIL and "temperature (float)" in outcome["bounds"].detail
    assert "gain" not in outcome["bounds"].detail


# -- harness check ------------------------------------------------------------------------------
LEAKY_FILE = (
    "from harness.plugin import Attention, AttentionConfig, AttentionSpec, hookimpl\n\n\n"
    + inspect.getsource(LeakyAttention)
    + "\n\n@hookimpl\ndef harness_register_attention(register):\n"
    "    register(AttentionSpec(name='leaky', build=LeakyAttention, exempt={'row_stochastic': 'not really'}))\n"
)


def test_check_prints_a_table_per_component_and_exits_1_on_a_failure(tmp_path, capsys):
    from harness.cli.main import main

    plugin = tmp_path / "leaky.py"
    plugin.write_text(LEAKY_FILE)
    assert main(["check", "--plugin", str(plugin)]) == 1
    out = capsys.readouterr().out
    rows = {line.split()[1]: line.split()[0] for line in out.splitlines() if line.startswith("  ") and
            not line.startswith("  ->")}
    assert rows["causality"] == "FAIL" and rows["shapes"] == "ok" and rows["row_stochastic"] == "exempt"
    assert "exempt row_stochastic" in flat(out) and "not really" in out
    assert "reads the future" in out and "FAILED: attention leaky" in out
    assert main(["check", "--plugin", str(plugin), "--check", "shapes", "--check", "padding"]) == 0
    out = capsys.readouterr().out
    assert "2 checks: all checks pass" in out


def test_check_by_name_kind_and_all(capsys):
    from harness.cli.main import main

    assert main(["check", "parity_nope"]) == 2
    assert main(["check", "multi_head", "--check", "causalty"]) == 2
    assert "Did you mean 'causality'" in flat(capsys.readouterr().err)
    assert main(["check", "--all", "--kind", "task", "--check", "vocabulary"]) == 0
    out = capsys.readouterr().out
    assert out.count("\ntask ") + out.startswith("task ") == len(testing.core.base_registry().names("task"))
    assert main(["check", "sliding_window", "--set", "window=3", "--check", "causality"]) == 0
    assert main(["check", "sliding_window", "--set", "windw=3"]) == 2
    assert "did you mean 'window'" in flat(capsys.readouterr().err)


def test_a_reference_that_disagrees_fails_the_reference_check():
    import dataclasses

    cosine = _examples["TestExample_attention_cosine"].spec
    wrong = cosine.reference

    def transposed_causality(layer, x, *, causal):
        return wrong(layer, x, causal=not causal)

    spec = dataclasses.replace(cosine, reference=transposed_causality)
    outcome = {o.check: o for o in run_checks(broken("attention", spec))}["reference"]
    assert outcome.status == FAIL and "differs from its float64 reference" in outcome.detail

    parity = _examples["TestExample_task_parity"].spec
    spec = dataclasses.replace(parity, reference=lambda task, e: not parity.reference(task, e))
    outcome = {o.check: o for o in run_checks(broken("task", spec))}["reference"]
    assert outcome.status == FAIL and "is wrong according to the reference" in outcome.detail
