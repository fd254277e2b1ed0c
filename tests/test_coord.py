"""Coordinate checks (harness.testing.coord, ``harness check --coord``): flat under μP and
growing under the standard parametrization; a planted layer whose role μP cannot see fails
it; a plugin written with ``harness new-plugin`` gets μP without code; every built-in model
and mixer passes (slow)."""

from __future__ import annotations

import pytest

import harness
from harness.cli.main import main
from harness.testing import CoordinateChecks, coord

FAST = {"widths": (32, 64, 128, 256), "steps": 3, "seeds": 1}

#: a mixer whose hidden matrix is stored flat: μP sees a vector (one dimension grows), keeps
#: Adam's lr and lets the matrix's output grow with width, which the check must catch
PLANTED = '''
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from harness.plugin import Mixer, MixerSpec, hookimpl


@dataclass
class FlatConfig:
    pass


class Flat(Mixer):
    why_not = {"qk": "none", "bias": "none"}

    def __init__(self, config: FlatConfig, *, d_model: int, num_heads: int) -> None:
        super().__init__(d_model, num_heads)
        self.flat = nn.Parameter(torch.randn(d_model * d_model) / d_model**0.5)

    def mix(self, x: Tensor, *, causal: bool, key_padding_mask: Any, position: Any) -> Tensor:
        return torch.cumsum(x, dim=1) @ self.flat.view(self.d_model, self.d_model) / x.shape[1]


@hookimpl
def harness_register_mixer(register: Any) -> None:
    register(MixerSpec(name="flat", build=Flat))
'''


def test_the_transformer_is_flat_under_mup_and_grows_under_standard():
    reg = harness.load_plugins()
    standard = coord.coord_check(reg, "model", "transformer", parametrization="standard", **FAST)
    mup = coord.coord_check(reg, "model", "transformer", parametrization="mup", **FAST)
    assert mup.passed, mup.verdict()
    assert not standard.passed, standard.verdict()
    layer, step, slope = standard.worst()
    assert slope > 0.6 and step >= 1  # Adam moves every entry by ~lr: outputs grow ~ width
    # the sizes themselves: the FFN's output at the widest over the narrowest, last step
    grow = standard.sizes["blocks.0.ffn"]
    flat = mup.sizes["blocks.0.ffn"]
    assert grow[-1][-1] / grow[0][-1] > 3 and 0.5 < flat[-1][-1] / flat[0][-1] < 1.5
    table = coord.table(standard)
    assert "**grows**" in table and "`blocks.0.ffn`" in table


def test_a_planted_layer_with_the_wrong_role_fails_the_check(tmp_path):
    path = tmp_path / "flat.py"
    path.write_text(PLANTED)
    reg = harness.load_plugins(str(path))
    result = coord.coord_check(reg, "mixer", "flat", parametrization="mup", **FAST)
    assert not result.passed
    layer, _, slope = result.worst()
    assert "self_attn" in layer and slope > coord.GROWTH, result.verdict()
    model = coord.build(reg, coord.model_config(reg, "mixer", "flat", 64, "mup", 32)[0], "lm", 0)
    assert model.mup_roles["blocks.0.self_attn.flat"].role == "vector"  # what μP took it for


@pytest.mark.parametrize("kind", ["mixer", "model", "attention"])
def test_a_plugin_from_new_plugin_gets_mup_without_code(tmp_path, capsys, kind):
    assert main(["new-plugin", kind, f"my_{kind}", "--out", str(tmp_path)]) == 0
    reg = harness.load_plugins(str(tmp_path / f"my_{kind}.py"))
    mup = coord.coord_check(reg, kind, f"my_{kind}", parametrization="mup", **FAST)
    standard = coord.coord_check(reg, kind, f"my_{kind}", parametrization="standard", **FAST)
    assert mup.passed, mup.verdict()
    assert not standard.passed, standard.verdict()
    model = coord.build(reg, coord.model_config(reg, kind, f"my_{kind}", 128, "mup", 32)[0], "lm", 0)
    roles = {r.role for r in model.mup_roles.values()}
    assert {"hidden", "readout", "vector"} <= roles


def test_harness_check_coord_prints_the_table_and_draws_the_figure(tmp_path, capsys):
    code = main(["check", "--coord", "gla", "--widths", "32,64,128", "--steps", "3", "--seeds", "1",
                 "--out", str(tmp_path)])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 0, out
    assert "standard: grows" in out and "mup: flat" in out and "μP keeps every layer flat" in out
    assert "| layer | w=32 | w=64 | w=128 |" in out
    png = tmp_path / "coord_mixer_gla.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("widths", ["32,64", "64,32,128", "a,b,c"])
def test_bad_widths_are_refused(widths, capsys):
    assert main(["check", "--coord", "gla", "--widths", widths]) == 2
    assert "--widths" in capsys.readouterr().err


def test_the_planted_layer_fails_harness_check_coord(tmp_path, capsys):
    path = tmp_path / "flat.py"
    path.write_text(PLANTED)
    code = main(["check", "--coord", "--plugin", str(path), "--widths", "32,64,128,256", "--steps", "3",
                 "--seeds", "1", "--out", str(tmp_path)])
    assert code == 1
    assert "μP lets layers grow in mixer flat" in " ".join(capsys.readouterr().out.split())


BUILTINS = [(k, n) for k in ("model", "mixer") for n in harness.load_plugins().names(k)]


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "name"), BUILTINS, ids=[f"{k}-{n}" for k, n in BUILTINS])
def test_every_builtin_model_and_mixer_is_flat_under_mup(kind, name):
    reg = harness.load_plugins()
    result = coord.coord_check(reg, kind, name, parametrization="mup", **FAST)
    assert result.passed, result.verdict()


class TestCoordinateChecksOnGLA(CoordinateChecks):
    """The kit's class, as a plugin's test suite subclasses it."""

    kind = "mixer"
    plugin = "gla"
