"""``corpus_lm`` on prepared corpora made here: streamed training windows (no training split is
built), evaluation windows fixed by the seed, bits per byte against an independent float64
computation, errors for windows longer than a split, and a real ``harness.train`` run."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
import torch
from scipy.special import logsumexp
from text import flat

import harness
from harness.data.corpus import open_corpus, window_starts
from harness.data.formats import LM
from harness.data.prepare import prepare
from harness.errors import ConfigError
from harness.run.system import masked_stats, summarize

WORDS = ["alpha", "beta", "gamma", "épsilon", "zeta", "中文", "ωμέγα"]


def corpus(tmp_path, docs=400, tokenizer="chars", name="out", short=False):
    rng = random.Random(0)
    lines = ["ab" if short else " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 30))) + f" {i}"
             for i in range(docs)]
    if short:  # distinct short documents (identical ones would all hash to one split)
        lines = [f"{i}" for i in range(docs)]
    src = tmp_path / f"{name}.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in lines))
    prepare([src], tmp_path / name, tokenizer=tokenizer, workers=1, progress=False)
    return tmp_path / name


def task(registry, path, seed=0, **params):
    return harness.create_task("corpus_lm", seed=seed, registry=registry, path=str(path), **params)


def test_training_windows_stream_from_the_train_split_fresh_every_step(tmp_path, registry):
    t = task(registry, corpus(tmp_path), length=16, eval_tokens=64)
    assert t.streams
    train = open_corpus(tmp_path / "out").split("train")
    stream = t.train_batches(16, 4, seed=3)
    first, second = next(stream), next(stream)
    assert first.shape == second.shape == (4, 17) and first.dtype == np.int64
    expected = window_starts(train.tokens, 16, 4, seed=(0, 3), step=0)
    assert (first == np.stack([train.read(int(s), 17) for s in expected])).all()
    assert not (first == second).all(), "every step draws new windows"
    again = t.train_batches(16, 4, seed=3)
    assert (next(again) == first).all(), "the same seeds give the same stream"
    other = task(registry, tmp_path / "out", seed=1, length=16, eval_tokens=64)
    assert not (next(other.train_batches(16, 4, seed=3)) == first).all(), "the task seed changes the data"


def test_ranks_of_a_run_draw_disjoint_windows(tmp_path, registry):
    t = task(registry, corpus(tmp_path), length=16, eval_tokens=64)
    streams = [t.train_batches(16, 4, seed=0, rank=r, world=3) for r in range(3)]
    for _ in range(5):
        rows = [tuple(row) for s in streams for row in next(s)]
        assert len(rows) == 12 and len(set(rows)) == 12


def test_evaluation_scores_the_same_text_at_every_length_and_for_every_candidate(tmp_path, registry):
    path = corpus(tmp_path)
    a = task(registry, path, length=16, eval_lengths=[32, 48], eval_tokens=96)
    b = task(registry, path, length=16, eval_lengths=[32, 48], eval_tokens=96)
    sliding = task(registry, path, length=16, eval_lengths=[32, 48], eval_tokens=96,
                   eval_protocol="sliding", score_last=8)

    def scored(t, split, n):
        return [tok for e in t.examples(split, n) for tok, m in
                zip(e["tokens"][1:], e.get("loss_mask") or [True] * n, strict=True) if m]

    for split in ("val", "test"):
        assert a.examples(split, 16) == b.examples(split, 16), "fixed by the seed: identical for every candidate"
        texts = [scored(a, split, n) for n in (16, 32, 48)] + [scored(sliding, split, n) for n in (16, 32, 48)]
        assert all(t == texts[0] for t in texts) and len(texts[0]) == 96
        data = open_corpus(path).split(split)
        start = a.eval_start(split)
        assert texts[0] == data.read(start + 1, 96).tolist()
    for e in sliding.examples("val", 48):
        assert len(e["tokens"]) == 49 and sum(e["loss_mask"]) == 8


def test_documents_shorter_than_a_window_are_packed_not_refused(tmp_path, registry):
    t = task(registry, corpus(tmp_path, docs=600, short=True), length=32, eval_tokens=32)
    window = next(t.train_batches(32, 2, seed=0))[0]
    assert (window == t.corpus.eod_id).sum() >= 5, "a window spans several short documents"


@pytest.mark.parametrize(("params", "expected"), [
    ({"length": 50_000, "eval_tokens": 50_000}, "longer than the train split"),
    ({"length": 16, "eval_lengths": [4_000], "eval_tokens": 100_000}, "longer than the val split"),
])
def test_windows_longer_than_a_split_are_config_errors(tmp_path, registry, params, expected):
    path = corpus(tmp_path, docs=100)
    with pytest.raises(ConfigError, match=expected):
        task(registry, path, **params)


def test_eval_tokens_beyond_a_small_split_score_the_whole_split_and_say_so(tmp_path, registry):
    """A small corpus trains with the default eval_tokens: each split scores what it holds past
    the context room, the config's warning says so (the run prints it and tags it)."""
    path = corpus(tmp_path, docs=100)
    val = open_corpus(path).split("val")
    assert val.tokens < 16_384 + 1 + 32
    t = task(registry, path, length=16, eval_lengths=[32])  # eval_tokens: the default 16,384
    scored = t.examples("val", 16)
    assert sum(sum(e["loss_mask"]) if "loss_mask" in e else len(e["tokens"]) - 1 for e in scored) \
        == (val.tokens - 1 - 32) // 16 * 16
    first = t.eval_start("val")
    assert first == 32, "the whole split past the context room"
    assert list(scored[0]["tokens"]) == val.read(32, 17).tolist()
    warned = t.config.meaningless()
    assert len(warned) == 1 and f"of {path} hold (val {val.tokens:,} tokens, test " in warned[0]
    assert f"the whole split is scored (val {val.tokens - 33:,} tokens, test " in warned[0]
    big = task(registry, path, length=16, eval_tokens=64)
    assert big.config.meaningless() == [], "a split that holds eval_tokens is not warned about"


