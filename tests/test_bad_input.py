"""Bad input ends in exit 2 with one paragraph naming the field, never a traceback nor a silent
acceptance: the probe's list (issue 15) as a table, then a property test (hypothesis) that
generates malformed values for every numeric field of the run config and study schemas, and
malformed ``--set`` overrides. ``HYPOTHESIS_PROFILE=fuzz`` (``nox -s fuzz``) runs thousands."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from text import flat, one_paragraph

from harness.cli.main import main
from harness.config import RunConfig, load_run_config
from harness.errors import ConfigError
from harness.study.schema import StudyConfig, parse_study_config

settings.register_profile("default", max_examples=300, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("fuzz", max_examples=5000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

BASE = ["train", "--task", "copy", "--model", "transformer", "--max-steps", "1", "--no-progress"]

#: (override, what the message must name): the probe's tracebacks and silent acceptances.
PROBE = [
    ("model.params.d_model=0", "d_model"),
    ("model.params.heads=0", "heads"),
    ("task.params.vocab=0", "vocab"),
    ("task.params.num_train=0", "num_train"),
    ("model.params.layers=-1", "layers"),
    ("model.params.ffn_mult=0", "ffn_mult"),
    ("train.lr=inf", "train.lr"),
    ("train.weight_decay=inf", "train.weight_decay"),
    ("model.position.name=rope", None),  # paired with base=inf below
    ("task.params.eval_lengths=[-1]", "eval_lengths"),
    ("task.params.eval_lengths=[2]", "eval_lengths"),  # shorter than the training length
    ("train.max_steps=1e30", "train.max_steps"),
    ("train.batch_size=true", "train.batch_size"),
    ("train.batch_size=1e9", "train.batch_size"),
    ("train.seed=-1", "train.seed"),
    ("train.lr=[1", "train.lr"),  # malformed YAML in --set
    ("train.lr={a: ", "train.lr"),
    ("train.lr=nan", "train.lr"),
    ("tracking.experiment=../../x", "tracking.experiment"),
]


@pytest.mark.parametrize(("override", "field"), [p for p in PROBE if p[1]])
def test_each_probe_input_exits_2_naming_the_field(override, field, capsys):
    assert main([*BASE, "--set", override]) == 2
    assert field in one_paragraph(capsys.readouterr().err)


def test_a_model_too_large_to_build_is_refused_naming_its_size(capsys):
    assert main([*BASE, "--set", "model.params.d_model=1073741824"]) == 1  # a memory refusal, not a config error
    err = flat(capsys.readouterr().err)
    assert "d_model=1073741824" in err and "Nothing was trained" in err and "Traceback" not in err
    # beyond any size (a parameter without an upper bound of its own): a config error
    assert main([*BASE, "--set", "model.params.d_model=1e12"]) == 2
    assert "model.params.d_model" in capsys.readouterr().err


def test_an_infinite_rope_base_is_refused(capsys):
    assert main([*BASE, "--set", "model.position.name=rope", "--set", "model.position.params.base=inf"]) == 2
    err = capsys.readouterr().err
    assert "base" in err and "Traceback" not in err


@pytest.mark.parametrize("content", [b"task: {name: copy}\ntask: {name: copy}\n",
                                     b"task: {name: c\xffopy}\n",
                                     b"train: {lr: 1e-3, lr: 2e-3}\ntask: {name: copy}\n"])
def test_duplicate_keys_and_non_utf8_files_exit_2(tmp_path, content, capsys):
    path = tmp_path / "run.yaml"
    path.write_bytes(content)
    assert main(["train", str(path), "--max-steps", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and str(path) in err
    err = err.replace(str(path), "")  # the test's folder is named after it
    assert ("twice" in err) != (b"\xff" in content) and ("UTF-8" in err) == (b"\xff" in content)


def test_a_non_utf8_study_file_exits_2(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_bytes(b"name: s\ndescription: \xff\xfe\n")
    assert main(["study", "create", str(path), "--storage", f"sqlite:///{tmp_path / 'o.db'}"]) == 2
    err = capsys.readouterr().err
    assert "UTF-8" in err and "Traceback" not in err


# -- property tests ------------------------------------------------------------------------------

def _numeric_fields(model: type[BaseModel], prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted path, field info) of every int/float field reachable through nested models."""
    import typing

    out = []
    for name, info in model.model_fields.items():
        ann = info.annotation
        if typing.get_origin(ann) is list:  # items are not reachable by a dotted path
            continue
        args = [a for a in typing.get_args(ann) if a is not type(None)] or [ann]
        for arg in args:
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                out += _numeric_fields(arg, f"{prefix}{name}.")
            elif arg in (int, float):
                out.append((f"{prefix}{name}", info))
    return out


