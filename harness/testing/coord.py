"""Coordinate checks: does a plugin's μP hold as it widens?

The test of Yang et al. (2022, "Tensor Programs V", section 6 and the ``mup`` package's
``coord_check``): train the same model at several widths for a few steps with one learning
rate and record the size of every layer's output (the mean absolute entry, ``mup``'s "l1")
at each step. Under μP (:mod:`harness.nn.parametrization`) every size stays of the same order
as the width grows; under the standard parametrization the activations after the first
update grow with width, since Adam moves every entry of a hidden matrix by about the learning
rate whatever the width. A layer whose role μP gets wrong (a hidden matrix it took for a
vector, a multiplier it does not know) grows too.

The verdict: for each layer and each step after the first update, the slope of log(size)
against log(width), fitted over the widths by least squares; a slope above ``GROWTH`` fails
(a size that doubles when the width goes from 32 to 512 has slope 0.25). Sizes that fall with
width (a readout's logits at initialisation under μP) pass: μP promises that nothing blows
up, and shrinking outputs are its readout's design.

A plugin of any kind is checked inside a model: a model as it is (its ``width_param`` set
to each width), a mixer or an attention variant inside a two-layer ``transformer``
(``d_model`` set to each width, four heads), all on next-token prediction over random tokens
(the data does not matter to the sizes' order). ``harness check --coord NAME`` prints the
table and draws the figure (:func:`figure`); :class:`CoordinateChecks` runs it under pytest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from harness.registry.specs import Registry
from harness.testing.core import Checks, NotApplicable

WIDTHS = (32, 64, 128, 256, 512)
#: the largest log-log slope of a layer's size over width that passes (see the module docs)
GROWTH = 0.25
STEPS, SEEDS, LR = 4, 2, 1e-2
VOCAB, LENGTH, BATCH = 64, 16, 8


@dataclass
class CoordResult:
    """Sizes of every layer's output: ``sizes[layer][i][t]`` at ``widths[i]`` and step t (0:
    at initialisation), averaged over the seeds."""

    plugin: str
    parametrization: str
    widths: tuple[int, ...]
    steps: int
    sizes: dict[str, list[list[float]]] = field(default_factory=dict)

    def slope(self, layer: str, step: int) -> float:
        """The least-squares slope of log(size) against log(width) at ``step``."""
        xs = [math.log(w) for w in self.widths]
        ys = [math.log(max(s[step], 1e-30)) for s in self.sizes[layer]]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)

    def worst(self) -> tuple[str, int, float]:
        """The layer and step (after the first update) whose size grows fastest with width."""
        return max(((layer, t, self.slope(layer, t)) for layer in self.sizes for t in range(1, self.steps)),
                   key=lambda item: item[2])

    @property
    def passed(self) -> bool:
        return self.worst()[2] <= GROWTH

    def verdict(self) -> str:
        layer, step, slope = self.worst()
        how = "flat" if slope <= GROWTH else "grows"
        return (f"{self.parametrization}: {how}: largest growth {slope:+.2f} (size ~ width^slope; "
                f"pass <= {GROWTH}) in '{layer}' at step {step}")


def model_config(registry: Registry, kind: str, name: str, width: int, parametrization: str,
                 base: int, params: dict[str, Any] | None = None) -> tuple[Any, str]:
    """The model config that carries the plugin at ``width``, and the batch format it trains
    on (``lm``; ``tagging`` for a layer that runs only bidirectionally)."""
    from harness.config import ModelConfig

    params = dict(params or {})
    if kind == "model":
        spec = registry.get("model", name)
        width_param = spec.width_param
        if width_param is None:
            raise NotApplicable(f"model '{name}' declares no width_param: it has no width to grow")
        attention = ("multi_head" if spec.uses_attention and spec.attention_required
                     and not spec.default_attention else None)
        data: dict[str, Any] = {"name": name, "params": {**params, width_param: width},
                                "attention": {"name": attention} if attention else None}
        fmt = "lm" if "lm" in spec.task_kinds else sorted(spec.task_kinds)[0]
    elif kind in ("mixer", "attention"):
        width_param = "d_model"
        data = {"name": "transformer", "params": {"d_model": width, "layers": 2, "heads": 4},
                kind: {"name": name, "params": params}}
        fmt = "lm" if "causal" in (registry.get(kind, name).directions or ()) else "tagging"
    else:
        raise NotApplicable(f"a {kind} has no width of its own: check the models and layers that use it")
    if parametrization != "standard":
        data.update(parametrization=parametrization, base={width_param: base})
    return ModelConfig.model_validate(data), fmt


def _batch(fmt: str, seed: int) -> dict[str, Any]:
    from harness.data.formats import FORMATS
    from harness.data.vocab import EOS

    g = torch.Generator().manual_seed(seed)

    def symbols(n: int) -> list[int]:
        return torch.randint(4, VOCAB, (n,), generator=g).tolist()

    examples: list[dict[str, Any]]
    if fmt == "lm":
        examples = [{"tokens": symbols(LENGTH + 1)} for _ in range(BATCH)]
    elif fmt == "seq2seq":
        examples = [{"src": symbols(LENGTH), "tgt": symbols(LENGTH - 1) + [EOS]} for _ in range(BATCH)]
    elif fmt == "classification":
        examples = [{"tokens": symbols(LENGTH), "label": int(symbols(1)[0]) % 3} for _ in range(BATCH)]
    else:
        examples = [{"tokens": symbols(LENGTH), "tags": [t % 3 for t in symbols(LENGTH)]} for _ in range(BATCH)]
    return FORMATS[fmt].collate(examples, fmt)  # type: ignore[no-any-return]


def build(registry: Registry, cfg: Any, fmt: str, seed: int) -> Any:
    """The model as a run builds it (``harness.run.build``), for a toy task of ``fmt``."""
    from harness.data.tasks import TaskInfo
    from harness.run.build import build_model_from
    from harness.run.plan import resolve_model

    info = TaskInfo(format=fmt, vocab_size=VOCAB, max_length=2 * LENGTH,
                    num_classes=3 if fmt in ("classification", "tagging") else None)
    torch.manual_seed(seed)
    return build_model_from(resolve_model(registry, cfg), info)


def record(model: Any, fmt: str, *, steps: int, lr: float, optimizer: str, seed: int) -> dict[str, list[float]]:
    """Train ``model`` for ``steps`` steps (``harness.run.optim``'s optimiser, constant lr) and
    return the mean absolute entry of every module's output at each step's forward pass."""
    import torch.nn.functional as F

    from harness.config import TrainConfig
    from harness.data.formats import FORMATS
    from harness.run.optim import make_optimizer

    sizes: dict[str, list[float]] = {}

    def hook(name: str) -> Any:
        def save(module: Any, args: Any, out: Any) -> None:
            out = out[0] if isinstance(out, tuple) and out else out
            if isinstance(out, torch.Tensor) and out.is_floating_point() and out.numel():
                sizes.setdefault(name, []).append(float(out.detach().abs().mean()))
        return save

    handles = [m.register_forward_hook(hook(name or "model")) for name, m in model.named_modules()]
    opt, _ = make_optimizer(model, TrainConfig(lr=lr, optimizer=optimizer, warmup_steps=0,  # type: ignore[arg-type]
                                               schedule="constant", grad_clip=None))
    model.train()
    try:
        for step in range(steps):
            batch = _batch(fmt, seed * 1000 + step)
            out = FORMATS[fmt].call(model, batch)
            mask = batch["loss_mask"]
            loss = F.cross_entropy(out[mask], batch["targets"][mask])
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        for h in handles:
            h.remove()
    # a module called several times per step (shared, or once per chunk): its mean per step
    out = {}
    for name, values in sizes.items():
        if len(values) % steps == 0:
            k = len(values) // steps
            out[name] = [sum(values[i * k:(i + 1) * k]) / k for i in range(steps)]
    return out


def coord_check(registry: Registry, kind: str, name: str, *, parametrization: str = "mup",
                widths: tuple[int, ...] = WIDTHS, steps: int = STEPS, seeds: int = SEEDS,
                lr: float = LR, optimizer: str = "adam", params: dict[str, Any] | None = None) -> CoordResult:
    """The coordinate check of one plugin (``kind``: model, mixer or attention) under one
    parametrization; μP's base width is the smallest of ``widths``."""
    result = CoordResult(name, parametrization, tuple(widths), steps)
    for i, width in enumerate(widths):
        cfg, fmt = model_config(registry, kind, name, width, parametrization, widths[0], params)
        runs = [record(build(registry, cfg, fmt, seed), fmt, steps=steps, lr=lr, optimizer=optimizer, seed=seed)
                for seed in range(seeds)]
        for layer in runs[0]:
            if all(layer in r for r in runs):
                mean = [sum(r[layer][t] for r in runs) / seeds for t in range(steps)]
                result.sizes.setdefault(layer, [[] for _ in widths])[i] = mean  # type: ignore[misc]
    result.sizes = {k: v for k, v in result.sizes.items() if all(v)}
    return result


def table(result: CoordResult) -> str:
    """A Markdown table: each layer's size at the last step per width, and its slope per step."""
    last = result.steps - 1
    head = (["layer"] + [f"w={w}" for w in result.widths]
            + [f"slope t={t}" for t in range(result.steps)])
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for layer, per_width in result.sizes.items():
        slopes = [result.slope(layer, t) for t in range(result.steps)]
        mark = " **grows**" if max(slopes[1:], default=0.0) > GROWTH else ""
        rows.append("| " + " | ".join([f"`{layer}`{mark}"] + [f"{s[last]:.3g}" for s in per_width]
                                      + [f"{s:+.2f}" for s in slopes]) + " |")
    return "\n".join(rows)


def figure(results: list[CoordResult], path: str | Path) -> Path:
    """One row per parametrization, one panel per step: each layer's size against width."""
    from harness.run.plots import pyplot, save_figure

    plt = pyplot()
    steps = max(r.steps for r in results)
    fig, axes = plt.subplots(len(results), steps, figsize=(3.0 * steps, 2.8 * len(results)),
                             squeeze=False, sharey="row")
    for row, result in zip(axes, results, strict=True):
        for t, ax in enumerate(row):
            for per_width in result.sizes.values():
                ax.plot(result.widths, [s[t] for s in per_width], marker=".", linewidth=0.8, alpha=0.7)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{result.parametrization}, step {t}", fontsize=9)
            ax.set_xlabel("width", fontsize=8)
        row[0].set_ylabel("mean |activation|", fontsize=8)
    fig.suptitle(f"coordinate check: {results[0].plugin} (one line per layer)", fontsize=10)
    return save_figure(fig, path)  # type: ignore[no-any-return]


class CoordinateChecks(Checks):
    """The coordinate check as a kit check: ``kind`` and ``plugin`` say what to check; μP must
    keep every layer flat (``check_mup_flat``) and, as a control that the check can see
    growth, the standard parametrization must grow (``check_standard_grows``)."""

    kind: ClassVar[str] = "mixer"
    # only the two checks below (not the per-kind kit's shared ones)
    test_exemptions = test_bounds = test_pickle = None  # type: ignore[assignment]
    widths: ClassVar[tuple[int, ...]] = (32, 64, 128, 256)
    steps: ClassVar[int] = 3
    seeds: ClassVar[int] = 1

    @classmethod
    def all_checks(cls) -> list[str]:
        return ["mup_flat", "standard_grows"]

    def result(self, parametrization: str) -> CoordResult:
        return coord_check(self.registry(), self.kind, self.component().name, parametrization=parametrization,
                           widths=self.widths, steps=self.steps, seeds=self.seeds, params=dict(self.params))

    def check_mup_flat(self) -> None:
        """Under μP no layer's activations grow with width over the first steps."""
        result = self.result("mup")
        assert result.passed, result.verdict()

    def check_standard_grows(self) -> None:
        """Under the standard parametrization some layer grows (the check can see growth)."""
        result = self.result("standard")
        assert not result.passed, f"the standard parametrization stayed flat: {result.verdict()}"
