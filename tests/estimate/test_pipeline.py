"""The pipeline around the engines: one engine policy, shared checks, one assembly."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from typing import Any

import pytest

import memfit
from memfit.errors import (
    MemfitError,
    MissingDependencyError,
    NotModelledError,
    SpecError,
    TraceError,
)
from memfit.estimate import policy
from memfit.estimate.analytic import estimate_analytic
from memfit.estimate.device import allocator_workspaces, device_totals
from memfit.estimate.pipeline import (
    EngineResult,
    PhaseResult,
    ReservedRule,
    assemble,
    paged_note,
)
from memfit.estimate.policy import EnginePolicy
from memfit.estimate.result import MemoryEstimate
from memfit.hardware import get_gpu
from memfit.models import resolve_model
from memfit.spec import WorkloadSpec
from memfit.units import GiB, MiB

FACTORY = "tests.fixtures.cnn:make_cnn"
NO_GPU_NOTE = "no --gpu given: CUDA context and cuBLAS workspace sized for a generic Ampere GPU"


def _result(**overrides: Any) -> EngineResult:
    fields: dict[str, Any] = {
        "engine": "fake",
        "model_name": "m",
        "n_params": 10,
        "n_trainable_params": 10,
        "phases": {"forward": PhaseResult(components={"parameters": 1000})},
        "reserved": ReservedRule(replayed_bytes=0),
        "environment": {"python": "3"},
    }
    return EngineResult(**{**fields, **overrides})


def _estimate(engine: str) -> MemoryEstimate:
    return assemble(_result(engine=engine), WorkloadSpec(), None)


class FakeEngines:
    """Stands in for ``policy.run_engine``: each engine's answer (an estimate or an error)."""

    def __init__(self, **answers: MemoryEstimate | MemfitError) -> None:
        self.answers = answers
        self.calls: list[str] = []

    def __call__(self, name: str, source: Any, w: Any, gpu: Any, **_: Any) -> MemoryEstimate:
        self.calls.append(name)
        answer = self.answers[name]
        if isinstance(answer, MemfitError):
            raise answer
        return answer


@pytest.fixture
def engines(monkeypatch: pytest.MonkeyPatch) -> FakeEngines:
    fake = FakeEngines(
        analytic=_estimate("analytic"), derived=_estimate("derived"), trace=_estimate("trace")
    )
    monkeypatch.setattr(policy, "run_engine", fake)
    return fake


def _without(monkeypatch: pytest.MonkeyPatch, package: str) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == package else real(name, *a)
    )


# -- the policy ----------------------------------------------------------------------------------
#: A job the fast-path grid does not validate (frozen layers are no grid job; eager attention
#: is one since issue 32's gridfree rows), so ``auto`` answers it with the precise engine.
UNVALIDATED = WorkloadSpec(freeze_layers=2)


def test_auto_answers_with_the_trace_engine_where_its_stack_is_installed(
    engines: FakeEngines,
) -> None:
    est = EnginePolicy().estimate(resolve_model("gpt2"), UNVALIDATED, None)
    assert est.engine == "trace" and engines.calls == ["trace"]
    assert not any(n.startswith("engine auto") for n in est.notes)


def test_auto_without_the_trace_stack_answers_with_analytic_and_says_why_first(
    engines: FakeEngines, monkeypatch: pytest.MonkeyPatch
) -> None:
    _without(monkeypatch, "transformers")
    est = EnginePolicy().estimate(resolve_model("gpt2"), UNVALIDATED, None)
    assert engines.calls == ["analytic"]
    assert est.notes[0] == "engine auto: transformers is not installed; used analytic"


def test_auto_falls_back_to_analytic_when_the_trace_fails_and_says_why_first(
    engines: FakeEngines,
) -> None:
    engines.answers["trace"] = TraceError("no fake kernel for op X")
    est = EnginePolicy().estimate(resolve_model("gpt2"), UNVALIDATED, None)
    assert est.engine == "analytic" and engines.calls == ["trace", "analytic"]
    assert est.notes[0] == (
        "engine auto: the trace engine failed (no fake kernel for op X); used analytic"
    )


def test_auto_keeps_the_trace_error_when_the_analytic_engine_cannot_answer_either(
    engines: FakeEngines,
) -> None:
    engines.answers["trace"] = TraceError("no fake kernel for op X")
    engines.answers["analytic"] = NotModelledError("no closed forms", engine="analytic")
    with pytest.raises(TraceError, match="no fake kernel for op X"):
        EnginePolicy().estimate(resolve_model("gpt2"), WorkloadSpec(), None)


