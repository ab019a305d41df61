"""benchmarks/gpu_issue19.py parses its arguments and skips cleanly where there is no CUDA."""

from __future__ import annotations

import json

import pytest
from benchmarks import gpu_issue19 as g19


def test_out_is_required() -> None:
    with pytest.raises(SystemExit) as exc:
        g19.parse_args([])
    assert exc.value.code == 2


def test_arguments_parse() -> None:
    args = g19.parse_args(["--out", "d", "--quick", "--steps", "50", "--no-predict"])
    assert (args.out, args.quick, args.steps, args.no_predict) == ("d", True, 50, True)


def test_without_cuda_it_says_so_and_exits_0(tmp_path, capsys, monkeypatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert g19.main(["--out", str(tmp_path / "o")]) == 0
    assert "no CUDA device; nothing measured" in capsys.readouterr().err
    assert not (tmp_path / "o" / "gpu_issue19.json").exists()


def test_the_run_uses_lengths_memfit_replays() -> None:
    from memfit.estimate.seqrun.dist import parse_seq_dist, step_lengths
    from memfit.spec.seqrun import StepPlan

    dist = parse_seq_dist(str(g19.RUN["seq_dist"]))
    plan = StepPlan(batch_size=int(g19.RUN["batch"]), n_steps=20, seed=int(g19.RUN["seed"]))
    lengths = step_lengths(dist, plan)
    assert len(lengths) == 20 and max(lengths) <= dist.max_len


def test_parts_default_to_all_and_take_a_subset() -> None:
    assert g19.parse_args(["--out", "d"]).parts == g19.PARTS
    assert g19.parse_args(["--out", "d", "--parts", "moe_fp8, blocks"]).parts == (
        "moe_fp8",
        "blocks",
    )


def test_an_unknown_part_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        g19.parse_args(["--out", "d", "--parts", "moe_fp9"])
    assert exc.value.code == 2
    assert "unknown part(s) ['moe_fp9']" in capsys.readouterr().err


def test_moe_configs_are_cut_to_a_few_layers_without_a_checkpoint_format() -> None:
    for name, _, _ in g19.moe.JOBS.values():
        config = g19.moe.reduced_config(name)
        assert config["num_hidden_layers"] == g19.moe.LAYERS
        assert "quantization_config" not in config
        if "layer_types" in config:
            assert len(config["layer_types"]) == g19.moe.LAYERS


def test_a_part_whose_package_is_missing_records_why(tmp_path, monkeypatch) -> None:
    real = g19.moe.importlib.util.find_spec
    monkeypatch.setattr(
        g19.moe.importlib.util, "find_spec", lambda n: None if n == "kernels" else real(n)
    )
    assert g19.main(["--out", str(tmp_path), "--dry-run", "--parts", "moe_mxfp4,qlora"]) == 0
    written = json.loads((tmp_path / "gpu_issue19_dry_run.json").read_text())
    assert written["moe_mxfp4"]["result"] == {
        "skipped": "skipped: kernels is not importable (pip install kernels)"
    }
    assert written["qlora"] == {"skipped": "skipped: no dry-run path (needs CUDA)"}


def test_mxfp4_without_its_hub_kernel_cached_is_skipped_not_downloaded(monkeypatch) -> None:
    monkeypatch.setattr(g19.moe.importlib.util, "find_spec", lambda n: object())
    monkeypatch.setattr(g19.moe, "kernel_cached", lambda repo: False)
    why = g19.moe.missing_dependency("moe_mxfp4")
    assert why is not None and g19.moe.MXFP4_KERNEL in why and "local cache" in why
    assert g19.moe.missing_dependency("moe_fp8") is None


def test_the_fp8_dry_run_builds_fp8_experts_on_meta(tmp_path) -> None:
    pytest.importorskip("transformers")
    argv = ["--out", str(tmp_path), "--dry-run", "--no-predict", "--parts", "moe_fp8"]
    assert g19.main(argv) == 0
    part = json.loads((tmp_path / "gpu_issue19_dry_run.json").read_text())["moe_fp8"]
    assert "error" not in part, part
    assert "warning" not in part["result"]
    built = part["result"]["built"]
    assert built["expert_modules"] == ["FP8Experts"]
    assert built["class"] == "Qwen3MoeForCausalLM"
    # far below the 2-layer model's bf16 size (the experts are one byte a weight)
    assert 2.0e9 < built["meta_tensor_bytes"] < 2.7e9


@pytest.mark.slow
def test_memfit_predicts_the_fp8_weights_transformers_builds(tmp_path) -> None:
    pytest.importorskip("transformers")
    assert g19.main(["--out", str(tmp_path), "--dry-run", "--parts", "moe_fp8"]) == 0
    result = json.loads((tmp_path / "gpu_issue19_dry_run.json").read_text())["moe_fp8"]["result"]
    built, predicted = result["built"]["meta_tensor_bytes"], result["memfit"]["components"]
    assert abs(predicted["parameters"] - built) / built < 1e-3


def test_the_block_modules_run_forward_and_backward_on_cpu() -> None:
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig

    small = dict(g19.LLAMA_8B, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                 num_key_value_heads=2)  # fmt: skip
    cfg = LlamaConfig(**small)
    cfg._attn_implementation = "sdpa"
    made, rotary = g19.block_modules(cfg, "cpu")
    x = torch.randn(2, 8, 64, requires_grad=True)
    cos_sin = rotary(x, torch.arange(8).unsqueeze(0))
    y = made["attention"](x, position_embeddings=cos_sin, attention_mask=None)[0]
    (y.sum() + made["mlp"](x).sum() + made["rmsnorm"](x).sum()).backward()
    assert x.grad is not None and x.grad.shape == x.shape
