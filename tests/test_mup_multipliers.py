"""μP's base-width multipliers (``model.mup``: harness.nn.multipliers): each checked against the
paper's formula computed independently in float64 on shapes no other test uses; bad values
refused naming the field; a study searches them at the base width and carries them unchanged
to full width."""

from __future__ import annotations

import copy
import math

import pytest
import torch

import harness
from harness.config import parse_run_config
from harness.errors import ConfigError
from harness.run.build import build_model_from, build_task, task_info
from harness.run.plan import plan

REG = harness.load_plugins()
CHAR = {"name": "char_lm", "params": {"length": 16, "num_train": 64, "num_val": 4}}


def cfg(model: str = "transformer", width: int = 72, base: int = 24, mup: dict | None = None, **params) -> dict:
    key = "width" if model == "lstm" else "d_model"
    m = {"name": model, "params": {key: width, "layers": 2, **params}, "parametrization": "mup", "base": {key: base}}
    if model == "transformer":
        m["params"].setdefault("heads", 4)
    if "heads_base" in params:
        m["params"].pop("heads_base")
        m["base"]["heads"] = params["heads_base"]
    if mup is not None:
        m["mup"] = mup
    return m


def built(model_cfg: dict, seed: int = 0):
    p = plan(parse_run_config({"task": CHAR, "model": model_cfg, "train": {"max_steps": 3}}), REG)
    info = task_info(p, build_task(p, 0))
    torch.manual_seed(seed)
    return build_model_from(p.parts, info).double(), p


