"""Checks of sequence layers: attention variants (:class:`AttentionChecks`) and mixers
(:class:`MixerChecks`).

Every check builds the layer with ``d_model = 16`` and ``num_heads = 2`` (class attributes),
in float64 unless it checks dtypes, on fresh random inputs of a few positions. Where a layer
declares ``qk`` or ``bias`` position hooks, the checks run it with the richest toy scheme
it declares (:class:`Turning` rotates queries and keys, :class:`DistanceBias` adds a
per-head distance penalty), so causality, padding and caching are checked with positions
in play.

``reference`` of an attention or mixer spec: ``reference(layer, x, *, causal) -> Tensor``,
the layer's self-attention / mixing output for ``x`` (B, L, d_model) float64, computed from
the layer's parameters independently of its code (no position scheme, no padding).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from harness.nn.position import PositionScheme
from harness.testing.core import Checks, NotApplicable, check_flop_count, close, rand

B = 2


def _turn(t: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    half = t.shape[-1] // 2
    angle = pos.to(t.dtype)[:, None] * 0.5 ** torch.arange(half, dtype=t.dtype, device=t.device)[None]
    a, b, rest = t[..., :half], t[..., half: 2 * half], t[..., 2 * half:]
    return torch.cat([a * angle.cos() - b * angle.sin(), a * angle.sin() + b * angle.cos(), rest], -1)


class Turning(PositionScheme):
    """Toy ``qk`` scheme: rotates pairs of query/key features by position-dependent angles."""

    def rotate(self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor,
               k_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return _turn(q, q_pos), _turn(k, k_pos)


class DistanceBias(PositionScheme):
    """Toy ``bias`` scheme: a per-head penalty on |query position - key position|."""

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads

    def score_bias(self, q: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        slopes = 0.5 ** torch.arange(1, self.num_heads + 1, dtype=q.dtype, device=q.device)
        distance = (q_pos[:, None] - k_pos[None, :]).abs().to(q.dtype)
        return -(slopes[:, None, None] * distance)[None]


class TurningBiased(Turning, DistanceBias):
    """Toy scheme acting at both ``qk`` and ``bias``."""


def _differs(a: torch.Tensor, b: torch.Tensor) -> bool:
    return not torch.allclose(a, b, atol=1e-8, rtol=1e-6)


class SequenceLayerChecks(Checks):
    """Checks attention variants and mixers share (both map (B, L, D) to (B, L, D))."""

    d_model: ClassVar[int] = 16
    num_heads: ClassVar[int] = 2
    #: attention variants must take AttentionConfig's dropout; a mixer may have none
    dropout_required: ClassVar[bool] = False
    #: attention is also called with a padding mask in causal mode (a mixer never is)
    pads_in_causal_mode: ClassVar[bool] = False

    # -- helpers ----------------------------------------------------------------------
    def build(self, dtype: torch.dtype = torch.float64, *, seed: int | None = None,
              **overrides: Any) -> Any:
        """The layer with the class's params (and ``overrides``), in eval mode."""
        torch.manual_seed(self.seed if seed is None else seed)
        layer = self.component().build(self.config(**overrides), d_model=self.d_model,
                                       num_heads=self.num_heads)
        return layer.to(dtype).eval()

    def modes(self) -> list[bool]:
        """The ``causal`` flags the layer declares it runs with."""
        directions = self.component().directions or frozenset()
        return [c for c, d in ((True, "causal"), (False, "bidirectional")) if d in directions]

    def scheme(self, hooks: set[str] | None = None) -> PositionScheme | None:
        """The richest toy position scheme among the hooks the layer declares."""
        declared = set(self.component().position_hooks or ()) & (hooks or {"qk", "bias"})
        if {"qk", "bias"} <= declared:
            return TurningBiased(self.num_heads)
        if "qk" in declared:
            return Turning()
        if "bias" in declared:
            return DistanceBias(self.num_heads)
        return None

    def x(self, length: int, seed: int = 0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        return rand(B, length, self.d_model, dtype=dtype, seed=seed)

    def run(self, layer: Any, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        out, _ = layer(x, **kwargs)
        return out  # type: ignore[no-any-return]

    def require_causal(self) -> None:
        if True not in self.modes():
            raise NotApplicable("the layer runs only bidirectionally (directions: bidirectional)")

    def decode(self, layer: Any, x: torch.Tensor, chunks: list[int], position: Any) -> tuple[torch.Tensor, Any]:
        """Causal outputs computed chunk by chunk through the layer's cache."""
        cache, outs, at = layer.new_cache(), [], 0
        for n in chunks:
            outs.append(self.run(layer, x[:, at: at + n], causal=True, position=position, cache=cache))
            at += n
        return torch.cat(outs, dim=1), cache

    # -- checks -----------------------------------------------------------------------
    def check_declarations(self) -> None:
        """The spec's directions and position hooks agree with the built layer's class."""
        spec, layer = self.component(), self.build()
        for attr in ("directions", "position_hooks"):
            mine = getattr(layer, attr, None)
            assert mine is None or set(mine) == set(getattr(spec, attr) or ()), (
                f"the spec declares {attr} {sorted(getattr(spec, attr) or ())} but the layer's class "
                f"says {sorted(mine)}: declare them once, as class attributes (build=TheClass)")
        complexity = getattr(layer, "complexity", None) or spec.complexity
        if complexity is not None:
            for which in ("time", "memory", "decode", "state"):
                complexity.exponent(which)  # a malformed expression raises here

    def check_shapes(self) -> None:
        """Outputs are (B, L, d_model) in every declared direction; weights only on request."""
        layer, x = self.build(), self.x(7)
        for causal in self.modes():
            out, weights = layer(x, causal=causal)
            assert out.shape == x.shape, f"causal={causal}: output {tuple(out.shape)} for input {tuple(x.shape)}"
            assert weights is None, f"causal={causal}: weights returned although need_weights=False"

    def check_dtypes(self) -> None:
        """float32 and float64 in give the same dtype out; bf16 autocast gives finite outputs."""
        position = self.scheme()
        for dtype in (torch.float32, torch.float64):
            layer, x = self.build(dtype), self.x(6, dtype=dtype)
            for causal in self.modes():
                out = self.run(layer, x, causal=causal, position=position)
                assert out.dtype == dtype, f"{dtype} in, {out.dtype} out (causal={causal})"
                assert torch.isfinite(out).all(), f"non-finite outputs in {dtype} (causal={causal})"
        layer, x = self.build(torch.float32), self.x(6, dtype=torch.float32)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = self.run(layer, x, causal=self.modes()[0], position=position)
        assert torch.isfinite(out.float()).all(), "non-finite outputs under bf16 autocast"

    def check_causality(self) -> None:
        """Changing inputs at positions > t changes no output at positions <= t."""
        self.require_causal()
        layer, position, x = self.build(), self.scheme(), self.x(9)
        base = self.run(layer, x, causal=True, position=position)
        tol = 1e-10 * (1.0 + float(base.detach().abs().max()))
        for t in (0, 4, 7):
            changed = x.clone()
            changed[:, t + 1:] = rand(B, 8 - t, self.d_model, seed=t + 1) * 3
            out = self.run(layer, changed, causal=True, position=position)
            close(out[:, : t + 1], base[:, : t + 1], f"outputs at positions <= {t} changed when only "
                  f"later inputs changed: the causal form reads the future", atol=tol, rtol=0)
            assert _differs(out[:, t + 1:], base[:, t + 1:]), "changing inputs changed no output at all"
        earlier = x.clone()
        earlier[:, :-1] = rand(B, 8, self.d_model, seed=11)
        out = self.run(layer, earlier, causal=True, position=position)
        assert _differs(out[:, -1], base[:, -1]), (
            "the output at the last position ignores every earlier input: the layer mixes no positions")

    def check_padding(self) -> None:
        """Padded positions never change outputs at real positions, and no output is NaN."""
        modes = [c for c in self.modes() if not c or self.pads_in_causal_mode]
        if not modes:
            raise NotApplicable("causal only: batches are right-padded, so padding never reaches a "
                                "real position (the causality check covers it)")
        layer, position, x = self.build(), self.scheme(), self.x(8)
        kpm = torch.zeros(B, 8, dtype=torch.bool)
        kpm[0, -3:] = True
        kpm[1, -1:] = True
        changed = x.clone()
        changed[kpm] = rand(int(kpm.sum()), self.d_model, seed=5) * 10
        for causal in modes:
            before = self.run(layer, x, causal=causal, key_padding_mask=kpm, position=position)
            after = self.run(layer, changed, causal=causal, key_padding_mask=kpm, position=position)
            assert torch.isfinite(before).all(), f"causal={causal}: non-finite outputs with padding"
            close(after[~kpm], before[~kpm], f"causal={causal}: changing padded inputs changed outputs "
                  f"at real positions (key_padding_mask is True at padding)")

    def check_determinism(self) -> None:
        """Same seed, same parameters and outputs (training mode, dropout on, included)."""
        overrides: dict[str, Any] = {"dropout": 0.1} if "dropout" in self.config_fields() else {}
        a, b = self.build(seed=1, **overrides), self.build(seed=1, **overrides)
        for (name, p), q in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
            assert torch.equal(p, q), f"two builds under the same seed differ in {name}"
        x, causal = self.x(7), self.modes()[0]
        outs = []
        for layer in (a, b):
            layer.train()
            torch.manual_seed(2)
            outs.append(self.run(layer, x, causal=causal))
        assert torch.equal(outs[0], outs[1]), "two training-mode passes under the same seed differ"
        a.eval()
        assert torch.equal(self.run(a, x, causal=causal), self.run(a, x, causal=causal)), (
            "two evaluation passes over the same input differ")

    def check_gradients(self) -> None:
        """A loss on the outputs reaches every parameter and the input, with finite values."""
        layer, position = self.build(), self.scheme()
        x = self.x(7).requires_grad_()
        loss = sum((self.run(layer, x, causal=c, position=position) * rand(B, 7, self.d_model, seed=3)).sum()
                   for c in self.modes())
        loss.backward()  # type: ignore[union-attr]
        missing = [n for n, p in layer.named_parameters()
                   if p.requires_grad and (p.grad is None or not p.grad.abs().sum() > 0)]
        assert not missing, f"no gradient reaches {', '.join(missing)}"
        bad = [n for n, p in layer.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
        assert not bad, f"non-finite gradients in {', '.join(bad)}"
        assert x.grad is not None and x.grad.abs().sum() > 0, "no gradient reaches the input"

    def check_flops(self) -> None:
        """float32 forward and backward count at least 6 FLOPs per weight per position."""
        layer, length = self.build(torch.float32), 12
        x = self.x(length, dtype=torch.float32).requires_grad_()
        causal = self.modes()[0]
        check_flop_count(layer, lambda: self.run(layer, x, causal=causal).square().sum(), B * length,
                         f"float32, causal={causal}")

    def check_reference(self) -> None:
        """float64 outputs equal the spec's independent ``reference(layer, x, causal=...)``."""
        reference = self.component().reference
        if reference is None:
            raise NotApplicable("no float64 reference declared (the spec's reference=)")
        layer = self.build()
        x = self.x(7, seed=9)
        with torch.no_grad():
            for causal in self.modes():
                expected = reference(layer, x, causal=causal)
                close(self.run(layer, x, causal=causal), expected,
                      f"causal={causal}: the layer differs from its float64 reference")

    def check_cache_equals_full_pass(self) -> None:
        """Cached decoding, token by token and in chunks, equals the causal full pass."""
        self.require_causal()
        layer, position, x = self.build(), self.scheme(), self.x(11)
        with torch.no_grad():
            full = self.run(layer, x, causal=True, position=position)
            for chunks, how in (([1] * 11, "token by token"), ([4, 1, 1, 1, 1, 1, 2], "in chunks 4, 1 x 5, 2")):
                steps, cache = self.decode(layer, x, chunks, position)
                close(steps, full, f"cached decoding {how} differs from the full pass")
                assert cache.length == 11, f"after 11 positions the cache says length {cache.length}"

    def check_state_size(self) -> None:
        """``state_size(n)`` equals the elements the cache keeps, and grows as declared."""
        self.require_causal()
        layer, position, x = self.build(), self.scheme(), self.x(10)
        cache, at = layer.new_cache(), 0
        with torch.no_grad():
            for n in (5, 1, 4):
                self.run(layer, x[:, at: at + n], causal=True, position=position, cache=cache)
                at += n
                kept, declared = cache.numel_per_sequence(), layer.state_size(at)
                assert kept == declared, (
                    f"after {at} positions the cache keeps {kept} elements per sequence but "
                    f"state_size({at}) = {declared}")
        complexity = getattr(layer, "complexity", None)
        if complexity is not None:
            small, large = layer.state_size(256), layer.state_size(1024)
            grows = complexity.exponent("state") > 0
            assert grows == (large > small), (
                f"complexity.state is '{complexity.state}' but state_size(256) = {small} and "
                f"state_size(1024) = {large}")

    def check_long_inputs(self) -> None:
        """At 48 positions (6x the other checks) outputs are finite and caching still matches."""
        layer, position, n = self.build(), self.scheme(), 48
        if hasattr(layer, "supports_length") and not layer.supports_length(n):
            raise NotApplicable(f"the layer declares supports_length({n}) = False")
        x = self.x(n, seed=4)
        with torch.no_grad():
            for causal in self.modes():
                out = self.run(layer, x, causal=causal, position=position)
                assert torch.isfinite(out).all(), f"non-finite outputs at length {n} (causal={causal})"
            if True in self.modes():
                full = self.run(layer, x, causal=True, position=position)
                steps, _ = self.decode(layer, x, [n - 4, 1, 1, 1, 1], position)
                close(steps[:, -4:], full[:, -4:], f"cached decoding at positions {n - 4}..{n - 1} "
                      f"differs from the full pass")

    def check_position_hooks(self) -> None:
        """Each declared ``qk`` / ``bias`` hook is applied: a scheme acting there changes outputs."""
        hooks = sorted(set(self.component().position_hooks or ()) & {"qk", "bias"})
        if not hooks:
            raise NotApplicable("the layer applies no qk or bias hook (schemes reach it through the "
                                "embeddings, which the model applies)")
        layer, x = self.build(), self.x(7)
        for hook in hooks:
            position = self.scheme({hook})
            for causal in self.modes():
                plain = self.run(layer, x, causal=causal)
                with_scheme = self.run(layer, x, causal=causal, position=position)
                assert _differs(with_scheme, plain), (
                    f"the layer declares the '{hook}' position hook, but a scheme acting there "
                    f"({type(position).__name__}) changes nothing (causal={causal})")

    def check_dropout(self) -> None:
        """``dropout`` (default 0) changes nothing in eval mode and acts in training mode."""
        fields = self.config_fields()
        if "dropout" not in fields:
            if self.dropout_required:
                raise AssertionError("the config has no `dropout`: subclass AttentionConfig "
                                     "(harness.plugin), which declares it")
            raise NotApplicable("the config declares no dropout")
        default = self.component().config().dropout
        assert default == 0.0, f"dropout defaults to {default}; regularisation is off by default"
        plain = self.build(torch.float32, seed=1)
        dropped = self.build(torch.float32, seed=1, dropout=0.5)
        dropped.load_state_dict(plain.state_dict())
        x, causal = self.x(12, dtype=torch.float32), self.modes()[0]
        close(self.run(dropped, x, causal=causal), self.run(plain, x, causal=causal),
              "dropout acts in eval mode", atol=1e-6, rtol=1e-5)
        dropped.train()
        torch.manual_seed(0)
        assert _differs(self.run(dropped, x, causal=causal), self.run(plain, x, causal=causal)), (
            "dropout=0.5 changes nothing in training mode")

    def pickle_subject(self) -> Any:
        return self.build()

    def compare_pickled(self, original: Any, restored: Any) -> None:
        x, causal = self.x(5), self.modes()[0]
        close(self.run(restored, x, causal=causal), self.run(original, x, causal=causal),
              "the unpickled layer computes something else")


class AttentionChecks(SequenceLayerChecks):
    """The conformance checks of an attention variant (:class:`harness.nn.Attention`)."""

    kind = "attention"
    dropout_required = True
    pads_in_causal_mode = True

    def check_cross_attention(self) -> None:
        """Cross-attention: shapes, padded memory ignored, cached steps equal the full pass."""
        layer, x, memory = self.build(), self.x(6), self.x(9, seed=1)
        kpm = torch.zeros(B, 9, dtype=torch.bool)
        kpm[0, 7:] = True
        with torch.no_grad():
            full, weights = layer(x, memory, key_padding_mask=kpm, need_weights=True)
            assert full.shape == x.shape, f"output {tuple(full.shape)} for queries {tuple(x.shape)}"
            if weights is not None:
                assert weights.shape[0] == B and weights.shape[-2:] == (6, 9), (
                    f"weights {tuple(weights.shape)}, expected (B, H, 6, 9)")
            changed = memory.clone()
            changed[kpm] = rand(int(kpm.sum()), self.d_model, seed=2) * 10
            close(self.run(layer, x, memory=changed, key_padding_mask=kpm), full,
                  "changing padded memory changed the output")
            cache = layer.new_cache()
            steps = [self.run(layer, x[:, t: t + 1], memory=memory, key_padding_mask=kpm, cache=cache)
                     for t in range(6)]
            close(torch.cat(steps, dim=1), full, "cached cross-attention differs from the full pass")

    def check_row_stochastic(self) -> None:
        """Weights (need_weights=True) are >= 0, zero at masked keys, and sum to 1 per query."""
        layer, x, memory = self.build(), self.x(6), self.x(8, seed=1)
        modes = [("causal" if c else "bidirectional") for c in self.modes()] + ["cross"]
        for mode in modes:
            keys = memory if mode == "cross" else x
            kpm = torch.zeros(B, keys.shape[1], dtype=torch.bool)
            kpm[1, -2:] = True
            with torch.no_grad():
                _, w = layer(x, memory if mode == "cross" else None, causal=mode == "causal",
                             key_padding_mask=kpm, need_weights=True)
            assert w is not None, f"{mode}: need_weights=True returned no weights"
            lq, lk = x.shape[1], keys.shape[1]
            allowed = ~kpm[:, None, None, :].expand(B, 1, lq, lk)
            if mode == "causal":
                allowed = allowed & torch.ones(lq, lk, dtype=torch.bool).tril()
            assert torch.all(w >= 0), f"{mode}: negative weights"
            assert torch.all(w[~allowed.expand_as(w)] == 0), f"{mode}: weight on masked keys"
            close(w.sum(-1), torch.ones_like(w.sum(-1)), f"{mode}: weights do not sum to 1", atol=1e-9, rtol=0)

    def check_permutation_equivariance(self) -> None:
        """Without positions, permuting the input permutes the output; memory is a set."""
        layer, x = self.build(), self.x(9)
        with torch.no_grad():
            if False in self.modes():
                kpm = torch.zeros(B, 9, dtype=torch.bool)
                kpm[1, 6:] = True
                perm = torch.randperm(9, generator=torch.Generator().manual_seed(3))
                out = self.run(layer, x, key_padding_mask=kpm)
                permuted = self.run(layer, x[:, perm], key_padding_mask=kpm[:, perm])
                close(permuted, out[:, perm], "permuting a bidirectional input does not permute the "
                      "output: the layer has a position signal of its own")
            memory = self.x(5, seed=4)
            out = self.run(layer, x, memory=memory)
            shuffled = self.run(layer, x, memory=memory[:, torch.tensor([3, 0, 4, 1, 2])])
            close(shuffled, out, "reordering the memory changes cross-attention")


class MixerChecks(SequenceLayerChecks):
    """The conformance checks of a sequence mixer (:class:`harness.nn.Mixer`)."""

    kind = "mixer"
