"""MAD's four tasks (noisy and fuzzy in-context recall, memorization, compression): the data
checked against the task definitions of Poli et al. 2024 re-derived here from the sequences
themselves, on seeds the generators' own checks never use.

Budget: about 5 s on 2 CPU cores.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from scipy import stats

from harness.errors import HarnessError
from harness.params import resolve

SIZES = {"num_train": 200, "num_val": 60}
FRESH = (11, 12)  # seeds the conformance kit does not use


def make(registry: Any, name: str, seed: int, **params: Any) -> Any:
    spec = registry.get("task", name)
    return spec.build(resolve(spec.config, {**SIZES, **params}, "task.params"), seed=seed)


def kind(task: Any, token: int) -> str:
    """The symbol's class by its name: k (key), v (value), n (noise), or the symbol."""
    return task.vocab.token(token)[0]


# -- noisy in-context recall (MAD's in-context recall with frac_noise 0) --------------------
@pytest.mark.parametrize("seed", FRESH)
def test_noisy_recall_scores_exactly_values_recoverable_from_the_context(registry, seed):
    task = make(registry, "noisy_recall", seed, length=64, vocab=32, noise_vocab=16, frac_noise=0.4)
    # MAD's vocab_size counts the noise symbols: 32 - 16 = 16 content symbols, half keys
    assert [kind(task, t) for t in task.keys].count("k") == 8 and len(task.values) == 8
    assert len(task.noise) == 16
    noise_slots = slots = 0
    for e in task.examples("val", 64):
        tokens, mask = e["tokens"], e["loss_mask"]
        assert len(tokens) == 64 and len(mask) == 63
        for j, scored in enumerate(mask):
            target, pos = tokens[j + 1], j + 1
            if scored:  # a value whose key appeared earlier with this same value
                assert pos % 2 == 1 and kind(task, target) == "v"
                key = tokens[pos - 1]
                earlier = [tokens[p + 1] for p in range(0, pos - 1, 2) if tokens[p] == key]
                assert earlier and set(earlier) == {target}
            elif pos % 2 == 1 and kind(task, tokens[pos - 1]) == "k":  # an unscored value: first sight
                assert all(tokens[p] != tokens[pos - 1] for p in range(0, pos - 1, 2))
        assert mask[-1], "the last slot's value is the query"
        pairs = list(zip(tokens[:-2:2], tokens[1:-2:2], strict=True))
        slots += len(pairs)
        noise_slots += sum(kind(task, a) == "n" for a, _ in pairs)
        assert all((kind(task, a) == "n") == (kind(task, b) == "n") for a, b in pairs)
    # one slot per example is never noise: the others are noise with probability 0.4
    n = slots - len(task.examples("val", 64))
    assert stats.binomtest(noise_slots, n, 0.4).pvalue > 1e-3
    train = task.examples("train", 64)[0]
    assert all(train["loss_mask"]), "training scores every next token (MAD's is_training)"


def test_noisy_recall_without_noise_is_mads_in_context_recall(registry):
    task = make(registry, "noisy_recall", 13, length=32, vocab=16, noise_vocab=0, frac_noise=0.0)
    assert len(task.keys) == 8 and len(task.values) == 8 and len(task.noise) == 0
    for e in task.examples("val", 32):
        assert all(kind(task, t) == "k" for t in e["tokens"][::2])
        assert all(kind(task, t) == "v" for t in e["tokens"][1::2])


def test_noisy_recall_refuses_noise_without_noise_symbols(registry):
    spec = registry.get("task", "noisy_recall")
    with pytest.raises(HarnessError, match="noise_vocab"):
        resolve(spec.config, {"noise_vocab": 0, "frac_noise": 0.2}, "task.params")


# -- fuzzy in-context recall ----------------------------------------------------------------
@pytest.mark.parametrize("seed", FRESH)
def test_fuzzy_recall_query_value_follows_the_same_key_motif_earlier(registry, seed):
    task = make(registry, "fuzzy_recall", seed, length=64, vocab=16, key_tokens=3, value_tokens=3)
    assert len(task.keys) == 7 and len(task.values) == 8  # MAD: vocab 16 less its pad symbol
    for e in task.examples("val", 64):
        tokens, mask = e["tokens"], e["loss_mask"]
        assert len(tokens) == 65
        assert mask[-1], "the final pair's value is scored"
        # the query: the last three key symbols before its value, and its value tokens
        value_start = min(p for p in range(len(tokens)) if all(
            kind(task, tokens[q]) == "v" for q in range(p, len(tokens))))
        key = tuple(tokens[value_start - 3: value_start])
        value = tuple(tokens[value_start:])
        assert all(kind(task, t) == "k" for t in key) and len(set(key)) == 3
        text = tokens[:value_start - 3]
        hits = [i for i in range(len(text) - 2) if tuple(text[i: i + 3]) == key]
        assert hits, "the queried key motif appears earlier"
        i = hits[0] + 3
        assert tuple(text[i: i + len(value)]) == value
    sizes = set()
    for e in task.examples("train", 64):
        runs = "".join("k" if kind(task, t) == "k" else " " for t in e["tokens"]).split()
        sizes.update(len(r) for r in runs)
    assert sizes == {1, 2, 3}, "training keys have 1 to key_tokens symbols"