def tokens(seed: int = 0) -> torch.Tensor:
    return torch.randint(4, 60, (3, 11), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(("model", "width", "base", "alpha"), [
    ("transformer", 72, 24, 3.7), ("transformer", 40, 40, 0.3), ("lstm", 60, 20, 5.5), ("lstm", 36, 12, 0.6)])
def test_the_output_multiplier_scales_the_logits_as_alpha_out_over_m(model, width, base, alpha):
    """Tensor Programs V's readout: logits = alpha_out / m W h (+ b), m = width / base."""
    net, _ = built(cfg(model, width, base, {"output_mult": alpha}, **({"tie_embeddings": False} if model == "lstm" else {})))
    seen = []
    net.head.register_forward_pre_hook(lambda mod, args: seen.append(args[0].detach().clone()), prepend=True)
    logits = net(tokens())
    h, w = seen[0].to(torch.float64), net.head.weight.detach().to(torch.float64)
    expected = (alpha * base / width) * torch.einsum("btd,vd->btv", h, w)
    if net.head.bias is not None:
        expected = expected + net.head.bias.detach()
    assert torch.allclose(logits.detach(), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("width", "base", "heads", "heads_base", "alpha"), [
    (96, 32, 4, 4, 2.5),    # heads fixed: the head dimension grows, 1/d beyond the base
    (96, 32, 6, 2, 0.7),    # heads grow at a fixed head dimension: the standard 1/sqrt(d_head)
    (48, 48, 4, 4, 3.0)])   # at the base width
def test_the_attention_multiplier_scales_the_scores(width, base, heads, heads_base, alpha):
    net, _ = built(cfg("transformer", width, base, {"attn_mult": alpha}, heads=heads, heads_base=heads_base))
    attn = net.blocks[1].self_attn
    d, d_base = width // heads, base // heads_base
    q, k, v = (torch.randn(2, heads, 7, d, dtype=torch.float64, generator=torch.Generator().manual_seed(i))
               for i in range(3))
    pos = torch.arange(7)
    out, _ = attn.attend(q, k, v, q_pos=pos, k_pos=pos, causal=True, key_padding_mask=None, bias=None,
                         need_weights=False)
    scale = alpha * math.sqrt(d_base) / d  # alpha_attn sqrt(d_base) / d: 1/sqrt(d) at the base head width
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * scale
    weights = scores.masked_fill(~torch.tril(torch.ones(7, 7, dtype=torch.bool)), float("-inf")).softmax(-1)
    assert torch.allclose(out, weights @ v, atol=1e-12)


@pytest.mark.parametrize(("model", "width", "base", "alpha"), [("transformer", 56, 28, 1.9), ("lstm", 44, 22, 0.4)])
def test_the_input_multiplier_scales_the_embeddings_output(model, width, base, alpha):
    net, _ = built(cfg(model, width, base, {"input_mult": alpha}))
    t = tokens(1)
    table = net.embed.weight.detach().to(torch.float64)[t]
    fixed = math.sqrt(base) if model == "transformer" else 1.0  # the embedding's sqrt(d), held at the base's
    assert torch.allclose(net.embed(t), alpha * fixed * table, rtol=1e-12)


@pytest.mark.parametrize(("model", "width", "base"), [("transformer", 60, 20), ("lstm", 30, 30)])
def test_the_initial_std_multiplier_scales_every_weight_matrix_and_nothing_else(model, width, base):
    sigma = 2.6
    plain, _ = built(cfg(model, width, base, tie_embeddings=False), seed=3)
    scaled, _ = built(cfg(model, width, base, {"init_std_mult": sigma}, tie_embeddings=False), seed=3)
    a, b = dict(plain.named_parameters()), dict(scaled.named_parameters())
    roles = plain.mup_roles
    matrices = {n for n, r in roles.items() if r.role in ("hidden", "readout")} | {"embed.weight"}
    assert "head.weight" in matrices and any(roles[n].role == "hidden" for n in matrices - {"embed.weight"})
    for name in a:
        ratio = sigma if name in matrices else 1.0
        assert torch.allclose(b[name], ratio * a[name], rtol=1e-6, atol=0), name  # float32 at build


def test_a_zero_readout_starts_at_zero_and_is_refused_when_tied():
    net, _ = built(cfg("lstm", 48, 16, {"zero_readout": True}, tie_embeddings=False))
    assert not net.head.weight.any() and net.embed.weight.std() > 0
    assert torch.allclose(net(tokens()).detach(), net.head.bias.detach().expand(3, 11, -1))
    with pytest.raises(ConfigError) as err:
        built(cfg("transformer", 48, 16, {"zero_readout": True}, tie_embeddings=True))  # head = embedding
    assert "model.mup.zero_readout" in " ".join(str(err.value).split())


def test_with_every_multiplier_neutral_mup_is_as_before():
    a, _ = built(cfg("transformer", 64, 32), seed=5)
    b, _ = built(cfg("transformer", 64, 32, {"output_mult": 1.0, "attn_mult": 1.0, "input_mult": 1.0,
                                             "init_std_mult": 1.0, "zero_readout": False}), seed=5)
    t = tokens(2)
    assert torch.equal(a(t), b(t))


def test_the_resolved_config_records_the_multipliers_and_rebuilds_the_same_model():
    model = cfg("transformer", 64, 32, {"output_mult": 4.0, "attn_mult": 2.0})
    net, p = built(model, seed=7)
    resolved = p.resolved_config()
    assert resolved["model"]["mup"]["output_mult"] == 4.0 and resolved["model"]["mup"]["attn_mult"] == 2.0
    p2 = plan(parse_run_config(resolved), REG)
    torch.manual_seed(7)
    again = build_model_from(p2.parts, task_info(p2, build_task(p2, 0))).double()
    assert torch.equal(net(tokens()), again(tokens()))


@pytest.mark.parametrize(("mup", "field", "fix"), [
    ({"output_mult": 0}, "model.mup.output_mult", "greater than 0"),
    ({"output_mult": -2.0}, "model.mup.output_mult", "greater than 0"),
    ({"attn_mult": "big"}, "model.mup.attn_mult", "number"),
    ({"input_mult": 1e9}, "model.mup.input_mult", "10000"),
    ({"init_std": 2.0}, "model.mup.init_std", "init_std_mult"),
])
def test_bad_multipliers_are_refused_naming_the_field(mup, field, fix):
    with pytest.raises(ConfigError) as err:
        plan(parse_run_config({"task": CHAR, "model": cfg("transformer", 64, 32, mup)}), REG)
    text = " ".join(str(err.value).split())
    assert field in text and fix in text


def test_multipliers_that_would_change_nothing_are_refused():
    with pytest.raises(ConfigError) as err:
        built(cfg("lstm", 64, 32, {"attn_mult": 2.0}))
    assert "model.mup.attn_mult" in str(err.value) and "no attention-like scores" in " ".join(str(err.value).split())
    with pytest.raises(ConfigError) as err:
        plan(parse_run_config({"task": CHAR, "model": {"name": "transformer", "mup": {"output_mult": 2.0}}}), REG)
    assert "parametrization: mup" in " ".join(str(err.value).split())


def test_a_bad_multiplier_exits_2_from_the_command_line(tmp_path, capsys):
    import yaml

    from harness.cli.main import main

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"task": CHAR, "model": cfg("transformer", 64, 32, {"output_mult": -1.0})}))
    assert main(["train", str(path)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "model.mup.output_mult" in err and "Traceback" not in err


# -- in a study ------------------------------------------------------------------------------
def study(tmp_path, **change):
    import yaml
    from test_mup_study import STUDY

    data = copy.deepcopy(STUDY)
    data["candidates"] = [data["candidates"][0]]  # the Transformer: the LSTM's base width goes with it
    data["transfer"] = {**data["transfer"], "base": {"d_model": data["transfer"]["base"]["d_model"]}}
    data["confirm"] = {"seeds": 1, "test": "t"}
    data.update(change)
    path = tmp_path / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_transfer_study_plans_the_multipliers_at_the_base_and_carries_them_unchanged(tmp_path):
    from harness.study.schema import load_study_config
    from harness.study.space import load_registry, validate

    cfg_ = load_study_config(study(tmp_path, search={"lr": [1.0e-2], "mup.output_mult": [8.0, 0.5]}))
    space = validate(cfg_, load_registry(cfg_))
    cand = space.candidate("att")
    tune = space.run_config(cand, None, seed=0)
    assert tune["model"]["params"]["d_model"] == 16 and tune["model"]["mup"] == {"output_mult": 8.0}
    full = space.confirm_run_config(tune, seed=1, cand=cand)
    assert full["model"]["params"]["d_model"] == 32 and full["model"]["mup"] == tune["model"]["mup"]


@pytest.mark.slow
def test_a_transfer_study_tunes_the_multipliers_at_the_base_and_carries_them_unchanged(tmp_path, monkeypatch):
    import optuna

    from harness.cli.main import main
    from harness.keys import Attr

    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / "home"))
    storage, uri = f"sqlite:///{tmp_path / 'o.db'}", f"sqlite:///{tmp_path / 'm.db'}"
    path = study(tmp_path, search={"lr": [1.0e-2], "mup.output_mult": [0.5, 8.0]}, budget={"trials": 2, "steps": 8})
    data = __import__("yaml").safe_load(path.read_text())
    data["candidates"][0]["model"]["mup"] = {"input_mult": 2.0}
    path.write_text(__import__("yaml").safe_dump(data))
    assert main(["study", "run", str(path), "--storage", storage, "--tracking-uri", uri]) == 0

    def configs(name):
        s = optuna.load_study(study_name=name, storage=storage)
        return [t for t in s.get_trials() if Attr.CONFIG in t.user_attrs]

    tuned = configs("small/att")
    assert len(tuned) == 2 and {t.params["mup.output_mult"] for t in tuned} <= {0.5, 8.0}  # searched by Optuna
    for t in tuned:  # at the base width, the sampled multiplier and the candidate's fixed one
        model = t.user_attrs[Attr.CONFIG]["model"]
        assert model["params"]["d_model"] == 16
        assert model["mup"]["output_mult"] == t.params["mup.output_mult"] and model["mup"]["input_mult"] == 2.0
    best = min(tuned, key=lambda t: t.value)
    confirmed = configs("small/att/confirm")
    assert confirmed
    for t in confirmed:  # full width, the best trial's multipliers unchanged
        model = t.user_attrs[Attr.CONFIG]["model"]
        assert model["params"]["d_model"] == 32 and model["mup"] == best.user_attrs[Attr.CONFIG]["model"]["mup"]


