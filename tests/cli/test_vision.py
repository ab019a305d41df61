"""memfit estimate on image and speech models: the workload line in the model's terms, the input
flags, and their one-line errors (exit 2)."""

from __future__ import annotations

import json

import pytest

from memfit.cli import main


def test_whisper_inference_reports_its_audio_windows(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    code = main(
        ["estimate", "whisper-tiny", "--mode", "infer", "--audio-seconds", "90",
         "--new-tokens", "8", "--precision", "bf16-true", "--json"]
    )  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["workload"]["inputs"]["windows"] == 3
    assert out["workload"]["inputs"]["input_features"] == [1, 80, 9000]


def test_a_vit_estimate_says_image_size_and_patches_not_seq(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("transformers")
    code = main(["estimate", "vit-base-patch16-224", "--mode", "infer", "--precision", "bf16"])
    text = capsys.readouterr().out
    assert code == 0
    assert "batch 1 × 224×224 images (3 channels, 196 patches, 197 tokens)" in text
    assert "seq 512" not in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["gpt2", "--image-size", "224"], "apply to image models"),
        (["vit-base-patch16-224", "--audio-seconds", "ten"], "audio_seconds ('ten') must be"),
        (["vit-base-patch16-224", "--image-size", "0"], "image_size (0) must be a whole number"),
    ],
)
def test_bad_input_flags_are_one_line_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["estimate", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_timm_by_name_without_timm_says_how_to_install_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import importlib.util

    if importlib.util.find_spec("timm") is not None:
        pytest.skip("timm is installed here")
    assert main(["estimate", "timm/vit_huge_patch14_224"]) == 2
    assert "timm is not installed: pip install timm torchvision" in capsys.readouterr().err
