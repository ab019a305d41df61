"""`fit / plan / upgrade --runtime sglang | llama.cpp` (memfit.cli.runtimes): the same answers
`memfit sglang` and `memfit llama-server` give, reached from the commands people already use."""

from __future__ import annotations

import json

import pytest

import memfit
from memfit.cli import main
from memfit.spec import LlamaCppJob, SglangConfig


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_fit_runtime_sglang_solves_the_requests_the_kv_pool_holds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "fit", "llama-3.1-8b", "--runtime", "sglang", "--gpu", "L4",
                       "--solve", "concurrency", "--seq", "8192", "--json")  # fmt: skip
    record = json.loads(out)
    value, s = memfit.fit("llama-3.1-8b", SglangConfig(context_length=8192), gpu="L4",
                          solve="max-running-requests")  # fmt: skip
    assert code == 0 and record["max_value"] == value > 0
    assert s is not None and value == s.max_total_num_tokens // 8192


def test_fit_runtime_llama_cpp_gives_memfit_llama_server_s_largest_values(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "fit", "llama-3.1-70b:Q4_K_M", "--runtime", "llama.cpp",
                       "--gpu", "RTX-4090", "--solve", "n-gpu-layers", "--seq", "8192",
                       "--json")  # fmt: skip
    record = json.loads(out)
    code2, out2, _ = run(capsys, "llama-server", "llama-3.1-70b:Q4_K_M", "-c", "8192", "-np",
                         "1", "--gpu", "RTX-4090", "--json")  # fmt: skip
    direct = json.loads(out2)
    assert code == 0 and code2 == 1  # all 81 layers do not fit; some do
    assert record["max_value"] == direct["largest_n_gpu_layers"] > 0
    value, _ = memfit.fit("llama-3.1-70b:Q4_K_M", LlamaCppJob(ctx_size=8192, n_parallel=1),
                          gpu="RTX-4090", solve="n-gpu-layers")  # fmt: skip
    assert value == record["max_value"]


def test_plan_runtime_sglang_says_how_many_requests_it_holds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["plan", "llama-3.1-8b", "--runtime", "sglang", "--mode", "infer", "--gpu", "L4",
            "--seq", "8192", "--json"]  # fmt: skip
    code, out, _ = run(capsys, *args, "--concurrency", "1")
    held = json.loads(out)["max_requests"]
    assert code == 0 and held >= 1
    code, out, _ = run(capsys, *args, "--concurrency", str(held + 1))
    assert code == 1 and json.loads(out)["fits"] is False


@pytest.mark.parametrize("runtime", ["vllm", "sglang", "llama.cpp"])
def test_a_serving_runtime_without_mode_is_inference(
    capsys: pytest.CaptureFixture[str], runtime: str
) -> None:
    """``plan MODEL --runtime R --gpu G`` (no --mode): a server serves; the answer is the same
    as with ``--mode infer``, not a "pass --mode infer" error."""
    argv = ["plan", "qwen2.5-7b", "--runtime", runtime, "--gpu", "L4", "--json"]
    code, out, err = run(capsys, *argv)
    want_code, want, _ = run(capsys, *argv, "--mode", "infer")
    assert code == want_code != 2, err
    assert json.loads(out) == json.loads(want)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["fit", "llama-3.1-8b", "--runtime", "sglang", "--gpu", "L4", "--solve", "batch"],
         "solve max-model-len or concurrency"),
        (["fit", "llama-3.1-8b", "--runtime", "llama.cpp", "--solve", "seq"], "needs --gpu NAME"),
        (["plan", "llama-3.1-8b", "--runtime", "llama.cpp", "--gpu", "L4", "--mode", "train"],
         "pass --mode infer"),
        (["fit", "llama-3.1-8b", "--gpu", "L4", "--solve", "n-gpu-layers"],
         "add --runtime llama.cpp"),
    ],
)  # fmt: skip
def test_runtime_misuse_is_bad_input(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2 and message in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "reason", "vllm"),
    [
        (["sglang", "t5-small"], "encoder-decoder", False),
        (["llama-server", "gpt-oss-20b"], "no llama.cpp tensor table", True),
        (["llama-server", "t5-small"], "no llama.cpp tensor table", False),
        (["fit", "gpt-oss-20b", "--runtime", "llama.cpp", "--solve", "max-model-len"],
         "no llama.cpp tensor table", True),
        (["plan", "t5-small", "--runtime", "sglang", "--mode", "infer"], "encoder-decoder", False),
    ],
)  # fmt: skip
def test_a_serving_question_memfit_does_not_model_is_said_with_the_nearest_answer(
    capsys: pytest.CaptureFixture[str], argv: list[str], reason: str, vllm: bool
) -> None:
    """issue 31: not modelled is not bad input (exit 1, never 2), and names what memfit can
    answer: vLLM where memfit models the model there, its inference outside any server."""
    code, out, err = run(capsys, *argv, "--gpu", "H100", "--json")
    record = json.loads(out)
    assert code == 1 and not err and record["modelled"] is False and reason in record["reason"]
    model = argv[1]
    assert record["nearest_commands"][-1].startswith(f"memfit estimate {model} --mode infer")
    assert any(c.startswith("memfit vllm") for c in record["nearest_commands"]) is vllm
