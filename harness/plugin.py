"""Everything a plugin author imports, in one place.

A plugin file is plain Python: a config dataclass, a top-level module class, one
registration::

    from dataclasses import dataclass
    from typing import Annotated

    import torch.nn.functional as F

    from harness.plugin import (Attention, AttentionConfig, AttentionSpec, FloatRange, Gt,
                                hookimpl)


    @dataclass
    class CosineConfig(AttentionConfig):           # dropout and bias come with the base
        init_scale: Annotated[float, Gt(0), FloatRange(1.0, 30.0, log=True)] = 10.0


    class CosineAttention(Attention):
        \"\"\"Cosine-similarity attention with a learned scale per head.\"\"\"

        def __init__(self, config: CosineConfig, *, d_model: int, num_heads: int) -> None:
            super().__init__(d_model, num_heads, dropout=config.dropout, bias=config.bias)
            ...

        def score(self, q, k):
            return self.scale * F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)


    @hookimpl
    def harness_register_attention(register):
        register(AttentionSpec(name="cosine", build=CosineAttention))

The spec takes the class itself; the host calls it with the config and the context of its
kind (``d_model, num_heads`` for attention and mixers; ``d_model, num_heads, head_dim,
max_length, causal`` for position schemes; ``task, attention, position`` (and ``mixer``) for
models; ``seed`` for tasks). What the class already says is derived: the config from the
constructor's annotation, the description from the docstring's first sentence, a position
scheme's hook points from the methods it overrides, a task's kind from ``task_kind``, a
mixer's directions and complexity from its class attributes.

Hyper-parameters: ``Annotated[type, <bounds>, <search range>]``. Bounds (``Ge``, ``Gt``,
``Le``, ``Lt``, ``Interval``) are hard limits checked on every config (a value outside them
is a clear error before training); a search range (``IntRange``, ``FloatRange``, ``Choice``)
is what studies sample. Floats must be finite and booleans are not numbers, for every
parameter. ``harness check NAME`` runs the conformance checks on a plugin; its pytest
form is :mod:`harness.testing`. The reference is ``docs/plugins.md``.

Compute: FLOP budgets count with torch's ``FlopCounterMode``, which sees aten operations
only. A module whose work runs elsewhere (a custom autograd function calling C++, CUDA or
Triton) declares it with a method ``hidden_flops(inputs, output) -> float`` (forward and
backward FLOPs of one call, added to the count); weights used once per position rather
than per token are named in a class attribute ``sequence_weights``. The kit's ``flops``
check fails a plugin whose count falls under 6 FLOPs per weight per token.

Importing this module imports torch (the base classes are ``nn.Module`` subclasses). The
harness imports it once before loading plugins; ``harness --help`` loads none, and
``harness list`` caches its listing.
"""

from __future__ import annotations

from annotated_types import Ge, Gt, Interval, Le, Lt

