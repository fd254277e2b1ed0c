"""μP (``model.parametrization: mup``, harness.nn.parametrization): roles from shapes, the
initialisation, learning rates and multipliers each role gets (checked against the rules of
Yang et al. 2022 written out here, not against the code), the base width equal to the standard
model bit for bit, the standard parametrization unchanged, configs recorded and reloaded."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import harness
from harness.config import TrainConfig, parse_run_config
from harness.data.formats import FORMATS
from harness.errors import ConfigError
from harness.nn.parametrization import qk_scale
from harness.run.build import build_model_from, build_task, task_info
from harness.run.optim import make_optimizer
from harness.run.plan import plan

REG = harness.load_plugins()
CHAR = {"name": "char_lm", "params": {"length": 16, "num_train": 64, "num_val": 4}}


def model_cfg(width: int, par: str = "standard", *, mixer: str | None = None, model: str = "transformer",
              base: int = 32, **params) -> dict:
    key = "width" if model in ("lstm", "gru") else "d_model"
    m = {"name": model, "params": {key: width, **({"layers": 2, "heads": 4} if key == "d_model" else {}), **params}}
    if mixer:
        m["mixer"] = {"name": mixer}
    if par == "mup":
        m.update(parametrization="mup", base={key: base})
    return m


def built(width: int, par: str = "standard", seed: int = 0, **kw):
    p = plan(parse_run_config({"task": CHAR, "model": model_cfg(width, par, **kw), "train": {"max_steps": 3}}), REG)
    info = task_info(p, build_task(p, 0))
    torch.manual_seed(seed)
    return build_model_from(p.parts, info), p


def batch(seed: int = 0, width: int = 84) -> dict:
    g = torch.Generator().manual_seed(seed)
    return FORMATS["lm"].collate([{"tokens": torch.randint(4, width, (17,), generator=g).tolist()}
                                  for _ in range(4)], "lm")


def train_steps(model, optimizer: str = "adamw", steps: int = 3, lr: float = 1e-2, opt=None) -> list[torch.Tensor]:
    """The parameters after ``steps`` steps of the harness's optimiser (or ``opt``)."""
    if opt is None:
        opt, _ = make_optimizer(model, TrainConfig(optimizer=optimizer, lr=lr, warmup_steps=0, schedule="constant"))
    for s in range(steps):
        b = batch(s)
        out = FORMATS["lm"].call(model, b)
        loss = F.cross_entropy(out[b["loss_mask"]], b["targets"][b["loss_mask"]])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


# -- at the base width μP is the standard parametrization ------------------------------------
@pytest.mark.parametrize("kw", [{}, {"mixer": "gla"}, {"mixer": "mamba2"}, {"mixer": "deltanet"},
                                {"model": "lstm"}, {"mixer": "h3"}],
                         ids=["transformer", "gla", "mamba2", "deltanet", "lstm", "h3"])
@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_at_the_base_width_mup_trains_exactly_as_standard(kw, optimizer):
    sp, _ = built(32, **kw)
    mup, _ = built(32, "mup", **kw)
    for (name, a), b in zip(sp.state_dict().items(), mup.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    for name, a, b in zip([n for n, _ in sp.named_parameters()], train_steps(sp, optimizer),
                          train_steps(mup, optimizer), strict=True):
        assert torch.equal(a, b), f"{name} differs after 3 {optimizer} steps"


def test_the_standard_parametrization_trains_as_before():
    """The standard path's optimiser is today's: two groups, decay on matrices but embeddings
    and norms, the same numbers as an AdamW built by hand."""
    model, _ = built(64)
    reference, _ = built(64)
    decay = [p for n, p in reference.named_parameters() if p.dim() >= 2 and "embed" not in n and "norm" not in n]
    spare = [p for n, p in reference.named_parameters() if not (p.dim() >= 2 and "embed" not in n and "norm" not in n)]
    from harness.run.optim import use_fused  # fused wherever the harness fuses (the CPU too)

    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": spare, "weight_decay": 0.0}], lr=1e-2,
                            **({"fused": True} if use_fused(decay + spare) else {}))
    for a, b in zip(train_steps(model), train_steps(reference, opt=opt), strict=True):
        assert torch.equal(a, b)
    assert not any(hasattr(p, "infshape") for p in model.parameters())


