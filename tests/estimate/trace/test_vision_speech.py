"""Image and speech models through the trace engine: inputs from the config, the techniques, and
the fake trace equal to the same step executed for real on CPU (to the byte, as
tests/estimate/trace/test_exactness.py holds for text models; CUDA's SDPA routing off in both)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

pytest.importorskip("transformers")

from memfit.errors import SpecError
from memfit.estimate.trace.engine import trace_hf
from memfit.models.media import with_media
from memfit.spec import WorkloadSpec
from memfit.spec.media import MediaSpec

TINY_VIT: dict[str, Any] = {
    "model_type": "vit", "architectures": ["ViTForImageClassification"], "hidden_size": 32,
    "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
    "image_size": 32, "patch_size": 8,
}  # fmt: skip
TINY_WHISPER: dict[str, Any] = {
    "model_type": "whisper", "architectures": ["WhisperForConditionalGeneration"], "d_model": 32,
    "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 2,
    "decoder_attention_heads": 2, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
    "num_mel_bins": 8, "max_source_positions": 16, "max_target_positions": 64, "vocab_size": 300,
    "pad_token_id": 1, "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 3,
}  # fmt: skip


def _both(config: dict[str, Any], **workload: Any) -> tuple[Any, Any]:
    wl = WorkloadSpec(**{"batch_size": 2, "seq_len": 16, "precision": "fp32", **workload})
    fake, real = (
        trace_hf(config, wl, name="t", extrapolate=False, execution=ex, emulate_cuda=False)
        for ex in ("fake", "real")
    )
    return fake, real


def _assert_equal(fake: Any, real: Any) -> None:
    assert fake.peak_allocated_bytes == real.peak_allocated_bytes
    assert {k: v.to_json() for k, v in fake.phases.items()} == {
        k: v.to_json() for k, v in real.phases.items()
    }
    assert fake.n_params == real.n_params and fake.n_trainable_params == real.n_trainable_params


def test_a_tiny_vit_inference_traces_what_real_cpu_execution_allocates() -> None:
    _assert_equal(*_both(TINY_VIT, mode="infer"))


@pytest.mark.slow  # 5-30 s each on a shared 2-core machine (real execution)
@pytest.mark.parametrize(
    "workload",
    [{}, {"precision": "bf16-mixed"}, {"checkpointing": "full"}, {"lora_rank": 4}],
    ids=lambda w: ",".join(f"{k}={v}" for k, v in w.items()) or "default",
)
def test_a_tiny_vit_step_traces_what_real_cpu_execution_allocates(workload: dict[str, Any]) -> None:
    _assert_equal(*_both(TINY_VIT, **workload))


@pytest.mark.slow  # 5-30 s each on a shared 2-core machine (real execution)
@pytest.mark.parametrize(
    "workload",
    [{}, {"checkpointing": "full"}, {"mode": "infer", "new_tokens": 5}],
    ids=lambda w: ",".join(f"{k}={v}" for k, v in w.items()) or "default",
)
def test_a_tiny_whisper_step_traces_what_real_cpu_execution_allocates(
    workload: dict[str, Any],
) -> None:
    _assert_equal(*_both(TINY_WHISPER, **workload))


def test_a_larger_image_grows_the_activations_with_the_patch_count() -> None:
    wl = WorkloadSpec(batch_size=2, precision="fp32")
    small = trace_hf(TINY_VIT, wl, name="t")
    big_cfg = with_media(TINY_VIT, MediaSpec(image_size=64), name="t")  # 16 patches -> 64
    big = trace_hf(big_cfg, wl, name="t")
    assert big.components["activations"] > 3 * small.components["activations"]


def test_checkpointing_drops_the_saved_activations_of_a_vit() -> None:
    wl = {"batch_size": 8, "precision": "fp32"}
    plain = trace_hf(TINY_VIT, WorkloadSpec(**wl), name="t")
    ckpt = trace_hf(TINY_VIT, WorkloadSpec(**wl, checkpointing="full"), name="t")
    forward = "forward"
    assert ckpt.phases[forward].components["activations"] < (
        plain.phases[forward].components["activations"] / 2
    )


def test_long_audio_keeps_the_whole_features_live_while_one_window_decodes() -> None:
    wl = WorkloadSpec(mode="infer", batch_size=1, new_tokens=4, precision="fp32")
    short = trace_hf(TINY_WHISPER, wl, name="t")
    hour = dataclasses.replace(wl, media=MediaSpec(audio_seconds=3600))
    long = trace_hf(TINY_WHISPER, hour, name="t")
    # (1, 8 mels, 100 frames a second) fp32 instead of one 32-frame window; nothing else grows
    # (512 B: the allocator's rounding)
    longer_features = 8 * 4 * (3600 * 100 - 32)
    extra = long.peak_allocated_bytes - short.peak_allocated_bytes
    assert abs(extra - longer_features) < 512


def test_whisper_training_refuses_labels_beyond_its_decoder_positions() -> None:
    with pytest.raises(SpecError, match=r"seq \(100\) label tokens exceed Whisper's 64 decoder"):
        trace_hf(TINY_WHISPER, WorkloadSpec(seq_len=100, precision="fp32"), name="t")


def test_whisper_training_refuses_clips_longer_than_its_window() -> None:
    clip = WorkloadSpec(seq_len=8, precision="fp32", media=MediaSpec(audio_seconds=45))
    with pytest.raises(SpecError, match=r"audio_seconds \(45\) exceeds Whisper's 30 s window"):
        trace_hf(TINY_WHISPER, clip, name="t")


def test_convnext_says_it_cannot_checkpoint() -> None:
    cfg = {"model_type": "convnext", "hidden_sizes": [8, 16], "depths": [1, 1], "num_stages": 2}
    with pytest.raises(SpecError, match=r"not supported by ConvNextForImageClassification"):
        trace_hf(cfg, WorkloadSpec(checkpointing="full", precision="fp32"), name="t")


def test_detr_runs_without_timm_with_its_pixel_mask() -> None:
    cfg = {
        "model_type": "detr", "d_model": 32, "encoder_layers": 1, "decoder_layers": 1,
        "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 64,
        "decoder_ffn_dim": 64, "num_queries": 10, "use_timm_backbone": True,
    }  # fmt: skip
    job = WorkloadSpec(mode="infer", precision="fp32", media=MediaSpec(image_size=64))
    small = trace_hf(cfg, job, name="t")
    big = trace_hf(cfg, dataclasses.replace(job, media=MediaSpec(image_size=128)), name="t")
    assert small.trace["task"] == "object-detection" and small.peak_allocated_bytes > 0
    assert big.peak_allocated_bytes > small.peak_allocated_bytes  # the job's image size counts


@pytest.mark.slow  # real execution of a tiny Swin (5-30 s on the shared machine)
def test_an_image_model_that_does_not_cast_its_pixels_gets_them_in_its_weights_dtype() -> None:
    """Swin's first convolution rejects the processor's fp32 pixels under bf16 weights (it does
    not cast them, unlike ViT): the trace passes them as its user must, in bf16, and counts what
    the same step allocates on real CPU tensors (was a TraceError: issue 11, the grid)."""
    from benchmarks.tiny_models import tiny_config

    _assert_equal(*_both(tiny_config("swin"), mode="infer", precision="bf16-true"))


def test_a_model_whose_task_memfit_does_not_build_says_which_class_it_is() -> None:
    """Wav2Vec2ForCTC (CTC speech recognition) is no task of the trace engine's: a TraceError
    naming the class and the tasks it builds, never a traceback nor a causal-LM guess."""
    from benchmarks.tiny_models import tiny_config

    from memfit.errors import TraceError

    with pytest.raises(TraceError, match=r"does not model Wav2Vec2ForCTC \(wav2vec2\): it builds"):
        trace_hf(tiny_config("wav2vec2"), WorkloadSpec(seq_len=8, precision="fp32"), name="t")
