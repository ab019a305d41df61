"""SD3 and PixArt-Sigma pipelines: tiny trees built by diffusers' and transformers' own classes,
on CPU; the bundled trees' sizes against the model cards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("diffusers")

import torch  # noqa: E402

from memfit.errors import SpecError  # noqa: E402
from memfit.estimate.diffusion.compose import model_offload_walk  # noqa: E402
from memfit.estimate.diffusion.pipeline import (  # noqa: E402
    build_component,
    trace_forward,
)
from memfit.estimate.diffusion.pipelines import estimate_pipeline  # noqa: E402
from memfit.models.pipelines import pipeline_dir  # noqa: E402
from memfit.spec.diffusion import DiffusionJob  # noqa: E402

VAE = {
    "_class_name": "AutoencoderKL",
    "block_out_channels": [8, 16],
    "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D"],
    "up_block_types": ["UpDecoderBlock2D", "UpDecoderBlock2D"],
    "latent_channels": 4,
    "layers_per_block": 1,
    "norm_num_groups": 4,
    "sample_size": 32,
    "mid_block_add_attention": False,
}
CLIP = {
    "model_type": "clip_text_model",
    "architectures": ["CLIPTextModelWithProjection"],
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
    "d_model": 64,
    "d_ff": 96,
    "d_kv": 16,
    "num_layers": 2,
    "num_heads": 4,
    "vocab_size": 1000,
    "feed_forward_proj": "gated-gelu",
}
SD3 = {
    "_class_name": "SD3Transformer2DModel",
    "sample_size": 8,
    "patch_size": 2,
    "in_channels": 4,
    "out_channels": 4,
    "num_layers": 2,
    "attention_head_dim": 8,
    "num_attention_heads": 2,
    "joint_attention_dim": 64,
    "caption_projection_dim": 16,
    "pooled_projection_dim": 64,
    "pos_embed_max_size": 16,
    "dual_attention_layers": [0],
    "qk_norm": "rms_norm",
}
PIXART = {
    "_class_name": "PixArtTransformer2DModel",
    "sample_size": 8,
    "num_layers": 1,
    "attention_head_dim": 8,
    "num_attention_heads": 2,
    "in_channels": 4,
    "out_channels": 8,
    "cross_attention_dim": 16,
    "caption_channels": 64,
    "norm_num_groups": 4,
    "use_additional_conditions": False,
}


def _tree(root: Path, index: dict[str, object], configs: dict[str, dict[str, object]]) -> Path:
    (root / "model_index.json").write_text(json.dumps(index))
    for name, cfg in configs.items():
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(cfg))
    return root


@pytest.fixture(scope="module")
def sd3_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    index = {
        "_class_name": "StableDiffusion3Pipeline",
        "text_encoder": ["transformers", "CLIPTextModelWithProjection"],
        "text_encoder_2": ["transformers", "CLIPTextModelWithProjection"],
        "text_encoder_3": ["transformers", "T5EncoderModel"],
        "transformer": ["diffusers", "SD3Transformer2DModel"],
        "vae": ["diffusers", "AutoencoderKL"],
    }
    configs = {
        "text_encoder": CLIP,
        "text_encoder_2": CLIP,
        "text_encoder_3": T5,
        "transformer": SD3,
        "vae": VAE,
    }
    return _tree(tmp_path_factory.mktemp("tiny-sd3"), index, configs)


@pytest.fixture(scope="module")
def pixart_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    index = {
        "_class_name": "PixArtSigmaPipeline",
        "text_encoder": ["transformers", "T5EncoderModel"],
        "transformer": ["diffusers", "PixArtTransformer2DModel"],
        "vae": ["diffusers", "AutoencoderKL"],
    }
    configs = {"text_encoder": T5, "transformer": PIXART, "vae": VAE}
    return _tree(tmp_path_factory.mktemp("tiny-pixart"), index, configs)


def job(**kw: object) -> DiffusionJob:
    base = {"height": 32, "width": 32, "steps": 2, "precision": "bf16", "max_sequence_length": 8}
    return DiffusionJob(**{**base, **kw})  # type: ignore[arg-type]


def test_model_offload_keeps_what_the_hook_chain_does_not_offload() -> None:
    chain = ["text_encoder", "text_encoder_2", "text_encoder_3", "transformer", "vae"]
    calls = [*chain[:3], *chain]
    walk = [sorted(on) for _, on in model_offload_walk(calls, chain)]
    # the negative-prompt pass: CLIP-L then CLIP-G run beside the T5 of the positive pass
    assert walk[3] == ["text_encoder", "text_encoder_3"]
    assert walk[4] == ["text_encoder_2", "text_encoder_3"]
    assert walk[5] == ["text_encoder_3"]
    assert walk[6:] == [["transformer"], ["vae"]]


def test_an_sd3_pipeline_runs_three_encoders_then_the_transformer(sd3_tree: Path) -> None:
    est = estimate_pipeline(sd3_tree, job(), name="tiny-sd3")
    assert [s.components for s in est.stages] == [
        ("text_encoder", "text_encoder_2", "text_encoder_3"),
        ("transformer",),
        ("vae",),
    ]
    comps = {c.name: c for c in est.components}
    off = estimate_pipeline(sd3_tree, job(offload="model"), name="tiny-sd3")
    encode = {s.stage: s for s in off.stages}["text_encode"]
    biggest_clip = max(comps["text_encoder"].weights_bytes, comps["text_encoder_2"].weights_bytes)
    assert encode.resident_weights_bytes == comps["text_encoder_3"].weights_bytes + biggest_clip


def test_dropping_text_encoder_3_removes_t5_and_is_refused_elsewhere(
    sd3_tree: Path, pixart_tree: Path
) -> None:
    est = estimate_pipeline(sd3_tree, job(drop_text_encoder_3=True), name="t")
    assert "text_encoder_3" not in {c.name for c in est.components}
    with pytest.raises(SpecError, match="no text_encoder_3"):
        estimate_pipeline(pixart_tree, job(drop_text_encoder_3=True), name="t")


def test_a_pixart_pipeline_has_one_encoder_and_doubles_the_denoiser_batch(
    pixart_tree: Path,
) -> None:
    one = estimate_pipeline(pixart_tree, job(), name="p")
    assert [s.components for s in one.stages] == [("text_encoder",), ("transformer",), ("vae",)]
    two = estimate_pipeline(pixart_tree, job(batch=2), name="p")
    act = {c.name: c.activation_peak_bytes for c in one.components}
    act2 = {c.name: c.activation_peak_bytes for c in two.components}
    assert act2["transformer"] > act["transformer"]


@pytest.mark.parametrize(
    ("config", "inputs"),
    [
        (
            SD3,
            lambda: {
                "hidden_states": torch.randn(2, 4, 4, 4, dtype=torch.bfloat16),
                "timestep": torch.ones(2, dtype=torch.bfloat16),
                "encoder_hidden_states": torch.randn(2, 85, 64, dtype=torch.bfloat16),
                "pooled_projections": torch.randn(2, 64, dtype=torch.bfloat16),
            },
        ),
        (
            PIXART,
            lambda: {
                "hidden_states": torch.randn(2, 4, 4, 4, dtype=torch.bfloat16),
                "encoder_hidden_states": torch.randn(2, 8, 64, dtype=torch.bfloat16),
                "encoder_attention_mask": torch.ones(2, 8, dtype=torch.long),
                "timestep": torch.zeros(2, dtype=torch.long),
                "added_cond_kwargs": {"resolution": None, "aspect_ratio": None},
            },
        ),
    ],
    ids=["sd3", "pixart"],
)
def test_the_denoiser_trace_equals_real_cpu_execution(config: dict[str, object], inputs) -> None:  # type: ignore[no-untyped-def]
    def call(m, **kw):  # type: ignore[no-untyped-def]
        return m(**kw, return_dict=False)

    def build(real: bool) -> torch.nn.Module:
        m = build_component("diffusers", str(config["_class_name"]), config)
        if real:
            m = m.to_empty(device="cpu")
        return m.to(torch.bfloat16).eval()

    fake = trace_forward(build(False), inputs, call)
    real = trace_forward(build(True), inputs, call, real=True)
    assert fake[1] == real[1]  # the output
    if config is SD3:
        assert fake == real
    else:
        # PixArt's cross-attention: the fake trace emulates the CUDA SDPA kernel memfit picks
        # for it (estimate/trace/engine.py), which allocates more than the CPU kernel
        assert real[0] <= fake[0] <= real[0] + 2048


@pytest.mark.parametrize(
    ("name", "component", "card_params", "card"),
    [
        ("sd3-medium", "transformer", 2.0e9, "2B"),
        ("sd3.5-medium", "transformer", 2.5e9, "2.5 billion"),
        ("pixart-sigma-1024-ms", "transformer", 0.6e9, "0.6B"),
        ("sd3-medium", "text_encoder_3", 4.7e9, "4.7B T5-XXL"),
    ],
)
def test_bundled_trees_match_the_model_cards_sizes(
    name: str, component: str, card_params: float, card: str
) -> None:
    root = pipeline_dir(name)
    assert root is not None
    index = json.loads((root / "model_index.json").read_text())
    cfg = json.loads((root / component / "config.json").read_text())
    m = build_component(*index[component], cfg)
    n = sum(t.numel() for t in [*m.parameters(), *m.buffers()])
    # model cards round to one or two figures: within 5 % of the stated size
    assert abs(n - card_params) / card_params < 0.05, (name, component, n, card)
