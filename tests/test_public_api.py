"""The public API is small, explicit, and cheap to import."""

from __future__ import annotations

import subprocess
import sys

import memfit


def test_all_lists_exactly_the_public_names() -> None:
    import inspect

    public = {
        name
        for name in dir(memfit)
        if not name.startswith("_")
        and not inspect.ismodule(getattr(memfit, name))
        and name not in ("annotations", "Any")
    }
    assert public == set(memfit.__all__) - {"__version__"}
    for name in (
        "estimate",
        "trace_step",
        "WorkloadSpec",
        "ModelSpec",
        "MemoryEstimate",
        "SpecError",
        "UnknownModelError",
        "UnknownGPUError",
        "DoesNotFitError",
        "COMPONENTS",
        "Monitor",
        "oom_guard",
        "diagnose",
        "analyze_snapshot",
        "render_html_report",
        "SnapshotError",
        "upgrade_verdict",
        "doctor",
        "bench",
        "quality",
        "apply_plan_",
        "build_optimizer",
        "find_batch_size",
        "EstimateOptions",
        "DiffusionJob",
        "DiffusionTrainJob",
        "SglangConfig",
        "VllmConfig",
        "LlamaCppJob",
        "SeqRun",
        "SeqDist",
        "MediaSpec",
        "PlanRequest",
        "Job",
        "ModelRef",
    ):
        assert name in memfit.__all__


def test_importing_memfit_and_its_cli_does_not_import_torch() -> None:
    code = (
        "import sys, memfit, memfit.cli, memfit.models, memfit.hardware;"
        "memfit.apply_plan_, memfit.build_optimizer, memfit.find_batch_size;"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_errors_form_one_tree() -> None:
    for cls in (
        memfit.SpecError,
        memfit.UnknownModelError,
        memfit.UnknownGPUError,
        memfit.DoesNotFitError,
        memfit.TraceError,
        memfit.ModelConfigError,
        memfit.SnapshotError,
    ):
        assert issubclass(cls, memfit.MemfitError)
    assert issubclass(memfit.SpecError, ValueError)


def test_raise_if_not_fit_names_the_gpu_and_the_shortfall() -> None:
    import pytest

    est = memfit.estimate("gpt2", memfit.WorkloadSpec(seq_len=64), gpu="T4")
    est.raise_if_not_fit()  # fits: no error
    big = memfit.estimate("llama-2-7b", memfit.WorkloadSpec(seq_len=64), gpu="T4")
    with pytest.raises(memfit.DoesNotFitError, match=r"DOES NOT FIT on T4: needs .* more than its"):
        big.raise_if_not_fit()
