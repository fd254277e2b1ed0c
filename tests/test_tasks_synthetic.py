"""Synthetic probe tasks: generator invariants checked from the sequences themselves,
determinism, splits, evaluation lengths, batch masks and config validation.

Budget: about 5 s on 2 CPU cores.
"""

from __future__ import annotations

import collections
import math
import re
from typing import Any

import pytest

from harness.data.formats import collate
from harness.data.vocab import PAD, SEP
from harness.errors import ConfigError
from harness.params import resolve

# small but non-trivial settings per task, with one evaluation length longer than training
SETTINGS: dict[str, dict[str, Any]] = {
    "sort": {"length": 8, "vocab": 12, "eval_lengths": (16,)},
    "associative_recall": {"length": 32, "vocab": 32, "num_kv_pairs": 4, "eval_lengths": (64,)},
    "selective_copy": {"length": 24, "num_tokens": 6, "vocab": 8, "eval_lengths": (48,)},
    "induction_head": {"length": 16, "vocab": 8, "eval_lengths": (40,)},
    "skip_dependency": {"length": 24, "num_cues": 6, "num_fillers": 16, "num_decoys": 2,
                        "eval_lengths": (64,)},
}
SIZES = {"num_train": 300, "num_val": 100}
KINDS = {"sort": "seq2seq", "associative_recall": "lm", "selective_copy": "seq2seq",
         "induction_head": "lm", "skip_dependency": "lm"}
# batch formats each task can be served in: lm tasks only as lm; seq2seq tasks natively
# (encoder-decoder models) and as ``src SEP tgt`` (decoder-only models)
FORMATS = [(name, fmt) for name, kind in sorted(KINDS.items())
           for fmt in (("lm", "seq2seq") if kind == "seq2seq" else ("lm",))]


def make(registry: Any, name: str, seed: int = 0, **overrides: Any) -> Any:
    """Build a task exactly as a run does: registry spec, params validated by ``resolve``."""
    spec = registry.get("task", name)
    params = {**SETTINGS[name], **SIZES, **overrides}
    return spec.build(resolve(spec.config, params, "task.params"), seed=seed)


def all_examples(task: Any) -> list[tuple[int, dict[str, Any]]]:
    return [(n, e) for n in task.eval_lengths for split in ("train", "val")
            for e in task.examples(split, n)]


# -- contract shared by every synthetic task ------------------------------------------------
@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_same_seed_same_data_other_seed_or_split_other_data(registry, name):
    a, b, c = make(registry, name, seed=3), make(registry, name, seed=3), make(registry, name, seed=4)
    n = a.train_length
    assert a.examples("train", n) == b.examples("train", n)
    assert a.examples("val", n) == b.examples("val", n)
    assert a.examples("train", n) != c.examples("train", n)
    assert a.examples("train", n)[: a.config.num_val] != a.examples("val", n)
    assert len(a.examples("train", n)) == SIZES["num_train"]
    assert len(a.examples("val", n)) == SIZES["num_val"]


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_every_eval_length_gives_examples_of_that_length(registry, name):
    task = make(registry, name)
    assert task.eval_lengths == tuple(sorted({SETTINGS[name]["length"], *SETTINGS[name]["eval_lengths"]}))
    for n in task.eval_lengths:
        for e in task.examples("val", n):
            if task.task_kind == "seq2seq":
                assert len(e["src"]) == n
            else:
                assert len(e["tokens"]) == n + 1 and len(e["loss_mask"]) == n
            tokens = e.get("tokens", []) + e.get("src", []) + e.get("tgt", [])
            assert all(task.vocab.first_symbol <= t < task.vocab.size for t in tokens)


def scored_answers(task: Any, example: dict[str, Any]) -> list[int]:
    """The tokens a correct model must produce, recomputed from the example's content
    (independently of the generator) for each task."""
    if task.task_kind == "seq2seq":
        return list(example["tgt"])
    tokens, mask = example["tokens"], example["loss_mask"]
    return [tokens[i + 1] for i, m in enumerate(mask) if m]


def test_each_task_declares_its_kind(registry):
    for name, kind in KINDS.items():
        assert registry.get("task", name).task_kind == kind
        assert make(registry, name).task_kind == kind


@pytest.mark.parametrize(("name", "fmt"), FORMATS)
def test_collate_masks_score_exactly_the_answers(registry, name, fmt):
    task = make(registry, name)
    n = max(task.eval_lengths)
    examples = list(task.examples("val", n)[:7]) + list(task.examples("val", task.train_length)[:5])
    batch = collate(examples, fmt, task.task_kind)
    mask, targets = batch["loss_mask"], batch["targets"]
    for row, e in enumerate(examples):
        assert targets[row][mask[row]].tolist() == scored_answers(task, e)
    if fmt == "lm":
        real = [len(e["tokens"]) - 1 if "tokens" in e else len(e["src"]) + len(e["tgt"])
                for e in examples]
        assert (~batch["padding_mask"]).sum(1).tolist() == real
        assert not (mask & batch["padding_mask"]).any()
        assert (batch["tokens"][batch["padding_mask"]] == PAD).all()
    else:
        assert batch["src_padding_mask"].sum(1).tolist() == [
            batch["src"].shape[1] - len(e["src"]) for e in examples]
        assert (~batch["tgt_padding_mask"]).sum(1).tolist() == [len(e["tgt"]) for e in examples]


