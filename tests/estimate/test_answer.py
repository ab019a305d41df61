"""Every result record reads as one :class:`~memfit.estimate.answer.Answer`: the same peaks,
device bytes, components, notes, engine and verdict, whatever the job's kind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from memfit.estimate.answer import Answer
from memfit.estimate.verdict import EXIT_CODES, VERDICTS, Verdict


def _common(answer: Any) -> None:
    """What every Answer promises, beyond having the members."""
    assert isinstance(answer, Answer)
    assert answer.peak_allocated_bytes > 0
    assert answer.peak_reserved_bytes is None or answer.peak_reserved_bytes > 0
    assert answer.device_used_bytes >= (answer.peak_reserved_bytes or answer.peak_allocated_bytes)
    for low, high in answer.ranges.values():
        assert 0 <= low <= high
    assert all(isinstance(v, int) and v >= 0 for v in answer.peak_components.values())
    assert all(isinstance(n, str) for n in answer.notes)
    assert answer.engine and (answer.engine_reason is None or answer.engine_reason)
    assert isinstance(answer.to_json(), dict)


def test_a_text_estimate_is_an_answer_with_the_verdict_of_its_fits() -> None:
    import memfit

    est = memfit.estimate(
        "gpt2", memfit.WorkloadSpec(batch_size=2, seq_len=256), gpu="T4", engine="analytic"
    )
    _common(est)
    assert est.peak_components == est.components
    assert isinstance(est.verdict, Verdict) and est.fits is not None
    assert est.verdict.verdict == est.fits.verdict and est.verdict.need_bytes == est.fits.need_bytes


def test_a_vllm_startup_is_an_answer_whose_question_is_whether_it_starts() -> None:
    from memfit.hardware import get_gpu
    from memfit.models import resolve_model
    from memfit.serving import simulate_startup
    from memfit.spec.serving import VllmConfig

    spec = resolve_model("llama-3.1-8b").spec
    assert spec is not None
    s = simulate_startup(spec, get_gpu("L40S"), VllmConfig(vllm_version="0.19"))
    _common(s)
    assert s.verdict is None and s.starts
    assert s.peak_components == {
        "parameters": s.weights_bytes,
        "kv_cache": s.kv_cache_bytes,
        "activations": s.activation_peak_bytes,
    }
    # what nvidia-smi shows once serving: within the GPU, above vLLM's own budget's tensors
    assert s.requested_bytes < s.device_used_bytes <= s.total_bytes + s.cuda_graph_bytes
    assert s.to_json()["starts"] is True and "command" not in s.to_json()
    # 0.34's extensible KV cache fills the device but for the margin it keeps free
    ext = simulate_startup(spec, get_gpu("L40S"), VllmConfig(vllm_version="0.34"))
    _common(ext)
    assert ext.extensible is not None and ext.starts
    assert s.device_used_bytes < ext.device_used_bytes
    assert ext.device_used_bytes <= ext.total_bytes - ext.extensible.margin_bytes


def test_a_seq_run_is_an_answer_of_the_device_bytes_after_the_run() -> None:
    from memfit.estimate.seqrun.run import SeqRunEstimate, Variant

    def variant(name: str, reserved: int) -> Variant:
        return Variant(name=name, reserved_bytes=reserved, reserved_expandable_bytes=reserved,
                       memory_only=True, how=name)  # fmt: skip

    run = SeqRunEstimate(
        n_steps=8, seed=0, max_len=512, mean_step_len=300.0, n_distinct_lengths=6,
        anchors=(128, 512), floor_len=1, fixed=variant("fixed", 3 * 2**30),
        run=variant("run", 4 * 2**30), alternatives=(), recommendations=("pad",),
        unmatched_frees=0, peak_allocated_bytes=3 * 2**30, overhead_bytes=500 * 2**20,
    )  # fmt: skip
    _common(run)
    assert run.device_used_bytes == 4 * 2**30 + 500 * 2**20
    assert run.notes == ("pad",) and run.verdict is None
    assert "overhead_bytes" not in run.to_json()  # the record's JSON keys are unchanged


@pytest.fixture(scope="module")
def flux(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("diffusers")
    from tests.estimate.diffusion.test_pipeline import tiny_flux

    return tiny_flux(tmp_path_factory.mktemp("answer-flux"))


def test_a_diffusion_pipeline_is_an_answer_judged_by_the_one_rule(flux: Path) -> None:
    from memfit.estimate.diffusion.pipelines import estimate_pipeline
    from memfit.estimate.verdict import judge_point
    from memfit.hardware import get_gpu
    from memfit.spec.diffusion import DiffusionJob

    gpu = get_gpu("T4")
    est = estimate_pipeline(flux, DiffusionJob(height=64, width=64), name="tiny", gpu=gpu)
    _common(est)
    assert est.peak_allocated_bytes == est.peak_bytes
    assert sum(est.peak_components.values()) == est.peak_bytes
    assert est.verdict == judge_point(est.device_used_bytes, gpu.capacity_bytes)
    fits = est.to_json()["fits"]
    assert fits["verdict"] in VERDICTS and fits["need_bytes"] == est.device_used_bytes
    assert fits["fits"] is (fits["verdict"] == "fits")
    assert EXIT_CODES[fits["verdict"]] == 0


def test_a_diffusion_training_run_is_an_answer_judged_by_the_one_rule(flux: Path) -> None:
    pytest.importorskip("peft")
    from memfit.estimate.diffusion.train_fast import estimate_training_fast
    from memfit.hardware import get_gpu
    from memfit.spec.diffusion import DiffusionTrainJob

    job = DiffusionTrainJob(resolution=64, max_sequence_length=16)
    est = estimate_training_fast(flux, job, name="tiny", gpu=get_gpu("T4"))
    _common(est)
    assert sum(est.peak_components.values()) == est.peak_bytes
    assert est.verdict is not None and est.verdict.point_bytes == est.device_used_bytes
    assert est.to_json()["fits"]["overhead_bytes"] == est.device_used_bytes - est.peak_bytes
