"""Checks of models (:class:`ModelChecks`).

A model is built exactly as a run builds it (``harness.run.plan``: its spec, its default
attention variant and position scheme, or those named by the class attributes
``attention``, ``position``, ``mixer``), for a toy task: ``vocab_size = 12``, ``max_length =
10``, ``num_classes = 3``, in float64. Batches come from examples the kit draws for each
batch format the model declares (``task_kinds``), collated by the harness's own formats, and
the model is called the way training calls it (``BatchFormat.call``).

``reference`` of a model spec: ``reference(model, fmt, batch) -> Tensor`` gives the float64
output of ``fmt.call(model, batch)`` (``fmt`` is the format's name: ``lm``, ``seq2seq``,
``classification``, ``tagging``; ``batch`` a collated batch), computed independently from the
model's parameters.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from harness.data.formats import FORMATS
from harness.data.tasks import TaskInfo
from harness.data.vocab import BOS, EOS
from harness.nn.mixer import LayerCache
from harness.testing.core import Checks, NotApplicable, check_flop_count, close

ENCODER_FORMATS = ("classification", "tagging")


def layer_caches(cache: Any) -> Iterator[LayerCache]:
    """Every :class:`LayerCache` inside a model's cache (lists, tuples and dicts of them), or
    the cache itself when it counts its own elements (``numel_per_sequence()``)."""
    if isinstance(cache, LayerCache) or hasattr(cache, "numel_per_sequence"):
        yield cache
    elif isinstance(cache, dict):
        for value in cache.values():
            yield from layer_caches(value)
    elif isinstance(cache, (list, tuple)):
        for value in cache:
            yield from layer_caches(value)


class ModelChecks(Checks):
    """The conformance checks of a model (a plain ``nn.Module`` for the batch formats it declares)."""

    kind = "model"
    vocab_size: ClassVar[int] = 12
    max_length: ClassVar[int] = 10
    num_classes: ClassVar[int] = 3
    #: the components to build the model with (None: the model's defaults)
    attention: ClassVar[str | None] = None
    position: ClassVar[str | None] = None
    mixer: ClassVar[str | None] = None

    # -- helpers ----------------------------------------------------------------------
    def formats(self) -> list[str]:
        return sorted(self.component().task_kinds)

    def build(self, fmt: str, *, seed: int | None = None, max_length: int | None = None,
              document_token: int | None = None, **overrides: Any) -> Any:
        """The model for batch format ``fmt``, float64, in eval mode (``document_token``: it
        keeps the documents that token starts apart)."""
        from harness.config import ComponentConfig, ModelConfig
        from harness.run.build import build_model_from
        from harness.run.plan import resolve_model

        spec = self.component()
        attention = self.attention
        if attention is None and spec.uses_attention and spec.attention_required and not spec.default_attention \
                and self.mixer is None:
            attention = "multi_head"
        cfg = ModelConfig(
            name=spec.name, params={**self.params, **overrides},
            attention=ComponentConfig(name=attention) if attention else None,
            position=ComponentConfig(name=self.position) if self.position else None,
            mixer=ComponentConfig(name=self.mixer) if self.mixer else None,
        )
        parts = resolve_model(self.registry(), cfg)
        info = TaskInfo(format=fmt, vocab_size=self.vocab_size, max_length=max_length or self.max_length,
                        num_classes=self.num_classes if fmt in ENCODER_FORMATS else None,
                        document_token=document_token)
        torch.manual_seed(self.seed if seed is None else seed)
        return build_model_from(parts, info).double().eval()

    def examples(self, fmt: str, lengths: list[int], seed: int = 0) -> list[dict[str, Any]]:
        """One example per length in the format's shape (lengths are model input lengths)."""
        rng = random.Random(seed)

        def symbols(n: int) -> list[int]:
            return [rng.randrange(4, self.vocab_size) for _ in range(n)]

        out: list[dict[str, Any]] = []
        for n in lengths:
            if fmt == "lm":
                out.append({"tokens": symbols(n + 1)})
            elif fmt == "seq2seq":
                out.append({"src": symbols(n), "tgt": symbols(max(1, n - 2)) + [EOS]})
            elif fmt == "classification":
                out.append({"tokens": symbols(n), "label": rng.randrange(self.num_classes)})
            else:
                out.append({"tokens": symbols(n), "tags": [rng.randrange(self.num_classes) for _ in range(n)]})
        return out

    def batch(self, fmt: str, lengths: list[int], seed: int = 0) -> dict[str, Any]:
        return FORMATS[fmt].collate(self.examples(fmt, lengths, seed), fmt)

    def call(self, model: Any, fmt: str, batch: dict[str, Any]) -> torch.Tensor:
        return FORMATS[fmt].call(model, batch)  # type: ignore[no-any-return]

    def expected_shape(self, fmt: str, batch: dict[str, Any]) -> tuple[int, ...]:
        b = batch["targets"].shape[0]
        if fmt == "classification":
            return (b, self.num_classes)
        width = self.num_classes if fmt == "tagging" else self.vocab_size
        return (*batch["targets"].shape, width)

    def real(self, fmt: str, example: dict[str, Any]) -> int:
        """How many output rows of ``example`` are real (not padding)."""
        return len(example["tgt"]) if fmt == "seq2seq" else len(example["tokens"]) - (fmt == "lm")

    def loss(self, fmt: str, out: torch.Tensor, batch: dict[str, Any]) -> torch.Tensor:
        mask = batch["loss_mask"]
        return F.cross_entropy(out[mask], batch["targets"][mask])

    def lm_model(self) -> Any:
        if "lm" not in self.formats():
            raise NotApplicable(f"the model declares no lm format (task kinds: {', '.join(self.formats())})")
        return self.build("lm")

    def tokens(self, n: int, seed: int = 1) -> torch.Tensor:
        return torch.randint(4, self.vocab_size, (2, n), generator=torch.Generator().manual_seed(seed))

    # -- checks -----------------------------------------------------------------------
    def check_declarations(self) -> None:
        """width_param is an int hyper-parameter; default components and presets resolve."""
        from harness.config import ModelConfig
        from harness.params import declared_params
        from harness.run.plan import resolve_model

        spec, reg = self.component(), self.registry()
        if spec.width_param is not None:
            types = {p.name: p.type for p in declared_params(spec.config)}
            assert types.get(spec.width_param) is int, (
                f"width_param '{spec.width_param}' is not an int hyper-parameter of {spec.config.__name__}")
        for kind, name in (("attention", spec.default_attention), ("position", spec.default_position)):
            assert name is None or name in reg.names(kind), f"default_{kind} '{name}' is not registered"
        for preset in spec.presets:
            resolve_model(reg, ModelConfig(name=spec.name, preset=preset))

    def check_task_formats(self) -> None:
        """Each declared batch format: the model's output has the format's shape, finite loss."""
        for fmt in self.formats():
            model = self.build(fmt)
            batch = self.batch(fmt, [self.max_length, 5, 3])
            with torch.no_grad():
                out = self.call(model, fmt, batch)
            shape = self.expected_shape(fmt, batch)
            assert tuple(out.shape) == shape, f"{fmt}: output {tuple(out.shape)}, expected {shape}"
            assert out.dtype == torch.float64, f"{fmt}: a float64 model returned {out.dtype}"
            assert torch.isfinite(out).all(), f"{fmt}: non-finite outputs"
            assert torch.isfinite(self.loss(fmt, out, batch)), f"{fmt}: non-finite loss"

    def check_causality(self) -> None:
        """lm: changing later tokens changes no earlier output; seq2seq: same for the decoder."""
        formats = [f for f in self.formats() if f in ("lm", "seq2seq")]
        if not formats:
            raise NotApplicable("no lm or seq2seq format: the model reads whole sequences")
        for fmt in formats:
            model = self.build(fmt)
            batch = self.batch(fmt, [8, 8])
            key = "tokens" if fmt == "lm" else "tgt_in"
            with torch.no_grad():
                base = self.call(model, fmt, batch)
                n = batch[key].shape[1]
                for t in (0, n // 2, n - 2):
                    changed = dict(batch)
                    changed[key] = batch[key].clone()
                    changed[key][:, t + 1:] = (changed[key][:, t + 1:] - 3) % (self.vocab_size - 4) + 4
                    out = self.call(model, fmt, changed)
                    close(out[:, : t + 1], base[:, : t + 1], f"{fmt}: outputs at positions <= {t} changed "
                          f"when only later {key} changed", atol=1e-10, rtol=1e-8)
                if fmt == "seq2seq":
                    other = dict(batch, src=self.batch(fmt, [8, 8], seed=5)["src"])
                    assert not torch.allclose(self.call(model, fmt, other)[:, 0], base[:, 0]), (
                        "seq2seq: the decoder's first output ignores the source")

    def check_documents(self) -> None:
        """A model declaring ``separates_documents``: with ``TaskInfo.document_token`` set, the
        outputs from a row's last document start on do not change when every token before it
        changes, and a cached decode gives the full pass's outputs."""
        if not self.component().separates_documents:
            raise NotApplicable("the model does not declare separates_documents")
        if "lm" not in self.formats():
            raise NotApplicable("documents are kept apart in lm windows; the model declares no lm format")
        sep = 4  # the first symbol stands for <eod>
        model = self.build("lm", document_token=sep)
        x = (self.tokens(10) - 4) % (self.vocab_size - 5) + 5  # no separator yet
        x[:, 2], x[:, 6] = sep, sep
        other = x.clone()
        other[:, :6] = (other[:, :6] - 2) % (self.vocab_size - 5) + 5
        other[:, 2] = sep
        with torch.no_grad():
            full = model(x)
            close(model(other)[:, 6:], full[:, 6:], "an output after a document start changed when "
                  "only the documents before it changed", atol=1e-10, rtol=1e-8)
            if hasattr(model, "new_cache"):
                cache = model.new_cache()
                stepped = torch.cat([model(x[:, i:i + 1], cache=cache) for i in range(x.shape[1])], dim=1)
                close(stepped, full, "cached decoding across document starts differs from the full pass")

    def check_padding(self) -> None:
        """Each format: an example alone and right-padded next to a longer one gives the same outputs."""
        for fmt in self.formats():
            model = self.build(fmt)
            short, long = self.examples(fmt, [5, self.max_length], seed=3)
            collate = FORMATS[fmt].collate
            with torch.no_grad():
                alone = self.call(model, fmt, collate([short], fmt))
                together = self.call(model, fmt, collate([short, long], fmt))
            rows = self.real(fmt, short)
            if fmt == "classification":
                close(together[:1], alone, f"{fmt}: padding changed the output", atol=1e-9, rtol=1e-7)
            else:
                close(together[:1, :rows], alone[:, :rows], f"{fmt}: padding changed the outputs at real positions",
                      atol=1e-9, rtol=1e-7)

    def check_decoding_cache(self) -> None:
        """lm models with new_cache(): cached decoding, in chunks and token by token, equals the full pass."""
        model = self.lm_model()
        if not hasattr(model, "new_cache"):
            raise NotApplicable("the model has no new_cache(): decoding recomputes the prefix for every token")
        x = self.tokens(10)
        with torch.no_grad():
            full = model(x)
            for chunks in ([4, 1, 1, 1, 1, 2], [1] * 10):
                cache, outs, at = model.new_cache(), [], 0
                for n in chunks:
                    outs.append(model(x[:, at: at + n], cache=cache))
                    at += n
                close(torch.cat(outs, dim=1), full, f"cached decoding in chunks {chunks} differs from the full pass")

    def check_greedy_decode(self) -> None:
        """seq2seq: greedy_decode(src, src_padding_mask, max_len) is the argmax of its teacher-forced pass."""
        if "seq2seq" not in self.formats():
            raise NotApplicable("the model declares no seq2seq format")
        model = self.build("seq2seq")
        assert hasattr(model, "greedy_decode"), (
            "a seq2seq model must implement greedy_decode(src, src_padding_mask, max_len) -> (B, max_len) "
            "token ids (harness.nn.decoding uses it for free-running evaluation)")
        batch = self.batch("seq2seq", [7, 4, 6])
        src, mask = batch["src"], batch["src_padding_mask"]
        with torch.no_grad():
            out = model.greedy_decode(src, mask, 6)
            assert tuple(out.shape) == (3, 6) and out.dtype == torch.long, (
                f"greedy_decode returned {tuple(out.shape)} {out.dtype}, expected (3, 6) int64")
            tgt_in = torch.cat([torch.full((3, 1), BOS), out[:, :-1]], dim=1)
            predicted = model(src, tgt_in, src_padding_mask=mask).argmax(-1).tolist()
        for row, (pred, got) in enumerate(zip(predicted, out.tolist(), strict=True)):
            end = got.index(EOS) + 1 if EOS in got else len(got)
            assert pred[:end] == got[:end], f"row {row}: greedy {got[:end]} but the teacher-forced argmax is {pred[:end]}"

    def check_state_size(self) -> None:
        """``state_size(n)`` equals the elements the model's decoding cache keeps after n tokens."""
        model = self.lm_model()
        if not (hasattr(model, "new_cache") and hasattr(model, "state_size")):
            raise NotApplicable("the model declares no state_size(length) and new_cache()")
        cache, x = model.new_cache(), self.tokens(9)
        with torch.no_grad():
            for start, stop in ((0, 5), (5, 6), (6, 9)):
                model(x[:, start:stop], cache=cache)
                kept = sum(c.numel_per_sequence() for c in layer_caches(cache))
                assert kept == model.state_size(stop), (
                    f"after {stop} tokens the cache keeps {kept} elements per sequence, state_size({stop}) = "
                    f"{model.state_size(stop)}")

    def check_supports_length(self) -> None:
        """extrapolates: runs (finite) at 3x max_length; fixed length: refuses longer inputs."""
        spec, fmt = self.component(), self.formats()[0]
        long = 3 * self.max_length
        model = self.build(fmt)
        batch = self.batch(fmt, [long, 4])
        if spec.extrapolates:
            if hasattr(model, "supports_length"):
                assert model.supports_length(long), f"extrapolates=True but supports_length({long}) is False"
            with torch.no_grad():
                out = self.call(model, fmt, batch)
            assert torch.isfinite(out).all(), f"non-finite outputs at {long} positions"
            return
        assert hasattr(model, "supports_length"), "a fixed-length model (extrapolates=False) needs supports_length(n)"
        assert model.supports_length(self.max_length), f"supports_length({self.max_length}) is False"
        assert not model.supports_length(long), f"extrapolates=False but supports_length({long}) is True"
        try:
            with torch.no_grad():
                self.call(model, fmt, batch)
        except ValueError:
            return
        raise AssertionError(f"a fixed-length model ran on {long} positions instead of raising ValueError")

    def check_determinism(self) -> None:
        """Same seed, same parameters and outputs (training mode, dropout on, included)."""
        fmt = self.formats()[0]
        overrides: dict[str, Any] = {"dropout": 0.1} if "dropout" in self.config_fields() else {}
        a, b = self.build(fmt, seed=1, **overrides), self.build(fmt, seed=1, **overrides)
        for (name, p), q in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
            assert torch.equal(p, q), f"two builds under the same seed differ in {name}"
        batch, outs = self.batch(fmt, [self.max_length, 4]), []
        for model in (a, b):
            model.train()
            torch.manual_seed(2)
            outs.append(self.call(model, fmt, batch))
        assert torch.equal(outs[0], outs[1]), "two training-mode passes under the same seed differ"

    def check_gradients(self) -> None:
        """Each format: the loss reaches every parameter, with finite gradients."""
        for fmt in self.formats():
            model = self.build(fmt)
            batch = self.batch(fmt, [self.max_length, 6, 4])
            self.loss(fmt, self.call(model, fmt, batch), batch).backward()
            missing = [n for n, p in model.named_parameters()
                       if p.requires_grad and (p.grad is None or not p.grad.abs().sum() > 0)]
            assert not missing, f"{fmt}: no gradient reaches {', '.join(missing)}"
            bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
            assert not bad, f"{fmt}: non-finite gradients in {', '.join(bad)}"

    def check_flops(self) -> None:
        """float32 forward and backward count at least 6 FLOPs per weight per token (lm first)."""
        formats = self.formats()
        fmt = "lm" if "lm" in formats else formats[0]
        model = self.build(fmt).float()
        batch = self.batch(fmt, [self.max_length] * 3, seed=4)
        if fmt == "seq2seq":  # the encoder's weights run per source token, the decoder's per target token
            positions = min(batch["src"].numel(), batch["tgt_in"].numel()) * 1.0
        else:
            positions = float(batch["tokens"].numel())
        check_flop_count(model, lambda: self.loss(fmt, self.call(model, fmt, batch), batch), positions,
                         f"{fmt}, float32")

    def check_reference(self) -> None:
        """float64 outputs equal the spec's independent ``reference(model, fmt, batch)``."""
        reference = self.component().reference
        if reference is None:
            raise NotApplicable("no float64 reference declared (the spec's reference=)")
        for fmt in self.formats():
            model = self.build(fmt)
            batch = self.batch(fmt, [self.max_length, 5], seed=9)
            with torch.no_grad():
                close(self.call(model, fmt, batch), reference(model, fmt, batch),
                      f"{fmt}: the model differs from its float64 reference")

    def pickle_subject(self) -> Any:
        return self.build(self.formats()[0])

    def compare_pickled(self, original: Any, restored: Any) -> None:
        fmt = self.formats()[0]
        batch = self.batch(fmt, [6, 4])
        with torch.no_grad():
            close(self.call(restored, fmt, batch), self.call(original, fmt, batch),
                  "the unpickled model computes something else")

