"""The sequence-mixer interface: what a layer that mixes information across positions declares
and implements, whether it is softmax attention, a state-space model, a linear RNN or a long
convolution.

A mixer maps ``x`` (B, L, d_model) to (B, L, d_model). It has two forms that must compute the
same function:

* the **parallel form** (training, full passes): ``forward(x)`` with ``cache=None``;
* the **recurrent or cached form** (decoding): ``forward(x, cache=cache)`` continues from the
  state in ``cache`` over the new positions of ``x`` (one token or a chunk) and updates it.
  ``cache.state`` is the mixer's own dict of tensors; ``cache.length`` counts the positions
  seen so far (the base class advances it).

It declares, as class attributes read by its spec (``harness list -v`` shows them):

* ``directions``: ``{"causal"}`` for a causal-only mixer, ``{"bidirectional"}`` for one that
  only mixes over a whole sequence (Linformer), both when it runs either way;
* ``complexity``: time and memory of the parallel form and time per decoded token, in the
  sequence length L (:class:`Complexity`);
* ``position_hooks``: which position-scheme hooks it applies (``embedding`` is applied by the
  model to the token embeddings; ``qk`` and ``bias`` only by mixers that form queries and keys
  or scores); ``why_not`` gives the reason for each hook it cannot apply;
* ``fast_path_ops``: the flash-linear-attention ops its recurrence runs on CUDA
  (:mod:`harness.nn.fast_path`; empty: the reference implementation only). The instance's
  ``kernel`` (``auto``, ``fla``, ``reference``: the run's ``train.kernels``) picks one.

and, per instance, :meth:`Mixer.state_size`: the number of elements its decoding state keeps
per sequence after ``length`` positions (the KV cache of attention grows with L; the state of
a recurrent mixer does not), so studies can match candidates by state size as well as by
parameters.

Padding: batches are right-padded, so a causal mixer never lets a pad reach a real position
and may ignore ``key_padding_mask``; a bidirectional mixer must keep padded positions out
of every real output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from harness.nn import fast_path
from harness.nn.documents import by_document

CAUSAL = "causal"
BIDIRECTIONAL = "bidirectional"
DIRECTIONS = frozenset({CAUSAL, BIDIRECTIONAL})


@dataclass(frozen=True)
class Complexity:
    """Cost in the sequence length L, as expressions (``"L^2"``, ``"L log L"``, ``"L"``, ``"1"``).

    ``time`` and ``memory``: the parallel form over a sequence of L positions (training);
    ``decode``: the time of one decoded token after L positions; ``state``: the decoding
    state's size (what :meth:`Mixer.state_size` returns, as a function of L).
    The benchmark (``harness bench mixer``) checks measured slopes against these.
    """

    time: str = "L"
    memory: str = "L"
    decode: str = "1"
    state: str = "1"

    def exponent(self, which: str) -> float:
        """The power of L in one of the expressions (``L log L`` counts as 1, ``1`` as 0)."""
        expr = getattr(self, which).replace(" ", "")
        if "L" not in expr:
            return 0.0
        if "L^" in expr:
            return float(expr.split("L^")[1].split("*")[0].split("log")[0])
        return 1.0


class LayerCache:
    """Decoding state of one layer: ``length`` positions seen so far and the layer's tensors
    in ``state`` (a mixer's recurrent state, attention's running sums)."""

    def __init__(self) -> None:
        self.length = 0
        self.state: dict[str, Any] = {}

    def tensors(self) -> list[Tensor]:
        """Every tensor this cache keeps (for measuring its size)."""
        return [v for v in self.state.values() if isinstance(v, Tensor)]

    def numel_per_sequence(self) -> int:
        """Elements kept per sequence of the batch (each tensor's first dim is the batch)."""
        return sum(t.numel() // max(1, t.shape[0]) for t in self.tensors() if t.dim() > 0)


class Mixer(nn.Module):
    """Base class of sequence mixers (see the module documentation for the contract).

    Subclasses implement :meth:`mix` (the parallel form) and :meth:`step` (continue from a
    cached state over new positions); the base class's :meth:`forward` picks one and keeps
    ``cache.length``. A mixer that computes both forms in one function may override
    :meth:`forward` instead.
    """

    directions: ClassVar[frozenset[str]] = frozenset({CAUSAL})
    complexity: ClassVar[Complexity] = Complexity()
    position_hooks: ClassVar[frozenset[str]] = frozenset({"embedding"})
    why_not: ClassVar[dict[str, str]] = {}
    #: ``mix`` takes ``document_starts`` (B, L) and resets its state there itself (a
    #: recurrence whose carried state is multiplied by 0 at a start); False: the base class
    #: runs each document as its own sequence (:func:`harness.nn.documents.by_document`)
    resets: ClassVar[bool] = False
    fast_path_ops: ClassVar[tuple[str, ...]] = ()
    kernel: str = "auto"  # set per run by harness.nn.fast_path.select

    def __init__(self, d_model: int, num_heads: int = 1) -> None:
        super().__init__()
        if d_model < 1 or num_heads < 1:
            raise ValueError(f"d_model ({d_model}) and num_heads ({num_heads}) must be >= 1.")
        self.d_model = d_model
        self.num_heads = num_heads

    def forward(
        self,
        x: Tensor,
        *,
        causal: bool = True,
        key_padding_mask: Tensor | None = None,
        position: Any = None,
        cache: LayerCache | None = None,
        need_weights: bool = False,
        document_starts: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """(B, L, d_model) -> ((B, L, d_model), None). With ``cache``, continue from its state.
        ``document_starts`` (B, L; causal parallel form only): the state starts afresh at each
        True position (:mod:`harness.nn.documents`)."""
        fast_path.begin_uncounted()  # the FLOPs its FLA kernels compute: hidden_flops
        if not causal and BIDIRECTIONAL not in self.directions:
            raise ValueError(f"{type(self).__name__} is causal-only; it cannot mix bidirectionally.")
        if causal and CAUSAL not in self.directions:
            raise ValueError(f"{type(self).__name__} mixes a whole sequence; it cannot run causally.")
        if document_starts is not None:
            if cache is not None or not causal:
                raise ValueError("document_starts applies to the causal parallel form (no cache)")
            if self.resets:
                return self.mix(x, causal=True, key_padding_mask=None, position=position,  # type: ignore[call-arg]
                                document_starts=document_starts), None
            return by_document(lambda d: self.mix(d, causal=True, key_padding_mask=None, position=position),
                               x, document_starts), None
        if cache is None:
            return self.mix(x, causal=causal, key_padding_mask=key_padding_mask, position=position), None
        if not causal:
            raise ValueError("cached (incremental) mixing is causal by definition")
        positions = torch.arange(cache.length, cache.length + x.shape[1], device=x.device)
        out = self.step(x, cache.state, positions=positions, position=position)
        cache.length += x.shape[1]
        return out, None

    def hidden_flops(self, inputs: Any, output: Any) -> float:
        """The forward and backward FLOPs of the FLA kernels this forward ran (invisible to the
        FLOP counter; :func:`harness.nn.fast_path.recurrence_flops`); 0 on the reference."""
        return fast_path.take_uncounted()

    def mix(self, x: Tensor, *, causal: bool, key_padding_mask: Tensor | None, position: Any) -> Tensor:
        """The parallel form over whole sequences."""
        raise NotImplementedError(f"{type(self).__name__} must implement mix() or forward()")

    def step(self, x: Tensor, state: dict[str, Any], *, positions: Tensor, position: Any) -> Tensor:
        """The recurrent form: continue from ``state`` (empty at the start) over the positions
        of ``x`` (B, l, d_model), updating ``state`` in place; returns (B, l, d_model)."""
        raise NotImplementedError(f"{type(self).__name__} has no recurrent form (step)")

    def new_cache(self) -> LayerCache:
        return LayerCache()

    def state_size(self, length: int) -> int:
        """Elements of decoding state kept per sequence after ``length`` positions."""
        raise NotImplementedError(f"{type(self).__name__} must declare state_size()")
