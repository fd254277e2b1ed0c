"""Downstream evaluation with real lm-eval on small local tasks, and sharing in the Hub layout.

A decoder-only Transformer trained to 100% on ``copy`` (``src SEP tgt``) must pick the copy
among four choices on every document (accuracy 1), never pick a reversal the task calls gold
(accuracy 0), and write the copy with ``generate_until`` (exact match 1), through ``harness
eval`` (logged to its MLflow run) and through lm-eval's own command line (``--model harness``).
On a byte-level corpus run whose scored validation text starts after an end-of-document token,
lm-eval's rolling loglikelihood of that text must give the run's own ``val/bpb``. A Hub-layout
export must load into identical weights and the same generations. Each bad input is one
paragraph and exit 2.
"""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path

import pytest
import torch
from copy_model import train_copy
from text import flat

import harness
from harness.cli.main import main
from harness.data.prepare import _cumulative, split_of
from harness.data.vocab import Vocab
from harness.errors import ConfigError
from harness.evaluation.text import SymbolCodec
from harness.run import trained as t
from harness.run.pipeline import train

ROOT = Path(__file__).resolve().parents[1]
SYMBOLS = [f"s{i}" for i in range(5)]


def _yaml(folder: Path, name: str, data: Path, body: str) -> None:
    (folder / f"{name}.yaml").write_text(
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
        f"test_split: test\n{body}")


def copy_tasks(folder: Path, n: int = 12, seed: int = 0) -> list[dict[str, object]]:
    """Documents whose answers the test knows, and three tasks over them: choose the copy
    (gold: the copy), choose the reversal (gold: the reversal, which the model never picks),
    and write the copy."""
    rng = random.Random(seed)
    docs = []
    while len(docs) < n:
        src = [rng.choice(SYMBOLS) for _ in range(4)]
        if src == src[::-1]:
            continue
        wrong = []
        while len(wrong) < 2:
            w = list(src)
            w[rng.randrange(4)] = rng.choice([s for s in SYMBOLS if s not in src] or SYMBOLS)
            if w != src and w != src[::-1] and " ".join(w) not in wrong:
                wrong.append(" ".join(w))
        choices = [" ".join(src), " ".join(src[::-1]), *wrong]
        rng.shuffle(choices)
        docs.append({"src": " ".join(src), "choices": choices, "copy": choices.index(" ".join(src)),
                     "reversal": choices.index(" ".join(src[::-1]))})
    data = folder / "copy.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    mc = 'output_type: multiple_choice\ndoc_to_text: "{{src}} <sep>"\ndoc_to_choice: "{{choices}}"\n'
    _yaml(folder, "copy_choice", data, mc + "doc_to_target: copy\nmetric_list:\n  - metric: acc\n")
    _yaml(folder, "reversal_choice", data, mc + "doc_to_target: reversal\nmetric_list:\n  - metric: acc\n")
    _yaml(folder, "copy_write", data, 'output_type: generate_until\ndoc_to_text: "{{src}} <sep>"\n'
          'doc_to_target: "{{src}}"\ngeneration_kwargs:\n  until: ["<eos>"]\n  max_gen_toks: 4\n'
          "metric_list:\n  - metric: exact_match\n")
    return docs


@pytest.fixture(scope="module")
def copy_run(tmp_path_factory):
    """(run id, tracking URI, root with tasks/) of a model trained to 100% on copy."""
    root = tmp_path_factory.mktemp("evaluation")
    (root / "tasks").mkdir()
    copy_tasks(root / "tasks")
    return (*train_copy(root), root)


@pytest.fixture
def home(copy_run, monkeypatch):
    monkeypatch.setenv("HARNESS_HOME", str(copy_run[2] / "home"))
    return copy_run


