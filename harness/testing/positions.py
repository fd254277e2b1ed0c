"""Checks of position schemes (:class:`PositionChecks`).

The scheme is built with ``d_model = 16``, ``num_heads = 2``, ``head_dim = 8`` and
``max_length = 12`` (class attributes), causal unless a check says otherwise, and its three
hooks are called directly on random inputs.

``reference`` of a position spec: ``reference(scheme, method, *args)`` returns what
``getattr(scheme, method)(*args)`` should (``method`` is ``"embed"``, ``"rotate"`` or
``"score_bias"``, with that hook's arguments, float64), computed from the paper's formula
and the scheme's parameters; it is called for the hooks the scheme declares.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from harness.registry.specs import HOOK_METHODS
from harness.testing.core import Checks, NotApplicable, close, rand

B = 2


def _flat(out: Any) -> list[torch.Tensor]:
    if out is None:
        return []
    return list(out) if isinstance(out, tuple) else [out]


class PositionChecks(Checks):
    """The conformance checks of a position scheme (:class:`harness.nn.PositionScheme`)."""

    kind = "position"
    d_model: ClassVar[int] = 16
    num_heads: ClassVar[int] = 2
    max_length: ClassVar[int] = 12

    # -- helpers ----------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    def build(self, dtype: torch.dtype = torch.float64, *, seed: int | None = None,
              causal: bool = True, **overrides: Any) -> Any:
        torch.manual_seed(self.seed if seed is None else seed)
        scheme = self.component().build(
            self.config(**overrides), d_model=self.d_model, num_heads=self.num_heads,
            head_dim=self.head_dim, max_length=self.max_length, causal=causal)
        return scheme.to(dtype).eval()

    def hook_args(self, scheme: Any, method: str, *, n: int = 5, m: int = 9, offset: int = 0,
                  dtype: torch.dtype = torch.float64, seed: int = 0) -> tuple[Any, ...]:
        """Random arguments of a hook: ``n`` queries at the last positions of ``m`` keys (as in
        cached decoding), all shifted by ``offset``."""
        keys = torch.arange(offset, offset + m)
        queries = keys[m - n:]
        h, d = self.num_heads, self.head_dim
        if method == "embed":
            return rand(B, n, scheme.token_width(self.d_model), dtype=dtype, seed=seed), queries
        q = rand(B, h, n, d, dtype=dtype, seed=seed)
        if method == "rotate":
            return q, rand(B, h, m, d, dtype=dtype, seed=seed + 1), queries, keys
        return q, queries, keys

    def declared_methods(self) -> list[str]:
        hooks = self.component().hooks or frozenset()
        return [method for method, hook in HOOK_METHODS.items() if hook in hooks]

    def outputs(self, scheme: Any, **kwargs: Any) -> dict[str, list[torch.Tensor]]:
        """Every declared hook's outputs on random arguments."""
        return {m: _flat(getattr(scheme, m)(*self.hook_args(scheme, m, **kwargs)))
                for m in self.declared_methods()}

    # -- checks -----------------------------------------------------------------------
    def check_hooks_act(self) -> None:
        """The declared hook points act; the others are the identity (embed, rotate, score_bias)."""
        scheme, declared = self.build(), self.declared_methods()
        for method, hook in HOOK_METHODS.items():
            args = self.hook_args(scheme, method)
            out = getattr(scheme, method)(*args)
            if method == "embed":
                acts = out.shape != args[0].shape or not torch.equal(out, args[0])
            elif method == "rotate":
                acts = not (torch.equal(out[0], args[0]) and torch.equal(out[1], args[1]))
            else:
                acts = out is not None
            if method in declared:
                assert acts, f"the scheme declares the '{hook}' hook but {method}() returns its input unchanged"
            else:
                assert not acts, f"{method}() acts but the scheme does not declare the '{hook}' hook"

    def check_shapes(self) -> None:
        """embed (B, L, token_width) -> (B, L, d_model); rotate keeps shapes; bias broadcasts."""
        scheme, d = self.build(), self.d_model
        width = scheme.token_width(d)
        assert 1 <= width <= d, f"token_width({d}) = {width}, expected 1 .. {d}"
        x, positions = self.hook_args(scheme, "embed")
        out = scheme.embed(x, positions)
        assert out.shape == (B, 5, d), f"embed: {tuple(out.shape)} for {tuple(x.shape)}, expected (B, L, {d})"
        q, k, q_pos, k_pos = self.hook_args(scheme, "rotate")
        rq, rk = scheme.rotate(q, k, q_pos, k_pos)
        assert rq.shape == q.shape and rk.shape == k.shape, "rotate changed the shapes of queries/keys"
        bias = scheme.score_bias(*self.hook_args(scheme, "score_bias"))
        if bias is not None:
            full = (B, self.num_heads, 5, 9)
            try:
                broadcast = torch.broadcast_shapes(bias.shape, full)
            except RuntimeError:
                broadcast = None
            assert broadcast == full, f"score_bias {tuple(bias.shape)} does not broadcast to (B, H, Lq, Lk) = {full}"

    def check_dtypes(self) -> None:
        """Every hook returns the dtype of its inputs (float32 and float64), finite."""
        for dtype in (torch.float32, torch.float64):
            for method, outs in self.outputs(self.build(dtype), dtype=dtype).items():
                for t in outs:
                    assert t.dtype == dtype, f"{method}: {dtype} in, {t.dtype} out"
                    assert torch.isfinite(t).all(), f"{method}: non-finite outputs in {dtype}"

    def check_cached_positions(self) -> None:
        """Hooks at a slice of positions equal that slice of the full call (cached decoding)."""
        scheme = self.build()
        x, positions = self.hook_args(scheme, "embed", n=9)
        close(scheme.embed(x[:, 6:], positions[6:]), scheme.embed(x, positions)[:, 6:],
              "embed at positions 6..8 differs from the last rows of embed at 0..8")
        q, k, q_pos, k_pos = self.hook_args(scheme, "rotate", n=9)
        full_q, full_k = scheme.rotate(q, k, q_pos, k_pos)
        part_q, part_k = scheme.rotate(q[:, :, 6:], k, q_pos[6:], k_pos)
        close(part_q, full_q[:, :, 6:], "rotate of the last queries differs from the full call")
        close(part_k, full_k, "rotate of the keys depends on which queries come with them")
        bias = scheme.score_bias(q, q_pos, k_pos)
        if bias is not None:
            part = scheme.score_bias(q[:, :, 6:], q_pos[6:], k_pos)
            expanded = bias.expand(B, self.num_heads, 9, 9)
            close(part.expand(B, self.num_heads, 3, 9), expanded[:, :, 6:],
                  "score_bias of the last queries differs from the full call")

    def check_supports_length(self) -> None:
        """``supports(n)`` agrees with ``extrapolates``; hooks stay finite far past max_length."""
        spec, scheme = self.component(), self.build()
        long = 4 * self.max_length
        assert scheme.supports(self.max_length), f"supports({self.max_length}) is False for the length it was built for"
        if not spec.extrapolates:
            assert not scheme.supports(long), (
                f"the spec declares extrapolates=False but supports({long}) is True")
            return
        assert scheme.supports(long), f"the spec declares extrapolates=True but supports({long}) is False"
        for method, outs in self.outputs(scheme, offset=long - 9).items():
            assert all(torch.isfinite(t).all() for t in outs), f"{method}: non-finite at positions near {long}"

    def check_in_model(self) -> None:
        """In a transformer with multi_head attention: cached decoding equals the full pass,
        and a bidirectional encoder runs with padding."""
        import harness

        reg = self.registry()
        if "transformer" not in reg.names("model") or "multi_head" not in reg.names("attention"):
            raise NotApplicable("the transformer model or multi_head attention is not installed")
        spec = self.component()
        kwargs = dict(vocab_size=12, max_length=10, attention="multi_head", position=spec.name,
                      position_params=dict(self.params), registry=reg, d_model=self.d_model,
                      heads=self.num_heads, layers=2)
        torch.manual_seed(self.seed)
        lm = harness.create_model("transformer", **kwargs).double().eval()  # type: ignore[arg-type]
        tokens = torch.randint(4, 12, (B, 10), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            full = lm(tokens)
            cache = lm.new_cache()
            steps = [lm(tokens[:, :4], cache=cache)] + [lm(tokens[:, t: t + 1], cache=cache) for t in range(4, 10)]
        close(torch.cat(steps, dim=1), full, "cached decoding of a transformer differs from its full pass")
        encoder = harness.create_model("transformer", batch_format="classification", num_classes=3,
                                       **kwargs).double().eval()  # type: ignore[arg-type]
        padding = torch.zeros(B, 10, dtype=torch.bool)
        padding[0, 6:] = True
        with torch.no_grad():
            out = encoder(tokens, padding_mask=padding)
        assert out.shape == (B, 3) and torch.isfinite(out).all(), "a bidirectional encoder gives no finite output"

    def check_determinism(self) -> None:
        """Same seed, same parameters and hook outputs."""
        a, b = self.build(seed=1), self.build(seed=1)
        for (name, p), q in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
            assert torch.equal(p, q), f"two builds under the same seed differ in {name}"
        for (method, x), y in zip(self.outputs(a).items(), self.outputs(b).values(), strict=True):
            assert all(torch.equal(s, t) for s, t in zip(x, y, strict=True)), f"{method} differs between the builds"

    def check_gradients(self) -> None:
        """A loss on the declared hooks' outputs reaches every parameter of the scheme."""
        scheme = self.build()
        params = [(n, p) for n, p in scheme.named_parameters() if p.requires_grad]
        if not params:
            raise NotApplicable("the scheme has no parameters")
        loss = sum((t * rand(*t.shape, seed=7)).sum() for outs in self.outputs(scheme).values() for t in outs)
        loss.backward()  # type: ignore[union-attr]
        missing = [n for n, p in params if p.grad is None or not p.grad.abs().sum() > 0]
        assert not missing, f"no gradient reaches {', '.join(missing)}"

    def check_reference(self) -> None:
        """float64 hooks equal the spec's independent ``reference(scheme, method, *args)``."""
        reference = self.component().reference
        if reference is None:
            raise NotApplicable("no float64 reference declared (the spec's reference=)")
        scheme = self.build()
        with torch.no_grad():
            for method in self.declared_methods():
                args = self.hook_args(scheme, method, offset=3, seed=5)
                close(_flat(getattr(scheme, method)(*args)), _flat(reference(scheme, method, *args)),
                      f"{method} differs from the float64 reference")

    def pickle_subject(self) -> Any:
        return self.build()

    def compare_pickled(self, original: Any, restored: Any) -> None:
        for (method, x), y in zip(self.outputs(original).items(), self.outputs(restored).values(), strict=True):
            close(y, x, f"the unpickled scheme's {method} computes something else")
