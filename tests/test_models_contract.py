"""Contracts every model keeps: declarations, causality, padding, caches, fixed length.

Causality and padding are checked on fresh random inputs of untrained models: a leak or a
padding dependence shows up at initialisation already.
"""

from __future__ import annotations

import pytest
import torch

import harness
import harness.errors
from harness.data.vocab import BOS, EOS, PAD
from harness.errors import ConfigError

VOCAB = 12
LM_MODELS = {
    "transformer": {"d_model": 32, "layers": 2, "heads": 2},
    "lstm": {"width": 32, "layers": 2},
    "gru": {"width": 32, "layers": 2},
    "mlp_mixer": {"d_model": 32, "layers": 2},
}
SEQ2SEQ = {
    "encoder_decoder": ("multi_head", {"d_model": 32, "heads": 2}),
    "rnn_seq2seq/bahdanau": ("multi_head", {"embed_dim": 16, "hidden": 32, "style": "bahdanau",
                                            "encoder_layers": 2, "decoder_layers": 2}),
    "rnn_seq2seq/luong": ("multi_head", {"embed_dim": 16, "hidden": 32, "style": "luong",
                                         "cell": "lstm"}),
    "rnn_seq2seq/none": (None, {"embed_dim": 16, "hidden": 32}),
}


def lm_model(registry, name: str, kind: str = "lm", max_length: int = 10, **extra):
    torch.manual_seed(0)
    return harness.create_model(
        name, vocab_size=VOCAB, max_length=max_length, batch_format=kind,
        num_classes=3 if kind == "classification" else None, registry=registry,
        **{**LM_MODELS[name], **extra},
    ).eval()


def seq2seq_model(registry, key: str):
    torch.manual_seed(0)
    attention, params = SEQ2SEQ[key]
    return harness.create_model(key.split("/")[0], vocab_size=VOCAB, max_length=10,
                                batch_format="seq2seq", attention=attention, registry=registry,
                                **params).eval()


def tokens(*shape: int) -> torch.Tensor:
    return torch.randint(4, VOCAB, shape)


# -- declarations ----------------------------------------------------------------------
def test_models_declare_kinds_and_length_behaviour(registry):
    declared = {s.name: s for s in registry.specs("model")}
    assert {"transformer", "encoder_decoder", "lstm", "gru", "rnn_seq2seq", "mlp_mixer"} <= set(declared)
    for name in ("lstm", "gru", "mlp_mixer"):
        assert declared[name].task_kinds == {"lm", "classification"}
    assert declared["transformer"].task_kinds == {"lm", "classification", "tagging"}
    for name in ("encoder_decoder", "rnn_seq2seq"):
        assert declared[name].task_kinds == {"seq2seq"}
    assert not declared["mlp_mixer"].extrapolates
    assert all(declared[n].extrapolates for n in ("lstm", "gru", "rnn_seq2seq", "encoder_decoder"))
    rnn = declared["rnn_seq2seq"]
    assert rnn.uses_attention and not rnn.attention_required and rnn.default_attention is None
    assert not rnn.uses_position
    widths = {"transformer": "d_model", "encoder_decoder": "d_model", "lstm": "width", "gru": "width",
              "rnn_seq2seq": "hidden", "mlp_mixer": "d_model"}
    assert {n: declared[n].width_param for n in widths} == widths


def test_bidirectional_model_on_lm_task_is_rejected(registry):
    for name in ("transformer", "mlp_mixer"):
        with pytest.raises(ConfigError, match="causal: false on an lm task"):
            lm_model(registry, name, causal=False)


# -- causality -------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(LM_MODELS))
def test_lm_output_has_zero_gradient_wrt_future_inputs(registry, name):
    model = lm_model(registry, name)
    captured = []

    def keep(module, args, out):
        out.retain_grad()
        captured.append(out)

    model.embed.register_forward_hook(keep)
    x = tokens(2, 10)
    for t in (0, 4, 9):
        captured.clear()
        model(x)[:, t].sum().backward()
        grad = captured[0].grad[:, : x.shape[1]]
        assert torch.all(grad[:, t + 1:] == 0), f"{name}: output {t} depends on later inputs"
        assert grad[:, : t + 1].abs().sum() > 0