# -- sort -----------------------------------------------------------------------------------
def test_sort_target_is_the_sorted_source_in_symbol_order(registry):
    task = make(registry, "sort")
    for _, e in all_examples(task):
        assert e["tgt"] == sorted(e["src"])
        names = [task.vocab.token(t) for t in e["tgt"]]
        assert [int(s) for s in names] == sorted(int(s) for s in names)
    repeats = sum(len(set(e["src"])) < len(e["src"]) for _, e in all_examples(task))
    assert repeats > 0, "with 8 draws from 12 symbols, repeated symbols must occur"


# -- associative recall (Zoology MQAR) ------------------------------------------------------
def parse_mqar(task: Any, e: dict[str, Any]) -> tuple[dict[int, int], list[int]]:
    """The key -> value bindings of the prefix and the scored positions."""
    d = task.config.num_kv_pairs
    tokens = e["tokens"]
    bindings = dict(zip(tokens[0: 2 * d: 2], tokens[1: 2 * d: 2], strict=True))
    return bindings, [i for i, m in enumerate(e["loss_mask"]) if m]


def test_mqar_answers_are_the_values_bound_earlier_and_only_they_are_scored(registry):
    task = make(registry, "associative_recall")
    d = task.config.num_kv_pairs
    half = task.vocab.first_symbol + task.config.vocab // 2
    for _, e in all_examples(task):
        tokens = e["tokens"]
        bindings, scored = parse_mqar(task, e)
        assert len(bindings) == d, "keys of one example are distinct"
        assert len(set(bindings.values())) == d, "values of one example are distinct"
        assert all(task.vocab.first_symbol <= k < half for k in bindings), "keys: first half"
        assert all(half <= v < task.vocab.size for v in bindings.values()), "values: second half"
        assert len(scored) == d, "one scored answer per key, nothing else"
        assert sorted(tokens[i] for i in scored) == sorted(bindings), "every key queried once"
        for i in scored:
            assert i >= 2 * d and (i - 2 * d) % 2 == 0, "queries sit in slots after the prefix"
            assert tokens[i + 1] == bindings[tokens[i]]


def test_mqar_key_and_value_halves_are_disjoint_named_symbols(registry):
    task = make(registry, "associative_recall")
    symbols = task.vocab.symbols
    keys = {s for s in symbols if s.startswith("k")}
    values = {s for s in symbols if s.startswith("v")}
    assert len(keys) == len(values) == task.config.vocab // 2 and not keys & values


def power_law(slots: int, a: float) -> list[float]:
    """Zoology's query-gap distribution over slot ranks 1..slots, normalised."""
    w = [a * i ** (a - 1) for i in range(1, slots + 1)]
    return [x / sum(w) for x in w]


@pytest.mark.parametrize("power_a", [0.01, 0.5, 1.0])
def test_mqar_query_gaps_follow_the_requested_power_law(registry, power_a):
    # one key-value pair: the only query's slot is one draw from the distribution
    task = make(registry, "associative_recall", num_kv_pairs=1, length=42, power_a=power_a,
                num_train=4000, eval_lengths=())
    slots = (42 - 2) // 2
    counts = collections.Counter((parse_mqar(task, e)[1][0] - 2) // 2
                                 for e in task.examples("train", 42))
    expected = power_law(slots, power_a)
    total_variation = sum(abs(counts[i] / 4000 - p) for i, p in enumerate(expected)) / 2
    assert total_variation < 0.05, (power_a, total_variation)


def test_mqar_gaps_reach_further_at_longer_evaluation_lengths(registry):
    task = make(registry, "associative_recall", power_a=1.0)
    far = {n: max(max(parse_mqar(task, e)[1]) for e in task.examples("val", n))
           for n in task.eval_lengths}
    assert far[32] < 32 - 1, "queries stay inside the sequence"
    assert far[64] > 32, "longer sequences put some queries beyond the training length"


# -- selective copy -------------------------------------------------------------------------
def test_selective_copy_target_is_the_source_without_noise_in_order(registry):
    task = make(registry, "selective_copy")
    noise = [i for i, s in enumerate(task.vocab.symbols, task.vocab.first_symbol) if s == "."]
    assert len(noise) == 1
    for n, e in all_examples(task):
        content = [t for t in e["src"] if t != noise[0]]
        assert e["tgt"] == content
        assert len(content) == task.config.num_tokens
        assert e["src"].count(noise[0]) == n - task.config.num_tokens
    positions = {tuple(i for i, t in enumerate(e["src"]) if t != noise[0])
                 for e in task.examples("train", task.train_length)}
    assert len(positions) > 250, "content positions vary from example to example"