RUN_FIELDS = _numeric_fields(RunConfig)
STUDY_FIELDS = [f for f in _numeric_fields(StudyConfig) if not f[0].startswith("search")]
BAD = st.one_of(
    st.sampled_from([math.inf, -math.inf, math.nan, True, False, "3", [], {}, None, 10**40, -10**40,
                     -1, 0, 1e300, -1e-300]),
    st.floats(allow_nan=True, allow_infinity=True), st.integers(), st.text(max_size=5),
)


def _bounds_hold(info: Any, value: Any) -> bool:
    """Whether ``value`` satisfies the field's declared type and range (the oracle)."""
    import typing

    ann = [a for a in typing.get_args(info.annotation) if a is not type(None)] or [info.annotation]
    if value is None:
        return type(None) in typing.get_args(info.annotation)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if isinstance(value, float) and (int in ann and float not in ann or not math.isfinite(value)):
        return False
    for m in info.metadata:
        for op, cmp in (("ge", lambda a, b: a >= b), ("gt", lambda a, b: a > b),
                        ("le", lambda a, b: a <= b), ("lt", lambda a, b: a < b)):
            bound = getattr(m, op, None)
            if bound is not None and not cmp(value, bound):
                return False
    return True


@given(field=st.sampled_from(RUN_FIELDS), value=BAD)
def test_run_config_numbers_are_refused_naming_the_field_or_accepted_in_range(field, value):
    path, info = field
    data: dict[str, Any] = {"task": {"name": "copy"}, "model": {"name": "transformer"}}
    if path.startswith("model.mup."):  # μP's multipliers exist only under μP
        data["model"]["parametrization"] = "mup"
    node = data
    *parents, leaf = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    try:
        load_run_config(overrides=[f"{k}={yaml.safe_dump(v, default_flow_style=True).strip().removesuffix('...').strip()}"
                                   for k, v in _flat(data).items()])
    except ConfigError as exc:
        assert path in str(exc) and "\n" not in str(exc).strip()
        return
    assert _bounds_hold(info, value), f"{path}={value!r} was accepted"


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in data.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


STUDY = {"task": {"name": "copy"}, "objective": {"metric": "acc"},
         "candidates": [{"name": "a", "model": {"name": "transformer"}}],
         "budget": {"trials": 1, "steps": 10}}


@given(field=st.sampled_from(STUDY_FIELDS), value=BAD)
def test_study_numbers_are_refused_naming_the_field_or_accepted_in_range(field, value):
    import copy

    path, info = field
    data = copy.deepcopy(STUDY)
    if path.startswith("scaling."):  # a scaling section needs its grid; its cells set the length
        data["scaling"] = {"sizes": [{"d_model": 16}, {"d_model": 32}, {"d_model": 64}],
                           "budgets": [1e9, 1e10, 1e11]}
        data["budget"] = {"trials": 1}
        data["objective"] = {"metric": "loss"}
    if path.startswith("reference."):  # a reference block needs its required fields
        data["reference"] = {"source": "paper", "metric": "acc", "rows": [{"model": "m"}]}
    node: dict[str, Any] = data
    *parents, leaf = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    try:
        parse_study_config(data, "s.yaml")
    except ConfigError as exc:
        # the field named, or (a section this test does not fill in, e.g. reference) the
        # section's own required fields
        section = path.rsplit(".", 1)[0]
        assert leaf in str(exc) or (f"{section}." in str(exc) and "required field is missing" in str(exc))
        return
    assert _bounds_hold(info, value), f"{path}={value!r} was accepted"


@given(key=st.text(min_size=0, max_size=12), raw=st.text(max_size=12))
def test_any_set_override_is_a_clean_error_or_applied(key, raw):
    try:
        load_run_config(overrides=["task.name=copy", "model.name=transformer", f"{key}={raw}"])
    except ConfigError as exc:
        assert str(exc).strip()


def test_the_property_tests_cover_the_fields_of_the_issue():
    names = {p for p, _ in RUN_FIELDS}
    assert {"train.lr", "train.weight_decay", "train.max_steps", "train.batch_size", "train.seed",
            "train.warmup_steps", "train.val_every"} <= names
    assert {"budget.trials", "budget.steps", "confirm.seeds"} <= {p for p, _ in STUDY_FIELDS}



# -- accepted values train ------------------------------------------------------------------------

