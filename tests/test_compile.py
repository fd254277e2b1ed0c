"""``torch.compile`` of every built-in (harness.bench.compile): no graph break and nothing
compiled again once the first two training steps compiled, counted with dynamo's own counters. One
representative runs in the default selection; every plugin of each family (attention,
position, mixers, models) in ``-m slow``. The plugins that do not compile cleanly are listed
in :data:`KNOWN` with the reason, as docs/performance.md's compile table states them; their
test checks the table is still true (a plugin fixed must leave the list).

Inductor's code generation (C++ here, Triton on a GPU) is not what these check (see
harness.bench.compile); flash kernels under compile can only be seen on a GPU."""

from __future__ import annotations

import pytest

from harness.bench.compile import cases, status

#: Built-ins that break the graph or fail to compile, and why (docs/performance.md).
KNOWN: dict[str, str] = {
    "longformer": "reads the first query and key positions (int(q_pos[0])) and the count of global "
                  "keys on the host to build its band: graph breaks in every layer",
    "sliding_window": "reads the first query and key positions on the host to build its band: graph "
                      "breaks in every layer",
    "performer": "its feature-redraw counter is a Python attribute, run outside the graph "
                 "(torch.compiler.disable): one break per layer instead of a recompile every step",
    "reformer": "its rotation-redraw counter, as performer's: one break per layer",
    "rnn_seq2seq": "torch.nn.utils.rnn.pack_padded_sequence, which dynamo never traces (and whose "
                   "lengths live on the host): a graph break per call",
    "linear": "aot_eager only: AOT autograd's backward graph views a gradient whose strides do not "
              "allow it (RuntimeError 'view size is not compatible'); inductor compiles and trains it "
              "without breaks or recompiles (checked once, docs/performance.md)",
    "gated_deltanet": "aot_eager only, as linear; inductor compiles and trains it cleanly (checked once)",
}

CASES = cases()


def test_the_default_transformer_compiles_without_breaks_or_recompiles():
    got = status(CASES["models"]["transformer"])
    assert got.error is None and got.graphs >= 1
    assert got.graph_breaks == 0 and got.recompiles == 0, got


@pytest.mark.slow
@pytest.mark.parametrize("name", ["transformer", "encoder_decoder", "mlp_mixer"])
def test_checkpointed_blocks_compile_without_breaks_or_recompiles(name):
    got = status(CASES["models"][name], checkpointing=True)
    assert got.clean and got.recompiles == 0, got


def check(name: str, config: dict) -> None:
    got = status(config)
    if name in KNOWN:
        assert not got.clean, f"{name} now compiles cleanly: remove it from KNOWN and the docs' table"
        return
    assert got.error is None, got.error
    assert got.graph_breaks == 0, got.break_reasons
    assert got.steady_recompiles == 0, got


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES["attention"]))
def test_every_attention_variant_compiles(name):
    check(name, CASES["attention"][name])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES["position"]))
def test_every_position_scheme_compiles(name):
    check(name, CASES["position"][name])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES["mixers"]))
def test_every_mixer_compiles(name):
    check(name, CASES["mixers"][name])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES["models"]))
def test_every_model_compiles(name):
    check(name, CASES["models"][name])
