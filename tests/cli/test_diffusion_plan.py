"""``memfit plan PIPELINE --mode infer`` and the line ``memfit estimate`` ends with when a pipeline
call does not fit: the door of memfit.plan.diffusion_infer (exit 0 a plan fits, 1 none, 2 bad
input in one line)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from memfit.cli import main

#: a synthetic card whose capacity is its memory_bytes (observed reservation 0)
CARD = "test card: capacity = memory_bytes"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--gpu", "RTX-3060", "--height", "1000"), "height must be a multiple of 16"),
        (("--gpu", "RTX-3060", "--batch", "0"), "batch must be a positive whole number, got 0"),
        ((), "plan of a diffusion pipeline needs --gpu NAME or --gpu-memory SIZE"),
        (("--gpu", "RTX-3060", "--global-batch", "8"), "--global-batch: text-model plan flags"),
        (("--gpu", "RTX-3060", "--resolution", "512"), "--resolution is a diffusion training"),
        (("--gpu", "RTX-3060", "--use-stream"), "add --pipeline-offload group"),
        (("--gpu", "RTX-3060", "--quant", "fp8"), "quant 'fp8' is not a diffusion weight format"),
        (("--gpu", "RTX-9999",), "RTX-9999"),
    ],
)  # fmt: skip
def test_a_bad_inference_plan_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str
) -> None:
    code, out, err = run(capsys, "plan", "flux.1-dev", "--mode", "infer", *argv)
    assert code == 2 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("argv", [("--quant", "q9"), ("--pipeline-offload", "disk")])
def test_a_value_outside_the_flag_choices_is_refused_by_the_parser(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["plan", "flux.1-dev", "--mode", "infer", "--gpu", "RTX-3060", *argv])
    assert exc.value.code == 2 and "invalid choice" in capsys.readouterr().err


def test_a_text_model_plan_refuses_the_pipeline_flags(capsys: pytest.CaptureFixture[str]) -> None:
    # a text job's --quant is its own weight format: QLoRA needs --lora-rank, and a pipeline's
    # formats are not a text model's
    code, _, err = run(capsys, "plan", "gpt2", "--gpu", "L4", "--quant", "nf4")
    assert code == 2 and "add --lora-rank" in err
    code, _, err = run(capsys, "plan", "gpt2", "--gpu", "L4", "--quant", "gguf-q8_0")
    assert code == 2 and "quant ('gguf-q8_0') must be one of" in err
    code, _, err = run(capsys, "plan", "gpt2", "--gpu", "L4", "--height", "512")
    assert code == 2 and "--height applies to diffusion pipelines only" in err


@pytest.fixture(scope="module")
def flux_mid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("diffusers")
    from tests.plan.test_diffusion_infer import mid_flux

    return mid_flux(tmp_path_factory.mktemp("cli-mid-flux"))


def _card(monkeypatch: pytest.MonkeyPatch, capacity_bytes: int) -> None:
    """A T4 of ``capacity_bytes`` for every door's get_gpu (no driver reservation)."""
    from memfit.hardware import catalog

    t4 = dataclasses.replace(
        catalog.get_gpu("T4"),
        driver_reserved_bytes=0,
        capacity_source=CARD,
        memory_bytes=capacity_bytes,
    )
    monkeypatch.setitem(catalog._INDEX, catalog._normalize("T4"), t4)


def test_an_estimate_that_does_not_fit_names_the_nearest_plan_and_the_command(
    capsys: pytest.CaptureFixture[str], flux_mid: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = ["--mode", "infer", "--height", "64", "--width", "64", "--precision", "bf16"]
    _card(monkeypatch, 10**12)
    _, out, _ = run(capsys, "plan", str(flux_mid), *base, "--gpu", "T4", "--json")
    asked = json.loads(out)["asked"]["need_bytes"]
    _card(monkeypatch, int(asked * 0.9))  # the call as asked needs more than the card
    code, out, _ = run(capsys, "estimate", str(flux_mid), *base, "--gpu", "T4")
    assert code == 1
    last = out.strip().splitlines()[-1]
    assert last.startswith("nearest change that fits: ")
    assert f"all plans: memfit plan {flux_mid} --mode infer --height 64 --width 64 --gpu T4" in last
    code, out, _ = run(capsys, "plan", str(flux_mid), *base, "--gpu", "T4", "--json")
    plans = json.loads(out)
    assert code == 0 and plans["fits"] and not plans["asked"]["fits"]
    first = plans["plans"][0]
    assert first["changes"][0]["change"] in last and first["memory_only"]
    assert all(p["need_bytes"] <= plans["budget"]["limit_bytes"] for p in plans["plans"])
    assert all(p["verdict"] == "fits" for p in plans["plans"])
    code, out, _ = run(capsys, "estimate", str(flux_mid), *base, "--gpu", "T4", "--json")
    hint = json.loads(out)["nearest_change_that_fits"]
    assert code == 1 and hint["changes"] == first["changes"]
