"""Estimators for planner tests: the real trace engine on a tiny Llama, and a closed-form one.

``closed_form_estimate`` is a stand-in engine, monotone in every dimension the planner orders
(micro-batch, sequence, checkpointing, optimizer, quantization, sharding, offload): property tests
use it to exercise the real planner and solver code hundreds of times per second. It is not an
accuracy claim; tests that check fits against memfit's own engines use ``trace_estimator``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import TINY_LLAMA

from memfit.estimate.result import MemoryEstimate, PhasePeak
from memfit.spec import WorkloadSpec

N_PARAMS = 1_000_000
#: bytes per parameter by precision: (weights, gradients), and optimizer states per trainable one
_WEIGHT = {
    "32-true": (4, 4),
    "bf16-true": (2, 2),
    "16-true": (2, 2),
    "bf16-mixed": (4, 4),
    "16-mixed": (4, 4),
}
_OPT = {"adamw": 8, "adamw-fused": 8, "adamw-8bit": 2, "adafactor": 1, "none": 0}
_QUANT = {"none": 1.0, "int8": 0.5, "fp8": 0.5, "nf4": 0.3, "nf4-dq": 0.28, "int4-awq": 0.3}
_CKPT = {"none": 1.0, "selective": 0.5, "full": 0.1, "offload": 0.05}
#: the LM head's loss: the full logits, chunked, fused (estimate/analytic/loss.py)
_LOSS = {"full": 1.0, "chunked": 0.9, "fused": 0.8}
_SHARD = {"none": 1.0, "ddp": 1.0, "zero1": 0.8, "zero2": 0.6, "zero3": 0.4, "fsdp": 0.4}


def closed_form_estimate(w: WorkloadSpec) -> MemoryEstimate:
    weight, grad = _WEIGHT[w.precision]
    q = _QUANT[w.quant]
    trainable = N_PARAMS if w.lora_rank is None else w.lora_rank * 1000
    trainable = trainable * 2 // (2 + (w.freeze_layers > 0))
    shard = _SHARD[w.shard or "none"] if w.gpus > 1 else 1.0
    offload = {"none": 1.0, "optimizer": 0.5, "params": 0.3}[w.offload]
    params = int(N_PARAMS * weight * q * (shard if w.shard in ("zero3", "fsdp") else 1))
    params = int(params * (0.5 if w.offload == "params" else 1))
    grads = int(trainable * grad * shard) if w.is_train else 0
    states = int(trainable * _OPT[w.optimizer or "none"] * shard * offload) if w.is_train else 0
    act_factor = _CKPT[w.checkpointing] * _LOSS[w.loss] if w.is_train else 0.05
    acts = int(w.batch_size * w.seq_len * 2000 * act_factor)
    kv = w.batch_size * (w.seq_len + w.new_tokens) * 512 if not w.is_train else 0
    comps = {
        "parameters": params,
        "gradients": grads,
        "optimizer_states": states,
        "activations": acts,
        "kv_cache": kv,
        "temporary": 1 << 20,
    }
    peak = sum(comps.values())
    return MemoryEstimate(
        model_name="closed-form",
        n_params=N_PARAMS,
        n_trainable_params=trainable,
        workload=w.normalized(),
        engine="closed-form",
        environment={},
        peak_allocated_bytes=peak,
        peak_reserved_bytes=peak,
        cuda_context_bytes=0,
        device_used_bytes=peak,
        peak_phase="forward",
        components=comps,
        phases={"forward": PhasePeak(phase="forward", peak_allocated_bytes=peak, components=comps)},
        top_modules=[],
    )


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tiny-llama")
    (d / "config.json").write_text(json.dumps(TINY_LLAMA))
    return d


@pytest.fixture(scope="session")
def trace_estimator(tiny_llama_dir: Path) -> Callable[[WorkloadSpec], MemoryEstimate]:
    """The real trace engine on the tiny Llama, memoised for the whole session."""
    from memfit.estimate import estimate
    from memfit.plan.engines import CachedEstimator

    return CachedEstimator(
        lambda w: estimate(str(tiny_llama_dir), w, gpu="L4", engine="trace"), "trace"
    )


def closed_form_plan(tiny_llama_dir: Path, capacity: int, **kw: object) -> Any:
    """``plan`` of the tiny Llama at 512 tokens, global batch 8, on a GPU of ``capacity`` bytes,
    estimated by :func:`closed_form_estimate` (``kw``: more PlanRequest fields)."""
    from memfit.plan import PlanRequest, plan

    request = PlanRequest(**{"seq_len": 512, "global_batch": 8, **kw})  # type: ignore[arg-type]
    return plan(
        str(tiny_llama_dir),
        request,
        gpu="A100-80GB",
        gpu_memory_bytes=capacity,
        estimator=closed_form_estimate,
    )