def test_the_data_summary_names_the_prepared_folder_from_its_manifest(tmp_path, registry):
    import hashlib

    path = corpus(tmp_path, tokenizer="chars")
    t = task(registry, path, length=16, eval_tokens=64)
    manifest = json.loads((path / "manifest.json").read_text())
    text = t.data_summary()
    digest = hashlib.sha256((path / "manifest.json").read_bytes()).hexdigest()[:12]
    assert str(path.resolve()) in text and f"manifest sha256 {digest}" in text
    assert "out.jsonl" in text and "tokenizer chars" in text
    assert f"{manifest['splits']['train']['tokens']:,}/{manifest['splits']['val']['tokens']:,}/" in text
    assert t.data_params == ("path", "source", "tokenizer")


def test_an_unprepared_path_names_the_prepare_command(tmp_path, registry):
    (tmp_path / "raw").mkdir()
    with pytest.raises(ConfigError, match="harness data prepare"):
        task(registry, tmp_path / "raw")


def test_a_source_is_prepared_on_first_use_and_reused(tmp_path, registry):
    src = tmp_path / "mine.txt"
    src.write_text("\n\n".join(f"paragraph {i} " + "text " * 20 for i in range(300)))
    t = harness.create_task("corpus_lm", registry=registry, source=str(src), tokenizer="bpe:300",
                            path=str(tmp_path / "mine"), length=16, eval_tokens=64)
    assert t.corpus.manifest["tokenizer"]["name"] == "bpe:300"
    stamp = (tmp_path / "mine" / "manifest.json").stat().st_mtime_ns
    harness.create_task("corpus_lm", registry=registry, source=str(src), tokenizer="bpe:300",
                        path=str(tmp_path / "mine"), length=16, eval_tokens=64)
    assert (tmp_path / "mine" / "manifest.json").stat().st_mtime_ns == stamp