# -- roles, initialisation, learning rates, multipliers --------------------------------------
def test_roles_follow_from_which_dimensions_grow():
    model, _ = built(128, "mup")
    roles = {n: r.role for n, r in model.mup_roles.items()}
    assert roles["embed.weight"] == "vector"  # (vocab, d): only d grows
    assert roles["blocks.0.self_attn.q_proj.weight"] == "hidden"
    assert roles["blocks.0.ffn.net.0.weight"] == "hidden"  # (4d, d)
    assert roles["blocks.0.self_attn.q_proj.bias"] == "vector"
    assert roles["blocks.0.norms.0.weight"] == "vector"
    assert roles["head.weight"] == "readout"  # (vocab, d): fan-in grows, fan-out does not
    assert model.mup_roles["blocks.0.ffn.net.0.weight"].mult == 4.0  # fan-in d: 128 / 32


def test_initialisation_per_role():
    """Hidden matrices keep std ~ 1/sqrt(fan-in); vectors, embeddings and the readout keep
    their base-width std (μP's Table 3); measured over four seeds."""
    def stds(width: int) -> dict[str, float]:
        out: dict[str, list[float]] = {}
        for seed in range(4):
            model, _ = built(width, "mup", seed=seed)
            for n, p in model.named_parameters():
                out.setdefault(n, []).append(float(p.detach().std()))
        return {n: sum(v) / len(v) for n, v in out.items()}

    small, large = stds(32), stds(512)  # width multiplier 16
    assert large["blocks.0.self_attn.q_proj.weight"] / small["blocks.0.self_attn.q_proj.weight"] == pytest.approx(0.25, rel=0.05)
    for name in ("embed.weight", "head.weight", "blocks.0.self_attn.q_proj.bias", "blocks.0.ffn.net.0.bias"):
        assert large[name] / small[name] == pytest.approx(1.0, rel=0.15), name


def test_readout_multiplier_and_embedding_multiplier():
    model, _ = built(128, "mup")
    x = torch.randn(2, 3, 128)
    expected = F.linear(x / 4.0, model.head.weight)  # μP's readout: W (x / m)
    assert torch.allclose(model.head(x), expected, atol=1e-6)
    tokens = torch.tensor([[5, 6]])
    assert torch.allclose(model.embed(tokens), model.embed.weight[tokens] * math.sqrt(32))  # base's sqrt(d)


@pytest.mark.parametrize("optimizer", ["adamw", "adam", "sgd"])
def test_learning_rate_per_role_and_optimizer(optimizer):
    """Adam(W): hidden lr / m, everything else lr; SGD: hidden lr x m_out / m_in, vectors
    and readout lr x m, finite parameters lr (the mup package's MuAdam / MuSGD)."""
    model, _ = built(128, "mup", mlp="gelu")
    opt, _ = make_optimizer(model, TrainConfig(optimizer=optimizer, lr=0.1, warmup_steps=0, schedule="constant"))
    lr = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    params = dict(model.named_parameters())
    m = 4.0
    adam = optimizer != "sgd"
    # (4d, d): m_in = m_out = 4, so SGD's m_out / m_in is 1
    assert lr[id(params["blocks.0.ffn.net.0.weight"])] == pytest.approx(0.1 / m if adam else 0.1)
    assert lr[id(params["blocks.0.self_attn.q_proj.bias"])] == pytest.approx(0.1 if adam else 0.1 * m)
    assert lr[id(params["head.weight"])] == pytest.approx(0.1 if adam else 0.1 * m)
    assert lr[id(params["embed.weight"])] == pytest.approx(0.1 if adam else 0.1 * m)
    if adam:  # AdamW's decay per step, lr x wd, the same at every width
        wd = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
        w = params["blocks.0.ffn.net.0.weight"]
        assert lr[id(w)] * wd[id(w)] == pytest.approx(0.1 * 0.01 if optimizer == "adamw" else 0.1 * 0.0)


