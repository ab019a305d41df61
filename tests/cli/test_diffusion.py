"""`memfit estimate <pipeline>`: the pipeline route, its refusals (exit 2, one line) and listing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memfit.cli import main
from memfit.models.pipelines import find_pipeline, list_pipelines, pipeline_dir

#: a synthetic card whose capacity is its memory_bytes (observed reservation 0)
CARD = "test card: capacity = memory_bytes"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_every_bundled_pipeline_ships_each_component_config_it_declares() -> None:
    names = [p.name for p in list_pipelines()]
    assert {"flux.1-dev", "flux.1-schnell", "sdxl-base-1.0"} <= set(names)
    for p in list_pipelines():
        index = json.loads((p.path / "model_index.json").read_text(encoding="utf-8"))
        assert index["_class_name"] == p.pipeline
        for comp, entry in index.items():
            if comp.startswith("_") or not isinstance(entry, list) or entry[0] is None:
                continue
            if comp.startswith("tokenizer"):
                continue
            cfg = "scheduler_config.json" if comp == "scheduler" else "config.json"
            assert (p.path / comp / cfg).is_file(), f"{p.name}/{comp}/{cfg}"
        assert p.source.startswith("https://")


def test_a_pipeline_is_found_by_name_hub_id_or_directory(tmp_path: Path) -> None:
    assert find_pipeline("FLUX.1-dev") == find_pipeline("black-forest-labs/FLUX.1-dev")
    assert pipeline_dir("gpt2") is None
    (tmp_path / "model_index.json").write_text("{}")
    assert pipeline_dir(str(tmp_path)) == tmp_path


def test_memfit_models_lists_the_pipelines(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "models")
    assert code == 0
    assert "diffusion pipelines" in out and "flux.1-dev" in out and "FluxPipeline" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("flux.1-dev", "--pipeline-offload", "model"), "is a diffusion inference flag"),
        (("flux.1-dev", "--mode", "infer", "--offload", "params"), "--pipeline-offload"),
        (("flux.1-dev", "--mode", "infer", "--quant", "fp8"), "not a diffusion weight format"),
        (("flux.1-dev", "--mode", "infer", "--use-stream"), "add --pipeline-offload group"),
        (
            ("flux.1-dev", "--mode", "infer", "--num-blocks-per-group", "2"),
            "--num-blocks-per-group is a group-offload setting",
        ),
        (("flux.1-dev", "--mode", "infer", "--height", "1000"), "multiple of 16"),
        (("flux.1-dev", "--mode", "infer", "--precision", "amp-bf16"), "not a diffusion"),
        (
            ("wan2.2-ti2v-5b", "--mode", "infer", "--num-frames", "0"),
            "num_frames must be a positive whole number, got 0",
        ),
        (("gpt2", "--num-frames", "9"), "applies to diffusion pipelines only"),
    ],
)
def test_a_pipeline_job_memfit_cannot_answer_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str
) -> None:
    code, out, err = run(capsys, "estimate", *argv)
    assert code == 2
    assert message in err
    assert "Traceback" not in err and out == ""


def test_a_gpu_verdict_adds_the_cuda_context(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytest.importorskip("diffusers")
    from tests.estimate.diffusion.test_pipeline import tiny_flux

    root = tiny_flux(tmp_path)
    argv = ["estimate", str(root), "--mode", "infer", "--height", "64", "--width", "64"]
    code, out, _ = run(capsys, *argv, "--precision", "bf16", "--gpu", "T4", "--json")
    fits = json.loads(out)["fits"]
    assert code == 0 and fits["fits"]
    # the reserved peak (the allocator replay, cuBLAS workspaces included) plus the CUDA context;
    # the cuDNN convolution-workspace allowance on top is reported beside it, not required
    est = json.loads(out)
    need = est["peak_reserved_bytes"] + fits["overhead_bytes"]
    assert fits["need_bytes"] == need
    assert est["conv_workspace_allowance_bytes"] > 0
    upper = fits["need_with_conv_workspace_bytes"]
    assert upper == est["peak_reserved_upper_bytes"] + fits["overhead_bytes"]
    assert need <= upper <= need + est["conv_workspace_allowance_bytes"]
    assert fits["overhead_bytes"] > 0


def test_the_tensors_decide_the_verdict_and_a_need_within_the_headroom_is_tight(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # PyTorch's cuDNN path runs a plan with less workspace when the preferred one's cannot be
    # allocated, so a card between the tensors' need and the allowance's fits, and says why
    pytest.importorskip("diffusers")
    import dataclasses

    from tests.estimate.diffusion.test_pipeline import tiny_flux

    from memfit.estimate.verdict import headroom_bytes
    from memfit.hardware import catalog

    root = tiny_flux(tmp_path)
    argv = ["estimate", str(root), "--mode", "infer", "--height", "512", "--width", "512"]
    _, out, _ = run(capsys, *argv, "--precision", "bf16", "--gpu", "T4", "--json")
    fits = json.loads(out)["fits"]
    need, upper = fits["need_bytes"], fits["need_with_conv_workspace_bytes"]
    assert need < upper
    t4 = dataclasses.replace(catalog.get_gpu("T4"), driver_reserved_bytes=0, capacity_source=CARD)
    between = dataclasses.replace(t4, memory_bytes=(need + upper) // 2)
    assert need + headroom_bytes(between.memory_bytes) <= between.memory_bytes  # fits, headroom too
    monkeypatch.setitem(catalog._INDEX, catalog._normalize("T4"), between)  # every door's get_gpu
    code, out, _ = run(capsys, *argv, "--precision", "bf16", "--gpu", "T4")
    assert code == 0
    assert out.count("FITS on T4") == 1
    assert "the tensors fit; cuDNN's preferred convolution plans may want up to" in out
    # THE verdict rule (memfit.estimate.verdict): within the capacity but not its headroom is
    # tight, and exits 1 like does-not-fit
    tight = dataclasses.replace(t4, memory_bytes=need + headroom_bytes(need) // 2)
    monkeypatch.setitem(catalog._INDEX, catalog._normalize("T4"), tight)  # every door's get_gpu
    code, out, _ = run(capsys, *argv, "--precision", "bf16", "--gpu", "T4", "--json")
    assert code == 1 and json.loads(out)["fits"]["verdict"] == "tight"
    assert not json.loads(out)["fits"]["fits"]
    small = dataclasses.replace(t4, memory_bytes=need - 1)
    monkeypatch.setitem(catalog._INDEX, catalog._normalize("T4"), small)  # every door's get_gpu
    code, out, _ = run(capsys, *argv, "--precision", "bf16", "--gpu", "T4", "--json")
    assert code == 1 and not json.loads(out)["fits"]["fits"]
    assert json.loads(out)["fits"]["verdict"] == "does not fit"


def test_a_group_offloaded_quantized_pipeline_prints_its_formats_and_reserved_peak(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytest.importorskip("diffusers")
    from tests.estimate.diffusion.test_pipeline import tiny_flux

    root = tiny_flux(tmp_path)
    argv = ["estimate", str(root), "--mode", "infer", "--height", "64", "--width", "64"]
    extra = ["--pipeline-offload", "group", "--offload-type", "leaf_level", "--use-stream"]
    code, out, _ = run(capsys, *argv, *extra, "--quant", "gguf-q8_0")
    assert code == 0
    assert "reserved by the caching allocator" in out
    assert "gguf-q8_0" in out and "group offload (leaf_level, use_stream)" in out
    code, out, _ = run(capsys, *argv, "--layerwise-casting", "fp8", "--json")
    est = json.loads(out)
    assert code == 0 and est["job"]["layerwise_casting"] == "fp8"
    storage = {c["name"]: c["storage"] for c in est["components"]}
    assert storage["transformer"] == "fp8 layerwise" and storage["vae"] == ""


@pytest.mark.parametrize(
    "flag", [["--height", "512"], ["--layerwise-casting", "fp8"], ["--use-stream"]]
)
def test_a_pipeline_flag_on_a_model_that_is_not_a_pipeline_is_refused(
    capsys: pytest.CaptureFixture[str], flag: list[str]
) -> None:
    code, out, err = run(capsys, "estimate", "gpt2", *flag)
    assert code == 2 and out == ""
    assert f"{flag[0]} applies to diffusion pipelines only" in err


def test_a_wan_video_job_is_estimated_with_its_frames_from_the_command_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytest.importorskip("diffusers")
    from tests.estimate.diffusion.test_wan import _tree

    root = _tree(tmp_path)
    argv = ["estimate", str(root), "--mode", "infer", "--height", "32", "--width", "48"]
    code, out, err = run(capsys, *argv, "--num-frames", "6", "--precision", "fp32", "--json")
    assert code == 0, err
    est = json.loads(out)
    assert est["pipeline"] == "WanPipeline" and est["job"]["num_frames"] == 6
    assert [s["stage"] for s in est["stages"]] == ["text_encode", "denoise", "vae_decode"]
    assert any("rounds it to 7" in n for n in est["notes"])
    code, text, _ = run(capsys, *argv, "--num-frames", "5", "--pipeline-offload", "model")
    assert code == 0 and "WanPipeline" in text and "host RAM for offloaded weights" in text
