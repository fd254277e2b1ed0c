"""Cached decoding gives the tokens of full recomputation, for every architecture that generates.

Every attention variant that runs causally and every mixer (each in the ``transformer``),
and the recurrent language models (``lstm``, ``gru``): greedy generation through the
model's cache (the prompt in one call, then one position per call, as ``harness bench
decode`` measures it) must choose the same tokens as re-running the model on the whole
prefix for every token, from logits that agree to float64 precision. Parameters are scaled
up so the untrained models' logits are far from ties.
"""

from __future__ import annotations

import pytest
import torch

from harness.bench import decode
from harness.registry.loader import load

REGISTRY = load()
ARCHS = decode.architectures(REGISTRY)
PROMPT, NEW = 7, 6


def test_every_generating_plugin_is_covered():
    kinds = {a.split(":")[0] for a in ARCHS}
    assert kinds == {"attention", "mixer", "model"}
    assert {"attention:multi_head", "attention:linear", "model:lstm", "model:gru"} <= set(ARCHS)
    assert {f"mixer:{n}" for n in REGISTRY.names("mixer")} <= set(ARCHS)
    assert "attention:linformer" not in ARCHS  # bidirectional only: it cannot generate
    assert "model:mlp_mixer" not in ARCHS  # no cache: it recomputes the prefix for every token


def full_recomputation(model, prompt, new):
    """Greedy decoding written out: the whole prefix through the model for every token."""
    tokens, chosen, logits_seen = prompt, [], []
    with torch.no_grad():
        for _ in range(new):
            logits = model(tokens)[:, -1]
            logits_seen.append(logits)
            nxt = logits.argmax(-1, keepdim=True)
            chosen.append(nxt)
            tokens = torch.cat([tokens, nxt], dim=1)
    return torch.cat(chosen, dim=1), logits_seen


@pytest.mark.parametrize("arch", ARCHS)
def test_cached_generation_equals_full_recomputation(arch):
    torch.manual_seed(0)
    model = decode.build(arch, d_model=16, layers=2, heads=2, vocab=13, max_length=PROMPT + NEW,
                         registry=REGISTRY)
    model = model.double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.0)
    prompt = torch.randint(4, 13, (2, PROMPT))
    expected, expected_logits = full_recomputation(model, prompt, NEW)
    tokens, logits = decode.generate(model, prompt, NEW, cached=True)
    for step, (got, want) in enumerate(zip(logits, expected_logits, strict=True)):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9, msg=f"logits of token {step}")
    assert torch.equal(tokens, expected)
    uncached, _ = decode.generate(model, prompt, NEW, cached=False)
    assert torch.equal(uncached, expected)


def test_cache_bytes_counts_what_the_cache_keeps():
    torch.manual_seed(0)
    model = decode.build("attention:multi_head", d_model=16, layers=2, heads=2, vocab=13, registry=REGISTRY)
    cache = model.new_cache()
    with torch.no_grad():
        model(torch.randint(4, 13, (3, 10)), cache=cache)
    # keys and values: 2 layers x 2 tensors x batch 3 x 10 positions x 16 features, float32
    assert decode.cache_bytes(cache) == 2 * 2 * 3 * 10 * 16 * 4
    lstm = decode.build("model:lstm", d_model=16, layers=2, heads=2, vocab=13, registry=REGISTRY)
    cache = lstm.new_cache()
    with torch.no_grad():
        lstm(torch.randint(4, 13, (3, 10)), cache=cache)
    assert decode.cache_bytes(cache) == 2 * 2 * 3 * 16 * 4  # (h, c) x layers x batch x width
