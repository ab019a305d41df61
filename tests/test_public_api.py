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


def test_the_verbs_keep_their_names_when_their_packages_load_later() -> None:
    """Issue 32: ``import memfit`` loads its names on first use, so the packages ``memfit.plan``,
    ``memfit.estimate`` and ``memfit.bench`` may be imported after it; the import system binds a
    subpackage on its parent, and the verbs of the same names must stay the verbs."""
    code = (
        "import memfit, sys\n"
        "assert 'memfit.plan' not in sys.modules and 'memfit.api' not in sys.modules\n"
        "import memfit.plan.search, memfit.estimate.policy, memfit.bench.result\n"
        "import memfit.plan.doctor\n"
        "from memfit.plan import doctor\n"
        "print(all(callable(f) and not isinstance(f, type(sys)) for f in\n"
        "          (memfit.plan, memfit.estimate, memfit.bench, doctor)),\n"
        "      memfit.plan.__module__, doctor.__module__, memfit.WorkloadSpec.__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "memfit", "memfit.plan.doctor", "WorkloadSpec"]
