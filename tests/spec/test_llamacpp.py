"""The llama.cpp job: LlamaCppJob names llama-server's flags in its refusals, defaults as
llama-server does, and is public from memfit and memfit.spec."""

from __future__ import annotations

import subprocess
import sys

import pytest

import memfit
from memfit.errors import SpecError
from memfit.models.ggml_types import FILE_TYPES as MIXES
from memfit.spec.llamacpp import FILE_TYPES, LlamaCppJob


def test_the_llamacpp_job_is_public_from_memfit_and_memfit_spec() -> None:
    assert memfit.LlamaCppJob is LlamaCppJob is memfit.spec.LlamaCppJob


def test_defaults_are_llama_servers() -> None:
    job = LlamaCppJob()
    assert (job.n_gpu_layers, job.ctx_size, job.cache_type_k, job.flash_attn) == (
        "auto", 0, "f16", "auto",
    )  # fmt: skip
    assert (job.batch_size, job.ubatch_size) == (2048, 512)
    assert job.slots == 4 and job.unified  # -np auto: 4 slots, unified KV
    assert LlamaCppJob(n_parallel=2).unified is False
    assert LlamaCppJob(n_parallel=2, kv_unified=True).unified is True


def test_every_problem_is_reported_with_the_flag() -> None:
    with pytest.raises(SpecError, match=r"3 problems: -ngl \(-3\).*-ctk \('q3'\).*-fa \('yes'\)"):
        LlamaCppJob(n_gpu_layers=-3, cache_type_k="q3", flash_attn="yes")


def test_a_quantized_v_cache_without_flash_attention_is_refused_as_llama_cpp_does() -> None:
    with pytest.raises(SpecError, match=r"-ctv q8_0 with -fa off.*requires flash_attn"):
        LlamaCppJob(cache_type_v="q8_0", flash_attn="off")
    assert LlamaCppJob(cache_type_v="q8_0", flash_attn="auto").cache_type_v == "q8_0"


def test_a_tensor_split_needs_one_share_per_gpu() -> None:
    with pytest.raises(SpecError, match=r"-ts has 2 shares for --gpus 3"):
        LlamaCppJob(tensor_split=(3.0, 1.0), n_gpus=3)
    with pytest.raises(SpecError, match=r"-ts .* non-negative shares"):
        LlamaCppJob(tensor_split=(0.0, 0.0), n_gpus=2)


def test_the_file_types_are_the_ones_memfit_can_mix() -> None:
    assert set(FILE_TYPES) == set(MIXES)
    with pytest.raises(SpecError, match=r"file type \('Q9_K'\) must be one of"):
        LlamaCppJob(file_type="Q9_K")


def test_the_job_and_the_engine_import_without_torch_or_gguf() -> None:
    code = (
        "import memfit.spec.llamacpp, memfit.estimate.llamacpp, memfit.cli.llamacpp, sys; "
        "assert 'torch' not in sys.modules and 'gguf' not in sys.modules, "
        "[m for m in ('torch', 'gguf') if m in sys.modules]"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