def test_sources_without_a_path_get_one_cache_folder_each(tmp_path, registry, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    folders = []
    for sub in ("a", "b"):  # two files of the same name
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "texts.txt").write_text("\n\n".join(f"{sub} paragraph {i} " * 5 for i in range(400)))
        t = harness.create_task("corpus_lm", registry=registry, source=str(tmp_path / sub / "texts.txt"),
                                length=16, eval_tokens=64)
        folders.append(t.corpus.root)
    assert folders[0] != folders[1] and all(f.parent == tmp_path / "cache" / "corpora" for f in folders)
    assert all(f.name.startswith("texts.txt-") and f.name.endswith("-bytes") for f in folders)
    shipped = harness.create_task("corpus_lm", registry=registry, length=16, eval_tokens=64)
    assert shipped.corpus.root == tmp_path / "cache" / "corpora" / "shakespeare-bytes"


def test_bits_per_byte_match_an_independent_float64_computation(tmp_path, registry):
    t = task(registry, corpus(tmp_path, tokenizer="chars"), length=16, eval_tokens=160)
    tok = t.corpus.tokenizer
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(t.vocab.size, 8), torch.nn.Linear(8, t.vocab.size))
    examples = t.examples("val", 16)
    table = torch.as_tensor(t.token_bytes, dtype=torch.float64)
    sums: dict[str, float] = {}
    for i in range(0, len(examples), 4):  # batches, as validation sums them
        batch = LM.collate(examples[i: i + 4], "lm")
        with torch.no_grad():
            stats = masked_stats(model(batch["tokens"]), batch, token_bytes=table)
        for key in ("nll_sum", "tokens", "correct", "exact", "sequences", "bytes"):
            sums[key] = sums.get(key, 0.0) + float(stats[key])
    got = summarize(sums, perplexity=True)["bpb"]
    # independently: float64 log-softmax of the same weights, bytes of the decoded scored text
    emb = model[0].weight.detach().double().numpy()
    w, b = model[1].weight.detach().double().numpy(), model[1].bias.detach().double().numpy()
    nats, targets = 0.0, []
    for e in examples:
        tokens = np.array(e["tokens"])
        logits = emb[tokens[:-1]] @ w.T + b
        nats -= float((logits[np.arange(16), tokens[1:]] - logsumexp(logits, axis=1)).sum())
        targets += tokens[1:].tolist()
    text_bytes = len(tok.decode(targets).encode("utf-8"))
    assert text_bytes > len(targets), "the text has multi-byte characters"
    assert got == pytest.approx(nats / math.log(2) / text_bytes, rel=1e-5)


@pytest.mark.slow
def test_corpus_lm_trains_end_to_end_without_building_a_training_split(tmp_path, registry, monkeypatch):
    from harness_plugins.tasks import corpus_lm

    path = corpus(tmp_path, tokenizer="bpe:320")
    asked = []
    original = corpus_lm.CorpusLMTask.generate
    monkeypatch.setattr(corpus_lm.CorpusLMTask, "generate",
                        lambda self, split, length: asked.append(split) or original(self, split, length))
    result = harness.train({
        "task": {"name": "corpus_lm", "params": {"path": str(path), "length": 16, "eval_lengths": [32],
                                                 "eval_tokens": 96}},
        "model": {"name": "transformer", "params": {"d_model": 32, "layers": 1, "heads": 2}},
        "train": {"max_steps": 4, "batch_size": 8, "val_every": 2, "warmup_steps": 0, "accelerator": "cpu",
                  "devices": 1, "num_threads": 1, "progress": False, "log_attention": False},
        "tracking": {"experiment": "corpus"}}, registry=registry)
    assert result.status == "FINISHED" and result.metrics["train/steps"] == 4
    assert "train" not in asked, "training streamed: no list of training examples was built"
    t = task(registry, path, length=16, eval_lengths=[32], eval_tokens=96)
    tok = t.corpus.tokenizer
    for n in (16, 32):
        targets = [x for e in t.examples("val", n) for x in e["tokens"][1:]]
        loss = result.metrics[f"val/loss_len{n}"]
        byte_count = len(tok.decode(targets).encode("utf-8"))
        assert result.metrics[f"val/bpb_len{n}"] == pytest.approx(loss / math.log(2) * len(targets) / byte_count, rel=1e-4)
        assert result.metrics[f"val/ppl_len{n}"] == pytest.approx(math.exp(loss))
    assert "val/bpb" in result.metrics


