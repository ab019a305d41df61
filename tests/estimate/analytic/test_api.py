"""The analytic engine's API: torch-free, fast paths agree, clear errors, exact counts."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from typing import Any
from unittest import mock

import pytest
from tests.estimate.analytic.configs import TINY

from memfit.errors import SpecError
from memfit.estimate import estimate
from memfit.estimate.analytic import estimate_analytic, estimate_many, supports
from memfit.estimate.result import COMPONENTS
from memfit.models import resolve_model
from memfit.spec import WorkloadSpec


def test_the_analytic_engine_imports_neither_torch_nor_transformers() -> None:
    code = (
        "import sys, json\n"
        "from memfit.estimate import estimate\n"
        "from memfit.spec import WorkloadSpec\n"
        "e = estimate('llama-3.1-8b', WorkloadSpec(batch_size=2, seq_len=4096), engine='analytic',"
        " gpu='H100-80GB')\n"
        "print(json.dumps({'peak': e.peak_allocated_bytes,"
        " 'mods': sorted(m for m in ('torch', 'transformers', 'peft') if m in sys.modules)}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["mods"] == []
    assert result["peak"] > 16 * 10**9  # bf16 weights of an 8B model alone are 16 GB


def test_estimate_many_gives_the_single_estimates_at_every_batch_size() -> None:
    source = resolve_model("qwen2.5-0.5b")
    workloads = [
        WorkloadSpec(batch_size=b, seq_len=s, **extra)
        for b in (1, 3, 8)
        for s in (128, 1024)
        for extra in ({}, {"checkpointing": "full"}, {"mode": "infer", "new_tokens": 16})
    ]
    many = estimate_many(source, workloads)
    for wl, fast in zip(workloads, many, strict=True):
        one = estimate_analytic(source, wl)
        assert fast.peak_allocated_bytes == one.peak_allocated_bytes, wl
        assert fast.components == one.components
        assert fast.peak_phase == one.peak_phase


def test_estimate_many_at_batch_1_alone_simulates_once_with_the_same_answer() -> None:
    """A stack's smallest split asked alone (the planner's first probe, issue 32): one
    simulation, not the two the batch-size lines need, and the answer the call with larger
    batch sizes gives at batch 1 (reserved bytes, every phase's components, the notes)."""
    from memfit.estimate.analytic import api, engine

    source = resolve_model("qwen2.5-0.5b")
    calls: list[int] = []
    real = engine.simulate

    def counted(prog: Any, wl: WorkloadSpec, task: str) -> Any:
        calls.append(wl.batch_size)
        return real(prog, wl, task)

    for extra in ({}, {"checkpointing": "full", "lora_rank": 8}, {"grad_accum": 4}):
        one = WorkloadSpec(batch_size=1, seq_len=512, **extra)
        with mock.patch.object(api, "simulate", counted):
            api._SIMULATIONS.clear()  # counted as a process that kept none (test_kept_simulations)
            calls.clear()
            [alone] = estimate_many(source, [one])
            assert calls == [1]
            calls.clear()
            [with_more, _] = estimate_many(source, [one, replace(one, batch_size=4)])
            assert calls == [1, 2]
        assert alone.peak_reserved_bytes == with_more.peak_reserved_bytes
        assert alone.phases == with_more.phases and alone.notes == with_more.notes
        assert alone.peak_phase == with_more.peak_phase


def test_estimates_have_the_trace_engines_shape() -> None:
    e = estimate("llama-3.2-1b", WorkloadSpec(batch_size=2, seq_len=1024), engine="analytic")
    assert e.engine == "analytic"
    assert set(e.components) == set(COMPONENTS)
    assert sum(e.components.values()) == e.peak_allocated_bytes
    assert set(e.phases) == {"forward", "backward", "optimizer"}
    assert e.peak_reserved_bytes >= e.peak_allocated_bytes
    assert e.device_used_bytes == e.peak_reserved_bytes + e.cuda_context_bytes
    assert any("analytic engine" in n for n in e.notes)
    gen = estimate(
        "llama-3.2-1b", WorkloadSpec(mode="infer", seq_len=512, new_tokens=8), engine="analytic"
    )
    assert set(gen.phases) == {"prefill", "decode"}
    assert gen.phases["decode"].components["kv_cache"] > 0


def test_supports_names_the_families_with_closed_forms() -> None:
    assert supports(resolve_model("mistral-7b-v0.1").config)
    assert supports(TINY["vit"])
    assert supports(resolve_model("t5-small").config)
    assert not supports({"model_type": "mamba"})
    assert not supports(None)


def test_an_unsupported_model_type_raises_a_spec_error_naming_it() -> None:
    with pytest.raises(SpecError, match=r"model_type 'mamba'.*--engine trace"):
        estimate_analytic({"model_type": "mamba", "vocab_size": 10}, WorkloadSpec())


def test_settings_not_modelled_raise_a_spec_error_naming_them() -> None:
    wl = WorkloadSpec(quant="nf4", lora_rank=8, gpus=2, shard="zero3")
    with pytest.raises(SpecError, match=r"quant='nf4' with tp=1, shard='zero3'.*--engine trace"):
        estimate_analytic(TINY["llama"], wl)
    with pytest.raises(SpecError, match=r"freeze_layers \(9\) exceeds the model's 3 layers"):
        estimate_analytic(TINY["llama"], WorkloadSpec(freeze_layers=9))
    with pytest.raises(SpecError, match=r"new_tokens \(4\) needs a generative model"):
        estimate_analytic(TINY["bert"], WorkloadSpec(mode="infer", new_tokens=4))
    alibi_40b = dict(TINY["falcon-40b"], alibi=True)
    with pytest.raises(SpecError, match=r"alibi=true and new_decoder_architecture=true.*trace"):
        estimate_analytic(alibi_40b, WorkloadSpec())


def test_flash_attention_removes_the_quadratic_term() -> None:
    """Doubling the sequence doubles SDPA/flash activations but roughly quadruples the eager
    attention scores (Korthikanti et al. 2022: the 5as/h term)."""

    def acts(attention: str, seq: int) -> int:
        wl = WorkloadSpec(
            batch_size=1, seq_len=seq, attention=attention, optimizer="none", precision="bf16-true"
        )
        e = estimate_analytic(resolve_model("llama-3.2-1b"), wl)
        return e.phases["forward"].components["activations"]

    flash_ratio = acts("sdpa", 8192) / acts("sdpa", 4096)
    eager_ratio = acts("eager", 8192) / acts("eager", 4096)
    assert 1.9 < flash_ratio < 2.1
    assert eager_ratio > 3.0


def test_full_checkpointing_keeps_one_input_per_layer() -> None:
    source = resolve_model("llama-3.1-8b")
    pure = {"precision": "bf16-true"}  # bf16 layer inputs, as the figure below counts them
    full = estimate_analytic(source, WorkloadSpec(batch_size=1, seq_len=4096, **pure))
    ckpt = estimate_analytic(
        source, WorkloadSpec(batch_size=1, seq_len=4096, checkpointing="full", **pure)
    )
    # forward activations without the head: 32 layer inputs of 4096 x 4096 bf16 = 1 GiB
    layer_inputs = 32 * 4096 * 4096 * 2
    f_full = full.phases["forward"].components["activations"]
    f_ckpt = ckpt.phases["forward"].components["activations"]
    assert f_ckpt < f_full / 4
    assert f_ckpt >= layer_inputs


SMALL_BUNDLED = ["gpt2", "opt-125m", "pythia-160m", "qwen2.5-0.5b", "bert-base-uncased"]
ALL_SUPPORTED = [
    "llama-2-7b",
    "llama-3.1-8b",
    "llama-3.2-1b",
    "mistral-7b-v0.1",
    "mixtral-8x7b",
    "gemma-2-2b",
    "gemma-2-9b",
    "phi-3-mini-4k",
    "gpt2-xl",
    "gpt-neox-20b",
    "opt-350m",
    "opt-1.3b",
    "starcoderbase-1b",
    "qwen2.5-7b",
    "roberta-base",
    "vit-base-patch16-224-in21k",
]


def _model_param_count(config: dict) -> int:
    """Parameters of the transformers model built on the meta device (the trace engine's
    builder), counted by torch."""
    pytest.importorskip("transformers")
    from memfit.estimate.trace import build

    task = build.resolve_task(config, "auto")
    model = build.build_hf_model(config, WorkloadSpec(mode="infer"), task, device="meta")
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", SMALL_BUNDLED)
def test_n_params_of_small_bundled_models_is_exact(name: str) -> None:
    source = resolve_model(name)
    analytic = estimate_analytic(source, WorkloadSpec(mode="infer"))
    assert analytic.n_params == _model_param_count(source.config or {})


@pytest.mark.slow
@pytest.mark.parametrize("name", ALL_SUPPORTED)
def test_n_params_of_every_supported_bundled_model_is_exact(name: str) -> None:
    source = resolve_model(name)
    analytic = estimate_analytic(source, WorkloadSpec(mode="infer"))
    assert analytic.n_params == _model_param_count(source.config or {})