@pytest.mark.parametrize(("change", "message"), [
    ({"search": {"mup.output": [1.0, 2.0]}}, "'mup.output' (did you mean 'mup.output_mult'"),
    ({"search": {"mup.output_mult": [1.0, -2.0]}}, "search.mup.output_mult: -2.0 is invalid"),
    ({"search": {"mup.output_mult": [1.0, 2.0]}, "transfer": None}, "standard parametrization"),
])
def test_a_bad_multiplier_search_is_refused_naming_the_field(tmp_path, change, message):
    from harness.study.schema import load_study_config
    from harness.study.space import load_registry, validate

    transfer_off = change.get("transfer", 1) is None
    change = {k: v for k, v in change.items() if k != "transfer"}
    path = study(tmp_path, **change)
    if transfer_off:
        data = __import__("yaml").safe_load(path.read_text())
        data.pop("transfer")
        path.write_text(__import__("yaml").safe_dump(data))
    with pytest.raises(ConfigError) as err:
        cfg_ = load_study_config(path)
        validate(cfg_, load_registry(cfg_))
    assert message in " ".join(str(err.value).split())


def with_mup(model_cfg, **mults):
    from harness.config import ModelConfig

    return ModelConfig.model_validate({**model_cfg.model_dump(), "mup": mults})


