"""``pathfinder``: Long Range Arena's Pathfinder (32x32) and Path-X (128x128), drawn offline.

Linsley, Kim, Veerabadran, Windolf & Serre, "Learning long-range spatial dependencies with
horizontal gated recurrent units" (NeurIPS 2018): an image holds two endpoint markers and
dashed contours; the label is 1 when the two markers lie on the two ends of the same contour,
0 when they lie on two different contours. The Long Range Arena (Tay et al., ICLR 2021,
arXiv:2011.04006) flattens the grey image row by row into a pixel sequence (Pathfinder: 32x32
= 1,024 pixels; Path-X: 128x128 = 16,384).

This generator is this project's own, made to Linsley's recipe in outline (not a port of
``drewlinsley/pathfinder``): contours on the pixel grid rather than anti-aliased paddles at
free angles, so that the label is decidable from the drawn pixels (the test checks it so).

* A contour is ``contour_length`` dashes ("paddles") of ``paddle_length`` pixels, each
  straight along one of the 8 grid directions, separated by ``gap`` background pixels along
  the walk. Between dashes the direction turns by 45 degrees with probability ``turn_p``
  (either way, equally; LRA's generator's ``continuity`` bounds the turn angle instead).
* Every image has two contours of ``contour_length`` dashes and ``num_distractors``
  distractor contours of ``distractor_length`` dashes (LRA's Pathfinder-32: 14 dashes, and
  20 // 4 = 5 distractors of 14 // 3 = 4 dashes; see the table below). The two markers are small squares
  (side ``2 * marker_radius + 1``) on contour ends: both ends of the first contour (label 1) or
  one end of each contour (label 0), so both classes have the same ink. The two ends of a
  contour are far enough apart that their markers neither touch nor link directly.
* Objects (a contour with its reserved marker squares) never come closer than ``gap + 2``
  pixels (Chebyshev distance) to one another, while the dashes of one contour are ``gap +
  1`` apart: two pixels are "linked" when within ``gap + 1``, and the markers are linked
  through the contour exactly when the label is 1.
* Intensities: background 0, each contour one grey level drawn from 128..224, markers 255.
  Tokens are the pixel values quantized to ``levels`` grey levels (256: the raw byte, as LRA;
  fewer: ``round(value * (levels - 1) / 255)``, so that ink stays ink even at 2 levels). Labels are balanced exactly (half of each split).

Difficulty (LRA's Pathfinder-32 is ``contour_length`` 14, "hard"; its easy and intermediate
sets use 6 and 9; Path-X is 128x128 at 14, with longer dashes and wider gaps):

    ======================  =========  ===============  ==================
    setting                 default    pathfinder-32    path-x (128x128)
    ======================  =========  ===============  ==================
    length (pixels)         1024       1024             16384
    contour_length          14         6 / 9 / 14       14
    paddle_length           2          2                5
    gap                     1          1                2
    num_distractors         5          5 (20 // 4)      8
    distractor_length       4          4 (14 // 3)      4
    marker_radius           1          1                2
    ======================  =========  ===============  ==================

Longer contours and more distractors are harder. Crowded settings may not fit: the generator
redraws an image up to ``max_attempts`` times and then says which setting to relax.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Annotated, Any

from harness.plugin import (
    Choice,
    Example,
    FloatRange,
    Ge,
    IntRange,
    Le,
    Task,
    TaskConfig,
    TaskSpec,
    Vocab,
    hookimpl,
)
from harness_plugins.tasks.lra import memo

DIRECTIONS = ((0, 1), (1, 1), (1, 0), (1, -1), (0, -1), (-1, -1), (-1, 0), (-1, 1))  # 45 degrees apart
MARKER = 255
CONTOUR_GREY = (128, 224)  # every contour stays visible at 2 grey levels
WALK_TRIES = 40  # starts tried per contour before the image is redrawn


@dataclass
class PathfinderConfig(TaskConfig):
    length: Annotated[int, Ge(64), Choice((1024, 4096, 16384))] = 1024  # pixels: side * side
    contour_length: Annotated[int, Ge(1), IntRange(4, 20)] = 14  # dashes per main contour
    paddle_length: Annotated[int, Ge(1), Le(16)] = 2  # pixels per dash
    gap: Annotated[int, Ge(1), Le(8)] = 1  # background pixels between dashes
    turn_p: Annotated[float, Ge(0.0), Le(1.0), FloatRange(0.0, 0.6)] = 0.3  # chance of a 45-degree turn
    num_distractors: Annotated[int, Ge(0), IntRange(0, 12)] = 5
    distractor_length: Annotated[int, Ge(1), Le(20)] = 4  # dashes per distractor
    marker_radius: Annotated[int, Ge(0), Le(8)] = 1  # marker square side: 2 * radius + 1
    levels: Annotated[int, Ge(2), Le(256)] = 256  # grey levels of the tokens
    max_attempts: Annotated[int, Ge(1)] = 200  # redraws of one image before giving up

    def __post_init__(self) -> None:
        super().__post_init__()  # evaluation lengths are >= length
        for n in (self.length, *self.eval_lengths):
            if math.isqrt(n) ** 2 != n:
                raise ValueError(f"length {n} is not a square image (side * side pixels): use "
                                 f"1024 (32x32), 4096 (64x64) or 16384 (128x128, Path-X).")


class _Canvas:
    """One image being drawn: pixel values, and the pixels no new object may touch."""

    def __init__(self, side: int, clearance: int) -> None:
        self.side, self.clearance = side, clearance
        self.pixels = bytearray(side * side)
        self.blocked = bytearray(side * side)  # within clearance of an object already drawn

    def free(self, y: int, x: int) -> bool:
        return 0 <= y < self.side and 0 <= x < self.side and not self.blocked[y * self.side + x]

    def add(self, cells: set[tuple[int, int]], value: int, paint: set[tuple[int, int]]) -> None:
        """Claim ``cells`` (blocking their neighbourhood) and paint ``paint`` with ``value``."""
        s, c = self.side, self.clearance
        for y, x in cells:
            for dy in range(-c, c + 1):
                for dx in range(-c, c + 1):
                    yy, xx = y + dy, x + dx
                    if 0 <= yy < s and 0 <= xx < s:
                        self.blocked[yy * s + xx] = 1
        for y, x in paint:
            self.pixels[y * s + x] = value


def _square(y: int, x: int, r: int) -> set[tuple[int, int]]:
    return {(y + dy, x + dx) for dy in range(-r, r + 1) for dx in range(-r, r + 1)}


class PathfinderTask(Task):
    """Pathfinder / Path-X: are the two markers joined by one dashed contour? (pixels)"""

    task_kind = "classification"
    config: PathfinderConfig

    def __init__(self, config: PathfinderConfig, *, seed: int) -> None:
        super().__init__(config, seed=seed, vocab=Vocab(tuple(f"g{i}" for i in range(config.levels))),
                         num_classes=2)

    def generate(self, split: str, length: int) -> list[Example]:
        return memo.split(self, split, length, lambda: self._generate(split, length))

    def _generate(self, split: str, length: int) -> list[Example]:
        rng = random.Random(self.split_seed(split, length))
        n = self.split_size(split)
        labels = [i % 2 for i in range(n)]
        rng.shuffle(labels)
        side, levels, first = math.isqrt(length), self.config.levels, self.vocab.first_symbol
        token = [first + round(v * (levels - 1) / 255) for v in range(256)]
        out = []
        for label in labels:
            pixels = self.image(rng, side, label)
            out.append({"tokens": [token[v] for v in pixels], "label": label})
        return out

    def image(self, rng: random.Random, side: int, label: int) -> bytearray:
        """The pixels (row-major, 0..255) of one image with this label."""
        cfg = self.config
        for _ in range(cfg.max_attempts):
            pixels = self._try_image(rng, side, label)
            if pixels is not None:
                return pixels
        raise ValueError(
            f"pathfinder could not fit two contours of {cfg.contour_length} dashes and "
            f"{cfg.num_distractors} distractors of {cfg.distractor_length} into a {side}x{side} "
            f"image in {cfg.max_attempts} attempts: lower contour_length, num_distractors, "
            f"paddle_length or gap, or use a larger image (length)."
        )

    def _try_image(self, rng: random.Random, side: int, label: int) -> bytearray | None:
        cfg = self.config
        canvas = _Canvas(side, cfg.gap + 1)
        mains = []
        for _ in range(2):
            walk = self._walk(rng, canvas, cfg.contour_length, markers=True)
            if walk is None:
                return None
            mains.append(walk)
        for _ in range(cfg.num_distractors):
            if self._walk(rng, canvas, cfg.distractor_length, markers=False) is None:
                return None
        (a_start, a_end), (b_start, b_end) = ((w[0], w[-1]) for w in mains)
        ends = (a_start, a_end) if label == 1 else (rng.choice((a_start, a_end)), rng.choice((b_start, b_end)))
        for y, x in ends:
            for yy, xx in _square(y, x, cfg.marker_radius):
                canvas.pixels[yy * side + xx] = MARKER
        return canvas.pixels

    def _walk(self, rng: random.Random, canvas: _Canvas, dashes: int,
              markers: bool) -> list[tuple[int, int]] | None:
        """Draw one contour of ``dashes`` dashes on free pixels; its dash pixels in order
        (first and last are its ends), or None when no start worked."""
        cfg, side = self.config, canvas.side
        r = cfg.marker_radius if markers else 0
        free: list[int] | None = None  # the free pixels, listed once a random one is hard to hit
        for _ in range(WALK_TRIES):
            at = next((p for p in (rng.randrange(side * side) for _ in range(8)) if not canvas.blocked[p]), None)
            if at is None:
                free = free if free is not None else [i for i, b in enumerate(canvas.blocked) if not b]
                if not free:
                    return None
                at = rng.choice(free)
            y, x = divmod(at, side)
            d = rng.randrange(8)
            cells: list[tuple[int, int]] = []
            ok = True
            for i in range(dashes):
                dash = self._dash(rng, canvas, cells, y, x, d, first=i == 0)
                if dash is None:
                    ok = False
                    break
                d, points = dash
                cells += points
                y, x = points[-1]
            if not ok:
                continue
            reserved = set(cells)
            apart = max(abs(a - b) for a, b in zip(cells[0], cells[-1], strict=True))
            if markers and apart < 2 * r + canvas.clearance + 1:
                continue  # the two markers would touch or link without the contour
            if r:
                for end in (cells[0], cells[-1]):
                    square = _square(*end, r)
                    if not all(canvas.free(*p) or p in reserved for p in square):
                        ok = False
                        break
                    reserved |= square
            if ok:
                canvas.add(reserved, rng.randint(*CONTOUR_GREY), set(cells))
                return cells
        return None


    def _dash(self, rng: random.Random, canvas: _Canvas, cells: list[tuple[int, int]], y: int,
              x: int, d: int, first: bool) -> tuple[int, list[tuple[int, int]]] | None:
        """The next dash after the one ending at (y, x) heading ``d`` (or the first dash, from
        (y, x)): its direction and pixels. The turn is drawn (straight with probability 1 -
        ``turn_p``); where the drawn turn is blocked, the other two are tried (a contour bends
        around what is in its way)."""
        cfg = self.config
        u = rng.random()
        drawn = 1 if u < cfg.turn_p / 2 else -1 if u < cfg.turn_p else 0
        others = [t for t in (0, 1, -1) if t != drawn]
        rng.shuffle(others)
        taken = set(cells)
        for turn in (0,) if first else (drawn, *others):
            nd = (d + turn) % 8
            dy, dx = DIRECTIONS[nd]
            sy, sx = (y, x) if first else (y + (cfg.gap + 1) * dy, x + (cfg.gap + 1) * dx)
            dash = [(sy + k * dy, sx + k * dx) for k in range(cfg.paddle_length)]
            if all(canvas.free(*p) and p not in taken for p in dash):
                return nd, dash
        return None


@hookimpl
def harness_register_task(register: Any) -> None:
    register(TaskSpec(name="pathfinder", build=PathfinderTask))
