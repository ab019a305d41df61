"""Diffusion pipelines: tiny trees built by diffusers' and transformers' own classes, on CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("diffusers")

import torch  # noqa: E402

from memfit.errors import NotModelledError, SpecError  # noqa: E402
from memfit.estimate.diffusion.pipeline import (  # noqa: E402
    build_component,
    trace_forward,
)
from memfit.estimate.diffusion.pipelines import estimate_pipeline  # noqa: E402
from memfit.spec.diffusion import DiffusionJob  # noqa: E402

VAE = {
    "_class_name": "AutoencoderKL",
    "act_fn": "silu",
    "block_out_channels": [8, 16],
    "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D"],
    "up_block_types": ["UpDecoderBlock2D", "UpDecoderBlock2D"],
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": 4,
    "layers_per_block": 1,
    "norm_num_groups": 4,
    "sample_size": 32,
    "mid_block_add_attention": False,
}
FLUX = {
    "_class_name": "FluxTransformer2DModel",
    "attention_head_dim": 16,
    "axes_dims_rope": [4, 6, 6],
    "guidance_embeds": True,
    "in_channels": 16,
    "joint_attention_dim": 32,
    "num_attention_heads": 2,
    "num_layers": 1,
    "num_single_layers": 1,
    "patch_size": 1,
    "pooled_projection_dim": 32,
}
CLIP = {
    "model_type": "clip_text_model",
    "hidden_size": 32,
    "intermediate_size": 37,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 77,
    "projection_dim": 32,
}
T5 = {
    "model_type": "t5",
    "d_model": 32,
    "d_ff": 37,
    "d_kv": 16,
    "num_layers": 1,
    "num_heads": 2,
    "vocab_size": 1000,
    "feed_forward_proj": "gated-gelu",
}


def tiny_flux(root: Path) -> Path:
    index = {
        "_class_name": "FluxPipeline",
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "CLIPTextModel"],
        "text_encoder_2": ["transformers", "T5EncoderModel"],
        "tokenizer": ["transformers", "CLIPTokenizer"],
        "tokenizer_2": ["transformers", "T5TokenizerFast"],
        "transformer": ["diffusers", "FluxTransformer2DModel"],
        "vae": ["diffusers", "AutoencoderKL"],
    }
    (root / "model_index.json").write_text(json.dumps(index))
    for name, cfg in {
        "text_encoder": CLIP,
        "text_encoder_2": T5,
        "transformer": FLUX,
        "vae": VAE,
    }.items():
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(cfg))
    return root


def job(**kw: object) -> DiffusionJob:
    base = {"height": 64, "width": 64, "steps": 4, "precision": "bf16", "max_sequence_length": 16}
    return DiffusionJob(**{**base, **kw})  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def flux_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_flux(tmp_path_factory.mktemp("tiny-flux"))


def test_a_flux_pipeline_has_three_stages_with_their_components(flux_tree: Path) -> None:
    est = estimate_pipeline(flux_tree, job(), name="tiny")
    assert [s.stage for s in est.stages] == ["text_encode", "denoise", "vae_decode"]
    assert [s.components for s in est.stages] == [
        ("text_encoder", "text_encoder_2"),
        ("transformer",),
        ("vae",),
    ]
    by_name = {c.name: c for c in est.components}
    assert by_name["transformer"].class_name == "FluxTransformer2DModel"
    assert all(c.weights_bytes > 0 and c.activation_peak_bytes > 0 for c in est.components)
    # no offload: every stage holds every component's weights
    total = sum(c.weights_bytes for c in est.components)
    assert all(s.resident_weights_bytes == total for s in est.stages)
    assert est.peak_bytes == max(s.peak_bytes for s in est.stages)
    assert est.host_weights_bytes == 0


def test_offload_modes_order_none_model_sequential_on_the_device(flux_tree: Path) -> None:
    peaks = {
        m: estimate_pipeline(flux_tree, job(offload=m), name="t")
        for m in ("none", "model", "sequential")
    }
    assert peaks["none"].peak_bytes > peaks["model"].peak_bytes > peaks["sequential"].peak_bytes
    total = sum(c.weights_bytes for c in peaks["none"].components)
    assert peaks["model"].host_weights_bytes == peaks["sequential"].host_weights_bytes == total
    # model offload: a stage holds only the component that runs
    denoise = {s.stage: s for s in peaks["model"].stages}["denoise"]
    transformer = {c.name: c for c in peaks["model"].components}["transformer"]
    assert denoise.resident_weights_bytes == transformer.weights_bytes


def test_steps_do_not_change_the_peak(flux_tree: Path) -> None:
    assert (
        estimate_pipeline(flux_tree, job(steps=2), name="t").peak_bytes
        == estimate_pipeline(flux_tree, job(steps=50), name="t").peak_bytes
    )


def _decode_peak(latents: tuple[int, ...], *, slicing: bool = False, tiling: bool = False) -> int:
    vae = build_component("diffusers", "AutoencoderKL", VAE).to(torch.bfloat16).eval()
    if slicing:
        vae.enable_slicing()
    if tiling:
        vae.enable_tiling()
    peak, _ = trace_forward(
        vae,
        lambda: {"latents": torch.empty(latents, dtype=torch.bfloat16)},
        lambda m, *, latents: m.decode(latents, return_dict=False)[0],
    )
    return peak


def test_vae_slicing_decodes_one_image_at_a_time() -> None:
    assert _decode_peak((4, 4, 16, 16), slicing=True) < _decode_peak((4, 4, 16, 16))


def test_vae_tiling_decodes_in_tiles_of_the_config_size() -> None:
    # the tiny VAE's latent tiles are 16 (sample_size 32 / 2): 32x32 latents are decoded in tiles
    assert _decode_peak((1, 4, 32, 32), tiling=True) < _decode_peak((1, 4, 32, 32))


def test_the_fake_trace_counts_what_a_real_cpu_decode_allocates() -> None:
    """The same VAE decode on fake tensors and on real CPU tensors: the same peak, to the byte."""

    def make() -> torch.nn.Module:
        return build_component("diffusers", "AutoencoderKL", VAE).to(torch.float32).eval()

    def inputs() -> dict[str, torch.Tensor]:
        return {"latents": torch.zeros(2, 4, 8, 8)}

    def call(m: torch.nn.Module, *, latents: torch.Tensor) -> torch.Tensor:
        return m.decode(latents, return_dict=False)[0]

    fake_peak, fake_out = trace_forward(make(), inputs, call)
    real = make().to_empty(device="cpu")
    real_peak, real_out = trace_forward(real, inputs, call, real=True)
    assert fake_peak == real_peak
    assert fake_out == real_out == 2 * 3 * 16 * 16 * 4


def test_a_pipeline_memfit_does_not_compose_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "model_index.json").write_text(
        json.dumps({"_class_name": "LTXPipeline", "vae": ["diffusers", "AutoencoderKLLTXVideo"]})
    )
    (tmp_path / "vae").mkdir()
    (tmp_path / "vae" / "config.json").write_text("{}")
    with pytest.raises(NotModelledError, match="LTXPipeline is not modelled"):
        estimate_pipeline(tmp_path, job(), name="ltx")


@pytest.mark.parametrize(
    ("kw", "rule"),
    [
        ({"height": 100}, "height must be a multiple of 16"),
        ({"steps": 0}, "steps must be a positive"),
        ({"precision": "amp-bf16"}, "not a diffusion inference precision"),
        ({"offload": "disk"}, "pipeline offload 'disk'"),
        ({"offload_type": "block"}, "offload_type 'block' is not one of"),
        ({"quant": "fp8"}, "quant 'fp8' is not a diffusion weight format"),
        ({"text_encoder_quant": "gguf-q8_0"}, "GGUF checkpoints are loaded for the denoiser"),
        ({"layerwise_casting": "fp8", "quant": "nf4"}, "use one of them"),
        ({"use_stream": True, "num_blocks_per_group": 2}, "use_stream needs num_blocks_per_group"),
    ],
)
def test_a_bad_job_is_refused_naming_the_field(kw: dict[str, object], rule: str) -> None:
    with pytest.raises(SpecError, match=rule):
        job(**kw)


def test_a_repeated_pipeline_estimate_reads_its_traces_from_the_cache(
    flux_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memfit.estimate.diffusion import pipelines

    monkeypatch.setenv("MEMFIT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("MEMFIT_NO_CACHE", raising=False)
    monkeypatch.setattr(pipelines, "_TRACES", {})  # a new process: nothing in memory
    first = estimate_pipeline(flux_tree, job(height=48, width=48), name="tiny")
    kept = sorted((tmp_path / "trace").glob("*.json"))
    assert len(kept) == 4  # text_encoder, text_encoder_2, transformer, vae

    traced: list[str] = []
    real = pipelines.trace_forward
    monkeypatch.setattr(pipelines, "_TRACES", {})
    monkeypatch.setattr(
        pipelines, "trace_forward", lambda *a, **k: traced.append("x") or real(*a, **k)
    )
    again = estimate_pipeline(flux_tree, job(height=48, width=48), name="tiny")
    assert traced == []  # every component read back, none traced
    assert again == first

    kept[0].write_text(kept[0].read_text().replace('"activation":', '"activation_":'))
    monkeypatch.setattr(pipelines, "_TRACES", {})
    rebuilt = estimate_pipeline(flux_tree, job(height=48, width=48), name="tiny")
    assert traced == ["x"]  # the corrupt entry traced again, never used
    assert rebuilt == first