def _in_range(info: Any) -> st.SearchStrategy[Any]:
    """Values the field accepts: its bounds (or just inside an open one) and values between,
    log-uniform where the range spans decades."""
    import typing

    ann = [a for a in typing.get_args(info.annotation) if a is not type(None)] or [info.annotation]
    lo = hi = None
    lo_open = hi_open = False
    for m in info.metadata:
        if getattr(m, "ge", None) is not None:
            lo = m.ge
        if getattr(m, "gt", None) is not None:
            lo, lo_open = m.gt, True
        if getattr(m, "le", None) is not None:
            hi = m.le
        if getattr(m, "lt", None) is not None:
            hi, hi_open = m.lt, True
    assert lo is not None and hi is not None, info
    if int in ann:
        lo, hi = lo + lo_open, hi - hi_open
        edges = [lo, hi, lo + 1, max(lo, min(hi, 64))]
        return st.one_of(st.sampled_from(edges), st.integers(lo, hi))
    tiny = 1e-12
    lo_v, hi_v = (lo + tiny if lo_open else lo), (hi * (1 - tiny) if hi_open else hi)
    inner = st.floats(lo_v, hi_v, allow_nan=False, allow_infinity=False)
    if lo_v > 0 and hi_v / lo_v > 1e3:
        inner = st.floats(math.log10(lo_v), math.log10(hi_v)).map(lambda e: min(hi_v, max(lo_v, 10.0 ** e)))
    return st.one_of(st.sampled_from([lo_v, hi_v]), inner)


#: a run that trains one step in about a second, whatever else is drawn
ONE_STEP = {"task": {"name": "copy", "params": {"length": 4, "vocab": 4, "num_train": 64, "num_val": 16}},
            "model": {"name": "transformer", "params": {"d_model": 16, "layers": 1, "heads": 2},
                      "attention": {"name": "multi_head"}, "position": {"name": "sinusoidal"}},
            "train": {"max_steps": 1, "val_every": 1, "batch_size": 8, "num_threads": 1,
                      "max_time_s": 3, "log_attention": False, "progress": False}}


@settings(max_examples=int(os.environ.get("HARNESS_TRAIN_EXAMPLES", "8")))
@given(drawn=st.lists(st.sampled_from(RUN_FIELDS), min_size=1, max_size=3, unique_by=lambda f: f[0])
       .flatmap(lambda fields: st.tuples(*[st.tuples(st.just(p), _in_range(i)) for p, i in fields])))
def test_accepted_run_config_values_train_or_fail_with_a_clear_error(drawn):
    """Values the schema accepts (its bounds included) either train a step or end in the
    harness's own error (one paragraph naming the cause): never another exception."""
    import copy

    import harness
    from harness.errors import HarnessError

    cfg = copy.deepcopy(ONE_STEP)
    for path, value in drawn:
        *parents, leaf = path.split(".")
        node = cfg
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    if {"train.max_flops", "train.max_tokens", "train.max_steps"} & {p for p, _ in drawn}:
        # a drawn budget can mean millions of steps, which a drawn max_time_s of a year would
        # let run: the wall clock stays the test's (the budget's value is still accepted)
        wall = cfg["train"].get("max_time_s")
        cfg["train"]["max_time_s"] = 3 if wall is None else min(wall, 3)
    try:
        result = harness.train(cfg)
    except HarnessError as exc:
        text = str(exc).strip()
        assert text and "Traceback" not in text, (drawn, text)
        return
    assert result.status in ("FINISHED", "FAILED"), (drawn, result.status)
    if result.status == "FINISHED":
        assert math.isfinite(result.metrics["val/loss"]), (drawn, result.metrics)


# -- issue 25: the classes the second probe found ---------------------------------------------------
# Each property below would have found one class of the probe's defects: plugin parameters
# accepted beyond any size or outside their declared choices, a damaged store opened (and so
# replaced), a password with URL-special characters shown, an echoed value without bound.

def _plugin_params() -> list[tuple[str, str, type, Any]]:
    """(kind, component, config class, Param) of every declared parameter of every plugin."""
    import harness
    from harness.params import declared_params
    from harness.registry.specs import KINDS

    registry = harness.load_plugins()
    out = []
    for kind in KINDS:
        for name in registry.names(kind):
            spec = registry.get(kind, name)
            out += [(kind, name, spec.config, p) for p in declared_params(spec.config)]
    return out


PLUGIN_PARAMS = _plugin_params()
HUGE_OR_ODD = st.one_of(
    st.sampled_from([1e30, -1e30, 10**12, 2**31, 10**40, 1e13, "bogus", "", "PRE", None, [], {}]),
    st.floats(allow_nan=False, allow_infinity=False), st.integers(), st.text(max_size=8),
)


