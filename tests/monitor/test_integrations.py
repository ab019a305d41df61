"""The transformers and Lightning callbacks drive a Monitor through a real (tiny) CPU training."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.monitor.conftest import read_records


class TinyRegressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)
        )

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.mse_loss(self.net(x).squeeze(-1), labels)}


def test_transformers_callback_logs_one_step_per_optimizer_step(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from transformers import Trainer, TrainingArguments

    from memfit.monitor.integrations import MemfitTrainerCallback

    torch.manual_seed(0)
    data = [{"x": torch.randn(8), "labels": torch.randn(())} for _ in range(32)]
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=3,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
    )
    log = tmp_path / "run.jsonl"
    callback = MemfitTrainerCallback(log, device="cpu", verbose=False)
    Trainer(model=TinyRegressor(), args=args, train_dataset=data, callbacks=[callback]).train()
    records = read_records(log)
    steps = [r for r in records if r["type"] == "step"]
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert all(s["samples"] == 8 and s["allocated_bytes"] > 0 for s in steps)
    assert records[-1]["type"] == "end" and records[-1]["summary"]["outcome"] == "ok"


def test_lightning_callback_logs_steps_and_analyses_an_oom(tmp_path: Path) -> None:
    L = pytest.importorskip("lightning")
    from memfit.monitor.integrations import MemfitLightningCallback

    class Module(L.LightningModule):
        def __init__(self, oom_at: int | None) -> None:
            super().__init__()
            self.net = torch.nn.Linear(8, 1)
            self.oom_at = oom_at

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            if batch_idx == self.oom_at:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 MiB.")
            return self.net(batch).pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def fit(oom_at: int | None, log: Path) -> None:
        trainer = L.Trainer(
            max_steps=3,
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[MemfitLightningCallback(log, device="cpu", verbose=False)],
        )
        loader = torch.utils.data.DataLoader(torch.randn(40, 8), batch_size=5)
        trainer.fit(Module(oom_at), loader)

    fit(None, tmp_path / "ok.jsonl")
    steps = [r for r in read_records(tmp_path / "ok.jsonl") if r["type"] == "step"]
    assert [(s["step"], s["samples"]) for s in steps] == [(1, 5), (2, 5), (3, 5)]

    with pytest.raises(torch.OutOfMemoryError):
        fit(1, tmp_path / "oom.jsonl")
    records = read_records(tmp_path / "oom.jsonl")
    assert [r["type"] for r in records] == ["start", "step", "oom", "end"]
    assert records[2]["requested_bytes"] == 4 * 2**20
    assert "parameters" in records[2]["live_bytes"]  # the LightningModule was registered
    assert records[-1]["summary"]["outcome"] == "oom"