@pytest.mark.slow
def test_corpus_lm_trains_with_ddp_spawn_on_two_cpu_processes(tmp_path, registry):
    """The streaming path runs under ddp_spawn: each process streams its share (its rank and
    the world size from the trainer; disjointness is tested above) and the validation sums,
    bytes included, are reduced over both processes."""
    path = corpus(tmp_path)
    cfg = {"task": {"name": "corpus_lm", "params": {"path": str(path), "length": 16, "eval_tokens": 64}},
           "model": {"name": "transformer", "params": {"d_model": 16, "layers": 1, "heads": 2},
                     "position": {"name": "none"}},
           "train": {"max_steps": 4, "batch_size": 4, "val_every": 2, "warmup_steps": 0, "accelerator": "cpu",
                     "num_threads": 1, "progress": False, "log_attention": False},
           "tracking": {"experiment": "corpus-ddp"}}
    single = harness.train(cfg, registry=registry)
    cfg["train"].update(devices=2, strategy="ddp_spawn")
    spawned = harness.train(cfg, registry=registry)
    assert spawned.status == "FINISHED" and spawned.metrics["train/steps"] == 4
    assert math.isfinite(spawned.metrics["val/bpb"]) and spawned.metrics["val/bpb"] > 0
    assert {k for k in spawned.metrics if k.startswith("val/")} == {k for k in single.metrics if k.startswith("val/")}


def study_file(tmp_path, candidates_task):
    import yaml

    model = {"name": "transformer", "params": {"d_model": 16, "layers": 1, "heads": 2},
             "search_declared": False, "position": {"name": "none", "search_declared": False}}
    study = {"name": "tokenizers", "task": {"name": "corpus_lm", "params": {"length": 16, "eval_tokens": 64}},
             "candidates": [{"name": name, "model": model, "task": task} for name, task in candidates_task],
             "objective": {"metric": "bpb"}, "search": {"lr": [3.0e-3]},
             "train": {"batch_size": 4, "val_every": 2, "num_threads": 1, "log_attention": False},
             "budget": {"trials": 1, "steps": 2}, "confirm": {"seeds": 2}, "pruner": {"name": "none"}}
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def test_candidates_may_each_read_their_own_prepared_folder(tmp_path, registry):
    """The tokenizer as what a study compares: one text, two prepared folders, ranked by bpb."""
    from harness.study.schema import load_study_config
    from harness.study.space import validate

    by_bytes, by_chars = corpus(tmp_path, tokenizer="bytes", name="b"), corpus(tmp_path, tokenizer="chars", name="c")
    path = study_file(tmp_path, [("bytes", {"path": str(by_bytes)}), ("chars", {"path": str(by_chars)})])
    space = validate(load_study_config(path), registry)
    runs = {c.name: space.run_config(c, None, seed=0) for c in space.candidates}
    assert runs["bytes"]["task"] == {"name": "corpus_lm", "params": {"length": 16, "eval_tokens": 64, "path": str(by_bytes)}}
    assert runs["chars"]["task"]["params"]["path"] == str(by_chars)
    vocab = {c.name: space.task_for(runs[c.name]["task"]["params"]).vocab.size for c in space.candidates}
    assert vocab["bytes"] == 261 and vocab["chars"] < 261


@pytest.mark.parametrize(("task", "expected"), [
    ({"paht": "x"}, "candidates[1] (b): task.params: unknown parameter 'paht'"),
    ({"path": "not/prepared"}, "harness data prepare"),
])
def test_a_candidates_bad_task_params_fail_validation(tmp_path, registry, task, expected):
    from harness.study.schema import load_study_config
    from harness.study.space import validate

    good = corpus(tmp_path)
    path = study_file(tmp_path, [("a", {"path": str(good)}), ("b", task)])
    with pytest.raises(ConfigError) as err:
        validate(load_study_config(path), registry)
    assert expected in str(err.value)