def test_symbol_codec_reads_and_writes_a_symbol_tasks_text():
    codec = SymbolCodec(Vocab(tuple(SYMBOLS)))
    ids = codec.encode("s1 s4 <sep> s0")
    assert ids == [5, 8, 3, 4] and codec.decode(ids) == "s1 s4 s0"
    with pytest.raises(ConfigError, match="'zz' is not in the run's vocabulary"):
        codec.encode("s1 zz")
    chars = SymbolCodec(Vocab(tuple("ab ")))
    assert chars.decode(chars.encode("ab a")) == "ab a"


def test_a_bpe_tokenizer_travels_as_its_json_and_reads_text_back():
    from harness.data.tokenizers import train_bpe
    from harness.evaluation.text import TokenizerCodec, codec_from_json

    text = "the cat sat on the mat and saw its hat near the old red barn. " * 20
    codec = TokenizerCodec(train_bpe(300, [text]))
    again = codec_from_json(codec.to_json(), Vocab(()), "tokenizer.json")
    sample = "the old cat saw a red hat"
    assert again.encode(sample) == codec.encode(sample) and min(codec.encode(sample)) >= 5
    assert again.decode(again.encode(sample)) == sample and again.prefix_id == 4


def test_a_missing_local_data_file_is_named_before_anything_loads(tmp_path, capsys):
    _yaml(tmp_path, "lost", tmp_path / "nowhere.jsonl",
          'output_type: loglikelihood_rolling\ndoc_to_text: ""\ndoc_to_target: "{{text}}"\n')
    assert main(["eval", "no-such-run", "--tasks", "lost", "--include-path", str(tmp_path)]) == 2
    err = flat(capsys.readouterr().err)
    assert "task 'lost' reads" in err and "nowhere.jsonl, which does not exist" in err


@pytest.mark.slow
def test_harness_eval_scores_the_copy_model_and_logs_to_its_run(home, capsys):
    run_id, uri, root = home
    out = root / "results.json"
    assert main(["eval", run_id, "--tasks", "copy_choice,reversal_choice,copy_write", "--include-path",
                 str(root / "tasks"), "--tracking-uri", uri, "--out", str(out), "--batch-size", "5"]) == 0
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    logged = client.get_run(run_id).data.metrics
    assert logged["eval/copy_choice/acc"] == 1.0  # the copy is always the most likely choice
    assert logged["eval/reversal_choice/acc"] == 0.0  # and a reversal never is
    assert logged["eval/copy_write/exact_match"] == 1.0
    artifact = json.loads(Path(client.download_artifacts(run_id, "eval/results.json", str(root))).read_text())
    assert artifact["results"]["copy_choice"]["acc,none"] == 1.0
    assert json.loads(out.read_text())["results"]["copy_write"]["exact_match,none"] == 1.0
    # reproducible: the same numbers again, batch size aside
    again = root / "again.json"
    assert main(["eval", run_id, "--tasks", "copy_choice,reversal_choice,copy_write", "--include-path",
                 str(root / "tasks"), "--no-log", "--batch-size", "3", "--out", str(again)]) == 0
    first, second = json.loads(out.read_text())["results"], json.loads(again.read_text())["results"]
    assert first == second


@pytest.mark.slow
def test_loglikelihood_batches_and_truncation_agree_with_one_request_at_a_time(home):
    from harness.evaluation.adapter import HarnessLM

    lm = HarnessLM(run=home[0], batch_size=3)
    pairs = [([4, 5, 6, 7, 3], [4, 5, 6, 7]), ([8, 3], [8]), ([5, 5, 4, 8, 3, 5, 5, 4], [8, 6]),
             ([1], [4, 4, 4])]  # ids: s0..s4 are 4..8, <sep> 3, <bos> 1
    batched = lm.score(pairs)
    for pair, (ll, greedy) in zip(pairs, batched, strict=True):
        ctx, cont = pair
        whole = (ctx + cont)[-(lm.max_length + 1):]  # cut from the left to the context
        with torch.no_grad():
            logits = lm.model(torch.tensor([whole[:-1]]))[0].double().log_softmax(-1)
        rows = logits[len(whole) - 1 - len(cont):]
        expected = sum(float(rows[i, tok]) for i, tok in enumerate(cont))
        assert ll == pytest.approx(expected, abs=1e-4)
        assert greedy == all(int(rows[i].argmax()) == tok for i, tok in enumerate(cont))
    assert batched[0][1]  # the copy of s0 s1 s2 s3 is what the model writes
    hot = {"do_sample": True, "temperature": 3.0, "max_gen_toks": 4}
    assert lm.continue_text("s2 s0 <sep>", **hot) == lm.continue_text("s2 s0 <sep>", **hot)  # seeded
    assert lm.continue_text("s2 s0 s4 s1 <sep>", max_gen_toks=4, until=["s4"]) == "s2 s0 "  # cut before the stop


