"""The Lightning pre-flight estimates the live job at ``on_train_start``, before the first batch."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning")

from memfit.errors import DoesNotFitError  # noqa: E402
from memfit.monitor.integrations.lightning import MemfitLightningPreflight  # noqa: E402

HIDDEN = 64


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(HIDDEN, 4 * HIDDEN),
            torch.nn.GELU(),
            torch.nn.Linear(4 * HIDDEN, HIDDEN),
        )
        self.steps_run = 0

    def training_step(self, batch, batch_idx):
        self.steps_run += 1
        return self.net(batch["x"]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class Lengths(torch.utils.data.Dataset):
    def __init__(self, lengths):
        self.lengths = lengths

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        return self.lengths[i]


def loader(lengths, batch_size=2):
    def collate(items):
        return {"x": torch.zeros(len(items), max(items), HIDDEN)}

    return torch.utils.data.DataLoader(Lengths(lengths), batch_size=batch_size, collate_fn=collate)


def fit(callback, module=None, precision="32-true", lengths=(8, 40, 16, 24)):
    module = module or Tiny()
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=1,
        precision=precision,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
    )
    trainer.fit(module, loader(list(lengths)))
    return module, callback.result


N_PARAMS = HIDDEN * 4 * HIDDEN * 2 + 4 * HIDDEN + HIDDEN


def test_the_live_module_its_optimizer_and_the_longest_batch_are_traced():
    _, result = fit(MemfitLightningPreflight(device_memory_bytes=80 * 2**30))
    w, est = result.workload, result.estimate
    assert (w.batch_size, w.seq_len) == (2, 40)  # the batch holding the 40-long sample
    assert est.n_params == N_PARAMS
    # fp32 parameters and AdamW's two fp32 states of the real module, as Lightning set them up
    assert est.components["parameters"] == pytest.approx(4 * N_PARAMS, rel=0.01)
    assert est.components["optimizer_states"] >= 2 * 4 * N_PARAMS
    assert result.fits is True


def test_bf16_true_is_read_from_the_precision_plugin():
    _, fp32 = fit(MemfitLightningPreflight(device_memory_bytes=80 * 2**30))
    _, bf16 = fit(MemfitLightningPreflight(device_memory_bytes=80 * 2**30), precision="bf16-true")
    assert bf16.estimate.components["parameters"] == pytest.approx(
        fp32.estimate.components["parameters"] / 2, rel=0.01
    )
    assert bf16.workload.precision == "bf16-true"


def test_raise_if_not_fit_stops_before_the_first_step_with_the_fix(capsys):
    module = Tiny()
    with pytest.raises(DoesNotFitError, match="WILL NOT FIT.*Fix: memfit plan"):
        fit(MemfitLightningPreflight(raise_if_not_fit=True, device_memory_bytes=1024), module)
    assert module.steps_run == 0


def test_a_module_that_cannot_be_traced_is_a_warning_and_training_goes_on(caplog):
    class Broken(Tiny):
        def training_step(self, batch, batch_idx):
            if isinstance(batch["x"], torch._subclasses.fake_tensor.FakeTensor):
                raise RuntimeError("data-dependent code")
            return super().training_step(batch, batch_idx)

    module, result = fit(MemfitLightningPreflight(raise_if_not_fit=True), Broken())
    assert result is None
    assert module.steps_run == 1
