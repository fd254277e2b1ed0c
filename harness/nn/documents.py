"""Document boundaries inside a sequence: windows of packed documents kept apart.

A language-modelling window cut from a packed corpus spans documents (``corpus_lm``: each
document is followed by ``<eod>``). With ``task.params.documents: separate`` the model keeps
them apart: every token sees only its own document. The boundary is the separator itself:
``<eod>`` is the **first** token of the document after it (it plays the part of a
beginning-of-document token), so the prediction of a document's first token comes from
``<eod>`` alone and the previous document's last target (predicting ``<eod>``) is scored in
its own document's context. ``document_starts`` (B, L) is True at every separator; the first
position of a window starts a (possibly cut) document anyway.

What each layer does at a start (``docs/data.md``, "Document boundaries"):

* dot-product softmax attention (``Attention.masks_documents``): a block-diagonal causal mask
  (a query sees the keys of its own document, :func:`document_ids` equal), built into the
  mask the fused kernels receive;
* mixers with a native reset (``Mixer.resets``: the linear recurrences, Mamba, Mamba-2,
  RWKV-6) multiply the carried state by 0 at the start token, inside their chunked forms
  (:func:`chunk_counts`), and their short convolutions drop the lags across a start
  (:func:`causal_conv`);
* every other causal layer (long convolutions, RWKV-4, the attention variants that form no
  dot-product mask) runs each document as its own sequence: :func:`by_document` gathers the
  documents of a batch into rows of their own (right-padded, which a causal layer never
  reads) and scatters the outputs back. This is exact for any causal layer, a fresh state at
  every document, at the cost of a padded batch of documents (and a host sync for its shape).

Positions: the model's position embedding numbers a window's positions 0..L-1 whatever the
documents (as Megatron-LM's ``reset_position_ids=False``); inside a layer each document reads
as if alone from its position 0 (what :func:`by_document` and a cache :func:`reset` give; the
mask's query/key and score hooks see only distances, so it agrees).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


def document_ids(starts: Tensor) -> Tensor:
    """(B, L) bool -> (B, L) long: per row, the index of each position's document (0 for the
    positions before the first start)."""
    return starts.long().cumsum(dim=1)


class Documents:
    """Where the documents of a batch lie: the row of each document in a batch of documents
    (``n`` rows of ``width`` positions) and each position's place in it."""

    def __init__(self, starts: Tensor) -> None:
        b, length = starts.shape
        starts = starts.clone()
        starts[:, 0] = True
        local = starts.long().cumsum(dim=1) - 1  # the document's index within its row
        counts = local[:, -1] + 1
        first = torch.cumsum(counts, 0) - counts  # the batch row of each row's first document
        self.row = (first[:, None] + local).reshape(-1)
        self.place = places(starts).reshape(-1)
        self.n, self.width = int(counts.sum()), int(self.place.max()) + 1
        self.shape = (b, length)

    def split(self, x: Tensor) -> Tensor:
        """(B, L, ...) -> (n, width, ...): one document per row, right-padded with zeros."""
        flat = x.reshape(-1, *x.shape[2:])
        out = flat.new_zeros(self.n, self.width, *x.shape[2:])
        return out.index_put((self.row, self.place), flat)

    def merge(self, y: Tensor) -> Tensor:
        """(n, width, ...) -> (B, L, ...): the inverse of :meth:`split`."""
        return y[self.row, self.place].reshape(*self.shape, *y.shape[2:])


def places(starts: Tensor) -> Tensor:
    """(B, L) bool -> (B, L) long: each position's distance from its document's start (from
    the window's start for the positions before the first one)."""
    t = torch.arange(starts.shape[1], device=starts.device).expand_as(starts)
    return t - torch.where(starts, t, torch.zeros_like(t)).cummax(dim=1).values