@pytest.mark.parametrize("key", sorted(SEQ2SEQ))
def test_decoder_output_ignores_later_target_inputs(registry, key):
    model = seq2seq_model(registry, key)
    src, tgt = tokens(2, 7), tokens(2, 6)
    base = model(src, tgt)
    changed = tgt.clone()
    changed[:, 3:] = (changed[:, 3:] - 4 + 1) % (VOCAB - 4) + 4  # every later input differs
    out = model(src, changed)
    torch.testing.assert_close(out[:, :3], base[:, :3], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(out[:, 3:], base[:, 3:])
    other_src = model(tokens(2, 7), tgt)
    assert not torch.allclose(other_src[:, 0], base[:, 0]), "the decoder ignores the source"


# -- padding ---------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["lm", "classification"])
@pytest.mark.parametrize("name", sorted(LM_MODELS))
def test_padding_does_not_change_outputs(registry, name, kind):
    model = lm_model(registry, name, kind)
    short, long = tokens(1, 6), tokens(1, 10)
    alone = model(short, padding_mask=torch.zeros_like(short, dtype=torch.bool))
    batch = torch.full((2, 10), PAD)
    batch[0, :6], batch[1] = short[0], long[0]
    together = model(batch, padding_mask=batch == PAD)
    if kind == "lm":
        torch.testing.assert_close(together[:1, :6], alone, rtol=1e-5, atol=1e-5)
    else:
        torch.testing.assert_close(together[:1], alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("key", sorted(SEQ2SEQ))
def test_source_and_target_padding_do_not_change_outputs(registry, key):
    model = seq2seq_model(registry, key)
    src, tgt = tokens(1, 5), tokens(1, 4)
    alone = model(src, tgt, src_padding_mask=src == PAD, tgt_padding_mask=tgt == PAD)
    src_b, tgt_b = torch.full((2, 8), PAD), torch.full((2, 6), PAD)
    src_b[0, :5], src_b[1] = src[0], tokens(8)
    tgt_b[0, :4], tgt_b[1] = tgt[0], tokens(6)
    together = model(src_b, tgt_b, src_padding_mask=src_b == PAD, tgt_padding_mask=tgt_b == PAD)
    torch.testing.assert_close(together[:1, :4], alone, rtol=1e-5, atol=1e-5)


# -- incremental decoding and greedy ---------------------------------------------------
@pytest.mark.parametrize("name", ["transformer", "lstm", "gru"])
def test_cached_lm_steps_match_the_full_pass(registry, name):
    model = lm_model(registry, name)
    x = tokens(2, 9)
    full = model(x)
    cache = model.new_cache()
    parts = [model(x[:, :4], cache=cache)] + [model(x[:, t: t + 1], cache=cache) for t in range(4, 9)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-5, atol=1e-5)


def test_encoder_decoder_cached_decoding_matches_the_full_pass(registry):
    model = seq2seq_model(registry, "encoder_decoder")
    src, tgt = tokens(2, 7), tokens(2, 6)
    mask = torch.zeros_like(src, dtype=torch.bool)
    mask[0, 5:] = True
    memory, _ = model.encode(src, mask)
    full, _ = model.decode(tgt, memory, mask)
    cache = model.new_cache()
    steps = [model.decode(tgt[:, t: t + 1], memory, mask, cache=cache)[0] for t in range(6)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("key", sorted(SEQ2SEQ))
def test_greedy_decode_is_the_argmax_of_its_own_teacher_forced_pass(registry, key):
    model = seq2seq_model(registry, key)
    src = tokens(3, 7)
    mask = torch.zeros_like(src, dtype=torch.bool)
    mask[1, 4:] = True
    out = model.greedy_decode(src, mask, 6)
    assert out.shape == (3, 6) and out.dtype == torch.long
    tgt_in = torch.cat([torch.full((3, 1), BOS), out[:, :-1]], dim=1)
    predicted = model(src, tgt_in, src_padding_mask=mask).argmax(-1).tolist()
    for row_pred, row_out in zip(predicted, out.tolist(), strict=True):
        end = row_out.index(EOS) + 1 if EOS in row_out else len(row_out)  # rows stop at EOS
        assert row_pred[:end] == row_out[:end]


def test_seq2seq_return_attention_gives_alignment_maps(registry):
    src, tgt = tokens(2, 7), tokens(2, 5)
    mask = torch.zeros_like(src, dtype=torch.bool)
    mask[0, 5:] = True
    for key in ("rnn_seq2seq/bahdanau", "encoder_decoder"):
        logits, maps = seq2seq_model(registry, key)(src, tgt, src_padding_mask=mask,
                                                    return_attention=True)
        cross = maps[0] if key.startswith("rnn") else maps[-1]
        assert cross.shape[-2:] == (5, 7)
        torch.testing.assert_close(cross.sum(-1), torch.ones_like(cross.sum(-1)))
        assert torch.all(cross[0, ..., 5:] == 0), "attention reached source padding"
    _, maps = seq2seq_model(registry, "rnn_seq2seq/none")(src, tgt, return_attention=True)
    assert maps == []


# -- fixed length ----------------------------------------------------------------------
def test_mlp_mixer_is_fixed_length(registry):
    model = lm_model(registry, "mlp_mixer", max_length=8)
    assert model.supports_length(8) and model.supports_length(3) and not model.supports_length(9)
    assert model(tokens(2, 3)).shape == (2, 3, VOCAB)
    with pytest.raises(ValueError, match="fixed-length"):
        model(tokens(2, 9))


def test_mlp_mixer_token_mixing_matches_a_float64_reference(registry):
    for causal, expansion in ((True, 2), (True, 1), (False, 2)):
        kind = "lm" if causal else "classification"
        model = lm_model(registry, "mlp_mixer", kind, max_length=6, token_expansion=expansion).double()
        mixing = model.blocks[0].tokens
        n = 6
        x = torch.randn(3, n, 32, dtype=torch.float64)
        w1, b1 = mixing.fc_in.weight, mixing.fc_in.bias
        w2, b2 = mixing.fc_out.weight, mixing.fc_out.bias
        expected = torch.zeros_like(x)
        for t in range(n):
            out = b2[t].expand(3, 32).clone()
            for j in range(n * expansion):
                owner = j // expansion
                if causal and owner > t:
                    continue
                pre = b1[j] + sum(w1[j, s] * x[:, s] for s in range(n) if not causal or s <= owner)
                out = out + w2[t, j] * torch.nn.functional.gelu(pre)
            expected[:, t] = out
        torch.testing.assert_close(mixing(x), expected, rtol=1e-10, atol=1e-10)


# -- every attention variant in every role, every position scheme ----------------------
def _names(registry, kind: str) -> list[str]:
    return registry.names(kind)


def test_encoder_decoder_runs_every_attention_and_position(registry):
    """Each registered attention variant serves encoder self-, decoder self- and
    cross-attention; each position scheme drives both stacks. Cached decoding must
    reproduce the full pass in every pairing the plugins accept."""
    from harness.run.plan import check_pairing

    src, tgt = tokens(2, 7), tokens(2, 6)
    mask = torch.zeros_like(src, dtype=torch.bool)
    mask[0, 5:] = True
    pairs = [(a, "none") for a in _names(registry, "attention")]
    pairs += [("multi_head", p) for p in _names(registry, "position") if p != "none"]
    for attention, position in pairs:
        if "causal" not in registry.get("attention", attention).directions:
            continue  # it would be the decoder's causal self-attention too (Linformer)
        try:
            check_pairing(registry.get("attention", attention), registry.get("position", position))
        except harness.errors.IncompatibleError:
            continue
        torch.manual_seed(0)
        model = harness.create_model("encoder_decoder", vocab_size=VOCAB, max_length=8,
                                     batch_format="seq2seq", attention=attention, position=position,
                                     registry=registry, d_model=32, heads=2).eval()
        memory, _ = model.encode(src, mask)
        full, _ = model.decode(tgt, memory, mask)
        assert torch.isfinite(full).all(), (attention, position)
        cache = model.new_cache()
        steps = [model.decode(tgt[:, t: t + 1], memory, mask, cache=cache)[0] for t in range(6)]
        torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-4, atol=1e-5,
                                   msg=f"{attention} x {position}: cached decoding differs")


@pytest.mark.parametrize("style", ["bahdanau", "luong"])
def test_rnn_seq2seq_runs_every_attention(registry, style):
    src, tgt = tokens(2, 7), tokens(2, 5)
    mask = torch.zeros_like(src, dtype=torch.bool)
    mask[0, 4:] = True
    for attention in _names(registry, "attention"):
        torch.manual_seed(0)
        model = harness.create_model("rnn_seq2seq", vocab_size=VOCAB, max_length=8,
                                     batch_format="seq2seq", attention=attention, registry=registry,
                                     embed_dim=16, hidden=32, style=style).eval()
        logits, maps = model(src, tgt, src_padding_mask=mask, return_attention=True)
        assert logits.shape == (2, 5, VOCAB) and torch.isfinite(logits).all(), attention
        if maps and maps[0] is not None:
            assert torch.all(maps[0][0, ..., 4:] == 0), f"{attention} attended to source padding"
        other = src.clone()
        other[0, 4:] = tokens(3)  # change only what the padding mask hides
        torch.testing.assert_close(model(other, tgt, src_padding_mask=mask), logits,
                                   rtol=1e-5, atol=1e-5, msg=f"{attention}: padding leaked")
