"""The RULER-style tasks (harness_plugins/tasks/ruler): where the needle sits, what the answer
is, how it is scored, in symbols and in text through a prepared corpus's tokenizer.

Each property is checked from the tokens alone, independently of the generator: the needle's
position against the depth asked for, the answers recomputed from the context (the kit's
references, here on text too), the score against a hand count, Zipf counts against
``scipy.special.zeta``. The conformance kit (tests/test_conformance.py) runs the rest.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from scipy.special import zeta

import harness
from harness.data.formats import LM
from harness.errors import ConfigError
from harness.params import resolve
from harness.plugin import prepare_corpus
from harness_plugins.tasks import ruler_words as words
from harness_plugins.tasks.ruler.base import unit_recall, units_of
from harness_plugins.tasks.ruler_words import zipf_counts

TEXT = ("It was the best of times, it was the worst of times. The sky was blue and the grass "
        "was green. Here we go; there and back again.\n") * 60


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A small prepared corpus (bytes) and one with a learned BPE vocabulary."""
    tmp = tmp_path_factory.mktemp("ruler")
    src = tmp / "text.txt"
    src.write_text("\n\n".join(f"Document {i}. " + TEXT for i in range(40)))
    out = {}
    for tok in ("bytes", "bpe:300"):
        folder = tmp / tok.replace(":", "-")
        prepare_corpus([src], folder, tokenizer=tok, progress=False, split_fractions=(0.6, 0.2, 0.2))
        out[tok] = str(folder)
    return out


def make(registry, name, **params):
    spec = registry.get("task", name)
    return spec.build(resolve(spec.config, params, "test"), seed=0)


def test_a_single_needle_sits_at_its_depth_and_is_the_answer(registry):
    task = make(registry, "needle", length=64, eval_lengths=(128,), num_train=8, num_val=10)
    is_, ask, eq = task.sym("is", "?", "=")
    for length in (64, 128):
        examples = task.examples("val", length)
        assert [e["depth"] for e in examples] == [0, 25, 50, 75, 100] * 2
        for e in examples:
            tokens = e["tokens"]
            assert len(tokens) == length + 1
            at = next(i for i in range(len(tokens) - 1) if tokens[i + 1] == is_)
            key, value = tokens[at], tokens[at + 2]
            room = length + 1 - 3 - 4  # needle k is v; question ? k = v
            assert at == round(e["depth"] / 100 * room)
            assert tokens[-4:] == [ask, key, eq, value]
            assert units_of(e) == [[value]] and sum(e["loss_mask"]) == 1
    assert all("depth" not in e for e in task.examples("train", 64))


@pytest.mark.parametrize("variant", [
    {"num_keys": 4},  # multikey: three distractors
    {"num_values": 3},  # multivalue
    {"num_keys": 4, "num_queries": 2, "num_values": 2},  # multiquery, several values
    {"value_length": 3, "num_values": 2},
])
def test_every_variant_answers_what_the_context_says(registry, variant):
    task = make(registry, "needle", length=96, num_train=20, num_val=20, **variant)
    spec = registry.get("task", "needle")
    examples = list(task.examples("train", 96)) + list(task.examples("val", 96))
    assert all(spec.reference(task, e) for e in examples)
    asked = variant.get("num_queries", 1) * variant.get("num_values", 1)
    assert all(len(units_of(e)) == asked for e in examples)


def test_the_other_tasks_answer_what_their_context_says(registry):
    for name, params in [("variable_tracking", {"num_chains": 3, "num_hops": 3}),
                         ("common_words", {}), ("frequent_words", {})]:
        task = make(registry, name, length=128, eval_lengths=(256,), num_train=10, num_val=10, **params)
        spec = registry.get("task", name)
        for n in (128, 256):
            assert all(spec.reference(task, e) for e in task.examples("val", n)), name