@pytest.mark.slow
def test_a_study_ranks_two_tokenizers_of_one_text_by_bits_per_byte(tmp_path, registry, capsys):
    from harness.cli.main import main

    by_bytes, by_chars = corpus(tmp_path, tokenizer="bytes", name="b"), corpus(tmp_path, tokenizer="chars", name="c")
    path = study_file(tmp_path, [("bytes", {"path": str(by_bytes)}), ("chars", {"path": str(by_chars)})])
    out = tmp_path / "report"
    assert main(["study", "run", str(path), "--report", "--out", str(out), "--format", "json,md"]) == 0
    assert "FAILED" not in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert sorted(c["name"] for c in summary["candidates"]) == ["bytes", "chars"]
    assert summary["complete"] and all(len(c["runs"]) == 2 for c in summary["candidates"])
    md = (out / "results.md").read_text()  # each candidate's folder, from its manifest
    assert f"data read: bytes: prepared corpus {by_bytes.resolve()} (manifest sha256 " in md
    assert f"; chars: prepared corpus {by_chars.resolve()} (manifest sha256 " in md


def test_training_on_an_unprepared_path_exits_2_with_the_prepare_command(tmp_path, capsys):
    from harness.cli.main import main

    (tmp_path / "raw").mkdir()
    code = main(["train", "--task", "corpus_lm", "--model", "transformer", "--max-steps", "1", "--no-progress",
                 "--set", f"task.params.path={tmp_path / 'raw'}"])
    err = flat(capsys.readouterr().err)
    assert code == 2 and "Traceback" not in err
    assert f"Prepare it first: harness data prepare YOUR_FILES... --tokenizer bytes --out {tmp_path / 'raw'}" in err


def test_a_budget_that_outgrows_the_corpus_is_warned(tmp_path, registry):
    """More than 4 passes over a prepared train split: the run says so (once it is prepared;
    nothing is opened or prepared to check)."""
    from harness.config import parse_run_config
    from harness.run.plan import plan
    from harness.run.sanity import meaningless

    path = corpus(tmp_path)
    tokens = open_corpus(path).split("train").tokens

    def warnings(steps: int, where: str = str(path)) -> list[str]:
        cfg = parse_run_config({"task": {"name": "corpus_lm", "params": {"path": where, "length": 16}},
                                "model": {"name": "transformer"},
                                "train": {"max_steps": steps, "batch_size": 8}})
        return [w for w in meaningless(plan(cfg, registry)) if "the corpus's train split" in w]

    four_passes = 4 * tokens // (8 * 16)
    assert warnings(four_passes) == []
    [text] = warnings(four_passes + tokens // (8 * 16) + 1)
    assert f"({tokens:,} tokens)" in text and "task.params.path" in text and "5.0 times" in text
    assert warnings(10**6, where=str(tmp_path / "not-prepared")) == []


def test_a_study_whose_compute_budgets_outgrow_the_corpus_says_so_before_it_runs(tmp_path, registry):
    """A scaling study on a small prepared corpus: its largest budget would read the train split
    many times over; the study's notes name the cells and the factor."""
    import yaml

    from harness.study.schema import load_study_config
    from harness.study.space import validate

    path = corpus(tmp_path)
    study = {"name": "outgrow", "task": {"name": "corpus_lm", "params": {"path": str(path), "length": 16,
                                                                       "eval_tokens": 64}},
             "candidates": [{"name": "att", "model": {"name": "transformer", "params": {"layers": 1, "ffn_mult": 2},
                                                      "search_declared": False}}],
             "objective": {"metric": "bpb"},
             "scaling": {"sizes": [{"d_model": 16, "heads": 2}, {"d_model": 24, "heads": 2},
                                   {"d_model": 32, "heads": 2}],
                         "budgets": [1e9, 1e10, 1e11], "transfer": {"rule": "scaled", "lr": 1e-2, "width": 16}},
             "train": {"batch_size": 8, "num_threads": 1}, "budget": {"trials": 1}, "pruner": {"name": "none"}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(study))
    cfg = load_study_config(tmp_path / "s.yaml")
    notes = " ".join(validate(cfg, registry).notes)
    assert "more than 4 times over for: " in notes and "att.s1.c1e11 (" in notes
    assert "att.s1.c1e9 (" not in notes  # ~1 pass: fine
