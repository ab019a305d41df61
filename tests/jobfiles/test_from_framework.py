"""`--from` a torchtune recipe or a LitGPT config on estimate / fit / plan: the same routing as
`memfit check` (its framework engine when installed), and who answered, said."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

import memfit
from memfit.cli import main
from memfit.estimate.trace import frameworks

EXAMPLES = Path(__file__).parent / "examples"
LITGPT = str(EXAMPLES / "litgpt-llama-3.1-8b-qlora.yaml")
TORCHTUNE = str(EXAMPLES / "torchtune-llama3_1-8B_qlora_single_device.yaml")
TRL = str(EXAMPLES / "trl-sft-config.yaml")

#: tests/estimate/trace/frameworks/test_torchtune.py's tiny Llama, as a recipe whose
#: checkpoint_dir holds the same model's Hugging Face config (transformers' side of the search).
TINY = {
    "vocab_size": 4096,
    "num_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 2,
    "embed_dim": 256,
    "max_seq_len": 256,
    "intermediate_dim": 512,
}
HF_CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 4096,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "tie_word_embeddings": True,
}


@pytest.fixture
def tiny_recipe(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(HF_CONFIG))
    recipe = {
        "model": {
            "_component_": "torchtune.models.llama3_2.lora_llama3_2",
            **TINY,
            "lora_attn_modules": ["q_proj", "v_proj"],
            "apply_lora_to_mlp": True,
            "lora_rank": 8,
            "lora_alpha": 16,
        },
        "tokenizer": {
            "_component_": "torchtune.models.llama3.llama3_tokenizer",
            "max_seq_len": 128,
        },
        "checkpointer": {
            "_component_": "torchtune.training.FullModelHFCheckpointer",
            "checkpoint_dir": str(tmp_path / "model"),
            "model_type": "LLAMA3_2",
        },
        "batch_size": 2,
        "gradient_accumulation_steps": 1,
        "optimizer": {"_component_": "torch.optim.AdamW", "lr": 3e-4},
        "dtype": "bf16",
        "enable_activation_checkpointing": False,
    }
    path = tmp_path / "tiny_lora.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return str(path)


@pytest.fixture
def installed(monkeypatch):
    monkeypatch.setattr(frameworks, "missing", lambda name: None)


@pytest.fixture
def framework_calls(monkeypatch):
    """Record the framework engine's calls; answer with transformers' analytic estimate of the
    same workload (the frameworks' own traces are tests/estimate/trace/frameworks' business)."""
    calls = []

    def fake(framework, data, workload, *, gpu=None, **options):
        calls.append((framework, data, workload))
        model = data["checkpointer"]["checkpoint_dir"] if "checkpointer" in data else None
        model = model if model and Path(model).is_dir() else "meta-llama/Llama-3.1-8B"
        return memfit.estimate(model, workload, gpu=gpu, engine="analytic")

    monkeypatch.setattr(frameworks, "estimate_with_framework", fake)
    return calls


@pytest.fixture
def analytic_search(monkeypatch):
    """fit's search without the trace engine's confirmation (seconds per candidate here): this
    file tests what happens after the search, not the search."""
    import dataclasses

    from memfit.plan import solve

    real = solve.resolve_engines

    def no_confirm(*args):
        return dataclasses.replace(real(*args), confirm=None)

    monkeypatch.setattr(solve, "resolve_engines", no_confirm)


@pytest.fixture
def analytic_estimate(monkeypatch):
    """estimate's default engine (auto: one answer is traced) on the analytic engine: what is
    tested here is who answers, not transformers' trace."""
    import importlib

    package = importlib.import_module("memfit.estimate")  # the package; memfit.estimate: its API
    real = package.estimate
    analytic = lambda *a, **k: real(*a, **{**k, "engine": "analytic"})  # noqa: E731
    for where in ("memfit.estimate", "memfit.cli.check"):  # and the check door
        monkeypatch.setattr(importlib.import_module(where), "estimate", analytic)
    import dataclasses

    from memfit import api

    def routed(*a, options, **k):  # the estimate door calls the route with its options
        return api.estimate(*a, options=dataclasses.replace(options, engine="analytic"), **k)

    monkeypatch.setattr(importlib.import_module("memfit.cli.estimate"), "estimate", routed)