@pytest.mark.slow
def test_lm_eval_command_line_runs_the_registered_harness_model(home, monkeypatch, capsys):
    from harness.evaluation import lm_eval_main

    run_id, _, root = home
    monkeypatch.setattr(sys, "argv", ["lm_eval", "--model", "harness", "--model_args", f"run={run_id}",
                                      "--tasks", "copy_write", "--include_path", str(root / "tasks")])
    lm_eval_main.main()
    row = next(line for line in capsys.readouterr().out.splitlines() if "exact_match" in line)
    assert [c.strip() for c in row.split("|")][7] == "1"


@pytest.mark.slow
def test_bad_requests_are_one_paragraph_and_exit_2(home, tmp_path, capsys):
    run_id, uri, root = home
    tasks = root / "tasks"
    assert main(["eval", run_id, "--tasks", "copy_choise", "--include-path", str(tasks)]) == 2
    err = flat(capsys.readouterr().err)
    assert "unknown task 'copy_choise'" in err and "copy_choice" in err
    data = tmp_path / "long.jsonl"
    data.write_text(json.dumps({"src": "s1 s2", "choices": [" ".join(["s1"] * 12), "s1"]}) + "\n")
    _yaml(tmp_path, "too_long", data, 'output_type: multiple_choice\ndoc_to_text: "{{src}} <sep>"\n'
          'doc_to_choice: "{{choices}}"\ndoc_to_target: 0\n')
    _yaml(tmp_path, "too_many_tokens", data, 'output_type: generate_until\ndoc_to_text: "{{src}}"\n'
          'doc_to_target: "s1"\ngeneration_kwargs:\n  max_gen_toks: 20\n')
    for task, words in (("too_long", "longer than the model's context"), ("too_many_tokens", "max_gen_toks 20")):
        assert main(["eval", run_id, "--tasks", task, "--include-path", str(tmp_path), "--no-log"]) == 2
        assert words in flat(capsys.readouterr().err)
    parity = train({"task": {"name": "parity", "params": {"length": 4, "num_train": 16, "num_val": 4}},
                    "model": {"name": "transformer", "params": {"d_model": 8, "layers": 1, "heads": 2}},
                    "train": {"max_steps": 2, "batch_size": 8, "progress": False, "num_threads": 1},
                    "plugins": [str(ROOT / "docs/examples/parity_task.py")], "tracking": {"uri": uri}})
    capsys.readouterr()
    assert main(["eval", parity.run_id, "--tasks", "copy_choice", "--include-path", str(tasks)]) == 2
    assert "lm-eval scores text with a language model" in flat(capsys.readouterr().err)
    # harness generate on a classifier: says it cannot generate before reading the prompt
    assert main(["generate", parity.run_id, "--prompt", "not even symbols"]) == 2
    assert "generate needs a language-model" in flat(capsys.readouterr().err)


