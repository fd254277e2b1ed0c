"""Property tests (hypothesis) of the third probe's surfaces (issue 33): whatever bytes a
source file, an exported folder or a checkpoint folder holds, and whatever budget a config
names, the harness answers with its own error (a ``HarnessError``) or does the right thing,
never a raw exception or a hang. A few dozen examples each in ``pytest``; thousands with
``HYPOTHESIS_PROFILE=fuzz`` (``nox -s fuzz``)."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import json
import lzma
import os
import pickle
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from harness.errors import ConfigError, HarnessError

FUZZ = os.environ.get("HYPOTHESIS_PROFILE") == "fuzz"
SOME = settings(max_examples=2000 if FUZZ else 40, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
FEW = settings(max_examples=500 if FUZZ else 15, deadline=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

GOOD = b'{"text": "alpha beta"}\n{"text": "gamma delta epsilon"}\n' * 8
COMPRESS = {"": lambda b: b, ".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress}


def _mutate(data: bytes, cut: int, flips: list[tuple[int, int]]) -> bytes:
    out = bytearray(data[: cut % (len(data) + 1)] if cut >= 0 else data)
    for at, value in flips:
        if out:
            out[at % len(out)] = value
    return bytes(out)


# -- prepare's sources --------------------------------------------------------------------
@SOME
@given(suffix=st.sampled_from([".jsonl", ".json", ".csv", ".txt"]), compression=st.sampled_from(list(COMPRESS)),
       base=st.sampled_from([GOOD, b"", b"[" * 3000, b'{"text": 1' + b"9" * 5000 + b"}\n", b"\xff\xfe\x00" * 40]),
       cut=st.integers(-1, 400), flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=4),
       extra=st.binary(max_size=64))
def test_prepare_answers_any_source_bytes_with_a_corpus_or_its_own_error(suffix, compression, base, cut, flips, extra):
    from harness.data.corpus import open_corpus
    from harness.data.prepare import prepare

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / f"a{suffix}{compression}"
        src.write_bytes(_mutate(COMPRESS[compression](base), cut, flips) + extra)
        try:
            result = prepare([src], Path(tmp) / "out", progress=False, workers=1)
        except ConfigError as exc:
            assert "\n" not in str(exc).strip() or len(str(exc)) < 3000
            return
        assert open_corpus(result.path).split("train").tokens > 0


# -- exported folders -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def export_folder(tmp_path_factory):
    """A folder as `harness export` writes it, of an untrained tiny model (no store needed)."""
    from harness.config import parse_run_config
    from harness.data.tasks import TaskInfo
    from harness.run.build import build_model_from
    from harness.run.plan import load_registry, plan
    from harness.run.trained import write_weights

    cfg = parse_run_config({"task": {"name": "copy", "params": {"length": 4, "vocab": 5}},
                            "model": {"name": "transformer", "params": {"d_model": 16, "layers": 1, "heads": 2}}})
    p = plan(cfg, load_registry(cfg, None))
    info = TaskInfo(format="lm", vocab_size=10, max_length=10)
    folder = tmp_path_factory.mktemp("export") / "model"
    write_weights(folder, build_model_from(p.parts, info),
                  {"config": p.resolved_config(), "task_kind": "seq2seq", "symbols": [f"s{i}" for i in range(5)],
                   "info": {"format": "lm", "vocab_size": 10, "max_length": 10, "num_classes": None}})
    return folder


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                           max_leaves=8)


@FEW
@given(where=st.sampled_from(["weights", "json", "json field"]), cut=st.integers(-1, 3000),
       flips=st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=3),
       path=st.sampled_from([("info", "vocab_size"), ("info", "max_length"), ("info",), ("symbols",), ("config",),
                             ("config", "model", "params", "d_model"), ("config", "model", "name"),
                             ("config", "plugins"), ("task_kind",)]),
       value=JSON_VALUES)
def test_an_exported_folder_loads_or_is_the_harness_s_own_error(export_folder, where, cut, flips, path, value):
    import shutil

    import harness

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "m"
        shutil.copytree(export_folder, folder)
        if where == "weights":
            data = (folder / "model.safetensors").read_bytes()
            assume(cut >= 0 or flips)
            (folder / "model.safetensors").write_bytes(_mutate(data, cut, flips))
        elif where == "json":
            data = (folder / "model.json").read_bytes()
            assume(cut >= 0 or flips)
            (folder / "model.json").write_bytes(_mutate(data, cut, flips))
        else:
            meta = json.loads((folder / "model.json").read_text())
            node = meta
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = value
            (folder / "model.json").write_text(json.dumps(meta, allow_nan=True))
        try:
            model, _ = harness.load_model(folder)
        except HarnessError:
            return
        assert not model.training


# -- checkpoint folders ---------------------------------------------------------------------------
KINDS = ["valid", "random", "pickle", "foreign dict", "folder", "dev zero", "no sidecar", "bad sidecar",
         "sidecar folder", "truncated"]


def _checkpoint(root: Path, step: int, kind: str, noise: bytes) -> None:
    import io

    import torch

    from harness.run import checkpoint

    path = checkpoint.step_path(root, step)
    valid = {"harness": {"step": step}, "state_dict": {"model.w": torch.zeros(2)}}
    if kind == "valid":
        checkpoint.write(path, valid)
        return
    if kind == "folder":
        path.mkdir()
        return
    if kind == "dev zero":
        os.symlink("/dev/zero", path)
        return
    buffer = io.BytesIO()
    torch.save({"weights": torch.ones(1)} if kind == "foreign dict" else valid, buffer)
    data = {"random": noise, "pickle": pickle.dumps(Exception("x")), "foreign dict": buffer.getvalue(),
            "no sidecar": buffer.getvalue(), "bad sidecar": buffer.getvalue(), "sidecar folder": b"x",
            "truncated": buffer.getvalue()[: len(buffer.getvalue()) // 2]}[kind]
    path.write_bytes(data)
    side = path.with_name(path.name + ".sha256")
    if kind == "no sidecar":
        return
    if kind == "sidecar folder":
        side.mkdir()
        return
    digest = hashlib.sha256(noise + b"other" if kind == "bad sidecar" else
                            buffer.getvalue() if kind == "truncated" else data).hexdigest()
    side.write_text(f"{digest}  {path.name}\n")


@SOME
@given(files=st.lists(st.tuples(st.integers(1, 50), st.sampled_from(KINDS)), max_size=6, unique_by=lambda f: f[0]),
       noise=st.binary(max_size=200))
def test_the_checkpoint_chooser_takes_the_newest_valid_one_or_none(files, noise, capsys):
    from harness.run import checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for step, kind in files:
            _checkpoint(root, step, kind, noise)
        chosen = checkpoint.latest(root)
        valid = [step for step, kind in files if kind == "valid"]
        assert chosen == (checkpoint.step_path(root, max(valid)) if valid else None)
        newer = [step for step, _ in files if not valid or step > max(valid)]
        err = capsys.readouterr().err
        assert "Traceback" not in err and err.count("warning: ") == len(newer)


# -- budgets ------------------------------------------------------------------------------------
@SOME
@given(flops=st.floats(min_value=1e-3, max_value=1e30, allow_nan=False))
def test_a_flop_budget_is_accepted_exactly_when_a_year_at_the_fastest_peak_spends_it(flops):
    from harness.config import parse_run_config
    from harness.runtime.bounds import max_flops

    data = {"task": {"name": "copy"}, "model": {"name": "transformer"}, "train": {"max_flops": flops}}
    try:
        cfg = parse_run_config(data)
    except ConfigError as exc:
        assert flops > max_flops() and "years" in str(exc)
        return
    assert flops <= max_flops() and cfg.train.max_flops == flops


@FEW
@given(sizes=st.integers(3, 25), budgets=st.integers(3, 25), candidates=st.integers(1, 3))
def test_a_scaling_grid_is_accepted_exactly_up_to_its_cap(sizes, budgets, candidates):
    import copy

    from harness.runtime.bounds import MAX_GRID_CELLS
    from harness.study.schema import parse_study_config
    from harness.yaml_io import read_yaml

    data = read_yaml(Path(__file__).resolve().parents[1] / "studies/scaling_lm.yaml")
    cpu = data.pop("profiles")["cpu"]
    data["candidates"] = [copy.deepcopy(c) for c in cpu["candidates"][:candidates]]
    data["scaling"] = {**cpu["scaling"], "sizes": [{"d_model": 16 + 2 * i, "layers": 2, "heads": 2} for i in range(sizes)],
                       "budgets": [1e10 * 100 ** (i / (budgets - 1)) for i in range(budgets)]}
    cells = sizes * budgets * candidates
    try:
        parse_study_config(data)
    except ConfigError as exc:
        assert cells > MAX_GRID_CELLS and f"{cells:,} cells" in str(exc)
        return
    assert cells <= MAX_GRID_CELLS