def test_a_variable_chain_lies_past_its_depth(registry):
    task = make(registry, "variable_tracking", length=128, num_train=4, num_val=20, num_hops=4)
    eq = task.sym("=")[0]
    for e in task.examples("val", 128):
        tokens = e["tokens"]
        chain = [u[0] for u in units_of(e)]
        where = [next(i for i in range(len(tokens) - 2) if tokens[i] == v and tokens[i + 1] == eq) for v in chain]
        assert where == sorted(where)  # assigned in order
        room = 129 - 5 * 3 - 3 - 9  # five statements, ? n :, five names and four commas
        assert where[0] == round(e["depth"] / 100 * room)


def test_frequent_words_follow_zipf(registry):
    z = float(zeta(2.0))
    assert words.zeta(2.0) == pytest.approx(z, rel=1e-9) and words.zeta(3.5) == pytest.approx(float(zeta(3.5)), rel=1e-9)
    assert zipf_counts(1000, 2.0, z) == [int(1000 * k ** -2.0 / z) for k in range(1, len(zipf_counts(1000, 2.0, z)) + 1)]
    task = make(registry, "frequent_words", length=256, num_train=4, num_val=4)
    e = task.examples("val", 256)[0]
    tokens, noise, ask = e["tokens"], *task.sym("...", "?")
    context = tokens[: tokens.index(ask)]
    counts = sorted((context.count(t) for t in set(context)), reverse=True)
    n = max(m for m in range(1, 400) if sum(int(m * k ** -2.0 / z) for k in range(1, 50)) <= 256 + 1 - 7)  # ? : then 3 words, 2 commas
    assert counts == [c for c in (int(n * k ** -2.0 / z) for k in range(1, 50)) if c]
    assert context.count(noise) == counts[0]


def test_common_words_repeat_as_configured(registry):
    task = make(registry, "common_words", length=128, num_train=4, num_val=4, num_common=3, freq_common=5,
                freq_uncommon=2)
    for e in task.examples("val", 128):
        context = e["tokens"][: e["tokens"].index(task.sym("?")[0])]
        common = [u[0] for u in units_of(e)]
        assert [context.count(w) for w in common] == [5, 5, 5]
        assert {context.count(w) for w in set(context) - set(common)} == {2}
        assert common == sorted(common, key=context.index)


def test_too_short_a_length_is_refused_with_the_length_needed(registry):
    with pytest.raises(ValueError, match="raise length .* to at least 9"):
        make(registry, "needle", length=8, num_keys=2, num_train=2, num_val=5).examples("train", 8)
    with pytest.raises(ConfigError, match="num_queries .* more keys"):
        make(registry, "needle", num_keys=1, num_queries=2)
    with pytest.raises(ConfigError, match="set path"):
        make(registry, "needle", haystack="corpus")
    with pytest.raises(ConfigError, match="distinct percents"):
        make(registry, "needle", depths=(0, 120))


def test_recall_counts_whole_units(registry):
    """Hand-made logits: the score is the share of answer units whose every token is right."""
    assert unit_recall([False, True, True, False, True], [True, True, False, True, True]) == 0.5
    assert unit_recall([False, False], [True, True]) is None
    task = make(registry, "needle", length=40, num_train=2, num_val=10, num_values=3, value_length=2)
    examples = list(task.examples("val", 40))
    batch = LM.collate(examples, "lm")
    logits = torch.nn.functional.one_hot(batch["targets"], task.vocab.size).float()
    broken = 0
    for i in range(len(examples)):  # break one token of the first unit of every other example
        if i % 2:
            j = int(batch["loss_mask"][i].nonzero()[0])
            logits[i, j] = torch.roll(logits[i, j], 1)
            broken += 1
    stats = task.statistics(None, batch, LM, logits)
    metrics = task.metrics_from_statistics(stats)
    assert metrics["recall"] == pytest.approx(1 - broken / len(examples) / 3)
    for d in task.depths:
        rows = [i for i, e in enumerate(examples) if e["depth"] == d]
        assert metrics[f"recall_depth{d}"] == pytest.approx(sum(1 - (i % 2) / 3 for i in rows) / len(rows))


