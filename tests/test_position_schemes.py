"""Each position scheme against its paper's formula, on fresh random inputs.

References are written here independently of the plugins: float64 closed forms, RoPE as
complex multiplication, Shaw et al.'s score as q·(k + a), T5 buckets and ALiBi slopes
computed by hand from the papers.
"""

from __future__ import annotations

import math

import pytest
import torch

from harness.params import resolve


def build_scheme(registry, name, *, d_model=16, num_heads=2, max_length=12, causal=True, **params):
    spec = registry.get("position", name)
    config = resolve(spec.config, params, f"{name} params")
    return spec.build(config, d_model=d_model, num_heads=num_heads, head_dim=d_model // num_heads,
                      max_length=max_length, causal=causal)


def random_positions(n: int, high: int = 500) -> torch.Tensor:
    return torch.randint(0, high, (n,))


# -- added / concatenated -----------------------------------------------------------------
def closed_form_sinusoids(positions: torch.Tensor, dim: int, base: float) -> torch.Tensor:
    table = torch.zeros(len(positions), dim, dtype=torch.float64)
    for row, p in enumerate(positions.tolist()):
        for col in range(dim):
            angle = p / base ** (2 * (col // 2) / dim)
            table[row, col] = math.sin(angle) if col % 2 == 0 else math.cos(angle)
    return table


def test_sinusoidal_equals_closed_form(registry):
    scheme = build_scheme(registry, "sinusoidal", d_model=24, base=1000.0)
    positions = random_positions(7)
    x = torch.randn(3, 7, 24)
    out = scheme.embed(x, positions)
    expected = x.double() + closed_form_sinusoids(positions, 24, 1000.0)
    torch.testing.assert_close(out.double(), expected, atol=1e-4, rtol=0)


def test_sinusoidal_concat_keeps_token_and_position_apart(registry):
    scheme = build_scheme(registry, "sinusoidal_concat", d_model=32, fraction=0.25, base=500.0)
    width = 32 - scheme.token_width(32)
    assert width == 8
    positions = random_positions(5)
    x = torch.randn(2, 5, 24)
    out = scheme.embed(x, positions)
    assert out.shape == (2, 5, 32)
    torch.testing.assert_close(out[..., :24], x)
    expected = closed_form_sinusoids(positions, 8, 500.0).expand(2, -1, -1)
    torch.testing.assert_close(out[..., 24:].double(), expected, atol=1e-4, rtol=0)


def test_sinusoidal_concat_rejects_a_fraction_that_leaves_no_token_width(registry):
    with pytest.raises(ValueError, match="leaving none for tokens"):
        build_scheme(registry, "sinusoidal_concat", d_model=2, fraction=0.5)


def test_scalar_appends_position_over_training_length(registry):
    scheme = build_scheme(registry, "scalar", d_model=16, max_length=9)
    assert scheme.token_width(16) == 15
    x = torch.randn(2, 20, 15)
    out = scheme.embed(x, torch.arange(20))
    torch.testing.assert_close(out[..., :15], x)
    value = out[0, :, 15]
    assert value[0] == 0 and value[8] == pytest.approx(1.0)  # first / last training position
    assert value[16] == pytest.approx(2.0)  # twice the training span: not clamped
    torch.testing.assert_close(out[1, :, 15], value)


# -- learned: explicit behaviour past its table ---------------------------------------------
def test_learned_supports_only_its_table(registry):
    assert registry.get("position", "learned").extrapolates is False
    scheme = build_scheme(registry, "learned", d_model=8, max_length=10)
    assert scheme.supports(10) and not scheme.supports(11)
    x = torch.randn(2, 10, 8)
    out = scheme.embed(x, torch.arange(10))
    torch.testing.assert_close(out, x + scheme.table.weight[None])
    with pytest.raises(ValueError, match="10 rows.*position 10 was asked for"):
        scheme.embed(torch.randn(1, 11, 8), torch.arange(11))


def test_learned_table_factor_allocates_untrained_rows(registry):
    scheme = build_scheme(registry, "learned", d_model=8, max_length=10, table_factor=2.5)
    assert scheme.supports(25) and not scheme.supports(26)
    out = scheme.embed(torch.zeros(1, 25, 8), torch.arange(25))
    out[:, :10].sum().backward()  # a training-length input reaches only the first 10 rows
    grad = scheme.table.weight.grad
    assert grad[:10].abs().sum() > 0 and grad[10:].abs().sum() == 0


def test_learned_rejects_a_table_smaller_than_training(registry):
    from harness.errors import ConfigError

    with pytest.raises(ConfigError, match="table_factor"):
        build_scheme(registry, "learned", table_factor=0.5)


def test_learned_model_past_its_length_raises_value_error(registry):
    import harness

    model = harness.create_model("transformer", vocab_size=10, max_length=6, position="learned",
                                 registry=registry, d_model=16, layers=1, heads=2)
    assert model.supports_length(6) and not model.supports_length(7)
    model(torch.randint(4, 10, (1, 6)))
    with pytest.raises(ValueError, match="cannot run past its table"):
        model(torch.randint(4, 10, (1, 7)))


# -- RoPE -----------------------------------------------------------------------------
def reference_rotation(x: torch.Tensor, positions: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """RoPE as complex multiplication: plane i is (x_i, x_{i + D/2}), turned by p·θ_i."""
    half = x.shape[-1] // 2
    z = torch.complex(x[..., :half].double(), x[..., half:].double())
    turned = z * torch.polar(torch.ones_like(theta), positions.double()[:, None] * theta[None, :])
    return torch.cat([turned.real, turned.imag], dim=-1)


def plain_theta(dim: int, base: float) -> torch.Tensor:
    return torch.tensor([base ** (-2 * i / dim) for i in range(dim // 2)], dtype=torch.float64)


def test_rope_rotation_matches_complex_reference(registry):
    scheme = build_scheme(registry, "rope", d_model=32, num_heads=2, base=500.0)
    q, k = torch.randn(2, 2, 6, 16), torch.randn(2, 2, 6, 16)
    q_pos, k_pos = random_positions(6), random_positions(6)
    q_rot, k_rot = scheme.rotate(q, k, q_pos, k_pos)
    theta = plain_theta(16, 500.0)
    torch.testing.assert_close(q_rot.double(), reference_rotation(q, q_pos, theta), atol=2e-4, rtol=0)
    torch.testing.assert_close(k_rot.double(), reference_rotation(k, k_pos, theta), atol=2e-4, rtol=0)


@pytest.mark.parametrize("scaling", ["none", "pi", "ntk", "yarn"])
def test_rope_scores_depend_only_on_the_offset(registry, scaling):
    scheme = build_scheme(registry, "rope", d_model=32, num_heads=2, scaling=scaling, scale=4.0)
    q, k = torch.randn(1, 2, 5, 16), torch.randn(1, 2, 7, 16)
    q_pos, k_pos = random_positions(5, 100), random_positions(7, 100)

    def scores(shift: int) -> torch.Tensor:
        q_rot, k_rot = scheme.rotate(q, k, q_pos + shift, k_pos + shift)
        return q_rot @ k_rot.transpose(-2, -1)

    base = scores(0)
    for shift in (1, 37, 1000):
        torch.testing.assert_close(scores(shift), base, atol=2e-3, rtol=1e-3)
    assert not torch.allclose(base, q @ k.transpose(-2, -1), atol=1e-2)  # it did rotate


def test_rope_frequencies_pi_and_ntk_match_their_formulas(registry):
    from harness_plugins.position.rope import RopeConfig, rope_frequencies

    d, base, s = 16, 10_000.0, 4.0
    theta = plain_theta(d, base)
    pi = rope_frequencies(d, RopeConfig(scaling="pi"), 32, scale=s)
    torch.testing.assert_close(pi, theta / s)  # positions / s
    ntk = rope_frequencies(d, RopeConfig(scaling="ntk"), 32, scale=s)
    ntk_base = base * s ** (d / (d - 2))
    torch.testing.assert_close(ntk, plain_theta(d, ntk_base))
    # the fastest plane is untouched; the slowest, (base·s^(d/(d-2)))^(-(d-2)/d), is θ/s
    assert ntk[0] == theta[0]
    assert ntk[-1].item() == pytest.approx(theta[-1].item() / s)
    for scaling in ("none", "pi", "ntk", "yarn"):  # every method is plain RoPE at s = 1
        torch.testing.assert_close(rope_frequencies(d, RopeConfig(scaling=scaling), 32, 1.0), theta)


def test_rope_yarn_frequencies_follow_the_ramp(registry):
    from harness_plugins.position.rope import RopeConfig, rope_frequencies

    d, base, s, length, alpha, beta = 16, 10_000.0, 4.0, 32, 1.0, 4.0
    cfg = RopeConfig(scaling="yarn", yarn_alpha=alpha, yarn_beta=beta)
    got = rope_frequencies(d, cfg, length, scale=s)
    expected = []
    for theta in plain_theta(d, base).tolist():
        r = length / (2 * math.pi / theta)  # turns over the original length
        gamma = 0.0 if r < alpha else 1.0 if r > beta else (r - alpha) / (beta - alpha)
        expected.append((1 - gamma) * theta / s + gamma * theta)
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64))
    # with these numbers plane 0 turns 5.1 times (kept), plane 1 1.6 times (blended),
    # the rest less than once (interpolated by s): all three regions are exercised
    theta = plain_theta(d, base)
    assert got[0] == theta[0] and got[2] == pytest.approx(theta[2].item() / s)
    assert theta[1] / s < got[1] < theta[1]


def test_rope_yarn_temperature_scales_logits_by_its_square(registry):
    from harness_plugins.position.rope import RopeConfig, rope_frequencies

    s = 8.0
    scheme = build_scheme(registry, "rope", d_model=32, num_heads=2, max_length=20,
                          scaling="yarn", scale=s, yarn_alpha=1.0, yarn_beta=8.0)
    q, k = torch.randn(1, 2, 6, 16), torch.randn(1, 2, 9, 16)
    q_pos, k_pos = random_positions(6, 50), random_positions(9, 50)
    q_rot, k_rot = scheme.rotate(q, k, q_pos, k_pos)
    theta = rope_frequencies(16, RopeConfig(scaling="yarn", yarn_alpha=1.0, yarn_beta=8.0), 20, s)
    ref = reference_rotation(q, q_pos, theta) @ reference_rotation(k, k_pos, theta).transpose(-2, -1)
    one_over_t = (0.1 * math.log(s) + 1) ** 2  # the paper: sqrt(1/t) = 0.1 ln s + 1
    got = (q_rot @ k_rot.transpose(-2, -1)).double()
    torch.testing.assert_close(got, one_over_t * ref, atol=1e-3, rtol=1e-4)


def test_rope_past_train_length_mode_switches_only_beyond_the_original_length(registry):
    scheme = build_scheme(registry, "rope", d_model=16, num_heads=2, max_length=8,
                          scaling="pi", scale=2.0, apply="past_train_length")
    plain = build_scheme(registry, "rope", d_model=16, num_heads=2, max_length=8)
    always = build_scheme(registry, "rope", d_model=16, num_heads=2, max_length=8,
                          scaling="pi", scale=2.0)
    for length, reference in ((8, plain), (9, always)):
        x = torch.randn(1, 2, length, 8)
        pos = torch.arange(length)
        torch.testing.assert_close(scheme.rotate(x, x, pos, pos), reference.rotate(x, x, pos, pos))


@pytest.mark.parametrize("scaling", ["pi", "yarn"])
def test_rope_dynamic_scale_maps_each_length_onto_the_original(registry, scaling):
    dynamic = build_scheme(registry, "rope", d_model=16, num_heads=2, max_length=8,
                           scaling=scaling, dynamic=True)
    for length, s in ((8, 1.0), (12, 1.5), (24, 3.0)):  # s = max(1, n / L)
        fixed = build_scheme(registry, "rope", d_model=16, num_heads=2, max_length=8,
                             scaling=scaling, scale=s)
        x = torch.randn(1, 2, length, 8)
        pos = torch.arange(length)
        torch.testing.assert_close(dynamic.rotate(x, x, pos, pos), fixed.rotate(x, x, pos, pos))


def test_rope_rejects_odd_head_width(registry):
    with pytest.raises(ValueError, match="must be even"):
        build_scheme(registry, "rope", d_model=6, num_heads=2)


# -- ALiBi --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "heads, expected",
    [
        # the paper: 2^(-8/n) as first slope and ratio
        (8, [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256]),
        # 4 slopes of 4 heads, then every other slope of 8 heads
        (6, [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8]),
        (12, [2.0**-e for e in range(1, 9)] + [2.0**-e for e in (0.5, 1.5, 2.5, 3.5)]),
        (1, [2.0**-8]),
    ],
)
def test_alibi_slopes_are_the_papers(heads, expected):
    from harness_plugins.position.alibi import alibi_slopes

    assert alibi_slopes(heads) == pytest.approx(expected, rel=1e-12)


def test_alibi_bias_is_minus_slope_times_distance(registry):
    from harness_plugins.position.alibi import alibi_slopes

    scheme = build_scheme(registry, "alibi", d_model=24, num_heads=6)
    q_pos, k_pos = random_positions(4), random_positions(5)
    bias = scheme.score_bias(torch.randn(1, 6, 4, 4), q_pos, k_pos)
    slopes = alibi_slopes(6)
    for h, i, j in [(0, 0, 0), (5, 3, 4), (2, 1, 2)]:
        expected = -slopes[h] * abs(int(q_pos[i]) - int(k_pos[j]))
        assert bias[0, h, i, j].item() == pytest.approx(expected, rel=1e-5)


# -- T5 -------------------------------------------------------------------------------------
# By hand from T5's bucketing, 32 buckets, max_distance 128.
# Bidirectional: 16 buckets per direction, distances < 8 exact, else
#   8 + floor(ln(n/8) / ln(16) * 8), capped at 15; keys after the query add 16.
#   n=20: ln 2.5 / ln 16 * 8 = 2.64 -> 10;  n=100: ln 12.5 / ln 16 * 8 = 7.29 -> 15.
# Causal: 32 buckets for n = max(i - j, 0), distances < 16 exact, else
#   16 + floor(ln(n/16) / ln 8 * 16), capped at 31.
#   n=40: ln 2.5 / ln 8 * 16 = 7.05 -> 23;  n=100: ln 6.25 / ln 8 * 16 = 14.1 -> 30.
T5_BIDIRECTIONAL = {0: 0, -3: 3, 3: 19, -7: 7, -8: 8, -20: 10, 20: 26, -100: 15,
                    -128: 15, -1000: 15, 1000: 31}
T5_CAUSAL = {0: 0, 5: 0, -5: 5, -15: 15, -16: 16, -40: 23, -100: 30, -200: 31}


@pytest.mark.parametrize("causal, table", [(False, T5_BIDIRECTIONAL), (True, T5_CAUSAL)])
def test_t5_buckets_match_hand_computed_values(causal, table):
    from harness_plugins.position.t5_bias import relative_bucket

    offsets = torch.tensor(list(table))
    got = relative_bucket(offsets, causal=causal, num_buckets=32, max_distance=128)
    assert got.tolist() == list(table.values())


def test_t5_bias_looks_up_one_scalar_per_bucket_and_head(registry):
    from harness_plugins.position.t5_bias import relative_bucket

    scheme = build_scheme(registry, "t5_bias", d_model=16, num_heads=4, causal=False,
                          num_buckets=16, max_distance=64)
    q_pos, k_pos = random_positions(5, 200), random_positions(6, 200)
    bias = scheme.score_bias(torch.randn(1, 4, 5, 4), q_pos, k_pos)
    assert bias.shape == (1, 4, 5, 6)
    for i in range(5):
        for j in range(6):
            offset = torch.tensor([int(k_pos[j]) - int(q_pos[i])])
            bucket = int(relative_bucket(offset, causal=False, num_buckets=16, max_distance=64))
            torch.testing.assert_close(bias[0, :, i, j], scheme.bias.weight[bucket])


# -- Shaw relative --------------------------------------------------------------------------
def test_relative_bias_is_q_dot_clipped_embedding(registry):
    clip, d = 3, 8
    scheme = build_scheme(registry, "relative", d_model=16, num_heads=2, clip=clip)
    q = torch.randn(2, 2, 5, d)
    q_pos, k_pos = random_positions(5, 20), random_positions(7, 20)
    bias = scheme.score_bias(q, q_pos, k_pos).double()
    table = scheme.table.double()
    for b, h, i, j in [(0, 0, 0, 0), (1, 1, 4, 6), (0, 1, 2, 3), (1, 0, 3, 1)]:
        offset = max(-clip, min(clip, int(k_pos[j]) - int(q_pos[i])))
        expected = q[b, h, i].double() @ table[offset + clip] / math.sqrt(d)
        assert bias[b, h, i, j].item() == pytest.approx(expected.item(), abs=1e-5)
