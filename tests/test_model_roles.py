"""Per-role attention (``model.attention_roles``): a model that declares roles (the
encoder-decoder: ``encoder``, ``decoder``, ``cross``) takes a different variant in each.

Real components throughout: configs resolved against the installed plugins, models built
by their plugins, one tiny Lightning run recorded in a real MLflow store.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from mlflow.tracking import MlflowClient

import harness
from harness.config import parse_run_config
from harness.data.tasks import TaskInfo
from harness.errors import ConfigError, IncompatibleError
from harness.run.build import build_model
from harness.run.plan import plan
from harness.store import tracking
from harness.study.schema import parse_study_config
from harness.study.space import validate

VOCAB = 12
MIXED = {"encoder": {"name": "linear"}, "cross": {"name": "additive"}}
RUN: dict[str, Any] = {
    "task": {"name": "reverse", "params": {"length": 4, "vocab": 4, "num_train": 64, "num_val": 16}},
    "model": {"name": "encoder_decoder",
              "params": {"d_model": 16, "heads": 2, "encoder_layers": 1, "decoder_layers": 1},
              "attention": {"name": "multi_head"}, "position": {"name": "sinusoidal"},
              "attention_roles": MIXED},
    "train": {"max_steps": 4, "batch_size": 16, "warmup_steps": 1, "val_every": 4,
              "progress": False, "log_attention": False},
    "tracking": {"experiment": "roles"},
}


def run_config(**model: Any) -> dict[str, Any]:
    cfg = copy.deepcopy(RUN)
    cfg["model"].update(model)
    return cfg


def variant(registry, name: str) -> type:
    """The class the attention plugin ``name`` builds."""
    spec = registry.get("attention", name)
    return type(spec.build(spec.config(), d_model=16, num_heads=2))


def mixed_model(registry, **roles: Any) -> Any:
    torch.manual_seed(0)
    return harness.create_model("encoder_decoder", vocab_size=VOCAB, max_length=8,
                                batch_format="seq2seq", attention="multi_head", position="rope",
                                attention_roles=roles or MIXED, registry=registry,
                                d_model=16, heads=2).eval()


# -- building ----------------------------------------------------------------------------
def test_encoder_decoder_declares_its_roles(registry):
    assert registry.get("model", "encoder_decoder").attention_roles == ("encoder", "decoder", "cross")


def test_each_role_gets_its_own_variant(registry):
    p = plan(parse_run_config(run_config()), registry)
    assert {r: c.name for r, c in p.attention_roles.items()} == {"encoder": "linear", "cross": "additive"}
    model = build_model(p, TaskInfo(format="seq2seq", vocab_size=VOCAB, max_length=8))
    linear, additive, shared = (variant(registry, n) for n in ("linear", "additive", "multi_head"))
    assert len({linear, additive, shared}) == 3
    assert all(type(layer.self_attn) is linear for layer in model.encoder)
    assert all(type(layer.self_attn) is shared for layer in model.decoder)  # no override: shared
    assert all(type(layer.cross_attn) is additive for layer in model.decoder)


def test_create_model_takes_names_or_name_and_params(registry):
    model = mixed_model(registry, decoder="linear", cross={"name": "additive", "params": {"heads": 2}})
    assert type(model.decoder[0].self_attn) is variant(registry, "linear")
    assert type(model.encoder[0].self_attn) is variant(registry, "multi_head")
    assert model.decoder[0].cross_attn.num_heads == 2  # additive's own default is 1
    with pytest.raises(ConfigError, match=r"attention_roles\.cross\.name: required field is missing"):
        mixed_model(registry, cross={"params": {}})


def test_the_attention_factory_keeps_its_two_argument_call_and_rejects_undeclared_roles(registry):
    from harness.errors import PluginError
    from harness.run.build import attention_factory
    from harness.run.plan import Component

    model = Component(registry.get("model", "transformer"), None)
    shared = Component(registry.get("attention", "multi_head"),
                       registry.get("attention", "multi_head").config())
    factory = attention_factory(model, shared, {})
    assert type(factory(16, 2)) is variant(registry, "multi_head")
    with pytest.raises(PluginError, match="asked for attention role 'cross'.*does not declare"):
        factory(16, 2, role="cross")
    assert attention_factory(model, None, {}) is None


# -- validation --------------------------------------------------------------------------
def test_role_params_are_validated_with_their_field_path(registry):
    cfg = run_config(attention_roles={"cross": {"name": "additive", "params": {"chunk_mbb": 2}}})
    with pytest.raises(ConfigError, match=r"model\.attention_roles\.cross\.params: unknown parameter 'chunk_mbb' \(did you mean 'chunk_mb'\?\)"):
        plan(parse_run_config(cfg), registry)
    cfg = run_config(attention_roles={"cross": {"name": "additiv"}})
    with pytest.raises(harness.errors.UnknownNameError,
                       match=r"model\.attention_roles\.cross\.name: unknown attention 'additiv'. Did you mean 'additive'"):
        plan(parse_run_config(cfg), registry)


def test_unknown_role_and_roles_on_a_model_without_roles_are_config_errors(registry):
    cfg = run_config(attention_roles={"encodr": {"name": "linear"}})
    with pytest.raises(ConfigError, match=(
            r"model\.attention_roles\.encodr: unknown role for model 'encoder_decoder'; its roles "
            r"are encoder, decoder, cross\. Did you mean 'encoder'\?")):
        plan(parse_run_config(cfg), registry)
    cfg = copy.deepcopy(RUN)
    cfg["task"]["name"] = "copy"
    cfg["model"] = {"name": "transformer", "params": {"d_model": 16, "heads": 2},
                    "attention_roles": {"cross": {"name": "linear"}}}
    with pytest.raises(ConfigError, match=r"model\.attention_roles: model 'transformer' declares no attention roles"):
        plan(parse_run_config(cfg), registry)
    cfg["model"] = {"name": "lstm", "attention_roles": {"cross": {"name": "linear"}}}
    with pytest.raises(ConfigError, match=r"model 'lstm' declares no attention roles; remove it"):
        plan(parse_run_config(cfg), registry)


def test_pairing_is_checked_for_self_attention_roles_only(registry):
    alibi = {"name": "alibi"}
    # linear self-attention never forms the score matrix that ALiBi biases
    with pytest.raises(IncompatibleError, match=(
            r"model\.attention_roles\.encoder: attention 'linear' cannot be paired with position "
            r"'alibi': the scheme acts through bias and linear attention")):
        plan(parse_run_config(run_config(position=alibi, attention_roles={"encoder": {"name": "linear"}})),
             registry)
    # cross-attention sees no positions: any variant is fine there
    p = plan(parse_run_config(run_config(position=alibi, attention_roles={"cross": {"name": "linear"}})),
             registry)
    assert p.role_attention("cross").name == "linear" and p.role_attention("encoder").name == "multi_head"
    # a shared variant used only for cross-attention is not checked either
    roles = {"encoder": {"name": "multi_head"}, "decoder": {"name": "multi_head"}}
    plan(parse_run_config(run_config(position=alibi, attention={"name": "linear"}, attention_roles=roles)),
         registry)
    # ... but one that serves a self-attention role is, with today's message
    with pytest.raises(IncompatibleError, match=r"^attention 'linear' cannot be paired"):
        plan(parse_run_config(run_config(position=alibi, attention={"name": "linear"},
                                         attention_roles={"encoder": {"name": "multi_head"}})), registry)


def test_configs_without_roles_serialise_as_before():
    cfg = copy.deepcopy(RUN)
    del cfg["model"]["attention_roles"]
    assert "attention_roles" not in parse_run_config(cfg).model_dump()["model"]


# -- decoding ----------------------------------------------------------------------------
def test_mixed_role_model_decodes_the_same_cached_and_in_full(registry):
    """Linear (prefix-sum cache) decoder self-attention, additive cross-attention, multi-head
    encoder, rotary positions: step-by-step cached decoding reproduces the full pass."""
    model = mixed_model(registry, decoder="linear", cross="additive")
    src, tgt = torch.randint(4, VOCAB, (2, 7)), torch.randint(4, VOCAB, (2, 6))
    mask = torch.zeros_like(src, dtype=torch.bool)
    mask[0, 5:] = True
    memory, _ = model.encode(src, mask)
    full, _ = model.decode(tgt, memory, mask)
    cache = model.new_cache()
    steps = [model.decode(tgt[:, t: t + 1], memory, mask, cache=cache)[0] for t in range(6)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-4, atol=1e-5)


# -- a real run --------------------------------------------------------------------------
@pytest.mark.slow
def test_run_with_per_role_attention_is_recorded(registry):
    result = harness.train(run_config(), registry=registry)
    assert result.status == "FINISHED"
    run = MlflowClient(tracking.tracking_uri()).get_run(result.run_id)
    assert run.info.status == "FINISHED"
    params, tags = run.data.params, run.data.tags
    assert params["model.attention_roles.cross.name"] == "additive"
    assert params["model.attention_roles.encoder.name"] == "linear"
    assert params["model.attention_roles.cross.params.chunk_mb"] == "64.0"  # defaults filled in
    assert params["model.attention.name"] == "multi_head"
    assert "model.attention_roles.decoder.name" not in params
    assert tags["harness.attention.cross"] == "additive"
    assert tags["harness.attention.cross.plugin"] == "attention.additive"
    assert tags["harness.attention.encoder.plugin"] == "attention.linear"
    assert tags["harness.attention.plugin"] == "attention.multi_head"
    assert tags["mlflow.runName"].startswith("encoder_decoder/multi_head,encoder=linear,cross=additive/")


# -- studies -----------------------------------------------------------------------------
def test_study_candidates_pass_fixed_roles_to_their_runs(registry):
    study = {
        "name": "roles",
        "task": RUN["task"],
        "candidates": [{"name": "mixed", "model": {
            "name": "encoder_decoder", "params": RUN["model"]["params"], "search_declared": False,
            "attention": {"name": "multi_head", "search_declared": False},
            "attention_roles": MIXED}}],
        "budget": {"trials": 1, "steps": 2},
    }
    space = validate(parse_study_config(study), registry)
    run = space.run_config(space.candidates[0], None, seed=0)
    assert run["model"]["attention_roles"] == {"encoder": {"name": "linear", "params": {}},
                                               "cross": {"name": "additive", "params": {}}}
    plain = parse_study_config({**study, "candidates": [{"name": "plain", "model": {"name": "transformer"}}]})
    assert "attention_roles" not in plain.protocol_dict()["candidates"][0]["model"]  # same fingerprint
    study["candidates"][0]["model"]["attention_roles"] = {"encodr": {"name": "linear"}}
    with pytest.raises(ConfigError, match=r"candidates\[0\] \(mixed\): model\.attention_roles\.encodr: unknown role"):
        validate(parse_study_config(study), registry)
