"""Long Range Arena's generated tasks: ListOps against an independent recursive-descent
evaluator, Pathfinder's labels against a connectivity check on the drawn pixels."""

from __future__ import annotations

import math
import random
import statistics

import numpy as np
import pytest
from scipy import ndimage

from harness_plugins.tasks.listops import ListOpsConfig, ListOpsTask
from harness_plugins.tasks.pathfinder import PathfinderConfig, PathfinderTask

# -- ListOps -----------------------------------------------------------------------------------

FUNCTIONS = {
    "[MAX": max,
    "[MIN": min,
    "[SM": lambda xs: sum(xs) % 10,
    "[MED": lambda xs: math.floor(statistics.median(xs)),  # LRA: int(np.median(xs))
}


class Parsed:
    """The result of parsing one expression: value, nesting depth, argument counts seen."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens, self.at, self.depth, self.arg_counts = tokens, 0, 0, []

    def expression(self, depth: int = 1) -> int:
        """expr := DIGIT | OP expr expr+ ']'"""
        self.depth = max(self.depth, depth)
        token = self.tokens[self.at]
        self.at += 1
        if token.isdigit():
            assert len(token) == 1
            return int(token)
        assert token in FUNCTIONS, f"unexpected token {token!r} at {self.at - 1}"
        args = []
        while self.tokens[self.at] != "]":
            args.append(self.expression(depth + 1))
        self.at += 1
        self.arg_counts.append(len(args))
        return FUNCTIONS[token](args)


def parse(tokens: list[str]) -> Parsed:
    p = Parsed(tokens)
    p.value = p.expression()
    assert p.at == len(tokens), "tokens left after the expression"
    return p


@pytest.mark.parametrize("length,min_length,max_depth,max_args,seed", [
    (2000, 500, 10, 10, 0), (300, 50, 10, 10, 1), (120, 20, 6, 5, 2), (64, 1, 4, 3, 3)])
def test_listops_is_grammatical_and_every_label_is_the_expressions_value(length, min_length, max_depth,
                                                                        max_args, seed):
    cfg = ListOpsConfig(length=length, min_length=min_length, max_depth=max_depth, max_args=max_args,
                        num_train=300, num_val=50)
    task = ListOpsTask(cfg, seed=seed)
    examples = [*task.examples("train", length), *task.examples("val", length), *task.examples("test", length)]
    assert task.num_classes == 10
    for e in examples:
        tokens = [task.vocab.token(i) for i in e["tokens"]]
        p = parse(tokens)
        assert p.value == e["label"]
        assert min_length <= len(tokens) <= length
        assert p.depth <= max_depth
        assert all(2 <= k <= max_args for k in p.arg_counts)
    assert len({tuple(e["tokens"]) for e in examples}) == len(examples)  # distinct, splits disjoint
    assert len({e["label"] for e in examples}) == 10


def test_listops_samples_trees_as_lras_generator_does():
    """Unbounded draws: the root is a digit with probability 0.75; an operator's argument
    count is uniform on 2..max_args; the four operators are equally likely."""
    task = ListOpsTask(ListOpsConfig(length=10**6, min_length=1, max_depth=10, max_args=6), seed=0)
    rng = random.Random(7)
    draws = [task.draw(rng, 10**6) for _ in range(4000)]
    tokens = [[t for t in d[0]] for d in draws if d is not None]
    assert len(tokens) == 4000
    single = sum(len(t) == 1 for t in tokens) / len(tokens)
    assert abs(single - 0.75) < 0.03
    counts = [k for t in tokens if len(t) > 1 for k in parse(t).arg_counts]
    assert set(counts) == {2, 3, 4, 5, 6}
    assert abs(statistics.mean(counts) - 4.0) < 0.1
    ops = [s for t in tokens for s in t if s in FUNCTIONS]
    for op in FUNCTIONS:
        assert abs(ops.count(op) / len(ops) - 0.25) < 0.02


def test_listops_is_deterministic_and_seeds_differ():
    """Drawn afresh (``_generate``: past the per-process memo, which would hide a difference)."""
    cfg = ListOpsConfig(length=100, min_length=20, num_train=20, num_val=5)
    a, b, c = (ListOpsTask(cfg, seed=s)._generate("train", 100) for s in (0, 0, 1))
    assert a == b and a != c


def test_a_worker_draws_each_generated_split_once():
    cfg = ListOpsConfig(length=100, min_length=20, num_train=20, num_val=5)
    first = ListOpsTask(cfg, seed=11).examples("train", 100)
    assert ListOpsTask(cfg, seed=11).examples("train", 100) is first  # a later run in the process
    assert ListOpsTask(cfg, seed=12).examples("train", 100) != first
    other = ListOpsConfig(length=100, min_length=21, num_train=20, num_val=5)
    assert ListOpsTask(other, seed=11).examples("train", 100) is not first  # any field is in the key
    pf = PathfinderConfig(num_train=4, num_val=2)
    assert PathfinderTask(pf, seed=2).examples("val", 1024) is PathfinderTask(pf, seed=2).examples("val", 1024)


def test_listops_refuses_bounds_it_cannot_meet():
    with pytest.raises(ValueError, match="min_length"):
        ListOpsConfig(length=100, min_length=200)
    task = ListOpsTask(ListOpsConfig(length=3, min_length=2, max_args=2, num_train=3), seed=0)
    with pytest.raises(ValueError, match="only 0 of 3 distinct train trees"):  # none has 2-3 tokens
        task.examples("train", 3)


# -- Pathfinder --------------------------------------------------------------------------------

def linked_markers(image: np.ndarray, marker: int, reach: int) -> bool:
    """Whether the two marker squares are joined by ink, pixels being linked when within
    ``reach`` (Chebyshev distance): a dilation by a reach x reach square makes exactly those
    pixels 8-connected, so ``ndimage.label`` finds the linked groups."""
    ink = image > 0
    grown = ndimage.binary_dilation(ink, structure=np.ones((reach, reach), dtype=bool))
    groups, _ = ndimage.label(grown, structure=np.ones((3, 3), dtype=int))
    markers, count = ndimage.label(image == marker, structure=np.ones((3, 3), dtype=int))
    assert count == 2, f"expected 2 markers, found {count}"
    first, second = (groups[markers == k] for k in (1, 2))
    assert len(set(first)) == 1 and len(set(second)) == 1
    return bool(first[0] == second[0])


@pytest.mark.parametrize("params", [
    {},  # LRA's Pathfinder-32, hard (14 dashes)
    {"contour_length": 6, "num_distractors": 6},
    {"length": 4096, "paddle_length": 4, "gap": 2, "marker_radius": 2, "num_distractors": 6},
], ids=["pf32-hard", "pf32-easy", "pf64-gap2"])
def test_pathfinder_labels_agree_with_connectivity_on_the_drawn_image(params):
    cfg = PathfinderConfig(num_train=200, num_val=20, **params)
    task = PathfinderTask(cfg, seed=3)
    examples = task.examples("train", cfg.length)
    side = math.isqrt(cfg.length)
    for e in examples:
        assert len(e["tokens"]) == cfg.length
        image = np.array(e["tokens"]).reshape(side, side) - task.vocab.first_symbol
        assert image.min() >= 0 and image.max() == 255
        assert linked_markers(image, 255, cfg.gap + 1) == bool(e["label"])
    assert sum(e["label"] for e in examples) == len(examples) // 2


def test_pathfinder_quantizes_the_same_image_to_fewer_levels_keeping_all_ink():
    full, binary = (PathfinderTask(PathfinderConfig(num_train=20, levels=n), seed=5) for n in (256, 2))
    first = full.vocab.first_symbol
    for a, b in zip(full.examples("train", 1024), binary.examples("train", 1024), strict=True):
        assert a["label"] == b["label"]
        assert [int(t > first) for t in a["tokens"]] == [t - first for t in b["tokens"]]
    assert binary.vocab.size == 4 + 2


def test_pathfinder_contours_are_dashed_and_as_long_as_asked():
    """Without the gap tolerance (8-connectivity only) a contour falls apart into its dashes."""
    cfg = PathfinderConfig(num_train=10, num_distractors=0, marker_radius=0)
    task = PathfinderTask(cfg, seed=0)
    for e in task.examples("train", 1024):
        image = np.array(e["tokens"]).reshape(32, 32) - task.vocab.first_symbol
        ink = (image > 0) & (image < 255)
        _, pieces = ndimage.label(ink, structure=np.ones((3, 3), dtype=int))
        assert (image > 0).sum() == 2 * cfg.contour_length * cfg.paddle_length
        assert pieces >= cfg.contour_length  # at least one contour's dashes are all apart


def test_pathfinder_balance_determinism_and_splits():
    cfg = PathfinderConfig(num_train=51, num_val=20)
    task = PathfinderTask(cfg, seed=0)
    train, val = task.examples("train", 1024), task.examples("val", 1024)
    assert sum(e["label"] for e in train) == 25 and sum(e["label"] for e in val) == 10
    assert train == PathfinderTask(cfg, seed=0)._generate("train", 1024)  # drawn afresh: deterministic
    assert train != PathfinderTask(cfg, seed=1).examples("train", 1024)
    assert not {tuple(e["tokens"]) for e in train} & {tuple(e["tokens"]) for e in val}


def test_pathfinder_says_what_to_relax_when_the_image_is_too_crowded():
    with pytest.raises(ValueError, match="square image"):
        PathfinderConfig(length=1000)
    task = PathfinderTask(PathfinderConfig(num_train=2, contour_length=20, num_distractors=12,
                                           max_attempts=3), seed=0)
    with pytest.raises(ValueError, match="lower contour_length"):
        task.examples("train", 1024)