@given(param=st.sampled_from(PLUGIN_PARAMS), value=HUGE_OR_ODD)
def test_every_plugin_parameter_refuses_what_cannot_be_meant(param, value):
    """A value is refused naming the field, or it is one the code can mean: within the bounds,
    no larger than any size (:data:`harness.params.MAX_INT`/``MAX_FLOAT`` where no upper bound
    is declared) and, for a choice of strings or booleans, one of the choices."""
    from harness.params import MAX_FLOAT, MAX_INT, Choice, enumerated, resolve

    kind, name, config, p = param
    where = f"{kind}.{name}.params"
    try:
        resolved = resolve(config, {p.name: value}, where)
    except ConfigError as exc:
        assert p.name in str(exc) or where in str(exc)
        assert len(str(exc)) < 2000 and "\n" not in str(exc).strip()
        return
    got = getattr(resolved, p.name)
    if p.numeric and isinstance(got, int | float) and not isinstance(got, bool):
        assert math.isfinite(got)
        if not any(getattr(b, "le", None) is not None or getattr(b, "lt", None) is not None for b in p.bounds):
            assert abs(got) <= (MAX_INT if isinstance(got, int) else MAX_FLOAT), (name, p.name, got)
    if enumerated(p):
        assert isinstance(p.range, Choice) and got in p.range.options, (name, p.name, got)


@pytest.fixture(scope="module")
def store_file(tmp_path_factory) -> Path:
    """A real MLflow SQLite store with a few runs, params and metrics (no training)."""
    from harness.store.tracking import Tracker

    path = tmp_path_factory.mktemp("fuzz-store") / "mlflow.db"
    tracker = Tracker(f"sqlite:///{path}")
    for i in range(3):
        run = tracker.start_run("e", run_name=f"r{i}")
        tracker.log_params(run, {"a": i, "b": "x" * 200})
        tracker.log_metrics(run, {"m": float(i)})
        tracker.end_run(run, "FINISHED")
    return path


@settings(max_examples=int(os.environ.get("HARNESS_STORE_EXAMPLES", "25")),
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(cut=st.floats(0.0, 0.999), spot=st.floats(0.0, 0.999), length=st.integers(1, 8192),
       how=st.sampled_from(["truncate", "overwrite", "zero", "both"]))
def test_a_damaged_store_is_refused_or_still_whole(store_file, tmp_path, cut, spot, length, how):
    """Damage anywhere, of any size: the guard refuses the file, or SQLite finds it whole and
    every run is still there (a damaged store is never opened, so never replaced)."""
    import sqlite3

    from harness.store.guard import StoreError, check_sqlite

    data = bytearray(store_file.read_bytes())
    if how in ("overwrite", "zero", "both"):
        at = int(spot * len(data))
        data[at: at + length] = (b"\x00" if how == "zero" else b"\xa5") * len(data[at: at + length])
    if how in ("truncate", "both"):
        data = data[: int(cut * len(data))]
    path = tmp_path / f"m-{how}-{cut}-{spot}-{length}.db"
    path.write_bytes(bytes(data))
    try:
        check_sqlite(path, "mlflow")
    except StoreError as exc:
        assert str(path) in str(exc) and "\n" not in str(exc)
        return
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 3


PASSWORD = st.text(alphabet=st.sampled_from(list("abcXYZ019/:?#%&=+;,!$'()*[]~-._@")), min_size=3, max_size=16)


@given(password=PASSWORD, scheme=st.sampled_from(["postgresql+psycopg", "mysql", "https", "postgresql"]))
def test_no_password_survives_masking(password, scheme):
    """Any password a URL can carry (raw '/', '?', '#', ':' and '@' included) is masked in the
    URL alone and inside a sentence, and the host and database stay readable."""
    from harness.store.masking import mask_text

    url = f"{scheme}://user:{password}@db.example:5432/name"
    shown = f"{scheme}://user:***@db.example:5432/name"
    for text in ("{}", "cannot open {} (refused)", "`--storage {}`"):
        assert mask_text(text.format(url)) == text.format(shown), (password, mask_text(text.format(url)))


@given(size=st.integers(1_000, 60_000), field=st.sampled_from(
    ["task.params.eval_lengths", "model.params.pattern", "train.lr", "task.params", "tracking.tags"]))
def test_an_echoed_value_is_bounded(registry, size, field):
    """However large the value, the error that echoes it stays short."""
    value: Any = list(range(size)) if field != "task.params" else {f"k{i}": i for i in range(size)}
    data: dict[str, Any] = {"task": {"name": "copy"}, "model": {"name": "transformer"}}
    node = data
    *parents, leaf = field.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    from harness.config import parse_run_config
    from harness.errors import HarnessError
    from harness.run.plan import plan

    try:
        plan(parse_run_config(data), registry)
    except HarnessError as exc:
        assert len(str(exc)) < 2000, (field, len(str(exc)))