@pytest.mark.slow
def test_hub_layout_round_trip_reproduces_weights_and_generations(home, tmp_path, capsys):
    from harness.evaluation.adapter import HarnessLM
    from harness.run.hub import HubModel, load_hf

    run_id, uri, _ = home
    out = tmp_path / "shared"
    assert main(["export", run_id, "--format", "hf", "--out", str(out), "--tracking-uri", uri]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors",
                                                     "tokenizer.json"]
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
    assert modes["model.safetensors"] == modes["config.json"], modes  # shareable alike
    card = (out / "README.md").read_text()
    assert "| model | transformer | attention-harness |" in card and "val/exact" in card
    assert "max_steps 160" in card
    original, shared = t.load(run_id), load_hf(out)
    a, b = original.model.state_dict(), shared.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    hub = HubModel.from_pretrained(str(out))  # huggingface_hub's own entry point
    assert all(torch.equal(a[k], hub.model.state_dict()[k]) for k in a)
    prompt = SymbolCodec(original.vocab).encode("s3 s1 s4 s0")
    for kwargs in ({}, {"temperature": 1.5, "seed": 3}):
        assert t.generate(shared, prompt, max_new_tokens=4, **kwargs) == \
            t.generate(original, prompt, max_new_tokens=4, **kwargs)
    assert HarnessLM(run=str(out)).continue_text("s3 s1 s4 s0 <sep>", max_gen_toks=4) == "s3 s1 s4 s0"
    capsys.readouterr()
    assert main(["generate", str(out), "--prompt", "s3 s1 s4 s0", "--max-new-tokens", "4"]) == 0
    assert capsys.readouterr().out.strip() == "s3 s1 s4 s0"
    # a plugin that is not installed is named, and nothing from the folder runs
    config = json.loads((out / "config.json").read_text())
    config["harness"]["components"]["model"].update(name="my_net", package="my-nets", version="2.1")
    config["harness"]["config"]["plugins"] = [str(out / "evil.py")]
    (out / "evil.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w')\n")
    (out / "config.json").write_text(json.dumps(config))
    assert main(["generate", str(out), "--prompt", "s1"]) == 2
    err = flat(capsys.readouterr().err)
    assert "not installed: model 'my_net' (from my-nets 2.1)" in err and "never runs code" in err
    assert not (tmp_path / "ran").exists()
    assert main(["export", run_id, "--format", "hf", "--out", str(out)]) == 2


# -- a byte-level corpus run: rolling loglikelihood against the run's own validation loss ----
L, B = 16, 64  # training length; scored validation tokens (a multiple of L: no partial window)
FRACTIONS = (0.8, 0.1, 0.1)


def _documents(split: int, size: int, rng: random.Random, count: int) -> list[str]:
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "saw", "its", "hat", "near", "the", "old", "red", "barn"]
    out = []
    while len(out) < count:
        text = ""
        while len(text) < size:
            text += rng.choice(words) + " "
        text = text[:size]
        if split_of(text, _cumulative(FRACTIONS)) == split:
            out.append(text)
    return out