def test_attention_scores_fall_as_one_over_d():
    class Layer:
        mup_qk_base = 16

    assert qk_scale(None, 64, 1 / 8) == 1 / 8  # standard: untouched
    assert qk_scale(Layer(), 16, 0.25) == 0.25  # at the base width: the standard scale
    assert qk_scale(Layer(), 64, 1 / 8) == pytest.approx(16**0.5 / 64)  # sqrt(base) / d
    assert qk_scale(Layer(), 64, 1.0, fixed=True) == pytest.approx(16 / 64)  # an unscaled variant: base / d
    Layer.qk_normalized = True
    assert qk_scale(Layer(), 64, 1 / 8) == pytest.approx(16**-0.5)  # unit q, k: held at its base value
    model, _ = built(128, "mup")
    attn = model.blocks[0].self_attn
    assert attn.mup_qk_base == 8 and attn.qk_dim == 32  # head width 32 / 4 heads at base, 128 / 4
    q, k, v = (torch.randn(2, 4, 5, 32, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(5)
    attn = attn.double()
    fused, _ = attn.attend(q, k, v, q_pos=pos, k_pos=pos, causal=True, key_padding_mask=None, bias=None,
                           need_weights=False)
    scores = (q @ k.transpose(-2, -1)) * (8**0.5 / 32)  # written from the rule, float64
    weights = scores.masked_fill(~torch.tril(torch.ones(5, 5, dtype=torch.bool)), float("-inf")).softmax(-1)
    assert torch.allclose(fused, weights @ v, atol=1e-12)


# -- configs ---------------------------------------------------------------------------------
def test_the_resolved_config_records_the_parametrization_and_its_base():
    p = plan(parse_run_config({"task": CHAR, "model": {"name": "transformer", "parametrization": "mup"}}), REG)
    model = p.resolved_config()["model"]
    assert model["parametrization"] == "mup" and model["base"] == {"d_model": 64}  # the declared default
    std = plan(parse_run_config({"task": CHAR, "model": {"name": "transformer"}}), REG)
    assert "parametrization" not in std.resolved_config()["model"]  # older configs unchanged


@pytest.mark.parametrize("model, fix", [
    ({"name": "transformer", "base": {"d_model": 32}}, "set parametrization: mup"),
    ({"name": "transformer", "parametrization": "mup", "base": {"width": 32}}, "not an int parameter"),
    ({"name": "transformer", "parametrization": "mup", "base": {"d_model": 30}}, "model.base"),
    ({"name": "transformer", "parametrization": "muP"}, "model.parametrization"),
])
def test_bad_parametrization_configs_name_the_field(model, fix):
    with pytest.raises(ConfigError) as err:
        plan(parse_run_config({"task": CHAR, "model": model}), REG)
    assert fix in " ".join(str(err.value).split())


def test_a_run_under_mup_reloads_to_the_logged_validation_loss(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / "home"))
    cfg = {"task": {"name": "char_lm", "params": {"length": 16, "num_train": 256, "num_val": 8}},
           "model": model_cfg(64, "mup"),
           "train": {"max_steps": 20, "batch_size": 16, "val_every": 20, "progress": False, "num_threads": 1,
                     "lr": 1e-2, "warmup_steps": 2, "log_attention": False},
           "tracking": {"uri": f"sqlite:///{tmp_path / 'm.db'}"}}
    result = harness.train(cfg)
    model, config = harness.load_model(result.run_id)
    assert config["model"]["parametrization"] == "mup" and config["model"]["base"] == {"d_model": 32}
    p = plan(parse_run_config({k: v for k, v in config.items() if k != "tracking"}), REG)
    task = build_task(p, 0)
    val = FORMATS["lm"].collate(task.examples("val", 16), "lm")

    def loss(m) -> float:
        with torch.no_grad():
            out = FORMATS["lm"].call(m, val)
        return float(F.cross_entropy(out[val["loss_mask"]], val["targets"][val["loss_mask"]]))

    assert loss(model) == pytest.approx(result.metrics["val/loss"], rel=1e-5)
    standard, _ = built(64)  # the same weights without μP's multipliers: another function
    standard.load_state_dict(model.state_dict())
    assert abs(loss(standard.eval()) - result.metrics["val/loss"]) > 1e-3


def test_mup_with_fsdp_is_refused_before_anything_runs():
    cfg = {"task": CHAR, "model": model_cfg(64, "mup"), "train": {"strategy": "fsdp"}}
    with pytest.raises(ConfigError, match="train.strategy: ddp"):
        plan(parse_run_config(cfg), REG)


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_the_groups_follow_the_papers_table_on_shapes_where_fan_in_and_fan_out_grow_differently(optimizer):
    """Tensor Programs V, Table 3 (Adam) and Table 8 (SGD), written out per parameter for a
    model whose matrices widen by different factors in and out (d -> 3d, 2d -> 6d at m = 3,
    against a base d = 4): the expected lr and weight decay are computed here from the
    multipliers, not read from the implementation."""
    from torch import nn

    from harness.nn.widths import mu_groups, set_dims

    def make(d: int) -> nn.Module:
        return nn.Sequential(nn.Embedding(10, d), nn.Linear(d, 2 * d), nn.Linear(2 * d, 7), nn.LayerNorm(7))

    model, base, delta = make(12), make(4), make(16)
    set_dims(model, base, delta)
    params = dict(model.named_parameters())
    groups = mu_groups([{"params": list(params.values()), "lr": 0.1, "weight_decay": 0.01}], optimizer)
    got = {id(p): (g["lr"], g["weight_decay"]) for g in groups for p in g["params"]}
    m = 3.0  # every growing dimension is 3x its base here: 12/4, 24/8
    if optimizer == "sgd":
        want = {"0.weight": (0.1 * m, 0.01 / m),   # embedding (10 x d): vector-like, lr x m
                "1.weight": (0.1 / (m / m), 0.01 * (m / m)),  # hidden: lr x m_out / m_in
                "1.bias": (0.1 * m, 0.01 / m),
                "2.weight": (0.1 * m, 0.01 / m),   # readout (7 x 2d): one growing dimension
                "2.bias": (0.1, 0.01), "3.weight": (0.1, 0.01), "3.bias": (0.1, 0.01)}  # fixed
    else:
        want = {"0.weight": (0.1, 0.01), "1.weight": (0.1 / m, 0.01 * m), "1.bias": (0.1, 0.01),
                "2.weight": (0.1, 0.01), "2.bias": (0.1, 0.01), "3.weight": (0.1, 0.01), "3.bias": (0.1, 0.01)}
    for name, (lr, wd) in want.items():
        assert got[id(params[name])] == pytest.approx((lr, wd)), name
    assert sum(len(g["params"]) for g in groups) == len(params)


def test_a_matrix_whose_fan_in_grows_more_than_its_fan_out_moves_sgds_lr_by_their_ratio():
    """SGD's hidden-matrix lr is lr x m_out / m_in; Adam's is lr / m_in (the main dimension)."""
    from torch import nn

    from harness.nn.widths import mu_groups, set_dims

    def make(d: int) -> nn.Linear:  # fan-in 3d^2, fan-out d + 2
        return nn.Linear(3 * d * d, d + 2, bias=False)

    model, base, delta = make(2), make(1), make(3)  # fan-in 3 -> 12 (x4), fan-out 3 -> 4 (x4/3)
    (p,) = model.parameters()
    set_dims(model, base, delta)
    assert p.infshape.ninf() == 2
    assert p.infshape.fanin_fanout_mult_ratio() == pytest.approx((12 / 3) / (4 / 3))
    (g,) = mu_groups([{"params": [p], "lr": 0.3, "weight_decay": 0.0}], "sgd")
    assert g["lr"] == pytest.approx(0.3 / ((12 / 3) / (4 / 3)))
    (g,) = mu_groups([{"params": [p], "lr": 0.3, "weight_decay": 0.0}], "adam")
    assert g["lr"] == pytest.approx(0.3 / (12 / 3))