def test_a_factory_model_is_never_sent_to_the_analytic_engine(
    engines: FakeEngines, monkeypatch: pytest.MonkeyPatch
) -> None:
    engines.answers["trace"] = TraceError("the factory's forward failed")
    with pytest.raises(TraceError, match="the factory's forward failed"):
        EnginePolicy().estimate(resolve_model(FACTORY, allow_code=True), WorkloadSpec(), None)
    assert engines.calls == ["trace"]
    monkeypatch.undo()  # the real engines: without torch a factory model cannot be estimated
    _without(monkeypatch, "torch")
    with pytest.raises(MissingDependencyError, match="torch is not installed"):
        EnginePolicy().estimate(resolve_model(FACTORY, allow_code=True), WorkloadSpec(), None)


@pytest.mark.parametrize("engine", ["trace", "analytic"])
def test_a_named_engine_never_falls_back(engine: str, engines: FakeEngines) -> None:
    engines.answers["trace"] = TraceError("trace failed")
    engines.answers["analytic"] = NotModelledError("not modelled", engine="analytic")
    with pytest.raises(MemfitError, match="trace failed" if engine == "trace" else "not modelled"):
        EnginePolicy(engine=engine).estimate(resolve_model("gpt2"), WorkloadSpec(), None)
    assert engines.calls == [engine]


def test_an_unknown_engine_is_refused_with_the_choices() -> None:
    with pytest.raises(
        SpecError, match=r"engine \('fast'\) must be one of auto, analytic, derived, trace"
    ):
        EnginePolicy(engine="fast")
    with pytest.raises(SpecError, match=r"engine \('fast'\) must be one of"):
        memfit.estimate("gpt2", engine="fast")


def _write_config(config: dict[str, Any]) -> str:
    import json
    import tempfile

    folder = tempfile.mkdtemp()
    with open(f"{folder}/config.json", "w") as f:
        json.dump(config, f)
    return folder


def test_searches_use_analytic_and_confirm_with_trace_where_it_can_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    auto, gpt2, cnn = EnginePolicy(), resolve_model("gpt2"), resolve_model(FACTORY, allow_code=True)

    def pair(p: EnginePolicy, source: Any) -> tuple[str, str | None]:
        chosen = p.search_engines(source)
        assert chosen.reason  # every choice says why
        return chosen.search, chosen.confirm

    assert pair(auto, gpt2) == ("analytic", "trace")
    # the analytic engine cannot model a factory or a model_type without closed forms: the
    # derived engine searches a config.json model, the trace a factory, so that "cannot model"
    # is never counted as "does not fit" (issue 11)
    assert pair(auto, cnn) == ("trace", None)
    unknown = resolve_model(_write_config({"model_type": "deepseek_v3"}))
    assert pair(auto, unknown) == ("derived", None)
    assert "no hand-written program" in auto.search_engines(unknown).reason
    assert pair(EnginePolicy(engine="trace"), gpt2) == ("trace", None)
    assert pair(EnginePolicy(engine="analytic"), gpt2) == ("analytic", None)
    assert pair(EnginePolicy(engine="derived"), gpt2) == ("derived", None)
    _without(monkeypatch, "transformers")
    assert pair(auto, gpt2) == ("analytic", None)
    assert pair(auto, unknown) == ("analytic", None)  # its refusal is then the answer


def test_the_checklist_sends_refused_jobs_to_the_trace_engine_at_most_max_trace_times(
    engines: FakeEngines,
) -> None:
    engines.answers["analytic"] = NotModelledError("no closed forms for x", engine="analytic")
    engines.answers["derived"] = NotModelledError("no derived form", engine="derived")
    first = EnginePolicy().analytic_first(resolve_model("gpt2"), None, max_trace=1)
    est = first(WorkloadSpec())
    assert est.engine == "trace"
    assert est.engine_reason and "no closed forms for x" in est.engine_reason
    with pytest.raises(NotModelledError, match="no closed forms for x"):
        first(WorkloadSpec(batch_size=2))
    assert first.n_trace == 1 and first.rejected == ["no closed forms for x"] * 2
    # the derived engine is asked first (a cached form costs no trace); it refused here
    assert engines.calls == ["analytic", "derived", "trace", "analytic"]


