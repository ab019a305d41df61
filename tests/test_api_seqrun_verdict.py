"""THE verdict of a variable-length run comes from the Python API (``api._estimate_seq``), and
``estimate --seq-dist`` prints and exits with that one (the run's replay is stubbed: the rule is
under test here, the replay in tests/estimate/seqrun)."""

from __future__ import annotations

import json
from typing import Any

import pytest

import memfit
from memfit.cli.entry import main
from memfit.estimate.options import EstimateOptions
from memfit.estimate.seqrun import run as seqrun_run
from memfit.estimate.seqrun.run import SeqRunEstimate, Variant
from memfit.spec import WorkloadSpec
from memfit.spec.seqrun import SeqDist, SeqRun
from memfit.units import GiB

WORKLOAD = WorkloadSpec(batch_size=4, seq_len=1024, precision="bf16-mixed", lora_rank=16)


def _run(reserved: int, *, n_ooms: int = 0, unbounded: int | None = None) -> SeqRunEstimate:
    def variant(name: str, n: int, ooms: int = 0, free: int | None = None) -> Variant:
        return Variant(name=name, reserved_bytes=n, reserved_expandable_bytes=n,
                       memory_only=True, how=name, n_ooms=ooms,
                       reserved_unbounded_bytes=n if free is None else free)  # fmt: skip

    return SeqRunEstimate(
        n_steps=50, seed=0, max_len=1024, mean_step_len=300.0, n_distinct_lengths=40,
        anchors=(64, 256, 1024), floor_len=1, fixed=variant("fixed", reserved // 2),
        run=variant("run", reserved, n_ooms, unbounded), alternatives=(), recommendations=(),
        unmatched_frees=0,
    )  # fmt: skip


def _answer(monkeypatch: pytest.MonkeyPatch, run: SeqRunEstimate, gpu: str | None) -> Any:
    monkeypatch.setattr(seqrun_run, "estimate_seq_run", lambda *a, **k: run)
    job = SeqRun(workload=WORKLOAD, dist=SeqDist(max_len=1024, mean=300.0, std=250.0))
    return memfit.estimate("llama-3.2-1b", job, gpu=gpu,
                           options=EstimateOptions(engine="analytic"))  # fmt: skip


def test_a_run_well_inside_the_gpu_fits_by_the_one_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    answer = _answer(monkeypatch, _run(6 * GiB), "L4")
    verdict = answer.run.fits
    assert verdict is not None and verdict.verdict == "fits"
    assert verdict.point_bytes == answer.run.device_used_bytes == verdict.need_bytes
    assert verdict.capacity_bytes == answer.estimate.fits.capacity_bytes
    assert verdict.headroom_bytes == answer.estimate.fits.headroom_bytes


def test_a_run_inside_the_capacity_but_not_the_headroom_is_tight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    probe = _answer(monkeypatch, _run(GiB), "L4")
    limit = probe.estimate.fits.capacity_bytes - probe.run.overhead_bytes
    answer = _answer(monkeypatch, _run(limit - 64 * 2**20), "L4")
    assert answer.run.fits.verdict == "tight"


def test_a_capped_replay_that_ran_out_of_memory_is_judged_on_its_uncapped_need(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answer = _answer(monkeypatch, _run(20 * GiB, n_ooms=3, unbounded=31 * GiB), "L4")
    verdict = answer.run.fits
    assert verdict.verdict == "does not fit"
    assert verdict.point_bytes == answer.run.overhead_bytes + 31 * GiB
    assert verdict.point_bytes > verdict.capacity_bytes


def test_without_a_gpu_the_run_has_no_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _answer(monkeypatch, _run(6 * GiB), None).run.fits is None


def test_the_cli_prints_and_exits_with_the_api_verdict(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    oom = _run(20 * GiB, n_ooms=3, unbounded=31 * GiB)
    monkeypatch.setattr(seqrun_run, "estimate_seq_run", lambda *a, **k: oom)
    argv = ["estimate", "llama-3.2-1b", "--lora-rank", "16", "--batch", "4", "--gpu", "L4",
            "--engine", "analytic", "--seq-dist", "300,250,1024"]  # fmt: skip
    assert main([*argv, "--json"]) == 1
    out = json.loads(capsys.readouterr().out)["seq_dist"]
    assert out["verdict"] == "does not fit" and out["fits"] is False
    assert out["judged"]["point_bytes"] > out["judged"]["capacity_bytes"]
    assert main(argv) == 1
    text = capsys.readouterr().out
    assert "DOES NOT FIT (3 OOMs in the replay capped at the GPU" in text
    assert "without a cap the run reserves" in text
