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


def _answer_key(root: Path, j: DiffusionJob, gpu: object = None) -> str:
    """The trace-cache key of a whole pipeline answer (memfit.estimate.diffusion.answer)."""
    from memfit.estimate.diffusion.pipeline import read_tree
    from memfit.estimate.trace_cache import key_of

    index, configs = read_tree(root)
    parts = {"pipeline": {"index": index, "configs": configs}, "job": repr(j), "gpu": repr(gpu)}
    return key_of({"answer": parts})


def test_a_repeated_pipeline_estimate_reads_its_traces_from_the_cache(
    flux_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memfit.estimate.diffusion import pipelines

    monkeypatch.setenv("MEMFIT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("MEMFIT_NO_CACHE", raising=False)
    monkeypatch.setattr(pipelines, "_TRACES", {})  # a new process: nothing in memory
    monkeypatch.setattr(pipelines, "_MODELS", {})
    j = job(height=48, width=48)
    first = estimate_pipeline(flux_tree, j, name="tiny")
    answer = tmp_path / "trace" / f"{_answer_key(flux_tree, j)}.json"
    # beside the forward traces: each component's facts and layout (diffusion/built.py)
    kept = sorted(p for p in (tmp_path / "trace").glob("*.json") if '"activation"' in p.read_text())
    assert answer.exists() and len(kept) == 4  # text_encoder, text_encoder_2, transformer, vae

    traced: list[str] = []
    real = pipelines.trace_forward
    answer.unlink()  # the whole answer gone: the components' traces are read back
    monkeypatch.setattr(pipelines, "_TRACES", {})
    monkeypatch.setattr(
        pipelines, "trace_forward", lambda *a, **k: traced.append("x") or real(*a, **k)
    )
    again = estimate_pipeline(flux_tree, j, name="tiny")
    assert traced == []  # every component read back, none traced
    assert again == first

    answer.unlink()
    kept[0].write_text(kept[0].read_text().replace('"activation":', '"activation_":'))
    monkeypatch.setattr(pipelines, "_TRACES", {})
    rebuilt = estimate_pipeline(flux_tree, j, name="tiny")
    assert traced == ["x"]  # the corrupt entry traced again, never used
    assert rebuilt == first


def test_a_repeated_pipeline_estimate_is_one_cache_read_without_building_anything(
    flux_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 32: the whole answer (verdict on the GPU included) is kept; a repeat neither builds
    nor traces a component, and the answer comes back equal, under the name asked."""
    from memfit.estimate.diffusion import pipelines
    from memfit.hardware import get_gpu

    monkeypatch.setenv("MEMFIT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("MEMFIT_NO_CACHE", raising=False)
    gpu = get_gpu("L4")
    first = estimate_pipeline(flux_tree, job(), name="tiny", gpu=gpu)
    assert first.fits is not None

    def never(*a: object, **k: object) -> None:
        raise AssertionError("built or traced although the answer is kept")

    monkeypatch.setattr(pipelines, "traced_pipeline", never)
    again = estimate_pipeline(flux_tree, job(), name="tiny", gpu=gpu)
    assert again == first
    renamed = estimate_pipeline(flux_tree, job(), name="other-name", gpu=gpu)
    assert renamed.name == "other-name" and renamed.stages == first.stages
    with pytest.raises(AssertionError, match="although the answer is kept"):
        estimate_pipeline(flux_tree, job(steps=5), name="tiny", gpu=gpu)  # another job: a miss


@pytest.mark.parametrize(
    "foreign",
    [
        {"__record__": "ComponentTrace", "fields": {}},  # another record
        "not a record",
        None,
    ],
    ids=["another-record", "a-string", "nothing"],
)
def test_a_foreign_or_implausible_pipeline_entry_is_rebuilt_never_used(
    flux_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, foreign: object
) -> None:
    from memfit.estimate.derived import cache
    from memfit.estimate.diffusion import answer, pipelines
    from memfit.estimate.trace_cache import FORMAT, KIND

    monkeypatch.setenv("MEMFIT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("MEMFIT_NO_CACHE", raising=False)
    j = job(height=32, width=32)
    first = estimate_pipeline(flux_tree, j, name="tiny")
    key = _answer_key(flux_tree, j)
    runs: list[str] = []
    real = pipelines.traced_pipeline
    monkeypatch.setattr(
        pipelines, "traced_pipeline", lambda *a, **k: runs.append("x") or real(*a, **k)
    )

    cache.store(key, {"answer": foreign}, kind=KIND, fmt=FORMAT)  # checksummed, but not an answer
    assert estimate_pipeline(flux_tree, j, name="tiny") == first
    assert runs == ["x"]  # rebuilt ...
    assert estimate_pipeline(flux_tree, j, name="tiny") == first
    assert runs == ["x"]  # ... and replaced: the next one is a hit

    # a kept answer with a negative count is not plausible: rebuilt too
    bad = answer._encode(first)
    bad["fields"]["host_weights_bytes"] = -1
    cache.store(key, {"answer": bad}, kind=KIND, fmt=FORMAT)
    assert estimate_pipeline(flux_tree, j, name="tiny") == first
    assert runs == ["x", "x"]