@pytest.fixture(scope="module")
def corpus_run(tmp_path_factory):
    """A byte-level corpus run whose scored val text is one whole document after an ``<eod>``:
    the val split is a document of L bytes, <eod>, the scored document of B bytes, <eod>; the
    task seed is one that starts the scored text at the first <eod>."""
    root = tmp_path_factory.mktemp("corpus")
    rng = random.Random(1)
    val = _documents(1, L, rng, 1) + _documents(1, B, rng, 1)
    docs = _documents(0, 200, rng, 20) + val + _documents(2, 120, rng, 1)
    (root / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HARNESS_HOME", str(root / "home"))
        folder = harness.prepare_corpus([root / "docs.jsonl"], root / "corpus", tokenizer="bytes",
                                        split_fractions=FRACTIONS, progress=False)
        folder = root / "corpus"
        seed = next(s for s in range(100) if harness.create_task(
            "corpus_lm", seed=s, path=str(folder), length=L, eval_tokens=B).eval_start("val") == L)
        result = train({"task": {"name": "corpus_lm", "params": {"path": str(folder), "length": L, "eval_tokens": B}},
                        "model": {"name": "transformer", "params": {"d_model": 32, "layers": 1, "heads": 2}},
                        "train": {"max_steps": 30, "batch_size": 8, "progress": False, "num_threads": 1,
                                  "data_seed": seed, "log_attention": False},
                        "tracking": {"uri": f"sqlite:///{root / 'm.db'}"}})
        yield result, val[1], root


@pytest.mark.slow
def test_rolling_loglikelihood_equals_the_runs_own_validation_loss(corpus_run, monkeypatch, capsys):
    from harness.evaluation import runner

    result, text, root = corpus_run
    monkeypatch.setenv("HARNESS_HOME", str(root / "home"))
    tasks = root / "tasks"
    tasks.mkdir(exist_ok=True)
    (tasks / "val_text.jsonl").write_text(json.dumps({"text": text}) + "\n")
    _yaml(tasks, "val_text", tasks / "val_text.jsonl",
          'output_type: loglikelihood_rolling\ndoc_to_text: ""\ndoc_to_target: "{{text}}"\n'
          "metric_list:\n  - metric: bits_per_byte\n  - metric: byte_perplexity\n")
    found = runner.metrics(runner.evaluate(result.run_id, ["val_text"], include_path=tasks))
    assert found["eval/val_text/bits_per_byte"] == pytest.approx(result.metrics["val/bpb"], rel=1e-5)
    assert found["eval/val_text/bits_per_byte"] == pytest.approx(result.metrics["val/loss"] / math.log(2), rel=1e-5)
    # the Hub layout carries the tokenizer: the exported folder scores the same without the corpus
    shared = root / "shared"
    assert main(["export", result.run_id, "--format", "hf", "--out", str(shared)]) == 0
    (root / "corpus").rename(root / "corpus.away")
    try:
        again = runner.metrics(runner.evaluate(shared, ["val_text"], include_path=tasks))
    finally:
        (root / "corpus.away").rename(root / "corpus")
    assert again["eval/val_text/bits_per_byte"] == pytest.approx(found["eval/val_text/bits_per_byte"], rel=1e-9)
    # generate reads and writes text through the run's own tokenizer (bytes), not symbols
    model = t.load(result.run_id)
    ids = t.generate(model, list(b + 5 for b in b"the cat "), max_new_tokens=12)
    capsys.readouterr()
    assert main(["generate", result.run_id, "--prompt", "the cat ", "--max-new-tokens", "12"]) == 0
    assert capsys.readouterr().out[:-1] == bytes(i - 5 for i in ids if i >= 5).decode("utf-8", "replace")


RECIPE_DATA = {  # a few documents in each recipe task's format (docs/evaluation.md)
    "lambada_openai": [{"text": "the cat sat on the mat"}, {"text": "a red barn near the old hat"}],
    "hellaswag": [{"query": "Cats: the cat sat on", "choices": [" a mat.", " the barn.", " red.", " hat."],
                   "gold": 0}] * 2,
    "piqa": [{"goal": "sit", "sol1": "on a mat", "sol2": "on a hat", "label": 0}] * 2,
    "arc_easy": [{"question": "Where is the cat?", "choices": {"text": ["mat", "barn"], "label": ["A", "B"]},
                  "answerKey": "B"}] * 2,
    "arc_challenge": [{"question": "What is red?", "choices": {"text": ["barn", "cat", "hat"],
                                                               "label": ["1", "2", "3"]}, "answerKey": "1"}] * 2,
    "wikitext": [{"page": " = The cat = \n\n the cat sat on a mat near the old red barn and saw its hat . \n"}],
}


@pytest.mark.slow
def test_the_documented_offline_recipes_run(corpus_run, tmp_path, monkeypatch, capsys):
    result, _, root = corpus_run
    monkeypatch.setenv("HARNESS_HOME", str(root / "home"))
    monkeypatch.chdir(tmp_path)  # the recipes' data paths are relative to the folder the command runs in
    (tmp_path / "evals/data").mkdir(parents=True)
    for name, docs in RECIPE_DATA.items():
        (tmp_path / f"evals/data/{name}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    recipes = sorted(p.stem for p in (ROOT / "docs/lm_eval_tasks").glob("*.yaml"))
    assert len(recipes) == 6
    assert main(["eval", result.run_id, "--tasks", ",".join(recipes), "--include-path",
                 str(ROOT / "docs/lm_eval_tasks"), "--no-log"]) == 0
    out = capsys.readouterr().out
    for key in ("lambada_local/acc", "hellaswag_local/acc_norm", "piqa_local/acc", "arc_easy_local/acc",
                "arc_challenge_local/acc", "wikitext_local/bits_per_byte"):
        assert f"eval/{key} " in out, key


def downstream_study(tasks: Path, objective: str = "acc") -> dict[str, object]:
    model = {"name": "transformer", "params": {"d_model": 16, "layers": 1, "heads": 2},
             "search_declared": False, "position": {"name": "sinusoidal", "search_declared": False}}
    return {"name": "downstream", "task": {"name": "copy", "params": {"length": 4, "vocab": 5, "num_train": 64,
                                                                      "num_val": 8}},
            "candidates": [{"name": "a", "model": model}], "objective": {"metric": objective},
            "search": {"lr": [3.0e-3]},
            "train": {"batch_size": 8, "val_every": 4, "num_threads": 1, "log_attention": False},
            "budget": {"trials": 1, "steps": 4}, "confirm": {"seeds": 2}, "pruner": {"name": "none"},
            "downstream": {"tasks": ["copy_choice", "copy_write"], "include_path": str(tasks)}}


def test_a_downstream_objective_names_a_downstream_task():
    from harness.study.schema import StudyConfig

    study = downstream_study(Path("tasks"), "eval/copy_choice/acc")
    assert StudyConfig.model_validate(study).objective.direction == "maximize"
    study["objective"] = {"metric": "eval/hellaswag/acc_norm"}
    with pytest.raises(ValueError, match="list its task 'hellaswag' under downstream.tasks"):
        StudyConfig.model_validate(study)


@pytest.mark.slow
def test_a_study_can_rank_by_a_downstream_metric(tmp_path, capsys):
    import yaml

    (tmp_path / "tasks").mkdir()
    copy_tasks(tmp_path / "tasks", n=6)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(downstream_study(tmp_path / "tasks", "eval/copy_choice/acc")))
    out = tmp_path / "report"
    assert main(["study", "run", str(path), "--report", "--out", str(out), "--format", "json,csv"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("downstream: copy_choice/acc") == 3 and "FAILED" not in printed  # tuning too
    summary = json.loads((out / "summary.json").read_text())
    rows = [line.split(",") for line in (out / "seeds.csv").read_text().splitlines()]
    head = rows[0]
    assert len(rows) == 3, head
    for row in rows[1:]:  # each run's objective is its own lm-eval accuracy
        assert row[head.index("val/eval/copy_choice/acc @4")] == row[head.index("eval/copy_choice/acc")]
    assert summary["complete"]


@pytest.mark.slow
def test_a_study_scores_each_confirmation_run_downstream_and_reports_it(tmp_path, capsys):
    import yaml

    (tmp_path / "tasks").mkdir()
    copy_tasks(tmp_path / "tasks", n=6)
    study = downstream_study(tmp_path / "tasks")
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    out = tmp_path / "report"
    assert main(["study", "run", str(path), "--report", "--out", str(out), "--format", "md,csv"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("downstream: copy_choice/acc") == 2 and "FAILED" not in printed
    report = (out / "results.md").read_text()
    assert "## Downstream tasks (lm-eval, mean over confirmation seeds)" in report
    row = next(line for line in report.splitlines() if line.startswith("| a "))
    assert "(n=2)" in row
    seeds = (out / "seeds.csv").read_text().splitlines()
    assert "eval/copy_choice/acc" in seeds[0] and "eval/copy_write/exact_match" in seeds[0] and len(seeds) == 3
