"""Issue 34's first-hour frictions, each on what a newcomer meets: the verdict carries the
handicaps the report detects (tuned values at a range edge, parameter counts apart, failed
seeds, an objective saturated at its bound), the report names the data a corpus study read,
and the smaller messages (CLI and study) that said too little."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_report import candidate, protocol
from text import flat

from harness.report.collect import with_data
from harness.report.document import document
from harness.report.render import headline, render_markdown, short_verdict
from harness.report.verdict import analyze


def spread(name: str, mu: float, n: int = 7, sd: float = 0.01, **kw):
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    return candidate(name, {s: float(mu + rng.normal(0, sd)) for s in range(1, n + 1)}, **kw)


# -- 2: caveats in the verdict's first line and the parent run's title ------------------------
def test_handicaps_the_report_detects_lead_the_verdict_and_the_title():
    a, b, c = spread("a", 0.9), spread("b", 0.8, params=12_000), spread("c", 0.7)
    a.edges = ["train.lr 0.0098 in the top tenth of [0.001, 0.01], log scale"]
    b.edges = ["train.lr 0.0011 in the bottom tenth of [0.001, 0.01], log scale",
               "train.weight_decay 0.099 in the top tenth of [0, 0.1]"]
    c.failed_seeds = {8: "TrainingDiverged: training loss became nan at step 97"}
    results = [a, b, c]
    proto = protocol(7, baseline="a")
    verdict = analyze(results, proto)
    text = headline(results, verdict, proto)
    first = text.split(". Read the verdict below with them.")[0]
    assert first.startswith("**Caveats:** ")
    assert "the tuned lr, weight_decay of 2 of 3 candidates (a, b) sit at the edge" in first
    assert "parameter counts differ by up to 20% (10,000 to 12,000)" in first
    assert "confirmation seeds failed (c 1 of 8)" in first
    title = short_verdict(results, verdict)
    assert title.startswith("best: a (a ")
    assert title.endswith("; caveats: lr/weight_decay at range edge (2 of 3), params differ 20%, "
                          "failed seeds: c 1/8")
    md = render_markdown(document(results, verdict, proto))
    assert md.split("## Verdict\n\n")[1].startswith("**Caveats:** the tuned lr")


def test_a_study_without_handicaps_has_no_caveat():
    results = [spread("a", 0.9), spread("b", 0.8)]
    proto = protocol(7, baseline="a")
    verdict = analyze(results, proto)
    assert verdict.caveats == []
    assert "Caveats" not in headline(results, verdict, proto)
    assert "caveats" not in short_verdict(results, verdict)


def test_params_off_the_target_are_a_caveat_only_past_the_tolerance():
    results = [spread("a", 0.9, params=10_400), spread("b", 0.8, params=9_700)]
    verdict = analyze(results, protocol(7, baseline="a", param_target=10_000))
    assert verdict.caveats == []  # 4% and 3%: within 5%
    results = [spread("a", 0.9, params=10_600), spread("b", 0.8, params=9_700)]
    verdict = analyze(results, protocol(7, baseline="a", param_target=10_000))
    assert [short for short, _ in verdict.caveats] == ["params off target (1)"]
    assert "a misses budget.params by more than 5%" in verdict.caveats[0][1]


# -- 3: an objective at its ceiling points to the metric that still separates ------------------
def test_an_objective_at_its_ceiling_for_several_candidates_points_to_the_longest_length():
    ones = dict.fromkeys(range(1, 8), 1.0)
    at16 = {"rope": [0.12] * 7, "sinusoidal": [0.2 + 0.01 * i for i in range(7)],
            "nope": [0.4] * 7}
    at24 = {"rope": [0.1] * 7, "sinusoidal": [0.15] * 7, "nope": [0.3] * 7}
    lengths = (12, 16, 24)

    def cand(name, values):
        return candidate(name, values, lengths={12: list(values.values()), 16: at16[name],
                                                24: at24[name]})

    results = [cand("rope", ones), cand("sinusoidal", dict(ones)),
               cand("nope", {s: 0.55 + 0.01 * s for s in range(1, 8)})]
    for r in results:  # the objective is at length 12 here
        for s in r.seeds:
            s.metrics["val/acc_len12"] = s.value
    proto = protocol(7, baseline="sinusoidal", length=12, train_length=12, lengths=lengths)
    verdict = analyze(results, proto)
    assert verdict.saturated == ["rope", "sinusoidal"] and verdict.separating_length == 24
    text = headline(results, verdict, proto)
    assert ("the objective is saturated: rope, sinusoidal score val/acc @12 = 1 on every seed, "
            "so it cannot rank them; val/acc at length 24 still separates them") in text
    assert "objective saturated (2 at 1)" in short_verdict(results, verdict)
    # one candidate at the ceiling is not a saturated objective: it is simply best
    results[1] = cand("sinusoidal", {s: 0.9 + 0.001 * s for s in range(1, 8)})
    assert analyze(results, proto).saturated == []


def test_a_floor_counts_as_saturation_too_and_no_separating_length_is_said():
    zeros = dict.fromkeys(range(1, 8), 0.0)
    results = [candidate("a", zeros), candidate("b", dict(zeros))]
    for r in results:
        r.seeds = [type(s)(s.seed, s.run_id, s.value, {**s.metrics, "val/loss_len16": 0.0})
                   for s in r.seeds]
    proto = protocol(7, baseline="a", metric="loss", maximize=False)
    verdict = analyze(results, proto)
    assert verdict.saturated == ["a", "b"] and verdict.separating_length is None
    assert "no evaluation length separates them either" in headline(results, verdict, proto)


# -- 1: the data a corpus study read, not the task's default params ---------------------------
def test_the_protocol_names_the_data_read_in_place_of_the_params_that_point_to_it():
    from harness.report.render import protocol_text
    from harness.study.schema import parse_study_config

    cfg = parse_study_config({
        "name": "c", "task": {"name": "corpus_lm", "params": {
            "source": "shakespeare", "tokenizer": "bytes", "length": 64, "path": "corpora/py"}},
        "candidates": [{"name": "a", "model": {"name": "transformer"}},
                       {"name": "b", "model": {"name": "transformer"}}],
        "objective": {"metric": "bpb"}, "budget": {"trials": 1, "steps": 10}})
    a, b = spread("a", 2.0), spread("b", 2.1)
    read = ("prepared corpus /data/corpora/py (manifest sha256 0123456789ab): 12 source file(s), "
            "240,000 bytes (ast.py, os.py, re.py, 9 more); tokenizer bpe:1024 (1024 tokens); "
            "train/val/test 80,000/4,000/4,100 tokens")
    for r in (a, b):
        r.data, r.data_params = read, ("path", "source", "tokenizer")
    proto = with_data(protocol(7, baseline="a", metric="bpb", maximize=False), [a, b], cfg)
    verdict = analyze([a, b], proto)
    text = protocol_text(proto, verdict)
    assert text.startswith(f"Task corpus_lm {{'length': 64}}; data read: {read}.")
    assert "shakespeare" not in text
    md = render_markdown(document([a, b], verdict, proto))
    assert f"Data read: {read}." in md.split("## Verdict")[0]
    # candidates that read different folders are named each with theirs
    b.data = read.replace("/py", "/py-bytes")
    both = with_data(protocol(7), [a, b], cfg)
    assert f"a: {read}; b: {b.data}" in both.task


def test_a_relative_data_path_is_made_absolute_when_the_study_is_created(tmp_path, monkeypatch):
    """``--set task.params.path=corpora/mine`` names the folder under the working folder of
    the command that created the study, whatever folder a worker or the report runs in."""
    import yaml

    from harness.study.schema import load_study_config

    (tmp_path / "corpora" / "mine").mkdir(parents=True)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.jsonl").write_text("{}\n")
    study = {"task": {"name": "corpus_lm", "params": {"source": "shakespeare",
                                                      "tokenizer": "bpe:1024"}},
             "candidates": [{"name": "a", "model": {"name": "transformer"}},
                            {"name": "b", "model": {"name": "transformer"},
                             "task": {"train": "data/*.jsonl", "tokenizer": "tok.json"}}],
             "objective": {"metric": "bpb"}, "budget": {"trials": 1, "steps": 10}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(study))
    monkeypatch.chdir(tmp_path)
    cfg = load_study_config("s.yaml", overrides=["task.params.path=corpora/mine"])
    assert cfg.task.params["path"] == str(tmp_path / "corpora" / "mine")
    assert cfg.task.params["source"] == "shakespeare" and cfg.task.params["tokenizer"] == "bpe:1024"
    assert cfg.candidates[1].task["train"] == str(tmp_path / "data" / "*.jsonl")
    assert cfg.candidates[1].task["tokenizer"] == "tok.json", "no such file: a name, left alone"


@pytest.mark.slow  # a real training run: about 15 s on the loaded 2-core machine
def test_a_corpus_run_records_what_it_read_and_scores_a_small_split_whole(tmp_path, registry, capsys):
    """A small corpus with the default eval_tokens (16,384) trains: the run prints one
    warning line, tags it, and records the manifest it read (``harness.data``)."""
    import json

    import harness
    from harness.data.prepare import prepare
    from harness.keys import Tag
    from harness.store.tracking import Tracker

    src = tmp_path / "small.jsonl"
    src.write_text("".join(json.dumps({"text": f"document {i} " * 8}) + "\n" for i in range(300)))
    prepare([src], tmp_path / "small", tokenizer="bytes", workers=1, progress=False)
    cfg = {"task": {"name": "corpus_lm", "params": {"path": str(tmp_path / "small"), "length": 16}},
           "model": {"name": "transformer", "params": {"d_model": 16, "layers": 1, "heads": 2},
                     "position": {"name": "none"}},
           "train": {"max_steps": 2, "batch_size": 2, "val_every": 2, "warmup_steps": 0,
                     "num_threads": 1, "progress": False, "log_attention": False},
           "tracking": {"experiment": "small-corpus"}}
    result = harness.train(cfg, registry=registry)
    assert result.status == "FINISHED"
    tags = Tracker().client.get_run(result.run_id).data.tags
    assert "the whole split is scored" in tags[Tag.WARNINGS]
    [line] = [line for line in capsys.readouterr().err.splitlines() if "whole split" in line]
    assert line.startswith("warning: ") and "eval_tokens 16,384 is more than the val and test" in line
    assert tags[Tag.DATA].startswith(f"prepared corpus {(tmp_path / 'small').resolve()} (manifest")
    assert tags[Tag.DATA_PARAMS] == "path,source,tokenizer"


# -- 4: a run prints its id at the start, a resumed run its step, the bar its real total --------
@pytest.mark.slow  # two real runs through the CLI: about 20 s on a loaded 2-core machine
def test_train_prints_its_run_id_first_and_a_resumed_run_its_step_and_real_total(tmp_path, monkeypatch, capsys):
    import lightning as L
    import yaml
    from mlflow.tracking import MlflowClient

    from harness.cli.main import main
    from harness.errors import Interrupted

    class StopAt(L.Callback):  # Ctrl-C after step 7: the run ends KILLED, resumable
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 7:
                raise Interrupted()

    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / "home"))
    store = f"sqlite:///{tmp_path / 'm.db'}"
    cfg = {"task": {"name": "copy", "params": {"length": 4, "vocab": 4, "num_train": 40, "num_val": 8}},
           "model": {"name": "transformer", "params": {"d_model": 16, "layers": 1, "heads": 2}},
           "train": {"max_steps": 12, "batch_size": 8, "val_every": 4, "num_threads": 1,
                     "checkpoint_every": 3, "warmup_steps": 2, "log_attention": False},
           "tracking": {"uri": store}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    from harness.run import console

    original = console.Announce.on_train_start

    def then_stop(self, trainer, pl_module):  # the CLI's own callbacks, plus a Ctrl-C at step 7
        original(self, trainer, pl_module)
        trainer.callbacks.append(StopAt())

    monkeypatch.setattr(console.Announce, "on_train_start", then_stop)
    assert main(["train", str(tmp_path / "run.yaml")]) == 130
    out = capsys.readouterr().out
    client = MlflowClient(store)
    [run] = client.search_runs([client.get_experiment_by_name("harness").experiment_id])
    cut = run.info.run_id
    first = next(line for line in out.splitlines() if cut in line)
    assert first.startswith(f"run {cut} started (12 steps, a checkpoint every 3)")
    assert f"continue it with `harness train --resume {cut}`" in first
    assert out.index(first) < out.index("training steps"), "the id comes before the bar"
    monkeypatch.setattr(console.Announce, "on_train_start", original)
    assert main(["train", "--resume", cut, "--tracking-uri", store]) == 0
    out = capsys.readouterr().out
    step = int(client.get_run(cut).data.tags["harness.resumed_from_step"])
    assert f"run {cut}: resumed from its checkpoint at step {step} of 12 steps" in out
    bar = [part for part in out.replace("\r", "\n").splitlines() if part.startswith("training steps")]
    assert bar and f"{step}/12" in bar[0] and "12/12" in bar[-1]
    assert not [part for part in bar if "/?" in part] and "Training:" not in out
    assert not [part for part in bar if " 0/12" in part], "a resumed bar starts at its step"


# -- 6: messages that name what is wrong first --------------------------------------------------
def test_a_glob_of_unsupported_files_names_the_supported_suffixes(tmp_path):
    from harness.data.readers import resolve_sources
    from harness.errors import ConfigError

    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text("print(1)\n")
    with pytest.raises(ConfigError) as err:
        resolve_sources([str(tmp_path / "*.py")])
    text = str(err.value)
    assert "matched 2 file(s), none in a format the harness reads (.py;" in text
    assert "supported: .txt, .jsonl, .json, .csv, .parquet, .arrow" in text
    assert "quote it" not in text
    with pytest.raises(ConfigError, match="matched no file .supported: .txt"):
        resolve_sources([str(tmp_path / "*.nothing")])


def test_an_unknown_objective_metric_is_named_before_any_direction_is_asked(registry):
    from harness.errors import ConfigError
    from harness.study.schema import parse_study_config
    from harness.study.space import validate

    def study(objective):
        return parse_study_config({
            "task": {"name": "copy", "params": {"length": 4}}, "name": "s",
            "candidates": [{"name": "a", "model": {"name": "transformer"}}],
            "objective": objective, "budget": {"trials": 1, "steps": 2}})

    with pytest.raises(ConfigError) as err:
        validate(study({"metric": "accuracy"}), registry)
    text = str(err.value)
    assert text.startswith("objective.metric: task 'copy' does not log 'accuracy' (did you mean 'acc'?)")
    assert "acc, exact, loss" in text and "direction" not in text
    # a metric the task logs whose direction is unknown still asks for one
    with pytest.raises(ConfigError, match="objective.direction is required for metric 'exact_x'"):
        from harness.study import space as sp

        known = sp.logged_metrics
        sp.logged_metrics = lambda task: known(task) | {"exact_x"}
        try:
            validate(study({"metric": "exact_x"}), registry)
        finally:
            sp.logged_metrics = known


# -- 10: the harness's warnings are its own lines, not Python's ``file.py:197: UserWarning`` ---
def test_harness_warnings_print_as_its_own_line_and_others_as_python_does(tmp_path, capsys):
    """The CLI path (``quiet``) and the API path (``quieted``): a labelled file with bytes
    that are not UTF-8 warns in one ``warning:`` line, with no file, line number or class."""
    import subprocess
    import sys

    src = tmp_path / "bad.csv"
    src.write_bytes(b"text,label\nok,a\nbad \xff byte,b\n")
    code = ("from harness.runtime import noise; noise.quiet()\n"
            "from harness.data.labelled import stream_splits, LabelledConfig\n"
            f"list(stream_splits(LabelledConfig(train={str(src)!r}, val_fraction=0.5), ['text', 'label'], 'text'))\n"
            "import warnings; warnings.warn('from elsewhere', UserWarning)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    lines = done.stderr.splitlines()
    assert lines[0] == ("warning: bytes that are not UTF-8 were replaced by U+FFFD (the readers' "
                        f"policy): 1 in {src}")
    assert "labelled.py" not in done.stderr and "UserWarning: bytes" not in done.stderr
    assert "<string>:4: UserWarning: from elsewhere" in done.stderr, "not the harness's: as Python shows it"
    # the API restores Python's display after the call
    import warnings

    from harness.runtime.noise import quieted
    before = warnings.showwarning
    with quieted(verbose=False):
        assert warnings.showwarning is not before
    assert warnings.showwarning is before
    # a caller recording warnings still records the harness's
    from harness.errors import HarnessWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with quieted(verbose=False):
            warnings.warn("texts were truncated", HarnessWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["texts were truncated"]
    assert "texts were truncated" not in capsys.readouterr().err


def test_data_prepare_help_and_the_docs_agree_on_the_workers_default(capsys):
    import re

    from harness.cli.main import main
    from harness.data.cli import WORKERS_DEFAULT
    from harness.data.prepare import CHUNK_BYTES, FEW_CHUNKS

    with pytest.raises(SystemExit):
        main(["data", "prepare", "--help"])
    help_text = flat(capsys.readouterr().out)
    assert f"(default: {WORKERS_DEFAULT})" in help_text
    docs = flat((Path(__file__).parent.parent / "docs" / "data.md").read_text())
    assert f"`--workers` processes (default: {WORKERS_DEFAULT})" in docs
    assert f"sources under {FEW_CHUNKS * CHUNK_BYTES >> 20} MB" in WORKERS_DEFAULT
    assert not re.search(r"default: the usable cores", help_text)


def test_a_new_store_made_in_another_folder_is_named(tmp_path, monkeypatch, capsys):
    from harness.store import tracking

    monkeypatch.delenv("HARNESS_HOME", raising=False)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert tracking.ensure_home() == elsewhere.resolve() / ".harness"
    err = flat(capsys.readouterr().err)
    assert f"created a new one, {elsewhere.resolve() / '.harness'}" in err and "HARNESS_HOME" in err
    tracking.ensure_home()  # it exists now: nothing more to say
    (elsewhere / "sub").mkdir()
    monkeypatch.chdir(elsewhere / "sub")  # a sub-folder uses the project's store, silently
    assert tracking.ensure_home() == elsewhere.resolve() / ".harness"
    assert capsys.readouterr().err == ""


def test_a_study_estimates_its_running_time_from_timed_steps(tmp_path, registry, monkeypatch):
    import copy

    import yaml
    from test_study import CANDIDATE, TINY

    from harness.study import estimate as est
    from harness.study.schema import load_study_config
    from harness.study.space import validate

    other = copy.deepcopy(CANDIDATE) | {"name": "other"}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(TINY | {"candidates": [CANDIDATE, other]}))
    space = validate(load_study_config(tmp_path / "s.yaml"), registry)
    calls = []
    real = est.run_seconds

    def counted(run, reg):
        calls.append(run["train"]["max_steps"])
        if run["model"]["params"].get("fail"):
            raise RuntimeError("cannot be timed")
        return real(run, reg)

    monkeypatch.setattr(est, "run_seconds", counted)
    guess = est.estimate(space, {"mha": 4, "other": 0}, workers=2)
    assert calls == [20], "a candidate with no run left is not timed"
    assert guess is not None and guess.runs == 4 and list(guess.per_step) == ["mha"]
    step, whole = real(space.run_config(space.candidates[0], None, seed=0), registry)
    assert step > 0 and whole >= 20 * step
    # the estimate is the runs' time shared among the workers (timings vary: a loose check)
    assert 0.2 * whole * 4 / 2 < guess.seconds < 5 * whole * 4 / 2
    line = guess.line()
    assert line.startswith("estimate: about ") and "for the 4 run(s) left with 2 workers" in line
    assert "a training step: mha " in line and " ms" in line
    assert ("and pruned trials save" in line) == (space.config.pruner.name != "none")
    assert "pruned" not in est.Estimate(60.0, 2, {"a": 0.01}, 1, [], pruner=False).line()
    monkeypatch.setattr(space, "run_config", lambda *a, **k: {"model": {"params": {"fail": 1}},
                                                              "train": {"max_steps": 1}})
    assert est.estimate(space, {"mha": 1}) is None, "nothing timed: no estimate, no error"


def test_a_pruner_on_an_objective_past_the_training_length_says_where_it_compares(registry):
    from harness.study.schema import parse_study_config
    from harness.study.space import validate

    def notes(objective, pruner):
        return validate(parse_study_config({
            "task": {"name": "copy", "params": {"length": 4, "eval_lengths": [8]}}, "name": "s",
            "candidates": [{"name": "a", "model": {"name": "transformer"}}],
            "objective": objective, "pruner": pruner, "budget": {"trials": 2, "steps": 20}}),
            registry).notes

    [note] = [n for n in notes({"metric": "acc", "length": 8}, {"name": "median"}) if "pruner" in n]
    assert "compares tuning trials by val/acc at the objective's length 8" in note  # issue 40
    assert "validates there too while it trains" in note
    assert not [n for n in notes({"metric": "acc", "length": 8}, {"name": "none"}) if "pruner" in n]
    assert not [n for n in notes({"metric": "acc"}, {"name": "median"}) if "pruner" in n]


# -- 7: the MLflow UI -----------------------------------------------------------------------------
def test_the_parent_description_says_where_the_intervals_are_and_the_data_read():
    """MLflow's grouped rows aggregate by min, average or max only: the parent run's
    description says the ranked view's group rows carry no interval, and where they are."""
    from types import SimpleNamespace

    from harness.report.summary import CandidateNumbers, VerdictText, note
    from harness.study.schema import parse_study_config

    cfg = parse_study_config({
        "name": "s", "task": {"name": "copy", "params": {"length": 4}},
        "candidates": [{"name": "a", "model": {"name": "transformer"}}],
        "objective": {"metric": "acc"}, "budget": {"trials": 1, "steps": 2}, "confirm": {"seeds": 2}})
    handle = SimpleNamespace(name="s", config=cfg, record={"train_length": 4})
    numbers = [CandidateNumbers("a", 1.0, 0.9, (0.8, 1.0), {1: 0.85, 2: 0.95})]
    lead = VerdictText("best: a", "Ranked ...", "headline", data="prepared corpus /x (manifest sha256 1)")
    text = note(handle, numbers, "| table |", "95% Student t", lead)
    assert "group row shows the mean over its confirmation seeds without its interval" in text
    assert "MLflow groups by min, average or max only" in text
    assert "Data read: prepared corpus /x (manifest sha256 1)." in text