def test_the_analytic_engine_refuses_what_it_cannot_model_with_a_typed_error() -> None:
    refusals = [
        (resolve_model(FACTORY, allow_code=True), WorkloadSpec(), "needs a config.json"),
        ({"model_type": "mamba", "num_hidden_layers": 2}, WorkloadSpec(), "no closed forms"),
        (
            resolve_model("llama-3.2-1b"),
            WorkloadSpec(mode="infer", quant="nf4", gpus=2, tp=2),
            r"does not model quant='nf4' with tp=2",
        ),
        (resolve_model("mixtral-8x7b"), WorkloadSpec(lora_rank=8), "mixture-of-experts"),
        (resolve_model("gpt2"), WorkloadSpec(mode="infer", gpus=2, tp=2), "Llama-style"),
    ]
    for source, w, message in refusals:
        with pytest.raises(NotModelledError, match=message) as info:
            estimate_analytic(source, w)
        assert info.value.engine == "analytic" and isinstance(info.value, SpecError)


def test_bad_input_and_not_fitting_are_not_refusals() -> None:
    with pytest.raises(SpecError, match="learned positions") as info:
        memfit.estimate("gpt2", WorkloadSpec(seq_len=4096), engine="analytic")
    assert not isinstance(info.value, NotModelledError)
    est = memfit.estimate("llama-2-7b", WorkloadSpec(), gpu="T4", engine="analytic")
    assert est.fits is not None and not est.fits.fits


# -- the shared checks: the same message from both engines ---------------------------------------
TP3 = (
    "tp (3) must divide {0} ({1}): tensor parallelism gives each rank {0}/tp of them; "
    "use a --tp that divides {1}"
)
CHECKS = [
    (
        "gpt2",
        {"mode": "infer", "quant": "fp8"},
        "T4",
        "quant 'fp8' cannot run on T4 (compute capability 7.5): FP8 matmuls need compute "
        "capability 8.9+ (Ada, Hopper, Blackwell); use --quant int8 or nf4, or an FP8-capable "
        "--gpu",
    ),
    (
        "gpt2",
        {"seq_len": 2048},
        None,
        "seq_len (2048) exceeds gpt2's 1024 learned positions (n_positions); "
        "pass --seq 1024 or less",
    ),
    (
        "gpt2",
        {"mode": "infer", "seq_len": 1000, "new_tokens": 30},
        None,
        "seq_len + new_tokens - 1 (1029) exceeds gpt2's 1024 learned positions (n_positions); "
        "pass --seq 995 or less",
    ),
    (
        "bert-base-uncased",
        {"mode": "infer", "new_tokens": 4},
        None,
        "new_tokens (4) needs a generative model but the task is 'seq-cls'; drop --new-tokens",
    ),
    ("gpt2", {"freeze_layers": 13}, None, "freeze_layers (13) exceeds the model's 12 layers"),
    (
        "llama-3.2-1b",
        {"mode": "infer", "gpus": 3, "tp": 3},
        None,
        "3 problems: "
        + "; ".join(
            TP3.format(name, n)
            for name, n in (
                ("num_attention_heads", 32),
                ("num_key_value_heads", 8),
                ("intermediate_size", 8192),
            )
        ),
    ),
]


@pytest.mark.parametrize("engine", ["analytic", "trace"])
@pytest.mark.parametrize(("model", "overrides", "gpu", "message"), CHECKS)
def test_each_shared_check_says_the_same_from_both_engines(
    engine: str, model: str, overrides: dict[str, Any], gpu: str | None, message: str
) -> None:
    with pytest.raises(SpecError) as info:
        memfit.estimate(model, WorkloadSpec(**overrides), gpu=gpu, engine=engine)
    assert str(info.value) == message
    assert not isinstance(info.value, NotModelledError)


@pytest.mark.parametrize("engine", ["analytic", "trace"])
def test_a_tensor_parallel_split_an_engine_lacks_is_its_refusal(engine: str) -> None:
    with pytest.raises(NotModelledError, match=f"the {engine} engine splits Llama-style") as info:
        memfit.estimate("gpt2", WorkloadSpec(mode="infer", gpus=2, tp=2), engine=engine)
    assert info.value.engine == engine


# -- the assembly -------------------------------------------------------------------------------
def test_assembly_adds_the_workspaces_to_every_phase_and_reports_the_highest() -> None:
    gpu = get_gpu("H100-80GB")
    phases = {
        "forward": PhaseResult(components={"parameters": 1000, "activations": 500}),
        "backward": PhaseResult(components={"parameters": 1000, "gradients": 1000}),
    }
    est = assemble(_result(phases=phases), WorkloadSpec(), gpu)
    workspaces = sum(allocator_workspaces(gpu, training=True))
    assert workspaces > 0
    assert est.phases["forward"].components["temporary"] == workspaces
    assert est.peak_phase == "backward"
    assert est.peak_allocated_bytes == 2000 + workspaces == sum(est.components.values())


