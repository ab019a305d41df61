"""The pre-flight callback estimates the live job before its first step."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from memfit.errors import DoesNotFitError  # noqa: E402
from memfit.monitor.integrations.preflight import MemfitPreflight  # noqa: E402
from memfit.spec import WorkloadSpec  # noqa: E402


class Lengths(torch.utils.data.Dataset):
    def __init__(self, lengths):
        self.lengths = lengths

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        ids = torch.ones(self.lengths[i], dtype=torch.long)
        return {"input_ids": ids, "labels": ids}


def tiny_model():
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=256, n_positions=128)
    return transformers.GPT2LMHeadModel(cfg)


def train(tmp_path, callback, lengths=(16, 48, 32, 8), **kw):
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=3,
        max_steps=1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        **kw,
    )

    def collate(items):
        n = max(len(x["input_ids"]) for x in items)
        ids = torch.ones(len(items), n, dtype=torch.long)
        return {"input_ids": ids, "labels": ids}

    trainer = transformers.Trainer(
        model=tiny_model(),
        args=args,
        train_dataset=Lengths(list(lengths)),
        data_collator=collate,
        callbacks=[callback],
    )
    trainer.train()
    return callback.result


def test_the_live_job_is_read_from_the_model_the_arguments_and_the_longest_batch(tmp_path):
    result = train(
        tmp_path, MemfitPreflight(device_memory_bytes=1 << 40), gradient_checkpointing=True
    )
    w = result.workload
    assert (w.batch_size, w.grad_accum, w.seq_len) == (2, 3, 48)  # the longest batch seen
    assert (w.precision, w.checkpointing, w.optimizer) == ("32-true", "full", "adamw-fused")
    assert result.fits is True
    assert result.estimate.workload["seq_len"] == 48


def test_a_job_that_will_not_fit_is_said_with_the_fix_and_training_goes_on(tmp_path, capsys):
    result = train(tmp_path, MemfitPreflight(device_memory_bytes=1 << 20))
    assert result.fits is False
    err = capsys.readouterr().err
    assert "WILL NOT FIT" in err and "memfit plan" in err


def test_raise_if_not_fit_stops_before_the_first_step(tmp_path):
    with pytest.raises(DoesNotFitError, match="WILL NOT FIT"):
        train(tmp_path, MemfitPreflight(device_memory_bytes=1 << 20, raise_if_not_fit=True))


def test_a_failure_inside_the_preflight_never_stops_training(tmp_path, monkeypatch):
    import memfit.monitor.integrations.preflight as pf

    def boom(*a, **k):
        raise RuntimeError("memfit bug")

    monkeypatch.setattr(pf, "run_preflight", boom)
    cb = MemfitPreflight(device_memory_bytes=1 << 20, raise_if_not_fit=True)
    assert train(tmp_path, cb) is None  # trained; the failure was reported once
    assert cb.guard.n_errors == 1


def test_the_estimate_is_the_one_memfit_estimate_gives_for_that_job(tmp_path):
    import memfit

    result = train(tmp_path, MemfitPreflight(device_memory_bytes=1 << 40))
    from memfit.monitor.integrations.preflight import live_job

    model = tiny_model()
    model.config.use_cache = False  # what the Trainer sets on the live model before training

    source, w = live_job(
        model,
        batch_size=2,
        grad_accum=3,
        seq_len=48,
        mixed=None,
        checkpointing=False,
        optimizer="adamw-fused",
    )
    assert w == WorkloadSpec(
        mode="train",
        batch_size=2,
        grad_accum=3,
        seq_len=48,
        precision="fp32",
        optimizer="adamw-fused",
    )
    direct = memfit.estimate(source, w, engine="analytic")
    assert result.estimate.peak_allocated_bytes == direct.peak_allocated_bytes
