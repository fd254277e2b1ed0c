"""``reformer``: LSH attention with shared queries and keys, hashed into buckets and chunked.

Kitaev, Kaiser, Levskaya, "Reformer: The Efficient Transformer", ICLR 2020,
arXiv:2001.04451.

Shared QK: one projection gives the queries q_i; the keys are the normalised queries
k_j = q_j / |q_j| (the paper's section 3). Scores are q_i · k_j / √d.

Hashing (angular LSH by random rotations): for each of ``n_hashes`` rounds r, a random
matrix R_r (d x n_buckets/2) gives h_r(x) = argmax([xR_r ; -xR_r]), one of ``n_buckets``
buckets (``n_buckets = 1`` puts every token in one bucket). In round r a query attends only
to keys of its own bucket, and only nearby ones: within each bucket, tokens in position
order are cut into chunks of ``chunk``; a query sees the keys of its own chunk and of the
bucket's previous chunk. A token does not attend to itself unless nothing else is available
(its score is lowered by 1e5, as the reference does). Causal: keys after the query are
masked by their original positions. The rounds are combined with the log-sum-exp weighting:
out_i = Σ_r exp(lse_r(i) - logsumexp_r' lse_r'(i)) · o_r(i), i.e. one softmax over the keys
of all rounds, a key found in several rounds counted once per round (the reference's default,
``allow_duplicate_attention``).

Chunks within buckets. The paper sorts the whole sequence by bucket and cuts the sorted
sequence into equal chunks, each attending to itself and the previous chunk. Where a chunk
boundary falls then depends on how many tokens, later ones included, hash into the lower
buckets: under a causal mask, which earlier keys a query sees would depend on later tokens
(not causal), and cached decoding could not reproduce the parallel pass. Here each bucket is
chunked on its own (the sorted sequence is padded to a chunk boundary at the end of each
bucket), so a query's keys depend only on the tokens before it: the attention is exactly
causal, and decoding equals the full pass for the same hashing. Restricting attention to
the query's own bucket is the paper's rule (its figure 2); the reference implementations
also let a chunk attend across a bucket boundary when one falls inside it.

Cost: per round, the padded sorted sequence has at most L + n_buckets·(chunk - 1) slots and
each chunk scores chunk x 2·chunk pairs: time and memory O(L · chunk · n_hashes), no L x L
tensor (attention weights, when asked for, are formed in full for logging).

Random rotations are a buffer, shared by the heads, redrawn every ``redraw_every`` training
forward passes (1: every step, like the reference, which draws fresh rotations per call;
0: fixed). Evaluation and decoding never redraw, so they hash the same way.

Decoding: the cache keeps every key (shared-QK vector) and value, and per round the bucket
and in-bucket index of each position plus the bucket counts; a new query attends, over the
cached keys, to those its hashing allows (same bucket, own or previous in-bucket chunk,
earlier positions): state O(L), O(L) per token. A prompt decoded from an empty cache runs
the chunked form.

Cross-attention (queries from a decoder, keys from an encoder's memory) is not hashed: the
shared-QK tie cannot hold between two sequences, so it is exact softmax attention against
the memory's normalised keys (memory O(Lq · Lk)).

Position hooks: rotations (RoPE) apply to the shared query/key vectors (both get the same
position, so the tie holds); an additive score bias cannot be applied: scores are formed per
hashed chunk, at positions that differ by batch element, head and round.

Checked against ``lucidrains/reformer-pytorch`` (``reformer_pytorch/reformer_pytorch.py``:
``LSHAttention.hash_vectors`` (rotations, argmax over [xR, -xR]), ``forward`` (normalised
keys, self-masking, causal masking by original positions, the logsumexp combination of the
rounds), ``FullQKAttention``) and ``google/trax``
(``trax/layers/research/efficient_attention.py``: ``mask_self_attention``, the -1e5 self score).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import torch
import torch.nn.functional as F
from torch import Tensor

from harness.plugin import (  # a list of names, not logic: other plugins list many of the same
    Attention,
    AttentionConfig,
    AttentionSpec,
    Choice,
    Complexity,
    Ge,
    IntRange,
    Le,
    allowed_mask,
    hookimpl,
    masked_softmax,
    qk_divisor,
)

#: added to a token's score against itself: ignored unless it has no other key
SELF_SCORE = -1e5
WHY_NOT_BIAS = (
    "Reformer scores each query against the keys of its hashed chunks, whose positions differ "
    "by batch element, head and round, so no position scheme's bias can be added"
)


@dataclass
class ReformerConfig(AttentionConfig):
    #: buckets per hashing round (1 or even: h(x) = argmax([xR; -xR]))
    n_buckets: Annotated[int, Ge(1), Le(4096), Choice((4, 8, 16, 32))] = 8
    #: hashing rounds
    n_hashes: Annotated[int, Ge(1), Le(64), IntRange(1, 8)] = 2
    #: tokens per chunk within a bucket (a query sees its chunk and the bucket's previous one)
    chunk: Annotated[int, Ge(1), Choice((8, 16, 32, 64))] = 32
    #: training forward passes between redraws of the random rotations (0: fixed)
    redraw_every: Annotated[int, Ge(0)] = 1

    def __post_init__(self) -> None:
        if self.n_buckets > 1 and self.n_buckets % 2:
            raise ValueError(f"n_buckets ({self.n_buckets}) must be 1 or even: a bucket is the "
                             f"argmax of [xR; -xR] over n_buckets / 2 random directions.")


class ReformerAttention(Attention):
    """Reformer LSH attention: shared queries/keys, angular hashing into buckets, chunked attention within buckets, several rounds."""

    complexity = Complexity(time="L", memory="L", decode="L", state="L")
    position_hooks = frozenset({"embedding", "qk"})
    why_not = {"bias": WHY_NOT_BIAS}

    def __init__(self, config: ReformerConfig, *, d_model: int, num_heads: int) -> None:
        super().__init__(d_model, num_heads, dropout=config.dropout, bias=config.bias, tied_qk=True)
        self.n_buckets, self.n_hashes, self.chunk = config.n_buckets, config.n_hashes, config.chunk
        self.redraw_every = config.redraw_every
        self.register_buffer("rotations", torch.randn(self.n_hashes, self.qk_dim, max(1, self.n_buckets // 2)))
        self.training_calls = 0

    def state_size(self, length: int) -> int:
        """Every key and value; per round each position's bucket and in-bucket index; the
        bucket counts."""
        if length == 0:
            return 0
        h, r = self.num_heads, self.n_hashes
        return length * h * (self.qk_dim + self.v_dim + 2 * r) + h * r * self.n_buckets

    @torch.no_grad()
    def redraw(self) -> None:
        self.rotations.normal_()

    @torch.compiler.disable
    def count_training_call(self) -> None:
        """Count a training forward pass and redraw when due: a Python counter, run outside
        compiled graphs (one graph break per layer; traced, the counter would be a constant
        that recompiles the layer every step until the recompile limit)."""
        self.training_calls += 1
        if self.redraw_every and self.training_calls % self.redraw_every == 0:
            self.redraw()

    @torch.no_grad()
    def hash(self, keys: Tensor) -> Tensor:
        """Bucket of each key in each round: (B, H, L, d) -> (B, H, R, L)."""
        b, h, n, _ = keys.shape
        if self.n_buckets == 1:
            return torch.zeros(b, h, self.n_hashes, n, dtype=torch.long, device=keys.device)
        turned = torch.einsum("bhld,rdk->bhrlk", keys, self.rotations.to(keys.dtype))
        return torch.cat([turned, -turned], dim=-1).argmax(dim=-1)

    def in_bucket(self, buckets: Tensor, counts: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Each token's index within its bucket (tokens before it in the same bucket, plus
        ``counts`` from earlier calls) and the updated counts (B, H, R, n_buckets)."""
        one_hot = F.one_hot(buckets, self.n_buckets)
        before = (one_hot.cumsum(dim=3) - one_hot).mul(one_hot).sum(dim=-1)
        if counts is None:
            counts = torch.zeros_like(one_hot[..., 0, :])
        return counts.gather(-1, buckets) + before, counts + one_hot.sum(dim=3)

    # -- the pipeline ----------------------------------------------------------------------
    def attend(self, q, k, v, *, q_pos, k_pos, causal, key_padding_mask, bias, need_weights,  # type: ignore[no-untyped-def]
               state=None, cross=False):
        if bias is not None:
            raise ValueError(f"a position scheme with a score bias was passed: {WHY_NOT_BIAS}.")
        if cross:
            allowed = allowed_mask(q_pos, k_pos, causal=False, key_padding_mask=key_padding_mask)
            weights = masked_softmax(self.scores(q, F.normalize(k, dim=-1)), allowed).to(v.dtype)
            dropped = F.dropout(weights, self.dropout, self.training) if self.dropout else weights
            return dropped @ v, (weights if need_weights else None)
        if state is None and self.training:
            self.count_training_call()
        if state is not None and "buckets" in state:
            if not causal:
                raise ValueError("cached (incremental) self-attention is causal; call it with causal=True.")
            return self._cached(q, k, v, q_pos, k_pos, key_padding_mask, state, need_weights)
        buckets = self.hash(F.normalize(k, dim=-1))
        rank, counts = self.in_bucket(buckets)
        if state is not None:
            state["buckets"], state["rank"], state["counts"] = buckets, rank, counts
        if need_weights:
            return self._dense(q, k, v, q_pos, k_pos, buckets, rank, buckets, rank, causal, key_padding_mask)
        return self._chunked(q, k, v, buckets, rank, counts, causal, key_padding_mask), None

    def scores(self, q: Tensor, keys: Tensor) -> Tensor:
        wide = torch.promote_types(q.dtype, torch.float32)
        return (q.to(wide) @ keys.to(wide).transpose(-2, -1)) / qk_divisor(self, q.shape[-1])

    def _chunked(self, q, k, v, buckets, rank, counts, causal, key_padding_mask):  # type: ignore[no-untyped-def]
        """Per round: tokens sorted into their bucket's slots (each bucket padded to whole
        chunks), each chunk against itself and the previous chunk, then the rounds combined."""
        b, h, n, d = q.shape
        r, c = self.n_hashes, self.chunk
        padded = (counts + c - 1) // c * c
        start = padded.cumsum(dim=-1) - padded  # first slot of each bucket
        slot = start.gather(-1, buckets) + rank  # (B, H, R, L)
        slots = -(-(n + self.n_buckets * (c - 1)) // c) * c  # enough for any hashing
        token = torch.full((b, h, r, slots), n, dtype=torch.long, device=q.device)
        token.scatter_(-1, slot, torch.arange(n, device=q.device).expand(b, h, r, n))
        valid = token < n
        token = token.clamp(max=n - 1)
        keys = F.normalize(k, dim=-1)

        def at_slots(t: Tensor) -> Tensor:  # (B, H, L, D) -> (B, H, R, slots, D)
            return t[:, :, None].expand(-1, -1, r, -1, -1).gather(
                3, token[..., None].expand(-1, -1, -1, -1, t.shape[-1]))

        def with_previous(t: Tensor, fill: Any) -> Tensor:  # (.., slots/c, c, ..) -> (.., 2c, ..)
            prev = torch.cat([torch.full_like(t[:, :, :, :1], fill), t[:, :, :, :-1]], dim=3)
            return torch.cat([prev, t], dim=4)

        m = slots // c
        qs = at_slots(q).view(b, h, r, m, c, d)
        ks = with_previous(at_slots(keys).view(b, h, r, m, c, d), 0.0)
        vs = with_previous(at_slots(v).view(b, h, r, m, c, -1), 0.0)
        pos_q = token.view(b, h, r, m, c)
        pos_k = with_previous(pos_q, 0)
        bucket_q = torch.where(valid, buckets.gather(-1, token), -1).view(b, h, r, m, c)
        bucket_k = with_previous(torch.where(valid, buckets.gather(-1, token), -2).view(b, h, r, m, c), -2)
        allowed = bucket_q[..., :, None] == bucket_k[..., None, :]  # invalid slots never match
        if causal:
            allowed = allowed & (pos_k[..., None, :] <= pos_q[..., :, None])
        if key_padding_mask is not None:
            pad_k = with_previous(key_padding_mask[:, None, None].expand(-1, h, r, -1).gather(
                -1, token).view(b, h, r, m, c), True)
            allowed = allowed & ~pad_k[..., None, :]
        scores = self.scores(qs, ks) + SELF_SCORE * (pos_k[..., None, :] == pos_q[..., :, None])
        # softmax per round; a row that sees nothing (a padded or empty slot) gets lse = -inf
        seen = allowed.any(dim=-1, keepdim=True)
        scores = scores.masked_fill(~allowed, float("-inf")).masked_fill(~seen, 0.0)
        lse = torch.logsumexp(scores, dim=-1, keepdim=True)
        # max-subtracted (not exp(s - lse)): weights sum to one even where the only key is the
        # query itself, whose score near -1e5 keeps few digits in float32
        weights = torch.softmax(scores, dim=-1).masked_fill(~allowed, 0.0).to(v.dtype)
        if self.dropout and self.training:
            weights = F.dropout(weights, self.dropout, True)
        out = (weights @ vs).view(b, h, r, slots, -1)
        lse = lse.masked_fill(~seen, float("-inf")).view(b, h, r, slots)
        # back to token order, the rounds combined by their log-sum-exp
        out = out.gather(3, slot[..., None].expand(-1, -1, -1, -1, out.shape[-1]))
        lse = lse.gather(3, slot)
        found = torch.isfinite(lse).any(dim=2, keepdim=True)
        share = torch.softmax(lse.masked_fill(~found, 0.0), dim=2)
        return (share[..., None].to(out.dtype) * out).sum(dim=2)

    def _dense(self, q, k, v, q_pos, k_pos, bq, rq, bk, rk, causal, key_padding_mask):  # type: ignore[no-untyped-def]
        """The same attention as one softmax per query over all keys, each key weighted by
        the number of rounds in which the hashing lets the query see it (decoding, weights)."""
        c = self.chunk
        wide = torch.promote_types(q.dtype, torch.float32)
        count = torch.zeros(*q.shape[:3], k.shape[2], device=q.device, dtype=wide)
        for r in range(self.n_hashes):
            same = bq[:, :, r, :, None] == bk[:, :, r, None, :]
            lag = (rq[:, :, r, :, None] // c) - (rk[:, :, r, None, :] // c)  # chunks back
            near = (lag == 0) | (lag == 1)
            count += (same & near).to(count.dtype)
        allowed = allowed_mask(q_pos, k_pos, causal=causal, key_padding_mask=key_padding_mask)
        if allowed is not None:
            count = count * allowed.to(count.dtype)
        scores = self.scores(q, F.normalize(k, dim=-1))
        scores = scores + SELF_SCORE * (q_pos[:, None] == k_pos[None, :]) + count.clamp(min=1).log()
        weights = masked_softmax(scores, count > 0).to(v.dtype)
        dropped = F.dropout(weights, self.dropout, self.training) if self.dropout else weights
        return dropped @ v, weights

    def _cached(self, q, k, v, q_pos, k_pos, key_padding_mask, state, need_weights):  # type: ignore[no-untyped-def]
        """New queries (the last ``lq`` keys) against the whole cache, block by block."""
        lq = q.shape[2]
        new = self.hash(F.normalize(k[:, :, -lq:], dim=-1))
        rank, counts = self.in_bucket(new, state["counts"])
        bk = state["buckets"] = torch.cat([state["buckets"], new], dim=-1)
        rk = state["rank"] = torch.cat([state["rank"], rank], dim=-1)
        state["counts"] = counts
        outs, maps = [], []
        for s in range(0, lq, self.chunk):
            e = min(lq, s + self.chunk)
            out, weights = self._dense(q[:, :, s:e], k, v, q_pos[s:e], k_pos, new[..., s:e],
                                       rank[..., s:e], bk, rk, True, key_padding_mask)
            outs.append(out)
            maps.append(weights)
        return torch.cat(outs, dim=2), (torch.cat(maps, dim=2) if need_weights else None)


@hookimpl
def harness_register_attention(register: Any) -> None:
    register(AttentionSpec(name="reformer", build=ReformerAttention, exempt={
        "row_stochastic": "a query sees only keys its hashing allows, and itself only as the last "
                          "resort; a padded query (its own key masked) may find no key at all and "
                          "gets zero weights, the harness's convention for a query with no key",
    }))
