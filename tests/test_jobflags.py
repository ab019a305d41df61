"""Every kind of job from one parsed command line (memfit.jobflags): the doors' builders."""

from __future__ import annotations

import pytest

from memfit.cli import build_parser
from memfit.errors import SpecError
from memfit.jobflags import job_from_flags
from memfit.spec import (
    DiffusionJob,
    DiffusionTrainJob,
    LlamaCppJob,
    SeqDist,
    SeqRun,
    VllmConfig,
    WorkloadSpec,
)


def _args(*argv: str):
    return build_parser().parse_args(list(argv))


def test_each_kind_is_built_from_the_flags_its_door_parses() -> None:
    text = _args("estimate", "gpt2", "--batch", "4", "--seq", "256", "--lora-rank", "8")
    assert job_from_flags(WorkloadSpec, text) == WorkloadSpec(
        batch_size=4, seq_len=256, lora_rank=8
    )

    infer = _args("estimate", "flux.1-dev", "--mode", "infer", "--height", "512", "--width", "768")
    assert job_from_flags(DiffusionJob, infer) == DiffusionJob(height=512, width=768)

    train = _args("estimate", "flux.1-dev", "--mode", "train", "--lora-rank", "16",
                  "--resolution", "512", "--checkpointing", "full")  # fmt: skip
    assert job_from_flags(DiffusionTrainJob, train) == DiffusionTrainJob(
        resolution=512, lora_rank=16, checkpointing=True
    )

    served = _args("vllm", "llama-3.1-8b", "--gpu", "L40S", "--max-model-len", "8192", "--tp", "2")
    config = job_from_flags(VllmConfig, served)
    assert (config.max_model_len, config.tensor_parallel_size) == (8192, 2)

    run = _args("estimate", "gpt2", "--seq-dist", "300,250,1024", "--run-steps", "40")
    dist = SeqDist(mean=300, std=250, max_len=1024)
    job = job_from_flags(SeqRun, run, WorkloadSpec(batch_size=2), dist)
    assert (job.n_steps, job.steps.batch_size, job.longest_step) == (40, 2, 1024)


def test_a_flag_that_means_nothing_to_the_kind_is_refused_not_ignored() -> None:
    infer = _args("estimate", "flux.1-dev", "--mode", "infer", "--lora-rank", "16")
    with pytest.raises(SpecError, match=r"--lora-rank does not apply to a diffusion pipeline"):
        job_from_flags(DiffusionJob, infer)
    train = _args("estimate", "flux.1-dev", "--mode", "train", "--shard", "zero3")
    with pytest.raises(SpecError, match=r"--shard zero3: the diffusers training scripts"):
        job_from_flags(DiffusionTrainJob, train)


def test_a_kind_with_no_builder_is_named() -> None:
    with pytest.raises(SpecError, match=r"kind \(<class 'int'>\) must be one of WorkloadSpec"):
        job_from_flags(int, _args("estimate", "gpt2"))


def test_a_llama_server_line_is_built_with_llama_cpps_spellings() -> None:
    served = _args("llama-server", "model.gguf", "--gpu", "RTX-3090", "-ngl", "all", "-c", "8192",
                   "-ctk", "q8_0", "-fa", "-np", "2", "-kvu", "-ts", "3/1")  # fmt: skip
    job = job_from_flags(LlamaCppJob, served)
    assert job == LlamaCppJob(n_gpu_layers="all", ctx_size=8192, cache_type_k="q8_0",
                              flash_attn="on", n_parallel=2, kv_unified=True,
                              tensor_split=(3.0, 1.0), n_gpus=2)  # fmt: skip
    legacy = job_from_flags(LlamaCppJob, _args("llama-server", "m.gguf", "--gpu", "L4",
                                               "-ngl", "-1", "-fa", "0"))  # fmt: skip
    assert (legacy.n_gpu_layers, legacy.flash_attn, legacy.unified) == ("auto", "off", True)
