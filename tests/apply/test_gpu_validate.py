"""benchmarks/gpu_validate.py is ready for a CUDA machine: its grid, estimates and report run."""

from __future__ import annotations

import json

from benchmarks import gpu_validate as gv

import memfit


def test_every_case_is_a_valid_plan_for_a_bundled_model() -> None:
    from memfit.models import resolve_model

    assert len(gv.CASES) >= 10
    for case, (model, _) in gv.CASES.items():
        assert resolve_model(model).origin == "bundled"
        assert isinstance(gv.workload(case), memfit.WorkloadSpec)
    techniques = {k: v for _, w in gv.CASES.values() for k, v in w.items()}
    for key in ("quant", "optimizer", "checkpointing", "lora_rank", "precision", "attention"):
        assert key in techniques


def test_dry_run_lists_the_grid_with_estimates(capsys) -> None:
    assert (
        gv.main(
            [
                "--dry-run",
                "--gpu",
                "H100-80GB",
                "--engine",
                "analytic",
                "--cases",
                "llama1b-bf16,qwen05b-fp32-sgd",
            ]
        )
        == 0
    )
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert [r["case"] for r in rows] == ["llama1b-bf16", "qwen05b-fp32-sgd"]
    assert all(r["estimate"]["peak_allocated_bytes"] > 0 for r in rows)


def test_results_are_compared_and_rendered_for_the_accuracy_doc() -> None:
    est = {
        "engine": "trace",
        "peak_allocated_bytes": 110,
        "peak_reserved_bytes": 120,
        "device_used_bytes": 130,
    }
    measured = {
        "max_memory_allocated": 100,
        "max_memory_reserved": 125,
        "nvml_process_used_bytes": None,
    }
    row = gv.compare("llama1b-bf16", measured, est)
    assert row["error_allocated"] == 0.1 and row["error_reserved"] == -0.04
    assert row["error_nvml"] is None
    table = gv.markdown([row, {"case": "llama1b-eager", "error": "timed out after 35 s"}])
    assert "| llama1b-bf16 |" in table and "+10.0%" in table and "-4.0%" in table
    assert "failed: timed out after 35 s" in table


def test_unknown_cases_are_refused(capsys) -> None:
    import pytest

    with pytest.raises(SystemExit):
        gv.main(["--dry-run", "--cases", "nope"])
    assert "unknown case(s) nope" in capsys.readouterr().err