def causal_conv(x: Tensor, weight: Tensor, starts: Tensor) -> Tensor:
    """A depthwise causal convolution of ``x`` (B, L, C) by ``weight`` (C, K) (its last column
    multiplies the current input, as ``F.conv1d`` after K - 1 zeros of left padding) whose
    lags never reach across a document start: y_t = Σ_j w_{K-1-j} x_{t-j} [same document]."""
    docs = document_ids(starts)
    y = x * weight[:, -1]
    for j in range(1, min(weight.shape[1], x.shape[1])):
        shifted = F.pad(x[:, :-j], (0, 0, j, 0))
        same = F.pad(docs[:, :-j], (j, 0), value=-1) == docs
        y = y + shifted * same.unsqueeze(-1).to(x.dtype) * weight[:, -1 - j]
    return y


def chunk_counts(starts: Tensor, chunk: int) -> Tensor:
    """(B, L) starts -> (B, N, C): per chunk of ``chunk`` positions (the last one padded with
    no start), the starts at or before each position. A decay factor from s to t (s <= t in a
    chunk) spans no start where the counts are equal; from the chunk's start to t where
    t's count is 0 (what the chunked forms of the linear recurrences mask)."""
    padded = F.pad(starts.long(), (0, -starts.shape[1] % chunk))
    return padded.view(starts.shape[0], -1, chunk).cumsum(-1)


def by_document(fn: Callable[[Tensor], Tensor], x: Tensor, starts: Tensor) -> Tensor:
    """``fn`` (a causal map of (N, L, D) sequences) run on every document of ``x`` (B, L, D)
    as its own sequence, outputs back in place."""
    docs = Documents(starts)
    return docs.merge(fn(docs.split(x)))


@functools.cache
def takes_starts(cls: Any) -> bool:
    """Whether a layer class's ``forward`` takes ``document_starts`` (keeps documents apart
    itself); other layers are run document by document (:func:`by_document`)."""
    return "document_starts" in inspect.signature(cls.forward).parameters


def mix(layer: Any, x: Tensor, starts: Tensor | None, **kwargs: Any) -> tuple[Tensor, Any]:
    """Call a sequence layer (attention or mixer) with documents kept apart at ``starts``
    (None: one stream, the plain call). A layer whose ``forward`` takes ``document_starts``
    does it itself; any other is run one document at a time (parallel form only)."""
    if starts is None:
        return layer(x, **kwargs)  # type: ignore[no-any-return]
    if takes_starts(type(layer)):  # type: ignore[arg-type]
        return layer(x, document_starts=starts, **kwargs)  # type: ignore[no-any-return]
    if kwargs.get("cache") is not None:
        raise ValueError("document_starts applies to a full pass; a cached model resets its "
                         "caches at a start (harness.nn.documents.reset)")
    kwargs["need_weights"] = False
    docs = Documents(starts)
    padding = kwargs.get("key_padding_mask")
    if padding is not None:  # the rows' own padding, and the documents' right padding
        kwargs["key_padding_mask"] = ~docs.split(~padding)
    return docs.merge(layer(docs.split(x), **kwargs)[0]), None


def pieces(starts: Tensor) -> list[tuple[int, int]]:
    """(start, end) of the stretches of a decoded chunk between document starts (every row
    must start documents at the same positions: a cached model decodes its rows in step)."""
    if bool((starts != starts[:1]).any()):
        raise ValueError("the rows of a cached decoding step start documents at different positions; "
                         "decode them one row at a time")
    cuts = [0, *(int(i) for i in starts[0].nonzero().flatten().tolist() if i > 0), starts.shape[1]]
    return list(zip(cuts[:-1], cuts[1:], strict=True))


def reset(cache: Any) -> None:
    """Forget a layer's decoding state at a document start: the layer reads the next document
    from its position 0, as :func:`by_document` runs it in a full pass."""
    cache.length = 0
    cache.state.clear()
    for name in ("k", "v", "k_pos", "key_padding_mask"):
        if hasattr(cache, name):
            setattr(cache, name, None)