# -- induction head -------------------------------------------------------------------------
def test_induction_head_answer_is_the_token_after_the_earlier_trigger(registry):
    task = make(registry, "induction_head")
    trigger = task.vocab.symbols.index("T") + task.vocab.first_symbol
    distances = set()
    for n, e in all_examples(task):
        tokens = e["tokens"]
        where = [i for i, t in enumerate(tokens) if t == trigger]
        assert len(where) == 2 and where[1] == n - 1, "trigger once in context, once at the end"
        assert where[0] + 1 < n - 1
        assert tokens[n] == tokens[where[0] + 1]
        assert e["loss_mask"] == [False] * (n - 1) + [True]
        distances.add(n - 1 - where[0])
    assert min(distances) == 2 and max(distances) == 39, "the trigger may be anywhere"


# -- skip dependency ------------------------------------------------------------------------
def skip_parts(task: Any, e: dict[str, Any]) -> dict[str, Any]:
    """Find the opening phrase and the trigger by their words; return cue, answer, decoys."""
    words = [task.vocab.token(t) for t in e["tokens"]]
    starts = [i for i in range(len(words) - 3) if words[i: i + 2] == ["check", "the"]]
    assert len(starts) == 1 and words[starts[0] + 3] == "log"
    cue_at = starts[0] + 2
    assert words[-3:-1] == ["it", "ran"] and words[:-3].count("it") == 0
    cues = [i for i, w in enumerate(words) if re.fullmatch(r"c\d+", w)]
    return {"cue": words[cue_at], "cue_at": cue_at, "answer": words[-1],
            "decoys": [words[i] for i in cues if i != cue_at]}


def test_skip_dependency_answer_is_a_function_of_the_far_cue_only(registry):
    task = make(registry, "skip_dependency")
    answer_of: dict[str, set[str]] = collections.defaultdict(set)
    answer_given_decoys: dict[tuple[str, ...], set[str]] = collections.defaultdict(set)
    for n, e in all_examples(task):
        parts = skip_parts(task, e)
        answer_of[parts["cue"]].add(parts["answer"])
        answer_given_decoys[tuple(sorted(parts["decoys"]))].add(parts["answer"])
        assert len(parts["decoys"]) == task.config.num_decoys
        assert parts["cue"] not in parts["decoys"]
        assert n - parts["cue_at"] >= 3 * (n - 6) // 4, "the cue is far from the answer"
        assert e["loss_mask"] == [False] * (n - 1) + [True]
    # the same cue always gives the same answer, whatever the fillers and decoys ...
    assert all(len(a) == 1 for a in answer_of.values())
    # ... different cues give different answers (the answer identifies the cue) ...
    assert len(answer_of) == task.config.num_cues
    assert len({next(iter(a)) for a in answer_of.values()}) == task.config.num_cues
    # ... and the decoys say nothing about it: the same decoys come with several answers
    assert max(len(a) for a in answer_given_decoys.values()) > 1


# -- config validation speaks to the user ---------------------------------------------------
@pytest.mark.parametrize(("name", "params", "message"), [
    ("associative_recall", {"num_kv_pairs": 16, "length": 32, "eval_lengths": ()}, "at least 4 * num_kv_pairs"),
    ("associative_recall", {"num_kv_pairs": 20, "vocab": 32, "length": 128, "eval_lengths": ()},
     "raise vocab"),
    ("selective_copy", {"num_tokens": 30, "length": 24}, "shorter than num_tokens"),
    ("skip_dependency", {"length": 7, "eval_lengths": ()}, "too short"),
    ("induction_head", {"length": 3, "eval_lengths": ()}, "greater than or equal to 4"),
    # every task: an evaluation length below the training length is refused, by name
    ("skip_dependency", {"length": 24, "eval_lengths": (7,)}, "eval_lengths [7] are shorter"),
    ("induction_head", {"eval_lengths": (3,)}, "eval_lengths [3] are shorter"),
])
def test_impossible_configs_are_rejected_with_the_reason(registry, name, params, message):
    spec = registry.get("task", name)
    with pytest.raises(ConfigError, match=re.escape(message)):
        resolve(spec.config, {**SETTINGS[name], **params}, "task.params")


def test_default_sizes_are_cpu_friendly(registry):
    """Defaults train in minutes on a CPU: short sequences, a small vocabulary."""
    for name in SETTINGS:
        cfg = registry.get("task", name).config()
        assert cfg.length <= 64 and math.prod([cfg.num_train, cfg.length]) <= 10_000 * 64


def test_decoder_only_view_of_seq2seq_tasks_separates_source_and_target(registry):
    task = make(registry, "sort")
    e = task.examples("val", 8)[0]
    batch = collate([e], "lm", task.task_kind)
    assert batch["tokens"][0].tolist() == e["src"] + [SEP] + e["tgt"][:-1]