def test_a_replayed_reserved_is_never_below_the_peak_allocated() -> None:
    est = assemble(_result(reserved=ReservedRule(replayed_bytes=0)), WorkloadSpec(), None)
    outside = device_totals(None, reserved_bytes=0, training=True).reserved_bytes
    assert est.peak_reserved_bytes == est.peak_allocated_bytes + outside


def test_a_reserved_ratio_scales_the_peak_and_widens_the_range() -> None:
    big = {"forward": PhaseResult(components={"activations": 10 * GiB})}
    rule = ReservedRule(ratio=(1.1, 1.0, 1.5))
    est = assemble(_result(phases=big, reserved=rule), WorkloadSpec(), None)
    peak = est.peak_allocated_bytes
    outside = device_totals(None, reserved_bytes=0, training=True).reserved_bytes
    assert est.peak_reserved_bytes == int(peak * 1.1) + outside
    low, high = est.ranges["peak_reserved_bytes"]
    assert low <= peak and high >= int(peak * 1.5)


def test_the_verdict_compares_the_device_total_with_what_cuda_hands_out() -> None:
    t4 = get_gpu("T4")
    small = assemble(_result(), WorkloadSpec(), t4)
    big = {"forward": PhaseResult(components={"parameters": 20 * GiB})}
    large = assemble(_result(phases=big), WorkloadSpec(), t4)
    assert small.fits is not None and small.fits.fits and small.fits.gpu == "T4"
    assert large.fits is not None and not large.fits.fits
    assert large.fits.free_bytes == large.fits.capacity_bytes - large.device_used_bytes < 0
    assert assemble(_result(), WorkloadSpec(), None).fits is None


def test_inference_reports_no_trainable_parameters() -> None:
    assert assemble(_result(), WorkloadSpec(mode="infer"), None).n_trainable_params == 0
    assert assemble(_result(), WorkloadSpec(), None).n_trainable_params == 10


def test_notes_are_the_workloads_then_the_engines_then_paged_states_then_the_devices() -> None:
    w = WorkloadSpec(shard="zero3")
    assert w.warnings()
    paged = {"forward": PhaseResult(components={"optimizer_states": MiB}, unified_bytes=MiB)}
    est = assemble(_result(phases=paged, notes=["engine note"]), w, None)
    assert est.notes == [*w.warnings(), "engine note", paged_note(MiB), NO_GPU_NOTE]
    assert est.unified_memory_bytes == MiB
    quiet = assemble(_result(phases=paged, notes=["engine note"], paged_note=False), w, None)
    assert quiet.notes == [*w.warnings(), "engine note", NO_GPU_NOTE]


def test_top_modules_are_the_peak_phases_owners_largest_first() -> None:
    modules = {"a": 5, "idle": 0, "c": 9}
    phases = {"forward": PhaseResult(components={"parameters": 14}, modules=modules)}
    est = assemble(_result(phases=phases), WorkloadSpec(), None)
    assert [(m.name, m.n_bytes) for m in est.top_modules] == [("c", 9), ("a", 5)]


def test_an_engine_result_refuses_what_only_an_engine_bug_produces() -> None:
    with pytest.raises(ValueError, match=r"components \['weights'\] are not among parameters"):
        PhaseResult(components={"weights": 1})
    with pytest.raises(ValueError, match="the fake engine returned no phase"):
        _result(phases={})
    with pytest.raises(ValueError, match="exactly one of replayed_bytes and ratio"):
        ReservedRule()


def test_the_pipeline_and_the_policy_import_no_torch() -> None:
    code = (
        "import sys, memfit.estimate.pipeline, memfit.estimate.policy, memfit.estimate.device;"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("engine", ["analytic", "trace"])
def test_lora_targets_by_role_estimate_what_the_familys_module_names_do(engine: str) -> None:
    """--lora-targets q,v on GPT-2 is its fused c_attn: the same bytes as naming c_attn, and the
    notes say what the roles became and that k is adapted too."""
    from memfit import WorkloadSpec, estimate

    def run(targets: tuple[str, ...]) -> Any:
        w = WorkloadSpec(batch_size=1, seq_len=64, lora_rank=8, lora_targets=targets)
        return estimate("gpt2", w, engine=engine)

    by_role, by_name = run(("q", "v")), run(("c_attn",))
    assert by_role.peak_allocated_bytes == by_name.peak_allocated_bytes
    assert by_role.n_trainable_params == by_name.n_trainable_params
    assert "LoRA targets q,v are c_attn in gpt2" in by_role.notes
    assert any("adapts k too" in n for n in by_role.notes)
