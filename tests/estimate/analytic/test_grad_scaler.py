"""``16-mixed``'s GradScaler in the analytic step (fp16grid): what ``torch.amp.GradScaler``
keeps on the device (its scale and growth tracker, the scaled loss, ``found_inf``) is what the
trace engine counts, phase by phase and component by component, over the same step in
``bf16-mixed`` (which runs no scaler: everything else is the same two-byte autocast)."""

from __future__ import annotations

import pytest
from tests.estimate.analytic.configs import TINY

from memfit.estimate.analytic import estimate_analytic
from memfit.spec import WorkloadSpec

PHASES = ("forward", "backward", "optimizer")


def _by_phase(est) -> dict[str, dict[str, int]]:
    return {p: dict(est.phases[p].components) for p in PHASES}


def _minus(a: dict[str, dict[str, int]], b: dict[str, dict[str, int]]) -> dict:
    return {p: {k: a[p][k] - b[p].get(k, 0) for k in a[p] if a[p][k] != b[p].get(k, 0)}
            for p in PHASES}  # fmt: skip


@pytest.mark.parametrize(
    ("family", "fields"),
    [("llama", {}), ("gpt2", {"checkpointing": "full"}), ("llama", {"optimizer": "adamw-fused"})],
)
def test_the_grad_scalers_bytes_are_what_the_trace_allocates(family, fields, trace_hf) -> None:
    base = {"mode": "train", "batch_size": 2, "seq_len": 32, **fields}
    fp16 = WorkloadSpec(precision="16-mixed", **base)
    bf16 = WorkloadSpec(precision="bf16-mixed", **base)
    traced = _minus(
        _by_phase(trace_hf(TINY[family], fp16, name=family)),
        _by_phase(trace_hf(TINY[family], bf16, name=family)),
    )
    analytic = _minus(
        _by_phase(estimate_analytic(TINY[family], fp16)),
        _by_phase(estimate_analytic(TINY[family], bf16)),
    )
    assert analytic == traced
    assert traced["optimizer"], "the scaler allocates in a 16-mixed step"


def test_pure_fp16_runs_no_scaler() -> None:
    """``16-true`` (memfit's default LoRA on a GPU without bf16) has no GradScaler: its step is
    ``bf16-true``'s byte for byte."""
    base = {"mode": "train", "batch_size": 2, "seq_len": 32, "lora_rank": 4}
    fp16 = estimate_analytic(TINY["llama"], WorkloadSpec(precision="16-true", **base))
    bf16 = estimate_analytic(TINY["llama"], WorkloadSpec(precision="bf16-true", **base))
    assert _minus(_by_phase(fp16), _by_phase(bf16)) == {p: {} for p in PHASES}