def run(capsys, *argv):
    code = main([*map(str, argv), "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_estimate_from_a_recipe_goes_to_the_framework_as_check_sends_it(
    capsys, installed, framework_calls
):
    _, est = run(capsys, "estimate", "--from", TORCHTUNE, "--gpu", "A100-80GB")
    _, check = run(capsys, "check", TORCHTUNE, "--gpu", "A100-80GB")
    assert est["answered_by"] == check["answered_by"] == "torchtune's model + recipe step"
    assert est["note"] is None
    (fw, data, workload), (fw2, data2, workload2) = framework_calls
    assert (fw, data) == (fw2, data2) == ("torchtune", data)
    assert workload == workload2  # the same job as `memfit check` traces


def test_without_the_package_estimate_falls_back_and_names_the_extra(
    capsys, monkeypatch, framework_calls, tiny_recipe, analytic_estimate
):
    monkeypatch.setattr(
        frameworks, "missing", lambda name: f"{name} is not installed: pip install 'memfit[{name}]'"
    )
    code, est = run(capsys, "estimate", "--from", tiny_recipe)
    assert code == 0 and framework_calls == []
    assert est["answered_by"] == "transformers' model, the framework's settings (analytic engine)"
    assert "pip install 'memfit[torchtune]'" in est["note"]


def test_an_explicit_engine_keeps_transformers_model(capsys, installed, framework_calls):
    _, est = run(capsys, "estimate", "--from", LITGPT, "--engine", "analytic")
    assert framework_calls == []
    assert est["answered_by"] == (
        "transformers' model, the framework's settings (analytic engine, as asked)"
    )


def test_a_flag_that_sets_what_the_framework_reads_from_its_file_falls_back_and_says_so(
    capsys, installed, framework_calls, tiny_recipe, analytic_estimate
):
    _, est = run(capsys, "estimate", "--from", tiny_recipe, "--lora-rank", "4")
    assert framework_calls == [] and est["workload"]["lora_rank"] == 4
    assert est["note"].startswith("--lora-rank overrides the torchtune file")
    assert main(["estimate", "--from", TORCHTUNE, "--lora-rank", "4", "--engine", "framework"]) == 2
    assert "edit the file instead" in capsys.readouterr().err


def test_batch_and_sequence_flags_still_go_to_the_framework(capsys, installed, framework_calls):
    _, est = run(capsys, "estimate", "--from", TORCHTUNE, "--batch", "1", "--seq", "512")
    ((_, _, workload),) = framework_calls
    assert (workload.batch_size, workload.seq_len) == (1, 512)
    assert est["answered_by"] == "torchtune's model + recipe step"


def test_engine_framework_needs_a_framework_file(capsys):
    assert main(["estimate", "gpt2", "--engine", "framework"]) == 2
    assert "name it with --from FILE" in capsys.readouterr().err
    assert main(["estimate", "--from", TRL, "--engine", "framework"]) == 2
    assert "needs a torchtune recipe or a LitGPT config" in capsys.readouterr().err


def test_engine_framework_without_the_package_is_exit_2_naming_the_extra(capsys, monkeypatch):
    monkeypatch.setattr(
        frameworks, "missing", lambda name: f"{name} is not installed: pip install 'memfit[{name}]'"
    )
    assert main(["fit", "--from", TORCHTUNE, "--solve", "batch", "--engine", "framework"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'memfit[torchtune]'" in err and "Traceback" not in err


def test_fit_searches_on_transformers_and_traces_its_answer_once_through_the_framework(
    capsys, installed, framework_calls, tiny_recipe, analytic_search
):
    code, out = run(capsys, "fit", "--from", tiny_recipe, "--solve", "batch", "--gpu-memory", "1GB")
    assert code == 0 and out["max_batch"] > 2
    ((fw, _, workload),) = framework_calls  # one trace: the answer, not every candidate
    assert fw == "torchtune" and workload.batch_size == out["max_batch"]
    assert out["answered_by"].startswith("searched with transformers' model")
    assert out["answered_by"].endswith(f"answered the estimate of batch {out['max_batch']}")
    assert out["framework_estimate"]["fits"] is True
    assert "the framework's own code (torchtune's model + recipe step)" in out["note"]


def test_fit_is_exit_1_when_the_framework_says_the_answer_does_not_fit(
    capsys, installed, monkeypatch, tiny_recipe, analytic_search
):
    import dataclasses

    def larger(framework, data, workload, *, gpu=None, **options):  # a framework needing more
        big = dataclasses.replace(workload, batch_size=workload.batch_size * 4)
        return memfit.estimate(data["checkpointer"]["checkpoint_dir"], big, engine="analytic")

    monkeypatch.setattr(frameworks, "estimate_with_framework", larger)
    code, out = run(capsys, "fit", "--from", tiny_recipe, "--solve", "batch", "--gpu-memory", "1GB")
    assert code == 1 and out["framework_estimate"]["fits"] is False
    assert "does NOT fit" in out["note"]


def test_plan_searches_on_transformers_and_says_its_plans_were_not_traced(
    capsys, installed, framework_calls, tiny_recipe
):
    code, out = run(
        capsys,
        "plan",
        "--from",
        tiny_recipe,
        "--gpu",
        "L4",
        "--confirm",
        "none",
        "--lora-rank",
        "4",
    )
    assert code == 0 and framework_calls == []
    assert out["answered_by"].startswith("searched with transformers' model")
    assert "not traced through torchtune's own code" in out["note"]


def test_files_of_other_formats_answer_as_before(capsys):
    _, est = run(capsys, "estimate", "--from", TRL, "--engine", "analytic")
    assert "answered_by" not in est


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torchtune") is None, reason="memfit[torchtune]")
def test_estimate_from_a_recipe_is_checks_torchtune_trace(capsys, tiny_recipe):
    _, est = run(capsys, "estimate", "--from", tiny_recipe, "--gpu", "L4")
    _, check = run(capsys, "check", tiny_recipe, "--gpu", "L4")
    assert est["answered_by"] == check["answered_by"] == "torchtune's model + recipe step"
    for d in (est, check["estimate"]):
        d.pop("answered_by", None), d.pop("note", None)
        d["trace"].pop("wall_s", None)
    assert est == check["estimate"]
    assert est["device_used_bytes"] > 0
