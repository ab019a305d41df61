"""peft's LoRA dropout in the analytic engine against the trace engine, which runs peft's own
``nn.Dropout`` (CUDA's fused ``native_dropout``: the dropped copy and a 1-byte bool mask).

What the dropout adds (the peak with ``lora_dropout=0.1`` less the peak without) must be the
trace's to the byte on these jobs: the analytic engine records the same tensors (``Ops
.lora_dropout_of``). The peaks themselves are held to ``test_vs_trace``'s 3 %.
"""

from __future__ import annotations

import pytest
from tests.estimate.analytic.configs import TINY

from memfit.estimate.analytic import estimate_analytic
from memfit.spec import WorkloadSpec

TOLERANCE = 0.03

CASES = [
    ("llama", {"precision": "bf16-true"}),
    ("llama", {"precision": "bf16-mixed"}),
    ("llama", {"precision": "fp32"}),
    ("llama", {"precision": "amp-bf16"}),
    ("llama", {"precision": "bf16-true", "checkpointing": "full"}),
    ("llama", {"precision": "bf16-true", "checkpointing": "selective"}),
    ("llama", {"precision": "bf16-true", "lora_targets": ("q_proj", "v_proj")}),
    # QLoRA: peft's bitsandbytes forward (the dropout on the input as it comes under autocast,
    # on its fp32 copy without)
    ("llama", {"quant": "nf4", "prepare_kbit": True}),
    ("llama", {"quant": "nf4", "precision": "bf16-true"}),
    # the caller's argument (down_proj's input) lives until the adapter returns: was the
    # recomputed layer's peak, 262 KB under the trace
    ("llama", {"quant": "nf4", "precision": "bf16-true", "checkpointing": "full"}),
    ("llama", {"quant": "int8", "prepare_kbit": True, "checkpointing": "full"}),
    ("mistral", {"quant": "int4-awq", "prepare_kbit": True, "precision": "16-true"}),
    ("qwen3", {"precision": "bf16-true"}),
    ("gpt2", {"precision": "bf16-true"}),  # Conv1D adapters
    ("gemma2", {}),
    ("opt", {}),
    ("roberta", {}),
]


def _ids(case: tuple[str, dict]) -> str:
    fam, wl = case
    return fam + ":" + (",".join(f"{k}={v}" for k, v in wl.items()) or "default")


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_lora_dropout_adds_what_the_trace_adds(case, trace_hf) -> None:
    family, overrides = case
    peaks = {}
    for p in (0.0, 0.1):
        wl = WorkloadSpec(
            **{"batch_size": 2, "seq_len": 128, "lora_rank": 4, **overrides, "lora_dropout": p}
        )
        traced = trace_hf(TINY[family], wl, name=family).peak_allocated_bytes
        peaks[p] = (traced, estimate_analytic(TINY[family], wl).peak_allocated_bytes)
    (t0, a0), (t1, a1) = peaks[0.0], peaks[0.1]
    detail = f"{family} {overrides}: trace {t0} -> {t1}, analytic {a0} -> {a1}"
    assert a1 - a0 == t1 - t0, detail
    assert abs(a1 / t1 - 1) <= TOLERANCE, detail


def test_in_pure_bf16_the_dropout_costs_each_adapter_its_bool_mask() -> None:
    """With a bf16 base, peft already saves an fp32 copy of each adapter's input for lora_A
    (``_cast_input_dtype``); the dropout's copy takes its place, so what it adds is its 1-byte
    mask per input element, saved wherever the input requires grad: every adapter but the
    first layer's q/k/v, whose input (the frozen embeddings' output) does not."""
    config = TINY["llama"]
    tokens, hidden, ffn, layers = 2 * 128, config["hidden_size"], config["intermediate_size"], 3
    per_layer = 6 * hidden + ffn  # q, k, v, o, gate, up read hidden; down reads ffn
    masks = tokens * (layers * per_layer - 3 * hidden)
    peaks = [
        estimate_analytic(
            config,
            WorkloadSpec(
                batch_size=2, seq_len=128, lora_rank=4, precision="bf16-true", lora_dropout=p
            ),
        ).peak_allocated_bytes
        for p in (0.0, 0.05)
    ]
    assert config["num_hidden_layers"] == layers
    assert peaks[1] - peaks[0] == masks


@pytest.mark.parametrize(
    ("fields", "job"),
    [
        ({"lora_rank": 16}, "lora_dropout"),
        ({"lora_rank": 16, "checkpointing": "full"}, "lora_ckpt_dropout"),
        ({"lora_rank": 16, "zero_grad_set_to_none": False}, "lora_held_dropout"),
        ({"lora_rank": 16, "quant": "nf4"}, None),  # QLoRA: no grid row, traced
        ({"lora_rank": 16, "precision": "bf16-mixed"}, None),
    ],
)
def test_a_lora_job_with_dropout_is_its_own_grid_job(fields: dict, job: str | None) -> None:
    """The grid validates the LoRA jobs with dropout on their own rows (``*_dropout``); the
    probability itself is free (it changes no byte)."""
    from memfit.estimate import fastpath

    for p in (0.05, 0.1):
        w = WorkloadSpec(**{"precision": "bf16-true", **fields, "lora_dropout": p})
        assert fastpath.grid_job(w) == job
    assert fastpath.grid_job(WorkloadSpec(precision="bf16-true", lora_rank=16)) == "lora"
    if job is not None:
        assert job in fastpath.VALIDATED["llama"]


def test_real_cpu_execution_keeps_what_the_analytic_engine_counts(trace_hf) -> None:
    """One real training step on CPU tensors (random weights, the trace's tracker; CUDA's fused
    dropout kernel, which CPU also has, and eager attention, as CPU has no bf16 SDPA kernel):
    the bytes dropout adds are the analytic engine's to the byte; the peaks within 1 %
    (benchmarks/lora_dropout_cpu.py, docs/accuracy.md: +0.19 %)."""
    config = TINY["llama"]
    peaks = []
    for p in (0.0, 0.1):
        w = WorkloadSpec(
            batch_size=2,
            seq_len=128,
            lora_rank=8,
            precision="bf16-true",
            attention="eager",
            lora_dropout=p,
        )
        real = trace_hf(config, w, name="t", extrapolate=False, execution="real")
        peaks.append((real.peak_allocated_bytes, estimate_analytic(config, w).peak_allocated_bytes))
    (r0, a0), (r1, a1) = peaks
    assert a1 - a0 == r1 - r0 > 0
    assert abs(a1 / r1 - 1) <= 0.01