@pytest.mark.parametrize("tok", ["bytes", "bpe:300"])
def test_text_tasks_write_ruler_sentences_through_the_corpus_tokenizer(registry, corpus, tok):
    path = corpus[tok]
    for name, params in [("needle", {"num_keys": 3, "num_values": 2, "num_queries": 2}),
                         ("variable_tracking", {"num_chains": 2}), ("common_words", {}), ("frequent_words", {})]:
        for hay in ("corpus", "random"):
            task = make(registry, name, length=700, num_train=3, num_val=5, path=path, haystack=hay, **params)
            spec = registry.get("task", name)
            assert task.vocab.size == task.corpus.vocab_size
            for e in list(task.examples("val", 700)) + list(task.examples("train", 700)):
                assert spec.reference(task, e), (name, hay)
                assert len(e["tokens"]) <= 701 and (name.endswith("words") or len(e["tokens"]) == 701)
    task = make(registry, "needle", length=500, num_train=3, num_val=5, path=path, haystack="corpus")
    text = task.tokenizer.decode(task.examples("val", 500)[0]["tokens"])
    assert re.search(r"One of the special magic numbers for \w+ is: \d{7}\.", text)
    assert "What is the special magic number for" in text
    hay = re.sub(r" ?One of the special magic numbers for \w+ is: \d{7}\.", "", text.split("\nWhat is")[0])
    assert hay.strip()[:40] in "\n\n".join(f"Document {i}. " + TEXT for i in range(40))  # the corpus's own text


def test_a_tokenizer_that_cannot_spell_the_needle_is_refused(registry, tmp_path):
    src = tmp_path / "letters.txt"
    src.write_text("\n\n".join("abc def ghi " * 50 + "a" * i for i in range(20)))  # 20 documents
    folder = tmp_path / "chars"
    prepare_corpus([src], folder, tokenizer="chars", progress=False, split_fractions=(0.5, 0.5, 0))
    task = make(registry, "needle", length=300, num_train=2, num_val=5, path=str(folder))
    with pytest.raises(ConfigError, match="cannot spell"):
        task.examples("val", 300)


def test_a_run_logs_every_cell_the_grid_mean_and_a_heatmap(tmp_path):
    result = harness.train({
        "task": {"name": "needle", "params": {"length": 24, "eval_lengths": [48], "depths": [0, 50, 100],
                                              "num_train": 64, "num_val": 12, "keys": 8, "values": 8, "words": 8}},
        "model": {"name": "transformer", "params": {"d_model": 16, "layers": 1, "heads": 2}},
        "train": {"max_steps": 2, "batch_size": 8, "val_every": 2, "progress": False, "num_threads": 1}})
    m = result.metrics
    cells = {(n, d): m[f"val/recall_depth{d}_len{n}"] for n in (24, 48) for d in (0, 50, 100)}
    assert m["val/recall_grid"] == pytest.approx(sum(cells.values()) / 6)
    for n in (24, 48):  # four examples per depth: the length's recall is the mean of its cells
        assert m[f"val/recall_len{n}"] == pytest.approx(sum(cells[(n, d)] for d in (0, 50, 100)) / 3)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(harness.store.tracking.tracking_uri(None))
    names = {a.path for a in client.list_artifacts(result.run_id, "plots")}
    assert {"plots/heatmap_recall.png", "plots/heatmap_recall.json"} <= names
    logged = client.get_run(result.run_id).data.metrics
    assert logged["val/recall_depth50_len48"] == pytest.approx(cells[(48, 50)])
    assert math.isfinite(logged["cost/state_bytes"]) and logged["cost/state_bytes"] == 4 * logged["cost/state_size"]
