"""A fast bench of a tiny OPT on packaged text: the table's structure and real properties.

Tolerance of the estimate on CPU: the trace engine with CPU kernels counts what real CPU execution
allocates, so the CPU-kernel estimate (workspaces taken out) should match the tracker's peak almost
exactly. What remains: AdamW keeps one ``step`` scalar per parameter tensor, a CPU tensor (512 B
after rounding) that the estimate leaves out because on a CUDA run it lives on the host, and the
bitsandbytes / torchao layers the estimator replaces with stand-ins. 2 % covers these on a model
this small (measured: under 0.5 %).
"""

from __future__ import annotations

import pytest

from memfit.bench import bench
from memfit.bench.data import make_batches
from memfit.bench.models import minilm_tokenizer
from memfit.bench.render import render_markdown, render_png, render_text
from memfit.errors import SpecError

ESTIMATE_TOLERANCE = 0.02


@pytest.fixture(scope="module")
def result():
    return bench(
        "tiny-opt",
        techniques=["bf16", "checkpointing", "lora", "int8"],
        steps=2,
        batch_size=2,
        seq_len=64,
        device="cpu",
    )


def test_rows_are_the_baseline_each_technique_and_the_combined_plan(result) -> None:
    assert [r.name for r in result.rows] == [
        "baseline",
        "bf16",
        "checkpointing",
        "lora",
        "int8",
        "combined",
    ]
    assert result.row("combined").techniques == ["bf16", "checkpointing", "lora", "int8"]
    assert all(r.error is None for r in result.rows), [r.error for r in result.rows]
    for r in result.rows:
        assert r.measured_peak_bytes and r.estimated_peak_bytes and r.step_time_s
        assert len(r.losses) == 2


def test_estimate_matches_the_cpu_measurement_within_tolerance(result) -> None:
    assert result.workspace_bytes_excluded > 0
    for r in result.rows:
        assert abs(r.prediction_error) < ESTIMATE_TOLERANCE, (r.name, r.prediction_error)


def test_lora_bf16_and_the_combined_plan_cut_the_measured_peak(result) -> None:
    base = result.row("baseline").measured_peak_bytes
    assert result.row("lora").measured_peak_bytes < base
    assert result.row("bf16").measured_peak_bytes < base
    combined = result.row("combined")
    assert combined.measured_peak_bytes < min(
        r.measured_peak_bytes for r in result.rows if r.name != "combined"
    )
    assert combined.reduction_factor == pytest.approx(base / combined.measured_peak_bytes, 1e-3)


def test_checkpointing_saves_activations_and_the_estimate_predicts_the_saving(result) -> None:
    ckpt = result.row("checkpointing")
    assert ckpt.measured_saving_bytes > 0
    assert ckpt.saving_agreement == pytest.approx(1.0, abs=0.1)


def test_int8_row_quantizes_and_passes_the_quality_gate(result) -> None:
    # The tiny model's Linear weights are ~1 % of its bytes (the embedding dominates), so the
    # int8 row's memory is checked on opt-125m (docs/bench.md); here: quantized, gated, estimated.
    int8 = result.row("int8")
    assert int8.estimated_peak_bytes is not None
    q = int8.quality
    assert q is not None and q.passed and q.notes == []
    assert 0 < q.kl < 0.05 and q.cosine > 0.99


def test_rows_start_from_the_same_weights_and_data_and_deltas_are_against_the_baseline(
    result,
) -> None:
    # The first loss comes before any update: same weights (seed 0), same first batch. LoRA's B
    # matrices start at zero and checkpointing recomputes the same math, so they match fp32
    # exactly; bf16 rounds.
    base = result.row("baseline")
    for name in ("checkpointing", "lora"):
        assert result.row(name).losses[0] == pytest.approx(base.losses[0], abs=1e-3)
    assert result.row("bf16").losses[0] == pytest.approx(base.losses[0], abs=0.05)
    bf16 = result.row("bf16")
    assert bf16.loss_delta == pytest.approx(bf16.losses[-1] - base.losses[-1], abs=1e-4)


def test_json_table_markdown_and_png(result, tmp_path) -> None:
    d = result.to_dict()
    assert {"model", "device", "corpus", "estimate_kind", "rows"} <= set(d)
    assert {
        "measured_peak_bytes",
        "estimated_peak_bytes",
        "prediction_error",
        "tokens_per_s",
    } <= set(d["rows"][0])
    text = render_text(result)
    assert "combined" in text and "King James" in text
    assert render_markdown(result).count("\n| ") == len(result.rows) + 1
    png = render_png(result, tmp_path / "b.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_batches_are_real_text_with_testament_labels() -> None:
    data = make_batches(task="seq-cls", n_steps=1, batch_size=4, seq_len=32, vocab_size=30522)
    assert data.train[0]["labels"].tolist() == [0, 1, 0, 1]
    words = minilm_tokenizer().decode(data.train[0]["input_ids"][0].tolist()).split()
    assert {"the", "and", "of"} & set(words)


def test_bad_bench_inputs_are_reported_together() -> None:
    with pytest.raises(SpecError, match=r"2 problems: technique 'zip' is not one of .*steps \(0\)"):
        bench("tiny-opt", techniques=["zip"], steps=0)
