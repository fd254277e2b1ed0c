"""Activation checkpointing per block (harness.nn.checkpointing): every built-in model with
blocks gets it without code, checkpointed blocks give the plain blocks' gradients exactly
(dropout included), the state dict is unchanged, and a step's peak tensor memory drops."""

from __future__ import annotations

import pytest
import torch

from harness.config import parse_run_config
from harness.nn.blocks import TransformerBlock
from harness.nn.checkpointing import blocks, checkpoint_blocks, uncheckpoint_blocks
from harness.run.build import build
from harness.run.plan import load_registry, plan
from harness.run.system import masked_stats
from harness.runtime.memory import TensorMemory

COPY = {"name": "copy", "params": {"length": 12, "vocab": 6, "num_train": 16, "num_val": 4}}
MODELS = {
    "transformer": {"name": "transformer", "params": {"d_model": 32, "layers": 3, "heads": 4, "dropout": 0.2}},
    "mamba": {"name": "transformer", "params": {"d_model": 16, "layers": 2, "heads": 2, "dropout": 0.1},
              "mixer": {"name": "mamba"}},
    "encoder_decoder": {"name": "encoder_decoder", "params": {
        "d_model": 16, "encoder_layers": 2, "decoder_layers": 2, "heads": 2, "dropout": 0.1}},
    "mlp_mixer": {"name": "mlp_mixer", "params": {"d_model": 16, "layers": 2}},
}


def built(model: str):
    cfg = parse_run_config({"task": COPY, "model": MODELS[model]})
    p = plan(cfg, load_registry(cfg, None))
    b = build(p)
    examples = b.task.examples("train", b.task.train_length)[:8]
    batch = p.fmt.collate(examples, b.task.task_kind)
    return p, b, batch


def step(p, model, batch, seed: int = 0) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    torch.manual_seed(seed)  # the same dropout masks for both runs
    model.zero_grad(set_to_none=True)
    loss = masked_stats(p.fmt.call(model, batch), batch)["loss"]
    loss.backward()
    return {n: q.grad.clone() for n, q in model.named_parameters() if q.grad is not None}, loss.detach()


@pytest.mark.parametrize("name", list(MODELS))
def test_checkpointed_blocks_give_the_plain_blocks_gradients(name):
    p, b, batch = built(name)
    model = b.model.double().train()
    plain, plain_loss = step(p, model, batch)
    keys = list(model.state_dict())
    assert checkpoint_blocks(model) >= 2
    checkpointed, loss = step(p, model, batch)
    assert list(model.state_dict()) == keys  # checkpoints and saved weights are unchanged
    assert torch.equal(loss, plain_loss)
    assert checkpointed.keys() == plain.keys()
    for n in plain:
        torch.testing.assert_close(checkpointed[n], plain[n], rtol=1e-12, atol=1e-14, msg=n)
    uncheckpoint_blocks(model)
    assert not any("forward" in vars(m) for m in model.modules())


def test_the_blocks_are_the_residual_blocks():
    _, b, _ = built("transformer")
    found = blocks(b.model)
    assert len(found) == 3 and all(isinstance(m, TransformerBlock) for m in found)
    _, b, _ = built("encoder_decoder")
    assert len(blocks(b.model)) == 4


def test_a_model_without_blocks_is_left_alone():
    gru = torch.nn.Sequential(torch.nn.Embedding(5, 4), torch.nn.Linear(4, 4))
    assert checkpoint_blocks(gru) == 0


def peak(p, model, batch) -> int:
    meter = TensorMemory("cpu")
    meter.add(list(model.parameters()) + [v for v in batch.values() if isinstance(v, torch.Tensor)])
    with meter:
        masked_stats(p.fmt.call(model, batch), batch)["loss"].backward()
    model.zero_grad(set_to_none=True)
    return meter.peak


def test_a_steps_peak_tensor_memory_drops():
    """Counted tensor by tensor (harness.runtime.memory.TensorMemory), so the figure is exact
    and repeatable; the size of the saving is in benchmarks/activation_memory.py's record."""
    p, b, batch = built("transformer")
    model = b.model.train()
    plain = peak(p, model, batch)
    checkpoint_blocks(model)
    assert peak(p, model, batch) < 0.8 * plain


def test_evaluation_and_decoding_run_the_block_as_it_is():
    p, b, batch = built("transformer")
    model = b.model
    checkpoint_blocks(model)
    calls = []
    original = torch.utils.checkpoint.checkpoint

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    import harness.nn.checkpointing as module

    module.checkpoint = counting  # type: ignore[assignment]
    try:
        with torch.no_grad():
            p.fmt.call(model.train(), batch)
        p.fmt.call(model.eval(), batch)
        assert not calls
        p.fmt.call(model.train(), batch)
        assert len(calls) == 3
    finally:
        module.checkpoint = original  # type: ignore[assignment]


@pytest.mark.slow
def test_a_run_with_activation_checkpointing_trains_the_same_weights(tmp_path):
    from harness.run.pipeline import train
    from harness.run.trained import load

    store = f"sqlite:///{tmp_path / 'm.db'}"
    base = {"task": COPY, "model": MODELS["transformer"], "tracking": {"uri": store},
            "train": {"max_steps": 3, "batch_size": 8, "val_every": 3, "progress": False, "num_threads": 1,
                      "precision": "64-true", "micro_batch_size": 4}}
    plain = train(base)
    checkpointed = train({**base, "train": {**base["train"], "activation_checkpointing": True}})
    assert checkpointed.config["train"]["activation_checkpointing"] is True
    a, b = load(plain.run_id).model.state_dict(), load(checkpointed.run_id).model.state_dict()
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-12, atol=1e-14, msg=name)
