"""``longformer``: sliding-window attention plus global tokens.

Beltagy, Peters, Cohan, "Longformer: The Long-Document Transformer", 2020, arXiv:2004.05150.

Two attention patterns, one softmax per query (the paper's section 3.1):

* local: a query sees the keys within ``window`` positions (``|i - j| < window``; causal:
  ``0 <= i - j < window``), exactly the ``sliding_window`` variant;
* global: the first ``num_global`` positions are global tokens. Every query also sees them
  (one softmax over window ∪ global keys, each key once), and a global token's query sees
  every key: the whole sequence bidirectionally, every earlier position causally ("global
  tokens only look back"). Which tokens are global is positional and declared: the first
  ``num_global`` (the [CLS]/BOS slot of a classifier, an attention sink of a causal LM),
  not task-specific special tokens.

Separate projections (``separate_global``, the paper's default): global tokens' own rows
are computed from Q_g, K_g, V_g (extra linear projections of the input) over all keys, as
the paper and the reference (``query_global``, ``key_global``, ``value_global``) do; the other queries see the global tokens through the local projections.
With ``separate_global: false`` the global rows use the shared projections.

Cost. Local rows run blocked (``harness.nn.banded``): query blocks of ``block`` rows, each
with the span of keys its window reaches plus the ``num_global`` global keys, through the
fused ``scaled_dot_product_attention``; time and memory O(L · (window + num_global)). The
global rows cost O(num_global · L). No L x L tensor, except attention weights when asked
for (logging). A score-bias scheme is asked for its bias per block (``bias_by_blocks``).

Decoding: the cache keeps the last ``window - 1`` keys and values (what the next query can
still see in its window) and the global tokens' keys and values (and, with separate
projections, their global keys and values): O(window + num_global) per token.

Cross-attention (decoder queries against an encoder's memory) sees the whole memory, as in
``sliding_window``: the two sequences' positions do not correspond.

Checked against ``allenai/longformer`` (``longformer/longformer.py``,
``LongformerSelfAttention.forward``: global keys removed from the windowed scores and
concatenated once in front of them, one softmax; the global tokens' rows recomputed with
``query_global``/``key_global``/``value_global`` over all keys and written over the local
ones). Its window ``w`` counts keys on each side (2w + 1 in all); here, as in
``sliding_window``, ``window`` counts the query itself and the keys on one side.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.plugin import (  # a list of names, not logic: other plugins list many of the same
    Attention,
    AttentionCache,
    AttentionConfig,
    AttentionSpec,
    Complexity,
    Ge,
    IntRange,
    allowed_mask,
    band,
    block_bias,
    gather_blocks,
    hookimpl,
    keep_last,
    masked_softmax,
    qk_divisor,
    qk_scale,
    run_blocks,
)


@dataclass
class LongformerConfig(AttentionConfig):
    #: keys a query sees in its window (itself included)
    window: Annotated[int, Ge(1), IntRange(4, 512, log=True)] = 64
    #: global tokens: the first num_global positions
    num_global: Annotated[int, Ge(0), IntRange(0, 8)] = 1
    #: separate query/key/value projections for the global tokens' own rows (the paper's)
    separate_global: bool = True
    #: queries per block (speed only, same result); None: max(window, 16)
    block: Annotated[int | None, Ge(1)] = None


class LongformerAttention(Attention):
    """Longformer: sliding-window attention plus global tokens (the first num_global positions) that see and are seen by every position."""

    bias_by_blocks = True  # ask the scheme for each block's bias, not the full L x L
    complexity = Complexity(time="L", memory="L", decode="1", state="1")

    def __init__(self, config: LongformerConfig, *, d_model: int, num_heads: int) -> None:
        super().__init__(d_model, num_heads, dropout=config.dropout, bias=config.bias)
        self.window, self.num_global = config.window, config.num_global
        self.block = config.block or max(config.window, 16)
        self.separate_global = config.separate_global and config.num_global > 0
        if self.separate_global:
            self.query_global = nn.Linear(d_model, num_heads * self.qk_dim, bias=config.bias)
            self.key_global = nn.Linear(d_model, num_heads * self.qk_dim, bias=config.bias)
            self.value_global = nn.Linear(d_model, num_heads * self.v_dim, bias=config.bias)

    def state_size(self, length: int) -> int:
        """The last ``window - 1`` keys and values, the global tokens' keys and values (twice
        with separate global projections)."""
        per_position = self.kv_heads * (self.qk_dim + self.v_dim)
        globals_kept = min(length, self.num_global) * (2 if self.separate_global else 1)
        return (min(length, self.window - 1) + globals_kept) * per_position

    # -- decoding cache --------------------------------------------------------------------
    def extend_cache(self, cache: AttentionCache, k: Tensor, v: Tensor, k_pos: Tensor,
                     key_padding_mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        new = k_pos < self.num_global
        if bool(new.any()):
            gk, gv = k[:, :, new], v[:, :, new]
            if "gk" in cache.state:
                gk, gv = torch.cat([cache.state["gk"], gk], dim=2), torch.cat([cache.state["gv"], gv], dim=2)
            cache.state["gk"], cache.state["gv"] = gk, gv
        k, v, k_pos, key_padding_mask = super().extend_cache(cache, k, v, k_pos, key_padding_mask)
        keep_last(cache, k, v, k_pos, key_padding_mask, self.window - 1)
        return k, v, k_pos, key_padding_mask

    # -- local rows: window ∪ global keys ----------------------------------------------------
    def attend(self, q, k, v, *, q_pos, k_pos, causal, key_padding_mask, bias, need_weights,  # type: ignore[no-untyped-def]
               state=None, cross=False):
        if cross:
            allowed = allowed_mask(q_pos, k_pos, causal=False, key_padding_mask=key_padding_mask)
            weights = masked_softmax((q / qk_divisor(self, q.shape[-1])) @ k.transpose(-2, -1), allowed).to(v.dtype)
            dropped = F.dropout(weights, self.dropout, self.training) if self.dropout else weights
            return dropped @ v, (weights if need_weights else None)
        if need_weights and state is not None:
            raise ValueError("longformer returns attention weights in full passes only, not "
                             "during cached decoding (the cache keeps a window).")
        if state is not None:
            gk, gv = state.get("gk", k[:, :, :0]), state.get("gv", v[:, :, :0])
            gpad = None
        else:
            g = int((k_pos < self.num_global).sum())
            gk, gv = k[:, :, :g], v[:, :, :g]
            gpad = key_padding_mask[:, :g] if key_padding_mask is not None else None
        gpos = torch.arange(gk.shape[2], device=q.device)
        if need_weights:
            return self._full(q, torch.cat([gk, k], 2), torch.cat([gv, v], 2), q_pos,
                              torch.cat([gpos, k_pos]), causal, key_padding_mask, gpad, bias)
        index, allowed = band(int(q_pos[0]), int(k_pos[0]), q.shape[2], k.shape[2], block=self.block,
                              window=self.window, causal=causal, device=q.device)
        key_pos = k_pos[index]
        allowed = (allowed & (key_pos >= self.num_global)[:, None, :])[None, None]  # globals: once
        if key_padding_mask is not None:
            allowed = allowed & ~key_padding_mask[:, index][:, None, :, None, :]
        n, c = index.shape[0], self.block
        rows = (q_pos[0] + torch.arange(n * c, device=q.device)).view(n, c, 1)
        seen = (gpos <= rows) if causal else torch.ones_like(gpos <= rows)  # (n, c, g)
        seen = seen[None, None]
        if gpad is not None:
            seen = seen & ~gpad[:, None, None, None, :]
        batch = max(seen.shape[0], allowed.shape[0])
        allowed = torch.cat([seen.expand(batch, *seen.shape[1:]), allowed.expand(batch, *allowed.shape[1:])],
                            dim=-1)
        all_pos = torch.cat([gpos.expand(n, -1), key_pos], dim=1)
        if bias is not None:
            bias = block_bias(bias, q, q_pos, all_pos, c)
        g = gk.shape[2]
        kb = torch.cat([gk[:, :, None].expand(-1, -1, n, g, -1), gather_blocks(k, index)], dim=3)
        vb = torch.cat([gv[:, :, None].expand(-1, -1, n, g, -1), gather_blocks(v, index)], dim=3)
        dropout = self.dropout if self.training else 0.0
        return run_blocks(q, kb, vb, allowed, bias, dropout, scale=qk_scale(self, q.shape[-1], None)), None

    def _full(self, q, k, v, q_pos, k_pos, causal, key_padding_mask, gpad, bias):  # type: ignore[no-untyped-def]
        """Every local row's scores at once, with the weights (for logging): keys are the
        global keys followed by the sequence's keys (``k_pos`` says which is which)."""
        g = k.shape[2] - q.shape[2]  # full passes only: the keys are the queries' positions
        scores = (q / qk_divisor(self, q.shape[-1])) @ k.transpose(-2, -1)
        if callable(bias):
            bias = bias(q, q_pos, k_pos)
        if bias is not None:
            scores = scores + bias
        diff = q_pos[:, None] - k_pos[None, :]
        is_global = torch.arange(k.shape[2], device=q.device) < g
        ok = torch.where(is_global, torch.ones_like(diff, dtype=torch.bool),
                         (diff.abs() < self.window) & (k_pos >= self.num_global))
        if causal:
            ok = ok & (diff >= 0)
        ok = ok[None, None]
        if key_padding_mask is not None:
            pad = torch.cat([gpad if gpad is not None else key_padding_mask[:, :0], key_padding_mask], 1)
            ok = ok & ~pad[:, None, None, :]
        weights = masked_softmax(scores, ok).to(v.dtype)
        dropped = F.dropout(weights, self.dropout, self.training) if self.dropout else weights
        # report weights over the sequence's positions: fold the global copies back in
        folded = weights[..., g:].clone()
        folded[..., :g] = folded[..., :g] + weights[..., :g]
        return dropped @ v, folded

    # -- global rows ------------------------------------------------------------------------
    def forward(self, x: Tensor, memory: Tensor | None = None, *, causal: bool = False,  # type: ignore[override]
                key_padding_mask: Tensor | None = None, position: Any = None,
                cache: AttentionCache | None = None, need_weights: bool = False
                ) -> tuple[Tensor, Tensor | None]:
        out, weights = super().forward(x, memory, causal=causal, key_padding_mask=key_padding_mask,
                                       position=position, cache=cache, need_weights=need_weights)
        start = (cache.length - x.shape[1]) if cache is not None else 0
        rows = min(self.num_global, start + x.shape[1]) - start
        if memory is not None or rows <= 0:
            return out, weights
        g_out, g_weights = self._global_rows(x, rows, start, causal, key_padding_mask, position,
                                             cache, need_weights)
        out = torch.cat([g_out, out[:, rows:]], dim=1)
        if weights is not None and g_weights is not None:
            weights = torch.cat([g_weights, weights[:, :, rows:]], dim=2)
        return out, weights

    def _global_rows(self, x, rows, start, causal, key_padding_mask, position, cache, need_weights):  # type: ignore[no-untyped-def]
        """The first ``rows`` positions of ``x`` are global tokens: each attends to every key
        (causal: every earlier one), with the global projections."""
        q_proj, k_proj, v_proj = ((self.query_global, self.key_global, self.value_global)
                                  if self.separate_global else (self.q_proj, self.k_proj, self.v_proj))
        q = self.split_heads(q_proj(x[:, :rows]), self.qk_dim)
        k = self.split_heads(k_proj(x), self.qk_dim)
        v = self.split_heads(v_proj(x), self.v_dim)
        q_pos = torch.arange(start, start + rows, device=x.device)
        k_pos = torch.arange(start, start + x.shape[1], device=x.device)
        if position is not None:
            q, k = self.position_rotate(position, q, k, q_pos, k_pos)
        if cache is not None:  # decoding: every earlier position is a global token
            name = ("ggk", "ggv") if self.separate_global else ("gk", "gv")
            if self.separate_global:
                keep = k_pos < self.num_global
                for key, new in zip(name, (k[:, :, keep], v[:, :, keep]), strict=True):
                    cache.state[key] = torch.cat([cache.state[key], new], 2) if key in cache.state else new
            k, v = cache.state[name[0]][:, :, :start + x.shape[1]], cache.state[name[1]][:, :, :start + x.shape[1]]
            k_pos, key_padding_mask = torch.arange(k.shape[2], device=x.device), None
        scores = (q / qk_divisor(self, q.shape[-1])) @ k.transpose(-2, -1)
        if position is not None:
            bias = self.position_bias(position, q, q_pos, k_pos)
            if bias is not None:
                scores = scores + bias
        allowed = allowed_mask(q_pos, k_pos, causal=causal, key_padding_mask=key_padding_mask)
        weights = masked_softmax(scores, allowed).to(v.dtype)
        dropped = F.dropout(weights, self.dropout, self.training) if self.dropout else weights
        return self.out_proj(self.merge_heads(dropped @ v)), (weights if need_weights else None)


@hookimpl
def harness_register_attention(register: Any) -> None:
    register(AttentionSpec(name="longformer", build=LongformerAttention, exempt={
        "permutation_equivariance": "the first num_global positions are global tokens (with their own "
                       "projections): the attention pattern is positional",
    }))
