"""``--compile``: torch.compile's saved-for-backward set in the analytic engine
(analytic/compile.py, measured by trace/compile_saved.py), and the engines that refuse it."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

import pytest

from memfit.errors import NotModelledError, SpecError
from memfit.estimate import estimate
from memfit.estimate.analytic.compile import (
    FP32_NORM_COPIES,
    MEASURED_POLICIES,
    SAVED_PER_TOKEN,
    compile_ratio,
    dropped,
    saved_per_token,
)
from memfit.flags import workload_kwargs
from memfit.spec import WorkloadSpec

#: Llama-3.1-8B (bundled): hidden, K/V width, MLP width, heads, layers
HIDDEN, KV, FFN, HEADS, LAYERS = 4096, 1024, 14336, 32, 32
BATCH, SEQ = 2, 1024
TOKENS = BATCH * SEQ


def _acts(**kw) -> int:
    """The activations at the forward's peak (every layer's saved set alive) of an 8B FSDP2 job
    (bf16 blocks: FSDP2's policy). Not the step's peak: at 2 x 1024 tokens that is the end of
    backward, where FSDP2's root group holds its gradients and no layer's saved set is left."""
    wl = WorkloadSpec(
        gpus=8, shard="fsdp", batch_size=BATCH, seq_len=SEQ, precision="bf16-mixed", **kw
    )
    est = estimate("llama-3.1-8b", wl, engine="analytic")
    return est.phases["forward"].components["activations"]


@pytest.mark.parametrize("model_type", ["llama"])
def test_the_partitioner_keeps_what_the_table_says(model_type: str) -> None:
    """Recomputes the measurement on a tiny layer (real tensors, torch's own partitioner): the
    bytes eager autograd and torch.compile keep, per checkpointing policy, equal the fitted
    coefficients at a shape the fit did not use."""
    pytest.importorskip("transformers")
    from memfit.estimate.trace.compile_saved import BlockShape, measure_block

    shape = BlockShape(
        hidden=384, intermediate=640, n_heads=3, n_kv_heads=1, batch=1, seq=96,
        model_type=model_type,
    )  # fmt: skip
    got = measure_block(shape)
    tokens = shape.batch * shape.seq
    dims = {"hidden": 384, "kv": 128, "ffn": 640, "heads": 3}
    for policy in MEASURED_POLICIES:
        for mode, measured in (("eager", got.eager_bytes), ("compile", got.compile_bytes)):
            fitted = saved_per_token(model_type, mode, policy, **dims) * tokens
            assert measured[policy] == fitted, (mode, policy)
    assert got.compile_bytes["none"] < got.eager_bytes["none"]


def test_the_measured_differences_are_named_tensors() -> None:
    """compile - eager of every measured model type is made of the tensors compile.py names:
    RMSNorm's fp32 copies and the SiLU output without checkpointing; under a selective policy
    the last linear's output where the policy saved it (Qwen2's per-op policy does not: its
    biased q/k/v run addmm, which the policy does not count)."""
    silu = (0, 0, -2, 0, 0)
    last_linear = (-2, 0, 0, 0, 0)
    for model_type in SAVED_PER_TOKEN:
        none = dropped(model_type, "none")
        assert tuple(d - n for d, n in zip(none, FP32_NORM_COPIES, strict=True)) == silu
        assert dropped(model_type, "selective") == last_linear
        assert dropped(model_type, "selective-op") in (last_linear, (0, 0, 0, 0, 0))
    assert dropped("llama", "selective-op") == last_linear


def test_the_8b_ratio_is_the_measured_one() -> None:
    """At Llama-3.1-8B's widths a layer keeps 34/49 of eager's bytes without checkpointing
    (the 8B check row of benchmarks/results/compile_saved.md)."""
    dims = {"hidden": HIDDEN, "kv": KV, "ffn": FFN, "heads": HEADS}
    eager = saved_per_token("llama", "eager", "none", **dims)
    assert eager == 20 * HIDDEN + 4 * KV + 8 * FFN + 4 * HEADS + 8  # tracing.md's closed form
    assert compile_ratio("llama", "none", **dims) == pytest.approx(0.6941, abs=1e-4)
    assert compile_ratio("llama", "full", **dims) == 1.0


@pytest.mark.parametrize("policy", ["none", "selective", "selective-op"])
def test_compile_takes_the_dropped_tensors_off_every_layer(policy: str) -> None:
    """The analytic engine's activations under --compile lose exactly the dropped bytes per
    token of each layer (its eager layer is the measured eager layer)."""
    per_token = -sum(
        c * v for c, v in zip(dropped("llama", policy), (HIDDEN, KV, FFN, HEADS, 1), strict=True)
    )
    expected = per_token * TOKENS * LAYERS
    saved = _acts(checkpointing=policy) - _acts(checkpointing=policy, compile=True)
    assert saved == pytest.approx(float(expected), rel=2e-3)
    assert saved > 0


def test_full_checkpointing_keeps_the_inputs_and_compiles_the_recomputed_layer() -> None:
    """Under full checkpointing the blocks keep their input, compiled or not (the forward is
    the same); in backward the recomputed layer rises by its compiled set, at most by eager's
    (here, batch 2 x 4096 with the fused loss, that layer's backward is the peak: lower by a
    part of one layer; with the full loss the logits' backward is, and at fewer tokens the end
    of backward, where FSDP2's root group holds its gradients)."""
    seq = 4096

    def run(**kw):
        wl = WorkloadSpec(
            gpus=8, shard="fsdp", batch_size=BATCH, seq_len=seq, precision="bf16-mixed",
            checkpointing="full", loss="fused", **kw,
        )  # fmt: skip
        return estimate("llama-3.1-8b", wl, engine="analytic")

    eager, compiled = run(), run(compile=True)
    fwd = "forward"
    assert compiled.phases[fwd].peak_allocated_bytes == eager.phases[fwd].peak_allocated_bytes
    one_layer = saved_per_token(
        "llama", "eager", "none", hidden=HIDDEN, kv=KV, ffn=FFN, heads=HEADS
    )
    drop = eager.components["activations"] - compiled.components["activations"]
    assert 0 < drop < one_layer * BATCH * seq


def test_the_trace_and_derived_engines_refuse_compile() -> None:
    wl = WorkloadSpec(batch_size=1, seq_len=128, precision="bf16-true", compile=True)
    for engine in ("trace", "derived"):
        with pytest.raises(NotModelledError, match=f"compile: the {engine} engine runs eager"):
            estimate("llama-3.1-8b", wl, engine=engine)


def test_auto_answers_compile_with_the_analytic_engine() -> None:
    wl = WorkloadSpec(batch_size=1, seq_len=128, precision="bf16-true", compile=True)
    est = estimate("llama-3.1-8b", wl)
    assert est.engine.startswith("analytic")
    assert "compile" in est.engine_reason
    assert any(n.startswith("compile: each layer keeps x0.") for n in est.notes)


@pytest.mark.parametrize(
    ("model", "kw", "match"),
    [
        ("gpt2", {}, "model_type 'gpt2'"),
        ("llama-3.1-8b", {"precision": "bf16-mixed"}, "precision 'bf16-mixed'"),
        ("llama-3.1-8b", {"attention": "eager"}, "attention 'eager'"),
        ("llama-3.1-8b", {"lora_rank": 8}, "LoRA adapters"),
    ],
)
def test_unmeasured_compile_jobs_are_not_modelled(model: str, kw: dict, match: str) -> None:
    wl = WorkloadSpec(**{"batch_size": 1, "seq_len": 128, "precision": "bf16-true", **kw})
    with pytest.raises(NotModelledError, match=match):
        estimate(model, WorkloadSpec(**{**wl.__dict__, "compile": True}), engine="analytic")


def test_compile_is_a_training_flag() -> None:
    with pytest.raises(SpecError, match="compile with mode 'infer'"):
        WorkloadSpec(mode="infer", compile=True)
    assert WorkloadSpec(compile=True).normalized()["compile"] is True
    assert "compile" not in WorkloadSpec().normalized()


def test_the_compile_flag_sets_the_field() -> None:
    assert workload_kwargs({"compile": True})["compile"] is True
    assert "compile" not in workload_kwargs({"compile": None})


def test_coefficients_are_exact_fractions() -> None:
    for table in SAVED_PER_TOKEN.values():
        for coeffs in table.values():
            assert all(isinstance(c, Fraction) for c in coeffs) and len(coeffs) == 5


def test_a_recomputed_layer_rises_by_its_compiled_recomputed_set() -> None:
    """A backward point above the backward's start (the checkpointed layer recomputed) is
    scaled by the recomputed set's ratio; releases and the forward by the saved set's."""
    from memfit.estimate.analytic.compile import compiled_profile, recompute_ratio
    from memfit.estimate.analytic.step import BlockProfile

    dims = {"hidden": HIDDEN, "kv": KV, "ffn": FFN, "heads": HEADS}
    r_rec = recompute_ratio("llama", "selective-op", **dims)
    kept = {
        m: saved_per_token("llama", m, "none", **dims)
        - saved_per_token("llama", m, "selective-op", **dims)
        for m in ("eager", "compile")
    }
    assert r_rec == pytest.approx(float(kept["compile"] / kept["eager"]))
    assert recompute_ratio("llama", "none", **dims) is None
    assert recompute_ratio("llama", "full", **dims) == compile_ratio("llama", "none", **dims)
    prof = BlockProfile(
        fwd=[(0, 0, 0, 1000, 0, 0)],
        fwd_end=(0, 0, 0, 1000, 0, 0),
        bwd=[(0, 0, 0, 2000, 0, 50), (0, 0, 0, -500, 0, 0)],
        bwd_end=(0, 0, 0, -1000, 0, 0),
    )
    out = compiled_profile(prof, 0.5, r_rec)
    assert out.fwd_end[3] == 500 and out.bwd_end[3] == -500
    assert out.bwd[0] == (0, 0, 0, round(2000 * r_rec), 0, 50)
    assert out.bwd[1][3] == -250


def test_auto_answers_an_unmeasured_compile_job_as_its_eager_twin_and_says_so() -> None:
    """``--compile`` with LoRA (not measured): the default engine answers the eager job, an
    upper bound, with a note naming why; never a refusal for a valid question."""
    wl = WorkloadSpec(batch_size=1, seq_len=512, lora_rank=8, precision="bf16-true")
    compiled = estimate("llama-3.1-8b", replace(wl, compile=True))
    eager = estimate("llama-3.1-8b", wl)
    assert compiled.peak_allocated_bytes == eager.peak_allocated_bytes
    lead = "--compile not modelled here (compile with LoRA"
    assert any(n.startswith(lead) for n in compiled.notes)
