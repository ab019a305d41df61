"""The cuDNN convolution-workspace allowance and the library-version rules of pipelines."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from memfit.errors import SpecError
from memfit.estimate.diffusion.versions import behaviour, parse
from memfit.estimate.diffusion.workspace import conv_workspace_probe
from memfit.spec.diffusion import DiffusionJob


def test_the_allowance_is_one_images_unfolded_input_of_the_largest_conv() -> None:
    model = torch.nn.Sequential(
        torch.nn.Conv2d(8, 16, 3, padding=1),  # 8 * 9 * 10 * 10 elements per image
        torch.nn.Conv2d(16, 4, 1),  # 1x1: no unfolding
        torch.nn.Conv2d(4, 4, 3, padding=1, groups=2),  # 2 * 9 * 100
    )
    with conv_workspace_probe(model) as probe:
        model(torch.zeros(3, 8, 10, 10))
    assert probe.bytes == 8 * 9 * 10 * 10 * 4
    # the hooks are gone afterwards
    assert all(not m._forward_hooks for m in model.modules())


def test_a_1x1_only_model_has_no_allowance() -> None:
    model = torch.nn.Conv2d(8, 8, 1).to(torch.bfloat16)
    with conv_workspace_probe(model) as probe:
        model(torch.zeros(1, 8, 4, 4, dtype=torch.bfloat16))
    assert probe.bytes == 0


def test_the_allowance_sits_on_the_decode_stage_and_in_the_upper_peak(tmp_path: Path) -> None:
    pytest.importorskip("diffusers")
    from tests.estimate.diffusion.test_pipeline import tiny_flux

    from memfit.estimate.diffusion.pipelines import estimate_pipeline

    root = tiny_flux(tmp_path)
    # 256 x 256: the allowance (18 MiB) is larger than the allocator's cached free blocks
    job = DiffusionJob(height=256, width=256, precision="bf16", max_sequence_length=16)
    est = estimate_pipeline(root, job, name="t")
    vae = {c.name: c for c in est.components}["vae"]
    # the tiny VAE's widest 3x3 conv at full resolution: 16 -> 8 channels up_blocks[1]
    assert vae.conv_workspace_bytes == 16 * 9 * 256 * 256 * 2
    decode = {s.stage: s for s in est.stages}["vae_decode"]
    assert est.peak_upper_bytes >= decode.peak_bytes + vae.conv_workspace_bytes
    assert est.peak_upper_bytes >= est.peak_bytes
    assert est.peak_reserved_bytes < est.peak_reserved_upper_bytes
    assert est.peak_reserved_upper_bytes <= est.peak_reserved_bytes + est.conv_workspace_bytes


@pytest.mark.parametrize(
    ("tf", "bnb", "fp32", "hooks"),
    [
        ("4.52.3", "0.45.5", True, False),
        ("4.58.1", "0.48.0", True, True),
        ("4.58.1", "0.47.0", True, False),
        ("5.23.0", "0.50.2", False, True),
    ],
)
def test_version_rules_follow_transformers_and_diffusers(
    tf: str, bnb: str, fp32: bool, hooks: bool
) -> None:
    b = behaviour(tf, bnb)
    assert b.bnb_keeps_fp32_modules_in_fp32 is fp32
    assert b.bnb_8bit_offload_hooks is hooks


def test_versions_parse_and_bad_ones_are_refused() -> None:
    assert parse("4.57.1") == (4, 57, 1)
    assert parse("2.13.0+cpu") == (2, 13, 0)
    with pytest.raises(SpecError, match="transformers_version must be a version"):
        DiffusionJob(transformers_version="latest")


def test_older_versions_keep_t5_wo_in_fp32_and_8bit_t5_on_the_device(tmp_path: Path) -> None:
    pytest.importorskip("diffusers")
    pytest.importorskip("bitsandbytes")
    from tests.estimate.diffusion.test_sd3_pixart import CLIP, SD3, T5, VAE, _tree

    from memfit.estimate.diffusion.pipelines import estimate_pipeline

    index = {
        "_class_name": "StableDiffusion3Pipeline",
        "text_encoder": ["transformers", "CLIPTextModelWithProjection"],
        "text_encoder_2": ["transformers", "CLIPTextModelWithProjection"],
        "text_encoder_3": ["transformers", "T5EncoderModel"],
        "transformer": ["diffusers", "SD3Transformer2DModel"],
        "vae": ["diffusers", "AutoencoderKL"],
    }
    configs = {"text_encoder": CLIP, "text_encoder_2": CLIP, "text_encoder_3": T5}
    root = _tree(tmp_path, index, {**configs, "transformer": SD3, "vae": VAE})
    base = {"height": 32, "width": 32, "precision": "bf16", "max_sequence_length": 8}
    quant = {"text_encoder_quant": "int8", "offload": "model"}
    new = DiffusionJob(**base, **quant, transformers_version="5.23", bitsandbytes_version="0.50")  # type: ignore[arg-type]
    old = DiffusionJob(**base, **quant, transformers_version="4.52", bitsandbytes_version="0.45")  # type: ignore[arg-type]
    e_new, e_old = (estimate_pipeline(root, j, name="t") for j in (new, old))
    t5_new = {c.name: c for c in e_new.components}["text_encoder_3"]
    t5_old = {c.name: c for c in e_old.components}["text_encoder_3"]
    assert t5_new.storage == t5_old.storage == "int8"
    # the tiny T5's two wo (d_ff 96 x d_model 64): fp32 instead of bf16, two bytes more a weight
    assert t5_old.weights_bytes - t5_new.weights_bytes == 2 * 96 * 64 * 2
    denoise_new = {s.stage: s for s in e_new.stages}["denoise"]
    denoise_old = {s.stage: s for s in e_old.stages}["denoise"]
    transformer = {c.name: c for c in e_new.components}["transformer"]
    assert denoise_new.resident_weights_bytes == transformer.weights_bytes
    # no offload hook: the 8-bit T5 stays beside the transformer
    assert denoise_old.resident_weights_bytes == transformer.weights_bytes + t5_old.weights_bytes
    total_old = sum(c.weights_bytes for c in e_old.components)
    assert e_old.host_weights_bytes == total_old - t5_old.weights_bytes