# -- memorization ---------------------------------------------------------------------------
@pytest.mark.parametrize("seed", FRESH)
def test_memorization_is_one_fixed_map_never_shown_in_the_input(registry, seed):
    task = make(registry, "memorization", seed, length=32, vocab=64, num_train=256)
    other = make(registry, "memorization", seed + 100, length=32, vocab=64)
    first = task.vocab.first_symbol
    assert task.vocab.token(first) == "?" and task.num_classes == task.vocab.size
    pairs: dict[int, set[int]] = {}
    for split in ("train", "val"):
        for e in task.examples(split, 32):
            assert e["tokens"][1::2] == [first] * 16
            assert not any(e["loss_mask"][0::2]) and all(e["loss_mask"][1::2])
            for key, value in zip(e["tokens"][0::2], e["tags"][1::2], strict=True):
                pairs.setdefault(key, set()).add(value)
                assert kind(task, key) == "k" and kind(task, value) == "v" and value not in e["tokens"]
    assert all(len(v) == 1 for v in pairs.values()), "a key has one value across splits"
    assert len({next(iter(v)) for v in pairs.values()}) == len(pairs), "the map is one-to-one"
    other_map = {k: v for e in other.examples("train", 32)
                 for k, v in zip(e["tokens"][0::2], e["tags"][1::2], strict=True)}
    assert any(other_map.get(k) not in (None, next(iter(v))) for k, v in pairs.items()), (
        "another data seed draws another map")
    assert task.model_hints == {"causal": True}


# -- compression ----------------------------------------------------------------------------
@pytest.mark.parametrize("seed", FRESH)
def test_compression_rebuilds_the_sequence_and_ends_with_the_mark(registry, seed):
    task = make(registry, "compression", seed, length=16, vocab=8)
    mark = task.vocab.first_symbol
    seen = set()
    for e in task.examples("val", 16):
        assert e["tags"] == e["tokens"] and len(e["tokens"]) == 16
        assert e["tokens"][-1] == mark and mark not in e["tokens"][:-1]
        seen.update(e["tokens"][:-1])
    assert seen == set(range(mark + 1, task.vocab.size)), "all 7 content symbols occur"


def compression_model(registry: Any, name: str, **params: Any) -> Any:
    """A model built for compression's batches as a run builds it (the task's hints given)."""
    from harness.config import ModelConfig
    from harness.data.tasks import TaskInfo
    from harness.run.build import build_model_from
    from harness.run.plan import resolve_model

    task = make(registry, "compression", 0, length=12, vocab=8)
    info = TaskInfo(format="tagging", vocab_size=task.vocab.size, max_length=12,
                    num_classes=task.num_classes, extra=dict(task.model_hints))
    return build_model_from(resolve_model(registry, ModelConfig(name=name, params=params)), info)


def test_compression_model_reads_every_output_from_the_last_position(registry):
    """The transformer's readout for compression: every output depends on every input (a
    per-position causal tagger's first output would not), and the outputs are a function of
    the stack's last position alone."""
    torch.manual_seed(0)
    model = compression_model(registry, "transformer", d_model=32, layers=1)
    assert model.bottleneck == "last" and model.causal
    model.eval()
    x = torch.randint(5, 12, (1, 12))
    x[0, -1] = 4
    y = x.clone()
    y[0, 3] = 5 if int(x[0, 3]) != 5 else 6
    with torch.no_grad():
        a, b = model(x), model(y)
        assert not torch.allclose(a[0, 0], b[0, 0]), "position 0 sees a later token: the bottleneck"
        hidden, _ = model.encode(x, None, None, False)
        again = model.head(model.readout(hidden[:, -1:].expand_as(hidden).contiguous()))
    assert torch.allclose(again, a, atol=1e-6)


def test_compression_refuses_a_model_without_the_readout(registry):
    with pytest.raises(HarnessError, match="bottleneck"):
        compression_model(registry, "lstm")