def test_a_plugin_from_new_plugin_gets_the_multipliers_without_code(tmp_path):
    """The attention template's scores (through qk_divisor) and the model template's readout and
    embedding, each against the formula in float64."""
    from harness.cli.main import main
    from harness.testing import coord

    for kind in ("attention", "model"):
        assert main(["new-plugin", kind, f"my_{kind}", "--out", str(tmp_path)]) == 0
    reg = harness.load_plugins(str(tmp_path / "my_attention.py"), str(tmp_path / "my_model.py"))
    alpha = 2.5
    cfg_att, _ = coord.model_config(reg, "attention", "my_attention", 96, "mup", 32)
    att = coord.build(reg, with_mup(cfg_att, attn_mult=alpha), "lm", 0)
    layer = next(m for m in att.modules() if isinstance(getattr(m, "qk_dim", None), int))
    d, d_base = 96 // 4, 32 // 4
    q, k = (torch.randn(2, 4, 5, d, dtype=torch.float64, generator=torch.Generator().manual_seed(i)) for i in (1, 2))
    squared = ((q[..., :, None, :] - k[..., None, :, :]) ** 2).sum(-1)
    expected = -squared * alpha * math.sqrt(d_base) / (layer.temperature * d)  # alpha_attn sqrt(d_base) / d
    assert torch.allclose(layer.score(q, k), expected, atol=1e-10)

    cfg_model, _ = coord.model_config(reg, "model", "my_model", 80, "mup", 20)
    net = coord.build(reg, with_mup(cfg_model, output_mult=3.0, input_mult=0.5),
                      "lm", 0).double()
    t = tokens(4)
    assert torch.allclose(net.embed(t), 0.5 * net.embed.weight.detach()[t])
    seen = []
    net.head.register_forward_pre_hook(lambda mod, args: seen.append(args[0].detach().clone()), prepend=True)
    logits = net(t)
    expected = 3.0 * 20 / 80 * seen[0] @ net.head.weight.detach().T + net.head.bias.detach()
    assert torch.allclose(logits.detach(), expected, atol=1e-10)


def test_a_scaling_study_under_mup_carries_the_multipliers_to_every_cell(tmp_path):
    import yaml
    from test_mup_study import SCALING

    from harness.study.schema import load_study_config
    from harness.study.space import load_registry, validate

    data = copy.deepcopy(SCALING)
    data["candidates"][0]["model"]["mup"] = {"output_mult": 4.0}
    data["search"] = {"mup.input_mult": [0.5, 2.0]}
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(data))
    cfg_ = load_study_config(path)
    space = validate(cfg_, load_registry(cfg_))
    assert len(space.candidates) == 9
    for cand in space.candidates:
        run = space.run_config(cand, None, seed=0)
        assert run["model"]["mup"]["output_mult"] == 4.0 and run["model"]["mup"]["input_mult"] == 0.5


def test_growing_by_heads_keeps_the_head_dimension_and_its_standard_scale():
    """base names the heads: a model four times as wide has four times the heads of the same
    width, its scores keep 1/sqrt(d_head), and its projections are hidden matrices."""
    from harness.nn.parametrization import qk_changed, qk_scale

    net, _ = built(cfg("transformer", 128, 32, heads=8, heads_base=2))
    attn = net.blocks[0].self_attn
    assert attn.qk_dim == 16 and not qk_changed(attn, 16)
    assert qk_scale(attn, 16, None) is None  # the kernel's own 1/sqrt(16)
    roles = net.mup_roles
    assert roles["blocks.0.self_attn.q_proj.weight"].role == "hidden"
    assert roles["blocks.0.self_attn.q_proj.weight"].mult == 4.0
    fixed, _ = built(cfg("transformer", 128, 32, heads=2, heads_base=2))  # heads fixed: 1/d beyond the base
    assert fixed.blocks[0].self_attn.mup_qk_base == 16 and qk_changed(fixed.blocks[0].self_attn, 64)
