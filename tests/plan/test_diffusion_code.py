"""A plan's diffusers code and its ``memfit estimate`` flags (memfit.plan.diffusion_code)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from memfit.cli.entry import build_parser
from memfit.jobflags import diffusion_job
from memfit.plan.diffusion_code import code_lines, describe, job_flags
from memfit.spec.diffusion import DiffusionJob

SD3 = SimpleNamespace(components=[
    SimpleNamespace(name="text_encoder", weights_bytes=1),
    SimpleNamespace(name="text_encoder_3", weights_bytes=9),
    SimpleNamespace(name="transformer", weights_bytes=5),
])  # fmt: skip


@pytest.mark.parametrize(
    "job",
    [
        DiffusionJob(offload="group", offload_type="leaf_level", use_stream=True),
        DiffusionJob(quant="nf4", text_encoder_quant="nf4", offload="model", vae_tiling=True),
        DiffusionJob(layerwise_casting="fp8", batch=2, height=768, width=512, vae_slicing=True),
        DiffusionJob(drop_text_encoder_3=True, precision="fp16", attention_slicing=True),
    ],
)
def test_the_flags_printed_for_a_plan_give_back_its_job(job: DiffusionJob) -> None:
    args = build_parser().parse_args(["estimate", "sd3-medium", *job_flags(job).split()])
    assert diffusion_job(args) == job


def test_the_code_loads_every_quantized_component_in_one_config_then_sets_the_switches() -> None:
    asked = DiffusionJob()
    plan = DiffusionJob(quant="nf4", text_encoder_quant="int8", offload="model",
                        drop_text_encoder_3=True, batch=2)  # fmt: skip
    changes = describe(plan, asked, SD3)
    assert {c.kind for c in changes} == {"memory-only", "changes the result"}
    load, offload, call = code_lines(changes, "StableDiffusion3Pipeline")
    assert load.startswith("pipe = StableDiffusion3Pipeline.from_pretrained(..., ")
    assert load.count("PipelineQuantizationConfig(") == 1
    assert '"transformer": diffusers.BitsAndBytesConfig(load_in_4bit=True' in load
    assert '"text_encoder_3": transformers.BitsAndBytesConfig(load_in_8bit=True)' in load
    assert load.endswith("text_encoder_3=None, tokenizer_3=None)")
    assert offload == "pipe.enable_model_cpu_offload()"
    assert call == "pipe(prompt, num_images_per_prompt=2)"
