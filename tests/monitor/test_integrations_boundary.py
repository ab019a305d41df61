"""The callbacks never abort Trainer.train() / Lightning fit(), and undo the monitor when the
user's training raises (issue 17)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tests.monitor.conftest import read_records
from tests.monitor.test_boundary import assert_nothing_installed
from tests.monitor.test_integrations import TinyRegressor


class Boom(RuntimeError):
    pass


class ExplodingRegressor(TinyRegressor):
    def __init__(self, at_call: int) -> None:
        super().__init__()
        self.calls, self.at_call = 0, at_call

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        self.calls += 1
        if self.calls == self.at_call:
            raise Boom("the user's model failed")
        return super().forward(x, labels)


def _trainer(tmp_path: Path, model: Any, callback: Any) -> Any:
    from transformers import Trainer, TrainingArguments

    data = [{"x": torch.randn(8), "labels": torch.randn(())} for _ in range(16)]
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=2,
        per_device_train_batch_size=4,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
    )
    return Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])


def test_an_exception_inside_trainer_train_closes_the_monitor(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from memfit.monitor.integrations import MemfitTrainerCallback

    log = tmp_path / "run.jsonl"
    callback = MemfitTrainerCallback(log, device="cpu", verbose=False)
    trainer = _trainer(tmp_path, ExplodingRegressor(at_call=2), callback)
    with pytest.raises(Boom, match="the user's model failed"):
        trainer.train()
    assert callback.monitor is None
    records = read_records(log)
    assert [r["type"] for r in records][-1] == "end"
    assert records[-1]["summary"]["outcome"] == "error"
    assert_nothing_installed()


def test_an_unwritable_log_does_not_abort_trainer_train(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from memfit.monitor.integrations import MemfitTrainerCallback

    callback = MemfitTrainerCallback(tmp_path / "missing" / "run.jsonl", device="cpu")
    _trainer(tmp_path, TinyRegressor(), callback).train()
    assert_nothing_installed()


def test_bad_callback_arguments_fail_when_the_callback_is_made_not_inside_train() -> None:
    pytest.importorskip("transformers")
    from memfit.monitor.integrations import MemfitTrainerCallback

    with pytest.raises(Exception, match=r"sample_interval_s \(-1\) must be positive"):
        MemfitTrainerCallback("run.jsonl", sample_interval_s=-1)


def test_lightning_fit_that_raises_or_cannot_log_leaves_nothing_installed(tmp_path: Path) -> None:
    L = pytest.importorskip("lightning")
    from memfit.monitor.integrations import MemfitLightningCallback

    class Module(L.LightningModule):
        def __init__(self, fail: bool) -> None:
            super().__init__()
            self.net = torch.nn.Linear(8, 1)
            self.fail = fail

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            if self.fail and batch_idx == 1:
                raise Boom("the user's step failed")
            return self.net(batch).pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def fit(fail: bool, log: Path) -> None:
        trainer = L.Trainer(
            max_steps=2,
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[MemfitLightningCallback(log, device="cpu", verbose=False)],
        )
        trainer.fit(Module(fail), torch.utils.data.DataLoader(torch.randn(20, 8), batch_size=5))

    with pytest.raises(Boom):
        fit(True, tmp_path / "boom.jsonl")
    assert read_records(tmp_path / "boom.jsonl")[-1]["summary"]["outcome"] == "error"
    assert_nothing_installed()
    fit(False, tmp_path / "no" / "folder" / "run.jsonl")  # a warning, and fit() completes
    assert_nothing_installed()
