"""A type checker sees memfit's public functions return their records, not ``Any``.

mypy (the project's configuration, pyproject.toml) checks :data:`SNIPPET`, a user's file of
memfit calls, once: each ``# revealed:`` line must reveal that type, each ``# error:`` line must
fail with that error code, and no other line may fail. The calls are never run (the snippet is
checked, not executed), so the models named need no config.

Time: mypy reads memfit and the torch stubs it names. With the project's cache warm (``make
test`` runs ``make lint``'s mypy first) the test takes about 10 s; cold, about 65 s of CPU (3 min
on a loaded 2-core machine).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: What the user's file sets up (checked too: it must pass).
SETUP = """\
from pathlib import Path

import memfit
from memfit.estimate.result import MemoryEstimate
from memfit.plan.search import Plan

est: MemoryEstimate = memfit.estimate("gpt2", gpu="L4", engine="analytic")
p: Plan = memfit.plan("llama-3.1-8b", gpu="L4", seq_len=4096, global_batch=16)
dist = memfit.SeqDist(mean=300, std=250, max_len=1024)
run = memfit.SeqRun(workload=memfit.WorkloadSpec(), dist=dist)
vllm = memfit.VllmConfig(max_model_len=2048)
sd = memfit.DiffusionJob()
sdt = memfit.DiffusionTrainJob()
job: memfit.Job = memfit.WorkloadSpec()
"""

#: (expression, the type mypy reveals; ``*``: a signature that starts so).
REVEALS = [
    (
        'memfit.estimate("llama-3.1-8b", memfit.WorkloadSpec())',
        "memfit.estimate.result.MemoryEstimate",
    ),
    ('memfit.estimate("gpt2")', "memfit.estimate.result.MemoryEstimate"),
    ('memfit.estimate("gpt2", run)', "memfit.api.SeqRunAnswer"),
    ('memfit.estimate("gpt2", vllm, gpu="L4")', "memfit.serving.startup.VllmStartup"),
    ('memfit.estimate("sd", sd)', "memfit.estimate.diffusion.answer.PipelineEstimate"),
    ('memfit.estimate("sd", sdt)', "memfit.estimate.diffusion.train.TrainEstimate"),
    (
        'memfit.estimate("gpt2", job)',  # any job: the union of the records
        "memfit.estimate.result.MemoryEstimate | memfit.api.SeqRunAnswer"
        " | memfit.estimate.diffusion.answer.PipelineEstimate"
        " | memfit.estimate.diffusion.train.TrainEstimate | memfit.serving.startup.VllmStartup"
        " | memfit.serving.sglang.SglangStartup | memfit.estimate.llamacpp.LlamaCppEstimate",
    ),
    (
        'memfit.estimate("gpt2", memfit.SglangConfig(), gpu="L4")',
        "memfit.serving.sglang.SglangStartup",
    ),
    (
        'memfit.estimate("gpt2", memfit.LlamaCppJob(), gpu="L4")',
        "memfit.estimate.llamacpp.LlamaCppEstimate",
    ),
    (
        'memfit.fit("gpt2", memfit.SglangConfig(), gpu="L4")',
        "tuple[int, memfit.serving.sglang.SglangStartup | None]",
    ),
    (
        'memfit.fit("gpt2", memfit.LlamaCppJob(), gpu="L4")',
        "tuple[int, memfit.estimate.llamacpp.LlamaCppEstimate]",
    ),
    ('memfit.plan("gpt2", memfit.PlanRequest())', "memfit.plan.search.Plan"),
    ('memfit.plan("gpt2", run, gpu="L4")', "memfit.plan.seq_fit.SeqPlanResult"),
    ('memfit.plan("sd", sdt, gpu="L4")', "memfit.plan.diffusion_train.TrainPlan"),
    ('memfit.plan("sd", sd, gpu="L4")', "memfit.plan.diffusion_infer.PipelinePlans"),
    ('memfit.plan("gpt2", vllm, gpu="L4")', "list[memfit.serving.solve.ServingOption]"),
    ('memfit.fit("gpt2", memfit.WorkloadSpec(), gpu="L4")', "memfit.plan.solve.FitResult"),
    ('memfit.fit("gpt2", run, gpu="L4")', "memfit.plan.seq_fit.SeqFitResult"),
    ('memfit.fit("sd", sdt, gpu="L4")', "memfit.plan.diffusion_train.TrainFit"),
    ('memfit.fit("sd", sd, gpu="L4")', "memfit.plan.diffusion_fit.PipelineFit"),
    (
        'memfit.fit("gpt2", vllm, gpu="L4")',
        "tuple[int, memfit.serving.startup.VllmStartup | None]",
    ),
    ('memfit.upgrade_verdict("gpt2", gpu="L4")', "memfit.plan.upgrade.UpgradeVerdict"),
    ('memfit.doctor("gpt2", memfit.WorkloadSpec())', "memfit.plan.doctor_findings.DoctorReport"),
    ('memfit.analyze_snapshot("s.pickle")', "memfit.snapshot.analyze.SnapshotAnalysis"),
    ('memfit.render_html_report("run.jsonl", "r.html", est)', "pathlib.Path"),
    ('memfit.bench("opt-125m", steps=3)', "memfit.bench.result.BenchResult"),
    ('memfit.quality("minilm")', "memfit.bench.gate.QualityResult"),
    # the torch layers' own signatures (the user's model and step function stay open there)
    ("memfit.find_batch_size", "def (step_fn: *"),
    ("memfit.apply_plan_", "def (model: torch.nn.modules.module.Module, plan: *"),
    ("memfit.build_optimizer", "def (model: torch.nn.modules.module.Module, plan: *"),
    ("memfit.trace_step", "def (step_fn: *"),
]

#: (a wrong use, the error code mypy must give it).
WRONG = [
    ('wrong: Plan = memfit.estimate("gpt2")', "assignment"),
    ('memfit.plan("gpt2", memfit.WorkloadSpec())', "call-overload"),  # NotModelledError at run
    ('memfit.estimate("gpt2", options="analytic")', "call-overload"),
    ('memfit.bench("opt-125m", stesp=3)', "call-arg"),
    ("memfit.analyze_snapshot(3)", "arg-type"),
    ('memfit.render_html_report(Path("run.jsonl"), "r.html", estimate=3)', "arg-type"),
]


def _snippet() -> tuple[str, dict[int, str], dict[int, str]]:
    """The file, and the line numbers of its reveals and of its wrong uses."""
    lines = SETUP.splitlines()
    reveals: dict[int, str] = {}
    for expr, want in REVEALS:
        lines.append(f"reveal_type({expr})")
        reveals[len(lines)] = want
    wrong: dict[int, str] = {}
    for stmt, code in WRONG:
        lines.append(stmt)
        wrong[len(lines)] = code
    return "\n".join(lines) + "\n", reveals, wrong


def _mypy_output(tmp_path: Path) -> str:
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed")
    snippet = tmp_path / "uses_memfit.py"
    snippet.write_text(_snippet()[0])
    # memfit from this checkout (not an installed copy); the project's cache, warm after `make lint`
    env = {**os.environ, "MYPYPATH": str(ROOT / "src")}
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
         "--show-error-codes", "--no-error-summary", "--hide-error-context", str(snippet)],
        capture_output=True, text=True, cwd=ROOT, env=env, check=False, timeout=600,
    )  # fmt: skip
    if run.returncode not in (0, 1) or run.stderr.strip():
        raise AssertionError(f"mypy failed to run ({run.returncode}): {run.stderr[-2000:]}")
    return run.stdout


def test_public_functions_reveal_their_records_and_wrong_uses_fail(tmp_path: Path) -> None:
    out = _mypy_output(tmp_path)
    revealed: dict[int, str] = {}
    errors: dict[int, str] = {}
    for line in out.splitlines():
        m = re.match(r".*uses_memfit\.py:(\d+): (note|error): (.*)$", line)
        if m is None:
            continue
        n, kind, text = int(m[1]), m[2], m[3]
        if kind == "note" and text.startswith("Revealed type is "):
            revealed[n] = text.removeprefix("Revealed type is ").strip('"')
        elif kind == "error":
            code = re.search(r"\[([a-z-]+)\]$", text)
            errors.setdefault(n, code[1] if code else text)
    _, expected_reveals, expected_errors = _snippet()
    for n, want in expected_reveals.items():
        got = revealed.get(n)
        assert got is not None, f"line {n}: nothing revealed\n{out}"
        if want.endswith("*"):
            assert got.startswith(want[:-1]), f"line {n}: {got} (want {want})"
        else:
            assert got == want, f"line {n}: {got} (want {want})"
    assert errors == expected_errors, out
