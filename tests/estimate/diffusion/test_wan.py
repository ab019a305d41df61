"""WanPipeline: a tiny Wan 2.2 TI2V-shaped tree built by diffusers' and transformers' own classes,
on CPU; the trace of each component against real CPU execution; the bundled tree's sizes against
the model card."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("diffusers")

import torch  # noqa: E402

from memfit.errors import SpecError  # noqa: E402
from memfit.estimate.diffusion.pipeline import (  # noqa: E402
    build_component,
    read_tree,
    trace_forward,
)
from memfit.estimate.diffusion.pipelines import estimate_pipeline  # noqa: E402
from memfit.estimate.diffusion.wan import adjust, wan_recipe  # noqa: E402
from memfit.models.pipelines import pipeline_dir  # noqa: E402
from memfit.spec.diffusion import DiffusionJob  # noqa: E402

Z = 4
TRANSFORMER = {
    "_class_name": "WanTransformer3DModel",
    "patch_size": [1, 2, 2],
    "in_channels": Z,
    "out_channels": Z,
    "text_dim": 16,
    "num_layers": 1,
    "num_attention_heads": 2,
    "attention_head_dim": 8,
    "freq_dim": 16,
    "ffn_dim": 32,
    "cross_attn_norm": True,
    "qk_norm": "rms_norm_across_heads",
    "eps": 1e-6,
    "rope_max_seq_len": 32,
}
# Wan 2.2's VAE features at toy size: residual blocks, 2x2 patching, a separate decoder width,
# one temporal down/up-sampling (scale_factor_temporal 2), spatial 2 ** 2 * patch 2 = 8
VAE = {
    "_class_name": "AutoencoderKLWan",
    "base_dim": 8,
    "decoder_base_dim": 16,
    "z_dim": Z,
    "dim_mult": [1, 2, 2],
    "num_res_blocks": 1,
    "attn_scales": [],
    "temperal_downsample": [False, True],
    "is_residual": True,
    "in_channels": 12,
    "out_channels": 12,
    "patch_size": 2,
    "scale_factor_temporal": 2,
    "scale_factor_spatial": 8,
    "latents_mean": [0.0] * Z,
    "latents_std": [1.0] * Z,
}
UMT5 = {
    "model_type": "umt5",
    "d_model": 16,
    "d_ff": 32,
    "d_kv": 8,
    "num_heads": 2,
    "num_layers": 1,
    "vocab_size": 100,
    "feed_forward_proj": "gated-gelu",
}


def _tree(root: Path, *, transformer_2: bool = False) -> Path:
    index: dict[str, object] = {
        "_class_name": "WanPipeline",
        "boundary_ratio": 0.875 if transformer_2 else None,
        "expand_timesteps": not transformer_2,
        "text_encoder": ["transformers", "UMT5EncoderModel"],
        "transformer": ["diffusers", "WanTransformer3DModel"],
        "vae": ["diffusers", "AutoencoderKLWan"],
    }
    configs = {"text_encoder": UMT5, "transformer": TRANSFORMER, "vae": VAE}
    if transformer_2:
        index["transformer_2"] = ["diffusers", "WanTransformer3DModel"]
        configs["transformer_2"] = TRANSFORMER
    (root / "model_index.json").write_text(json.dumps(index))
    for name, cfg in configs.items():
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(cfg))
    return root


@pytest.fixture(scope="module")
def wan_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tree(tmp_path_factory.mktemp("tiny-wan"))


def job(**kw: object) -> DiffusionJob:
    base: dict[str, object] = {"height": 32, "width": 48, "num_frames": 5, "steps": 2}
    return DiffusionJob(precision="fp32", max_sequence_length=8, **{**base, **kw})  # type: ignore[arg-type]


def _real(comp: str, config: dict[str, object], library: str, cls: str) -> torch.nn.Module:
    torch.manual_seed(0)
    m = build_component(library, cls, config).to_empty(device="cpu")
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.02)
    return m.eval()


@pytest.mark.parametrize(
    ("comp", "library", "cls"),
    [
        ("transformer", "diffusers", "WanTransformer3DModel"),
        ("vae", "diffusers", "AutoencoderKLWan"),
        ("text_encoder", "transformers", "UMT5EncoderModel"),
    ],
)
def test_each_wan_component_traced_on_fake_tensors_equals_real_cpu_execution(
    wan_tree: Path, comp: str, library: str, cls: str
) -> None:
    index, configs = read_tree(wan_tree)
    steps, _, _ = wan_recipe(index, configs, job(), torch.float32)
    make_inputs, call, _ = steps[comp]
    fake = build_component(library, cls, configs[comp]).eval()
    fake_peak, fake_out = trace_forward(fake, make_inputs, call)
    real_peak, real_out = trace_forward(
        _real(comp, configs[comp], library, cls), make_inputs, call, real=True
    )
    assert fake_peak == real_peak
    assert fake_out == real_out > 0


def test_the_decode_returns_every_frame_at_full_size(wan_tree: Path) -> None:
    index, configs = read_tree(wan_tree)
    steps, _, _ = wan_recipe(index, configs, job(num_frames=5), torch.float32)
    make_inputs, call, _ = steps["vae"]
    model = _real("vae", configs["vae"], "diffusers", "AutoencoderKLWan")
    with torch.no_grad():
        video = call(model, **make_inputs())
    # 5 frames -> (5 - 1) // 2 + 1 = 3 latent frames of 4x6 -> 5 frames of 32x48
    assert tuple(video.shape) == (1, 3, 5, 32, 48)


def test_frames_and_size_are_rounded_as_wan_pipeline_does() -> None:
    configs = {"vae": VAE, "transformer": TRANSFORMER}
    assert adjust(configs, job(num_frames=5))[:3] == (5, 32, 48)
    frames, h, w, notes = adjust(configs, job(num_frames=6, height=48, width=64))
    # num_frames // 2 * 2 + 1; multiples of scale_factor_spatial 8 x patch 2 = 16
    assert (frames, h, w) == (7, 48, 64)
    assert "rounds it to 7" in notes[0]
    assert adjust(configs, job(height=48, width=80))[1:3] == (48, 80)
    with pytest.raises(SpecError, match="num_frames must be a positive whole number"):
        job(num_frames=0)


def test_a_wan_pipeline_encodes_twice_and_denoises_twice_per_step(wan_tree: Path) -> None:
    est = estimate_pipeline(wan_tree, job(), name="tiny-wan")
    stages = {s.stage: s for s in est.stages}
    assert stages["denoise"].components == ("transformer",)
    assert est.peak_reserved_bytes is not None and est.peak_reserved_bytes >= est.peak_bytes
    assert any("runs twice per step" in n for n in est.notes)
    more = estimate_pipeline(wan_tree, job(num_frames=9), name="tiny-wan")
    assert {s.stage: s for s in more.stages}["vae_decode"].activation_peak_bytes > (
        stages["vae_decode"].activation_peak_bytes
    )
    # guidance runs two calls of batch B, so the cond prediction is alive during the uncond one
    steps, _, _ = wan_recipe(*read_tree(wan_tree), job(), torch.float32)
    make_inputs, call, _ = steps["transformer"]
    model = build_component("diffusers", "WanTransformer3DModel", TRANSFORMER).eval()
    once, _ = trace_forward(
        model,
        make_inputs,
        lambda m, latents, mask, prompt_embeds, **_: m(
            hidden_states=latents,
            timestep=mask.flatten()[:1],
            encoder_hidden_states=prompt_embeds,
            return_dict=False,
        )[0],
    )
    twice, _ = trace_forward(model, make_inputs, call)
    assert twice > once


def test_transformer_2_runs_the_low_noise_steps_under_model_offload(tmp_path: Path) -> None:
    tree = _tree(tmp_path, transformer_2=True)
    est = estimate_pipeline(tree, job(offload="model"), name="tiny-wan-a14b")
    denoise = {s.stage: s for s in est.stages}["denoise"]
    assert denoise.components == ("transformer", "transformer_2")
    one = next(c for c in est.components if c.name == "transformer").weights_bytes
    assert denoise.resident_weights_bytes == one  # the hook chain offloads transformer first


def test_num_frames_is_refused_for_an_image_pipeline() -> None:
    root = pipeline_dir("sdxl-base-1.0")
    assert root is not None
    with pytest.raises(SpecError, match="--num-frames is for video pipelines"):
        estimate_pipeline(root, DiffusionJob(num_frames=9), name="sdxl")


def test_the_bundled_wan_tree_matches_the_model_card_sizes() -> None:
    root = pipeline_dir("wan2.2-ti2v-5b")
    assert root is not None
    index, configs = read_tree(root)
    sizes = {
        c: sum(p.numel() for p in build_component(*index[c], configs[c]).parameters())
        for c in ("transformer", "text_encoder")
    }
    # model card: "TI2V-5B"; the UMT5-XXL encoder file models_t5_umt5-xxl-enc-bf16.pth (11.4 GB)
    assert 4.95e9 < sizes["transformer"] < 5.05e9
    assert 5.6e9 < sizes["text_encoder"] < 5.75e9


def test_the_vae_runs_in_its_own_precision_when_loaded_apart(wan_tree: Path) -> None:
    # the Wan 2.2 card: vae = AutoencoderKLWan.from_pretrained(..., torch_dtype=torch.float32)
    base = {"height": 32, "width": 48, "num_frames": 5, "max_sequence_length": 8}
    bf16 = estimate_pipeline(wan_tree, DiffusionJob(precision="bf16", **base), name="w")  # type: ignore[arg-type]
    mixed = estimate_pipeline(
        wan_tree,
        DiffusionJob(precision="bf16", vae_precision="fp32", **base),  # type: ignore[arg-type]
        name="w",
    )
    vae = {c.name: c for c in mixed.components}["vae"]
    assert (
        vae.dtype == "fp32" and {c.name: c for c in mixed.components}["transformer"].dtype == "bf16"
    )
    assert vae.weights_bytes == 2 * {c.name: c for c in bf16.components}["vae"].weights_bytes
    with pytest.raises(SpecError, match="vae_precision 'fp8' is not one of"):
        DiffusionJob(vae_precision="fp8")
