"""Diffusion training as the diffusers scripts run it: tiny trees from diffusers' and
transformers' own classes, traced on fake tensors and run for real on CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("diffusers")
pytest.importorskip("peft")

from tests.estimate.diffusion.test_pipeline import CLIP, VAE, tiny_flux  # noqa: E402

from memfit.errors import NotModelledError, SpecError  # noqa: E402
from memfit.estimate.diffusion.train_fast import estimate_training_fast  # noqa: E402
from memfit.estimate.diffusion.train_step import estimate_training  # noqa: E402
from memfit.spec.diffusion import DiffusionTrainJob  # noqa: E402

UNET = {
    "_class_name": "UNet2DConditionModel",
    "act_fn": "silu",
    "addition_embed_type": "text_time",
    "addition_time_embed_dim": 8,
    "attention_head_dim": [2, 4],
    "block_out_channels": [32, 64],
    "cross_attention_dim": 64,
    "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D"],
    "up_block_types": ["CrossAttnUpBlock2D", "UpBlock2D"],
    "in_channels": 4,
    "out_channels": 4,
    "layers_per_block": 1,
    "norm_num_groups": 8,
    "projection_class_embeddings_input_dim": 80,
    "sample_size": 8,
    "transformer_layers_per_block": [1, 1],
    "use_linear_projection": True,
}
CLIP_G = {**CLIP, "model_type": "clip_text_model"}


def tiny_sdxl(root: Path) -> Path:
    index = {
        "_class_name": "StableDiffusionXLPipeline",
        "text_encoder": ["transformers", "CLIPTextModel"],
        "text_encoder_2": ["transformers", "CLIPTextModelWithProjection"],
        "unet": ["diffusers", "UNet2DConditionModel"],
        "vae": ["diffusers", "AutoencoderKL"],
    }
    (root / "model_index.json").write_text(json.dumps(index))
    for name, cfg in {"text_encoder": CLIP, "text_encoder_2": CLIP_G, "unet": UNET,
                      "vae": VAE}.items():  # fmt: skip
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(cfg))
    return root


def job(**kw: object) -> DiffusionTrainJob:
    base: dict[str, object] = {"resolution": 64, "max_sequence_length": 16, "lora_rank": 4,
                               "precision": "bf16-mixed"}  # fmt: skip
    return DiffusionTrainJob(**{**base, **kw})  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def flux_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_flux(tmp_path_factory.mktemp("tiny-flux-train"))


@pytest.fixture(scope="module")
def sdxl_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_sdxl(tmp_path_factory.mktemp("tiny-sdxl-train"))


def _phases(est: object) -> list[tuple[str, int, int, int, int]]:
    return [
        (p.phase, p.peak_bytes, p.parameters_bytes, p.gradients_bytes, p.optimizer_states_bytes)
        for p in est.phases  # type: ignore[attr-defined]
    ]


SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"checkpointing": True},
        pytest.param({"lora_rank": None}, marks=SLOW),
        pytest.param({"cache_latents": True}, marks=SLOW),
        pytest.param({"train_text_encoder": True}, marks=SLOW),
        pytest.param({"precision": "16-mixed"}, marks=SLOW),
        pytest.param({"lora_rank": None, "precision": "32-true", "batch": 2}, marks=SLOW),
        # the real prodigyopt.Prodigy on both sides (full fine-tuning: every weight is nonzero,
        # so Prodigy keeps a full p0 copy of each in both runs)
        {"lora_rank": None, "optimizer": "prodigy"},
    ],
)
def test_a_flux_training_trace_allocates_what_real_cpu_execution_allocates(
    flux_tree: Path, kw: dict[str, object]
) -> None:
    # the same script on real CPU tensors and on fake ones (CPU kernels on both sides: the
    # CUDA emulation is off), every phase's peak and parts equal to the byte
    j = job(**kw)
    fake = estimate_training(flux_tree, j, name="t", emulate_cuda=False)
    real = estimate_training(flux_tree, j, name="t", execution="real", emulate_cuda=False)
    assert _phases(fake) == _phases(real)


@pytest.mark.parametrize(
    "kw",
    [{}, pytest.param({"lora_rank": None}, marks=SLOW),
     pytest.param({"train_text_encoder": True}, marks=SLOW)],
)  # fmt: skip
def test_an_sdxl_training_trace_allocates_what_real_cpu_execution_allocates(
    sdxl_tree: Path, kw: dict[str, object]
) -> None:
    j = job(**kw)
    fake = estimate_training(sdxl_tree, j, name="t", emulate_cuda=False)
    real = estimate_training(sdxl_tree, j, name="t", execution="real", emulate_cuda=False)
    exact = [p for p in _phases(fake) if p[0] != "backward"]
    assert exact == [p for p in _phases(real) if p[0] != "backward"]
    # the UNet's backward on real CPU kernels allocates a little more than the meta kernels
    # (measured: 15,872 B at the tiny UNet's backward peak of 11.6 MB; docs/accuracy.md)
    fb = {p[0]: p[1] for p in _phases(fake)}["backward"]
    rb = {p[0]: p[1] for p in _phases(real)}["backward"]
    assert fb <= rb <= fb * 1.005


def test_the_flux_lora_script_frees_the_text_encoders_and_trains_only_the_adapters(
    flux_tree: Path,
) -> None:
    est = estimate_training(flux_tree, job(), name="t")
    by = {c.name: c for c in est.components}
    assert by["text_encoder"].role == by["text_encoder_2"].role == "freed after text"
    assert by["transformer"].role == "lora"
    assert 0 < by["transformer"].n_trainable < by["transformer"].n_params
    assert by["vae"].n_trainable == 0
    phases = {p.phase: p for p in est.phases}
    assert list(phases) == ["precompute_text", "vae_encode", "forward", "backward", "optimizer"]
    text_weights = by["text_encoder"].weights_bytes + by["text_encoder_2"].weights_bytes
    # the training steps hold the transformer and the VAE, not the text encoders
    assert phases["forward"].parameters_bytes < phases["precompute_text"].parameters_bytes
    assert (
        phases["precompute_text"].parameters_bytes - phases["forward"].parameters_bytes
        >= text_weights
    )
    assert phases["optimizer"].optimizer_states_bytes > 0


def test_full_fine_tuning_keeps_fp32_weights_gradients_and_two_adam_states(
    flux_tree: Path,
) -> None:
    est = estimate_training(flux_tree, job(lora_rank=None), name="t")
    tr = {c.name: c for c in est.components}["transformer"]
    assert tr.dtype == "float32" and tr.n_trainable == tr.n_params
    opt = {p.phase: p for p in est.phases}["optimizer"]
    # AdamW: exp_avg + exp_avg_sq in fp32 per trained weight (plus 512-byte rounding per tensor)
    assert opt.optimizer_states_bytes >= 2 * 4 * tr.n_params
    assert opt.gradients_bytes >= 4 * tr.n_params


def test_gradient_checkpointing_lowers_the_peak(flux_tree: Path) -> None:
    plain = estimate_training(flux_tree, job(resolution=128), name="t")
    ckpt = estimate_training(flux_tree, job(resolution=128, checkpointing=True), name="t")
    assert ckpt.peak_bytes < plain.peak_bytes


def test_eight_bit_adam_stores_smaller_states_than_adamw(flux_tree: Path) -> None:
    a = estimate_training(flux_tree, job(lora_rank=None), name="t")
    b = estimate_training(flux_tree, job(lora_rank=None, optimizer="adamw-8bit"), name="t")
    adamw, adam8 = ({p.phase: p for p in e.phases}["optimizer"].optimizer_states_bytes
                    for e in (a, b))  # fmt: skip
    assert adam8 < adamw


def test_cached_latents_free_the_vae_before_training(flux_tree: Path) -> None:
    est = estimate_training(flux_tree, job(cache_latents=True), name="t")
    phases = [p.phase for p in est.phases]
    assert "cache_latents" in phases and phases.index("cache_latents") < phases.index("forward")
    assert {c.name: c for c in est.components}["vae"].role == "freed after latents"


def test_the_sdxl_lora_script_keeps_its_text_encoders_and_an_fp32_vae(sdxl_tree: Path) -> None:
    est = estimate_training(sdxl_tree, job(), name="t")
    by = {c.name: c for c in est.components}
    assert by["vae"].dtype == "float32"
    assert by["text_encoder"].role == by["text_encoder_2"].role == "frozen"
    assert any("text_encoder_one/_two" in n for n in est.notes)
    fwd = {p.phase: p for p in est.phases}["forward"]
    resident = sum(c.weights_bytes for c in est.components)
    assert fwd.parameters_bytes >= resident


@pytest.mark.slow  # 25 s: the block extrapolation against a full trace (make test-slow)
def test_extrapolating_over_flux_blocks_matches_a_full_trace(tmp_path: Path) -> None:
    root = tiny_flux(tmp_path)
    cfg = json.loads((root / "transformer" / "config.json").read_text())
    (root / "transformer" / "config.json").write_text(
        json.dumps({**cfg, "num_layers": 5, "num_single_layers": 6})
    )
    j = job(checkpointing=True)
    full = estimate_training(root, j, name="t")
    fast = estimate_training_fast(root, j, name="t")
    assert any("extrapolated" in n for n in fast.notes)
    # within the trace engine's extrapolation tolerance (0.1 %): 512-byte roundings of the
    # tiny model's smallest tensors are the only difference
    assert [p.phase for p in fast.phases] == [p.phase for p in full.phases]
    for f, g in zip(fast.phases, full.phases, strict=True):
        assert f.peak_bytes == pytest.approx(g.peak_bytes, rel=1e-3)
    assert [c.weights_bytes for c in fast.components] == [c.weights_bytes for c in full.components]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"resolution": 1000}, "multiple of 16"),
        ({"optimizer": "lion"}, "use adamw, adamw-8bit, prodigy"),
        ({"precision": "bf16-true"}, "--mixed_precision"),
        ({"lora_rank": None, "cache_latents": True}, "only the LoRA scripts"),
        ({"batch": 0}, "batch must be a positive whole number"),
    ],
)
def test_a_job_the_scripts_cannot_run_is_refused_with_the_rule(
    kw: dict[str, object], message: str
) -> None:
    with pytest.raises(SpecError, match=message):
        job(**kw)


def test_switches_a_script_does_not_have_are_not_modelled(sdxl_tree: Path) -> None:
    with pytest.raises(NotModelledError, match="has no --cache_latents"):
        estimate_training(sdxl_tree, job(cache_latents=True), name="t")
    with pytest.raises(NotModelledError, match="does not train the text encoders"):
        estimate_training(sdxl_tree, job(lora_rank=None, train_text_encoder=True), name="t")


def test_prodigy_keeps_four_states_per_weight(flux_tree: Path) -> None:
    pytest.importorskip("prodigyopt")
    est = estimate_training(flux_tree, job(lora_rank=None, optimizer="prodigy"), name="t")
    tr = {c.name: c for c in est.components}["transformer"]
    opt = {p.phase: p for p in est.phases}["optimizer"]
    # s, p0, exp_avg, exp_avg_sq: four fp32 copies of every trained weight
    assert opt.optimizer_states_bytes >= 4 * 4 * tr.n_params
