"""The doctor: each of the seven mistakes found and not found, with its numbers; CLI and JSON.

The estimator is the closed-form stand-in of conftest.py (1 M parameters; activations 2000 B per
token without checkpointing, KV cache 512 B per token); run logs are written record by record."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from tests.plan.conftest import closed_form_estimate

from memfit import cli
from memfit.errors import SpecError
from memfit.hardware import GPU, get_gpu
from memfit.monitor.log import record
from memfit.plan.doctor import MISTAKES, STACK_MIN, doctor
from memfit.plan.solve import fit
from memfit.spec import WorkloadSpec
from memfit.units import MiB, format_bytes

#: a synthetic card whose capacity is its memory_bytes (observed reservation 0)
CARD = "test card: capacity = memory_bytes"

# the module, not the function of the same name that memfit.plan exports
doctor_module = importlib.import_module("memfit.plan.doctor")


def _gpu(memory_bytes: int) -> GPU:
    return dataclasses.replace(
        get_gpu("L4"), memory_bytes=memory_bytes, driver_reserved_bytes=0, capacity_source=CARD
    )


def _doctor(model: Path, w: WorkloadSpec, **kw: Any) -> doctor_module.DoctorReport:
    return doctor(str(model), w, estimator=closed_form_estimate, **kw)


# -- 1 weights-only sizing ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("sized_by", "applies"), [("weights", "yes"), ("estimate", "no"), (None, "unknown")]
)
def test_weights_only_sizing_compares_the_weights_with_the_step(
    tiny_llama_dir: Path, sized_by: str | None, applies: str
) -> None:
    w = WorkloadSpec(precision="amp-bf16", seq_len=512)
    r = _doctor(tiny_llama_dir, w, sized_by=sized_by)
    f = r.finding("weights_only_sizing")
    need = closed_form_estimate(w).device_used_bytes  # the stand-in's ranges are its point value
    assert f.applies == applies
    assert f.numbers["weights_bytes"] == 2_000_000  # 1 M parameters x 2 B (16-bit checkpoint)
    assert f.numbers["ratio"] == pytest.approx(f.numbers["need_bytes"] / 2_000_000)
    assert f.numbers["need_bytes"] >= need
    assert f"the weights are {format_bytes(2_000_000)} but the step needs" in f.evidence
    assert f"under-counts by {f.numbers['ratio']:.1f}x" in f.evidence
    assert f.next_step.startswith(f"size the whole job: memfit estimate {tiny_llama_dir.name}")


def test_weights_that_fit_while_the_job_does_not_are_named(tiny_llama_dir: Path) -> None:
    r = _doctor(tiny_llama_dir, WorkloadSpec(precision="amp-bf16"), gpu=_gpu(8 * MiB))
    assert (
        "the weights alone fit L4 but the job does not" in r.finding("weights_only_sizing").evidence
    )


# -- 2 quantization without a quality check -----------------------------------------------------
@pytest.mark.parametrize(("checked", "applies"), [(False, "yes"), (True, "no"), (None, "unknown")])
def test_quantization_needs_a_quality_check(
    tiny_llama_dir: Path, checked: bool | None, applies: str
) -> None:
    w = WorkloadSpec(precision="bf16", quant="nf4-dq", lora_rank=16, optimizer="adamw-8bit")
    f = _doctor(tiny_llama_dir, w, quality_checked=checked).finding("quantization_unchecked")
    assert f.applies == applies
    assert "nf4-dq weights (4-bit base weights: check quality" in f.evidence
    assert "--no-quant" in f.next_step


def test_unquantized_weights_need_no_quality_check(tiny_llama_dir: Path) -> None:
    f = _doctor(tiny_llama_dir, WorkloadSpec(), quality_checked=False)
    assert f.finding("quantization_unchecked").applies == "no"


# -- 3 batch size chosen without profiling --------------------------------------------------------
def test_batch_from_a_guess_is_compared_with_the_largest_that_fits(tiny_llama_dir: Path) -> None:
    w = WorkloadSpec(precision="amp-bf16", batch_size=2, seq_len=512)
    gpu = _gpu(64 * MiB)
    f = _doctor(tiny_llama_dir, w, gpu=gpu, batch_from="guess").finding("batch_unprofiled")
    solved = fit(
        str(tiny_llama_dir), w, solve="batch", gpu=gpu, estimator=closed_form_estimate
    ).max_value
    assert f.applies == "yes" and f.numbers["max_batch"] == solved > 2
    assert "the largest batch that fits L4 within" in f.evidence and f"is {solved}" in f.evidence
    assert "memfit fit" in f.next_step and "--solve batch" in f.next_step


def test_a_batch_that_does_not_fit_is_a_mistake_whatever_its_origin(tiny_llama_dir: Path) -> None:
    w = WorkloadSpec(precision="amp-bf16", batch_size=64, seq_len=512)
    f = _doctor(tiny_llama_dir, w, gpu=_gpu(32 * MiB), batch_from="profile")
    found = f.finding("batch_unprofiled")
    assert found.applies == "yes" and found.evidence.endswith("batch 64 does not fit")
    ok = _doctor(tiny_llama_dir, replace_batch(w, 1), gpu=_gpu(32 * MiB), batch_from="profile")
    assert ok.finding("batch_unprofiled").applies == "no"


def replace_batch(w: WorkloadSpec, b: int) -> WorkloadSpec:
    return dataclasses.replace(w, batch_size=b)


# -- 4 sequence length / KV cache ignored ---------------------------------------------------------
def test_a_long_sequence_sized_by_weights_is_ignored_memory(tiny_llama_dir: Path) -> None:
    w = WorkloadSpec(precision="amp-bf16", seq_len=2048, batch_size=2)
    f = _doctor(tiny_llama_dir, w, sized_by="weights").finding("sequence_ignored")
    est = closed_form_estimate(w)
    acts = 2 * 2048 * 2000
    assert f.applies == "yes" and f.numbers["bytes"] == acts
    assert f.numbers["share"] == pytest.approx(acts / est.peak_allocated_bytes)
    assert f"at seq 2048 x batch 2 the activations take {format_bytes(acts)}" in f.evidence


def test_a_short_sequence_is_negligible(tiny_llama_dir: Path) -> None:
    w = WorkloadSpec(precision="amp-bf16", seq_len=16)
    f = _doctor(tiny_llama_dir, w, sized_by="weights").finding("sequence_ignored")
    assert f.applies == "no" and "the headroom absorbs it" in f.evidence


def test_serving_reports_the_kv_cache_per_token(tiny_llama_dir: Path) -> None:
    w = WorkloadSpec(mode="infer", seq_len=1024, new_tokens=1024, batch_size=8)
    f = _doctor(tiny_llama_dir, w, sized_by="weights").finding("sequence_ignored")
    assert f.numbers["component"] == "kv_cache" and f.numbers["kv_bytes_per_token"] == 512
    assert f.applies == "yes" and "--solve concurrency" in f.next_step


# -- 5 techniques stacked without benchmarking ----------------------------------------------------
@pytest.mark.parametrize(
    ("benchmarked", "applies"), [(False, "yes"), (True, "no"), (None, "unknown")]
)
def test_three_stacked_techniques_need_a_benchmark(
    tiny_llama_dir: Path, benchmarked: bool | None, applies: str
) -> None:
    w = WorkloadSpec(
        precision="amp-bf16", checkpointing="full", optimizer="adamw-8bit", lora_rank=16
    )
    f = _doctor(tiny_llama_dir, w, gpu="L4", benchmarked=benchmarked).finding(
        "stacked_unbenchmarked"
    )
    assert len(f.numbers["techniques"]) == STACK_MIN and f.applies == applies
    assert "full checkpointing, adamw-8bit optimizer, LoRA r16" in f.evidence
    assert f.numbers["predicted_slowdown"] > 0 and "roofline on L4" in f.evidence


def test_one_technique_is_not_a_stack(tiny_llama_dir: Path) -> None:
    w = WorkloadSpec(precision="amp-bf16", checkpointing="full")
    f = _doctor(tiny_llama_dir, w, benchmarked=False).finding("stacked_unbenchmarked")
    assert f.applies == "no" and f.numbers["techniques"] == ["full checkpointing"]


# -- 6 reserved memory mistaken for a leak --------------------------------------------------------
def _log(path: Path, allocated: list[int], reserved: list[int]) -> Path:
    start = record(
        "start", memfit_version="0", device="cuda:0", device_name="x", device_total_bytes=1 << 34,
        pid=1, argv=[], estimate=None,
    )  # fmt: skip
    lines = [start]
    for i, (a, r) in enumerate(zip(allocated, reserved, strict=True), start=1):
        lines.append(
            record(
                "step",
                step=i,
                step_time_s=0.1,
                tokens=1,
                samples=1,
                tokens_per_s=10.0,
                samples_per_s=10.0,
                allocated_bytes=a,
                peak_allocated_bytes=a,
                reserved_bytes=r,
                peak_reserved_bytes=r,
                device_used_bytes=None,
                utilization_pct=None,
                rss_bytes=None,
            )  # fmt: skip
        )
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_reserved_above_a_flat_allocated_is_cache_not_a_leak(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    log = _log(tmp_path / "run.jsonl", [100 * MiB] * 20, [300 * MiB] * 20)
    f = _doctor(tiny_llama_dir, WorkloadSpec(), log=log).finding("reserved_as_leak")
    assert f.applies == "yes" and f.numbers["verdict"] == "cache"
    assert f.numbers["allocated_bytes"] == 100 * MiB and f.numbers["reserved_bytes"] == 300 * MiB
    assert f.numbers["cache_bytes"] == 200 * MiB and "not a leak" in f.evidence


def test_a_real_leak_is_not_the_mistake(tiny_llama_dir: Path, tmp_path: Path) -> None:
    grow = [100 * MiB + i * MiB for i in range(20)]
    log = _log(tmp_path / "run.jsonl", grow, [g + MiB for g in grow])
    f = _doctor(tiny_llama_dir, WorkloadSpec(), log=log).finding("reserved_as_leak")
    assert f.applies == "no" and f.numbers["verdict"] == "leak"
    assert f.evidence.startswith("run.jsonl: leak: allocated grows")


def test_without_a_log_the_leak_question_is_unknown(tiny_llama_dir: Path) -> None:
    f = _doctor(tiny_llama_dir, WorkloadSpec()).finding("reserved_as_leak")
    assert f.applies == "unknown" and "memfit monitor" in f.next_step


# -- 7 GPU chosen by VRAM alone -------------------------------------------------------------------
def test_gpu_choice_is_ranked_by_predicted_throughput(tiny_llama_dir: Path) -> None:
    r = _doctor(tiny_llama_dir, WorkloadSpec(precision="amp-bf16"), gpu="T4", chose_gpu_by="vram")
    f = r.finding("gpu_by_vram")
    assert f.applies == "yes" and f.numbers["n_with_room"] > 20  # a 1 M-parameter job fits all
    assert f.numbers["rank"] > 1  # a T4 is not the fastest GPU for it
    assert f"T4 ranks {f.numbers['rank']} by predicted tokens/s" in f.evidence
    assert "--recommend-gpu" in f.next_step and "--gpu T4" not in f.next_step


def test_without_a_gpu_the_gpu_choice_is_unknown(tiny_llama_dir: Path) -> None:
    f = _doctor(tiny_llama_dir, WorkloadSpec(), chose_gpu_by="throughput").finding("gpu_by_vram")
    assert f.applies == "no" and f.evidence == "no --gpu given"


# -- input and output -----------------------------------------------------------------------------
def test_bad_facts_are_refused_together(tiny_llama_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(
        SpecError, match=r"2 problems: sized_by \('vibes'\) .*; log .* is not a file"
    ):
        _doctor(tiny_llama_dir, WorkloadSpec(), sized_by="vibes", log=tmp_path / "nope.jsonl")


@pytest.fixture
def _stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        doctor_module, "_estimator", lambda source, gpu, injected: (closed_form_estimate, None)
    )


@pytest.mark.usefixtures("_stand_in")
def test_cli_doctor_prints_every_finding_and_exits_0(
    tiny_llama_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["doctor", str(tiny_llama_dir), "--gpu", "L4", "--seq", "1024", "--batch", "2"]
    argv += ["--sized-by", "weights", "--no-quality-checked", "--quant", "nf4-dq"]
    argv += ["--lora-rank", "16", "--precision", "bf16", "--json"]
    assert cli.main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert [f["mistake"] for f in data["findings"]] == list(MISTAKES)
    assert set(data["findings"][0]) == {
        "mistake", "title", "applies", "evidence", "next_step", "numbers",
    }  # fmt: skip
    by = {f["mistake"]: f["applies"] for f in data["findings"]}
    assert by["weights_only_sizing"] == by["quantization_unchecked"] == "yes"
    assert data["n_apply"] == sum(a == "yes" for a in by.values())
    assert cli.main(argv[:-1]) == 0
    assert "[x] sizing by the weights alone: yes" in capsys.readouterr().out


@pytest.mark.usefixtures("_stand_in")
def test_cli_doctor_bad_input_exits_2(
    tiny_llama_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["doctor", str(tiny_llama_dir), "--log", str(tmp_path / "missing.jsonl")])
    assert code == 2 and "is not a file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli.main(["doctor", str(tiny_llama_dir), "--sized-by", "vibes"])
    assert exc.value.code == 2


# -- one needs figure, a way forward, the GPU's precision (issue 29) --------------------------
NEEDS = re.compile(r"\bneeds (\d[\d.,]* [KMGT]?i?B)")


def _doctor_cli(*argv: str) -> tuple[str, dict[str, Any]]:
    """``memfit doctor ARGV``: its text and its --json (the analytic engine)."""
    out = []
    for extra in ((), ("--json",)):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            cli.main(["doctor", *argv, "--engine", "analytic", *extra])
        out.append(buf.getvalue())
    return out[0], json.loads(out[1])


@pytest.mark.parametrize("lora", [(), ("--lora-rank", "16")])
def test_doctor_says_one_needs_figure_the_verdicts(lora: tuple[str, ...]) -> None:
    text, data = _doctor_cli(
        "llama-3.1-8b", "--gpu", "T4", "--seq", "4096", "--precision", "bf16-mixed", *lora
    )
    need = format_bytes(data["verdict"]["need_bytes"])
    assert data["need_bytes"] == data["verdict"]["need_bytes"]
    assert set(NEEDS.findall(text)) == {need}, text
    assert f"verdict: DOES NOT FIT on T4: needs {need} (upper end)" in text


def test_no_batch_that_fits_is_said_with_the_way_forward() -> None:
    text, data = _doctor_cli("llama-3.2-3b", "--gpu", "T4", "--seq", "2048")
    batch = next(f for f in data["findings"] if f["mistake"] == "batch_unprofiled")
    assert batch["numbers"]["max_batch"] == 0
    assert "is 0" not in text
    assert batch["evidence"].startswith("no batch size fits T4 as the job is set up")
    # the nearest change `memfit estimate` names for the same job (one search, one answer)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        cli.main(["estimate", "llama-3.2-3b", "--gpu", "T4", "--seq", "2048", "--json"])
    nearest = json.loads(buf.getvalue())["nearest_fit"]
    assert nearest["change"] and batch["numbers"]["nearest_plan"] == nearest["plan"]
    assert (
        f"the nearest change that fits ({nearest['kind']}) is {nearest['change']} — "
        f"{nearest['plan']}" in batch["evidence"]
    )
    assert batch["next_step"] == f"compare the plans: {nearest['command']}"


def test_doctor_settles_the_default_precision_for_the_gpu_as_estimate_does() -> None:
    """No --precision on a T4 (no bf16): doctor judges the job `memfit estimate` judges, in
    16-mixed, and says which default applied."""
    text, data = _doctor_cli("llama-3.2-3b", "--gpu", "T4", "--seq", "2048")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        cli.main(["estimate", "llama-3.2-3b", "--gpu", "T4", "--seq", "2048", "--json"])
    est = json.loads(buf.getvalue())
    assert est["workload"]["precision"] == "16-mixed"
    assert data["workload"]["precision"] == "16-mixed"
    assert data["verdict"]["need_bytes"] == est["fits"]["need_bytes"]
    assert "precision 16-mixed: the default for a full fine-tune" in text
    assert "bf16" not in text.split("note:")[0]


@pytest.mark.parametrize(("gpu", "bf16"), [("T4", False), ("V100-32GB", False), ("L4", True)])
def test_next_steps_use_the_precision_the_gpu_runs(gpu: str, bf16: bool) -> None:
    text, _ = _doctor_cli(
        "llama-3.1-8b", "--gpu", gpu, "--seq", "4096", "--precision", "bf16-mixed"
    )
    steps = [line for line in text.splitlines() if line.strip().startswith("next:")]
    assert steps and all(("bf16" in s) is bf16 for s in steps if "--precision" in s), steps
    assert any("16-mixed" in s for s in steps)


def test_a_tight_job_is_called_tight_in_every_finding() -> None:
    """The verdict's word, not another: a job whose point fits but whose upper end does not is
    ``tight`` in the verdict line and in the findings (not "does not fit")."""
    text, data = _doctor_cli(
        "llama-3.1-8b", "--gpu", "A100-80GB", "--seq", "4096", "--batch", "4", "--precision",
        "bf16-mixed", "--lora-rank", "16", "--checkpointing", "full", "--optimizer", "adamw-8bit",
    )  # fmt: skip
    assert data["verdict"]["verdict"] == "tight"
    assert "does not fit" not in text
    assert "batch 4 is tight (its upper end is over the limit)" in text


def test_the_sequence_finding_reads_the_activations_at_their_largest() -> None:
    """A full fine-tune peaks at the optimizer step, after the activations are freed: the finding
    reads them in the phase where they are largest (the forward / backward), not ~0 at the peak."""
    _, data = _doctor_cli("llama-3.1-8b", "--gpu", "T4", "--seq", "4096")
    seq = next(f for f in data["findings"] if f["mistake"] == "sequence_ignored")
    nums = seq["numbers"]
    assert nums["phase"] != "optimizer"
    assert nums["bytes"] > 10 * 2**30  # 4096 tokens through 32 layers of an 8B model
    assert seq["applies"] != "no"


def test_the_job_itself_is_answered_by_estimates_engine_choice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """doctor's own estimate of the job is the one `memfit estimate` gives (the engine policy's
    answer: the trace where the fast-path grid does not validate the analytic engine), not the
    checklist's analytic-first estimator: one verdict, one needs figure."""
    from memfit.estimate.policy import run_engine
    from memfit.models import resolve_model

    gpu, source = get_gpu("T4"), resolve_model("whisper-small")
    w = WorkloadSpec(mode="infer", batch_size=1, seq_len=512, precision="16-true")
    analytic = run_engine("analytic", source, w, gpu)
    # the policy's answer, told apart from the analytic engine's by its engine and 1 GiB more
    precise = dataclasses.replace(
        analytic,
        engine="trace",
        peak_reserved_bytes=analytic.peak_reserved_bytes + 1024 * MiB,
        device_used_bytes=analytic.device_used_bytes + 1024 * MiB,
    )
    asked: list[WorkloadSpec] = []

    class Policy:
        def estimate(self, src: Any, job: WorkloadSpec, g: Any) -> Any:
            asked.append(job)
            return precise

    monkeypatch.setattr(doctor_module, "active", lambda: Policy())
    r = doctor("whisper-small", w, gpu="T4")
    assert asked and asked[0] == w
    assert r.estimate.engine == "trace"
    assert r.estimate.device_used_bytes == precise.device_used_bytes
