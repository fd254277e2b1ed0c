"""``train.grad_clip`` (harness.run.distributed.ClipGradients): the same clipping as
Lightning's ``gradient_clip_val``, and for a fused optimiser too, which Lightning refuses under
mixed precision. The GPU proof found every GPU run with a clip failing at its first step (the
harness's Adam(W) is fused on a GPU); torch's fused AdamW also runs on the CPU, so it is
checked here."""

from __future__ import annotations

import copy

import lightning as L
import torch

from harness.run import optim
from harness.run.distributed import ClipGradients

RUN = {"task": {"name": "copy", "params": {"length": 6, "vocab": 8, "num_train": 64, "num_val": 16}},
       "model": {"name": "transformer", "params": {"layers": 1, "heads": 2, "d_model": 16},
                 "attention": {"name": "multi_head"}, "position": {"name": "sinusoidal"}},
       "train": {"max_steps": 3, "batch_size": 8, "val_every": 3, "progress": False, "num_threads": 1,
                 "accelerator": "cpu", "precision": "bf16-mixed", "grad_clip": 0.05},
       "tracking": {"experiment": "clip"}}


def test_a_fused_adamw_under_bf16_mixed_trains_with_its_gradients_clipped(harness_home, monkeypatch):
    import harness

    monkeypatch.setattr(optim, "use_fused", lambda params: True)  # as on a GPU
    seen: list[tuple[bool, float]] = []

    class Norm(L.Callback):  # runs after the clip (the callbacks' order: the clip comes first)
        def on_before_optimizer_step(self, trainer, pl_module, optimizer):  # type: ignore[no-untyped-def]
            grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
            seen.append((bool(optimizer.defaults.get("fused")), float(torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])))))

    result = harness.train(copy.deepcopy(RUN), callbacks=[Norm()])
    assert result.status == "FINISHED"
    assert len(seen) == 3 and all(fused for fused, _ in seen)
    assert all(norm <= 0.05 * (1 + 1e-3) for _, norm in seen), seen  # clipped: at most the bound


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

    def training_step(self, batch, _):  # type: ignore[no-untyped-def]
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y) * 100  # gradients far above the bound

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def _trained(tmp_path, **trainer_kwargs) -> list[torch.Tensor]:  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(40, 8, generator=gen), torch.randn(40, 1, generator=gen))
    model = Tiny()
    L.Trainer(max_steps=5, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
              enable_model_summary=False, default_root_dir=tmp_path, **trainer_kwargs).fit(
        model, torch.utils.data.DataLoader(data, batch_size=8))
    return [p.detach().clone() for p in model.parameters()]


def test_the_clip_is_lightnings_own_gradient_clip_val_to_the_bit(tmp_path):
    """Lightning's clipping (the reference) and the harness's callback give the same weights."""
    reference = _trained(tmp_path / "a", gradient_clip_val=0.3)
    ours = _trained(tmp_path / "b", callbacks=[ClipGradients(0.3)])
    unclipped = _trained(tmp_path / "c")
    assert all(torch.equal(a, b) for a, b in zip(reference, ours, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(reference, unclipped, strict=True))  # the clip acted