from harness.data.corpus import open_corpus, window_starts
from harness.data.formats import as_lm
from harness.data.labelled import (
    SPLITS,
    LabelledConfig,
    LazyExamples,
    TokenColumn,
    cached_read,
    empty_split_error,
    encoded,
    keep_smallest_hashes,
    key_fraction,
    note_truncated,
    stream_splits,
    tokenizer_for,
    train_texts,
    vocab_of,
    where,
)
from harness.data.prepare import prepare as prepare_corpus
from harness.data.tasks import Task, TaskConfig, TaskInfo, lm_windows
from harness.data.vocab import BOS, EOS, PAD, SEP, Example, Vocab
from harness.errors import ConfigError, HarnessWarning, MissingDataError, PluginError
from harness.nn import banded, documents, fast_path, linear_recurrence, selective, ssm
from harness.nn.attention import (
    Attention,
    AttentionCache,
    AttentionConfig,
    FusedDotProductAttention,
    allowed_mask,
    masked_softmax,
    scaled,
    sdpa_mask,
)
from harness.nn.banded import band, block_bias, gather_blocks, keep_last, run_blocks
from harness.nn.blocks import (
    FeedForward,
    ScaledEmbedding,
    SwiGLU,
    TransformerBlock,
    make_mlp,
    make_norm,
)
from harness.nn.both_ways import BothWays, reverse_rows
from harness.nn.bottleneck import BottleneckReadout
from harness.nn.decoding import edit_distance, greedy, greedy_steps
from harness.nn.mixer import Complexity, LayerCache, Mixer
from harness.nn.parametrization import qk_changed, qk_divisor, qk_scale
from harness.nn.position import PositionScheme, relative_positions, sinusoids
from harness.nn.recurrent import BidirectionalEncoder, RecurrentConfig, RecurrentLM, make_rnn
from harness.nn.running_sums import (
    RunningSumAttention,
    causal_block,
    kernel_weights,
    ratio_or_zero,
)
from harness.nn.ssm import DiagonalSSM, DiagonalSSMConfig, causal_fft_conv, compute_dtype
from harness.params import Choice, FloatRange, IntRange, NoParams
from harness.registry.hookspecs import hookimpl
from harness.registry.specs import AttentionSpec, MixerSpec, ModelSpec, PositionSpec, TaskSpec
from harness.runtime.cache import cache_dir
from harness.runtime.files import read_bytes as read_user_file

__all__ = [
    # shared numerics of the built-in mixers (modules): banded attention blocks, chunked linear
    # recurrences, selective scans, diagonal state-space models
    "banded", "fast_path", "linear_recurrence", "selective", "ssm",
    "DiagonalSSM", "DiagonalSSMConfig", "causal_fft_conv", "compute_dtype",
    "band", "block_bias", "gather_blocks", "keep_last", "run_blocks",
    # registration
    "hookimpl", "AttentionSpec", "MixerSpec", "PositionSpec", "ModelSpec", "TaskSpec",
    # hyper-parameters: bounds (hard limits) and search ranges
    "Ge", "Gt", "Le", "Lt", "Interval", "IntRange", "FloatRange", "Choice", "NoParams",
    # errors a plugin raises (a ValueError from a constructor also becomes a clean config error)
    "ConfigError", "PluginError", "MissingDataError", "HarnessWarning",
    # attention variants
    "Attention", "AttentionConfig", "AttentionCache", "FusedDotProductAttention",
    "allowed_mask", "masked_softmax", "scaled", "sdpa_mask", "qk_scale", "qk_divisor", "qk_changed",
    "RunningSumAttention", "causal_block", "kernel_weights", "ratio_or_zero",
    # mixers; documents kept apart inside a sequence (harness.nn.documents, a module)
    "documents", "Mixer", "LayerCache", "Complexity", "BothWays", "reverse_rows",
    # position schemes
    "PositionScheme", "sinusoids", "relative_positions",
    # models: backbone layers, recurrent layers and models
    "TaskInfo", "ScaledEmbedding", "BottleneckReadout", "FeedForward", "SwiGLU", "TransformerBlock", "make_norm", "make_mlp",
    "RecurrentLM", "RecurrentConfig", "BidirectionalEncoder", "make_rnn",
    # tasks, and decoding helpers for their metrics
    "Task", "TaskConfig", "Vocab", "Example", "PAD", "BOS", "EOS", "SEP", "as_lm", "lm_windows",
    # prepared corpora (harness data prepare) and the harness's cache folder
    "open_corpus", "prepare_corpus", "window_starts", "cache_dir", "read_user_file",
    "greedy", "greedy_steps", "edit_distance",
    # tasks on labelled files (harness.data.labelled): config, splits, compact token storage
    "LabelledConfig", "SPLITS", "LazyExamples", "TokenColumn", "cached_read", "stream_splits", "train_texts",
    "tokenizer_for", "vocab_of", "encoded", "key_fraction", "keep_smallest_hashes", "note_truncated",
    "empty_split_error", "where",
]
