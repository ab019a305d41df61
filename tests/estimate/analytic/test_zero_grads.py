"""How the analytic engine counts a new gradient under DeepSpeed ZeRO-2/3, which keep no
per-parameter ``.grad`` on the rank between backward passes (``compose.holds_grads``)."""

from __future__ import annotations

import dataclasses

import pytest

from memfit.estimate.analytic import estimate_analytic
from memfit.estimate.analytic.compose import holds_grads
from memfit.models import resolve_model
from memfit.spec import WorkloadSpec

#: the fast-path grid's ``mixed_offload_held`` job (benchmarks/fastpath_grid.py JOBS)
OFFLOAD = WorkloadSpec(
    mode="train",
    precision="bf16-mixed",
    shard="zero2",
    offload="optimizer",
    batch_size=5,
    seq_len=128,
)


def _two_layers(name: str) -> dict:
    config = dict(resolve_model(name).config)
    config["num_hidden_layers"] = 2
    return config


@pytest.mark.parametrize("shard", ["zero2", "zero3"])
def test_a_held_job_under_zero_keeps_no_gradient_of_its_own(shard: str) -> None:
    """``zero_grad(set_to_none=False)`` changes nothing on a ZeRO-2/3 rank: DeepSpeed copies
    each gradient into the reduce bucket as it is produced (and accumulates on the host), so
    the held job peaks where the plain one does. Before, the held job's LM-head gradient was
    counted twice (a temporary summed into a held .grad, and the rank view's new gradient):
    olmo-2-7b cut to 2 layers, +784 MiB (one bf16 100352 x 4096 matrix), +16.7 % against the
    trace (benchmarks/results/fastpath_grid.md)."""
    config = _two_layers("olmo-2-7b")
    plain = dataclasses.replace(OFFLOAD, shard=shard)
    held = dataclasses.replace(plain, zero_grad_set_to_none=False)
    assert not holds_grads(held)
    a, b = estimate_analytic(config, plain), estimate_analytic(config, held)
    assert b.peak_allocated_bytes == a.peak_allocated_bytes


def test_a_held_job_without_zero_still_sums_into_its_gradients() -> None:
    """One GPU, ZeRO-1 and FSDP keep each parameter's .grad: a held job's new gradient is a
    temporary summed into it, so it needs more than the same job with set_to_none."""
    config = _two_layers("olmo-2-7b")
    plain = dataclasses.replace(OFFLOAD, shard="none", offload="none")
    held = dataclasses.replace(plain, zero_grad_set_to_none=False)
    assert holds_grads(held)
    lm_head_grad_bytes = config["vocab_size"] * config["hidden_size"] * 4  # fp32 .grad
    a, b = estimate_analytic(config, plain), estimate_analytic(config, held)
    assert b.peak_allocated_bytes >= a.peak_allocated_bytes
    assert b.peak_allocated_bytes - a.peak_allocated_bytes <= lm_head_grad_bytes
