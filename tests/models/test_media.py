"""Image and speech inputs (memfit.models.media), the bundled vision / Whisper configs, and
timm / torchvision by name when those libraries are missing."""

from __future__ import annotations

import json

import pytest

from memfit.errors import MissingDependencyError, SpecError
from memfit.models import resolve_model, take_media
from memfit.models.bundled import CONFIGS_DIR, find_bundled
from memfit.models.media import describe_inputs, with_media
from memfit.spec.media import MediaSpec

VIT = {"model_type": "vit", "image_size": 224, "patch_size": 16}
WHISPER = {"model_type": "whisper", "num_mel_bins": 128, "max_source_positions": 1500}


def test_a_vit_workload_is_said_in_patches_and_tokens() -> None:
    inputs = describe_inputs(with_media(VIT, MediaSpec(image_size=384), name="m"), 8, 512)
    assert inputs["pixel_values"] == [8, 3, 384, 384]
    assert (inputs["patches"], inputs["tokens"]) == (576, 577)  # 24 x 24 patches + [CLS]


def test_whisper_audio_is_padded_to_one_30_second_window() -> None:
    inputs = describe_inputs(WHISPER, 4, 64, MediaSpec(audio_seconds=12))
    assert inputs["input_features"] == [4, 128, 3000] and inputs["windows"] == 1


def test_long_audio_is_counted_in_30_second_windows() -> None:
    inputs = describe_inputs(WHISPER, 1, 64, MediaSpec(audio_seconds=95))
    assert inputs["windows"] == 4 and inputs["input_features"] == [1, 128, 9500]


def test_the_job_s_inputs_stay_in_the_job_not_the_config() -> None:
    """Whisper's seconds of audio and DETR's image size change no weight: the config is left as
    it is (no memfit-only keys), and the job's media say the inputs."""
    assert with_media(WHISPER, MediaSpec(audio_seconds=95), name="m") == WHISPER
    detr = {"model_type": "detr"}
    assert with_media(detr, MediaSpec(image_size=640), name="d") == detr
    assert describe_inputs(detr, 2, 1, MediaSpec(image_size=640))["pixel_values"] == [
        2,
        3,
        640,
        640,
    ]
    assert describe_inputs(detr, 2, 1)["pixel_values"] == [2, 3, 800, 800]


def test_a_text_model_refuses_an_image_size() -> None:
    with pytest.raises(SpecError, match=r"apply to image models .* gpt2 is model_type 'gpt2'"):
        with_media({"model_type": "gpt2"}, MediaSpec(image_size=224), name="gpt2")


def test_an_image_model_refuses_audio_seconds() -> None:
    with pytest.raises(SpecError, match=r"audio_seconds \(10.0\) applies to speech models"):
        with_media(VIT, MediaSpec(audio_seconds=10.0), name="vit")


def test_media_values_are_checked() -> None:
    with pytest.raises(SpecError, match=r"image_size \(0\) must be a whole number from 1"):
        MediaSpec(image_size=0)
    with pytest.raises(SpecError, match=r"audio_seconds \('x'\) must be a number of seconds"):
        MediaSpec(audio_seconds="x")  # type: ignore[arg-type]


def test_siglip_takes_the_image_size_in_its_vision_config() -> None:
    out = with_media(
        {"model_type": "siglip", "vision_config": {"image_size": 224}},
        MediaSpec(image_size=512),
        name="s",
    )
    assert out["vision_config"]["image_size"] == 512


def test_a_model_is_resolved_for_the_job_s_media() -> None:
    source = resolve_model("vit-base-patch16-224", media=MediaSpec(image_size=448))
    assert source.config is not None and source.config["image_size"] == 448
    plain = resolve_model("vit-base-patch16-224")
    assert plain.config is not None and plain.config["image_size"] == 224
    again = take_media(source, MediaSpec(image_size=448))
    assert again is source  # the same media twice: the same source
    assert take_media(plain, MediaSpec()) is plain  # no media: as it is


@pytest.mark.parametrize("name", ["timm/vit_huge_patch14_224", "torchvision/resnet50"])
def test_a_zoo_model_without_its_library_says_how_to_install_it(name: str) -> None:
    import importlib.util

    package = name.split("/")[0]
    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed here")
    with pytest.raises(MissingDependencyError, match=rf"{package} is not installed: pip install"):
        resolve_model(name)


#: Parameters of the built model vs the paper's (or model card's) published count, in millions.
#: Tolerance 4 %: papers round to 2-3 digits and count the classifier of their own label set.
PUBLISHED_M = {
    "vit-base-patch16-224": 86,  # ViT paper Table 1
    "vit-large-patch16-224": 307,
    "vit-huge-patch14-224-in21k": 632,
    "deit-base-distilled-patch16-224": 87,  # DeiT paper Table 1 (DeiT-B⚗)
    "convnext-tiny-224": 29,  # ConvNeXt paper Table 1
    "convnext-base-224": 89,
    "swin-tiny-patch4-window7-224": 28,  # Swin paper Table 1
    "swin-base-patch4-window7-224": 88,
    "dinov2-base": 86,  # DINOv2 paper Table 17 (ViT-B/14)
    "dinov2-large": 300,
    "siglip-so400m-patch14-384": 428,  # the hub's safetensors count of the vision tower + head
    "detr-resnet-50": 41,  # DETR paper Table 1
    "whisper-tiny": 39,  # Whisper paper Table 1
    "whisper-base": 74,
    "whisper-small": 244,
    "whisper-medium": 769,
    "whisper-large-v3": 1550,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_M))
def test_the_bundled_vision_and_speech_configs_build_to_their_published_size(name: str) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from memfit.estimate.trace import build
    from memfit.models import media
    from memfit.spec import WorkloadSpec

    config = media.buildable(json.loads((CONFIGS_DIR / f"{name}.json").read_text()))
    model = build.build_hf_model(
        config, WorkloadSpec(mode="infer"), build.resolve_task(config, "auto")
    )
    n = sum(p.numel() for p in model.parameters()) / 1e6
    assert n == pytest.approx(PUBLISHED_M[name], rel=0.04)
    assert find_bundled(name).content_from.startswith("built from transformers")  # type: ignore[union-attr]
    del torch
