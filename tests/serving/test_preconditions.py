"""vLLM's own preconditions come before memory: a layout vLLM refuses at start-up "does not
start", with vLLM's error text (vllm/config/model.py ModelConfig.verify_with_parallel_config;
vllm/model_executor/layers/linear.py QKVParallelLinear via vllm/distributed/utils.py
ensure_divisibility)."""

from __future__ import annotations

import json

import pytest

from memfit.cli import main
from memfit.hardware.catalog import get_gpu
from memfit.models import resolve_model
from memfit.serving import simulate_startup
from memfit.serving.layout import parallel_error
from memfit.spec.serving import VllmConfig


def _startup(model: str, tp: int):
    spec = resolve_model(model).spec
    assert spec is not None
    return simulate_startup(spec, get_gpu("H100"), VllmConfig(tensor_parallel_size=tp))


def test_attention_heads_that_do_not_divide_by_tp_do_not_start_with_vllms_error():
    s = _startup("gpt2", 5)  # 12 heads
    assert not s.starts
    assert s.error == (
        "ValueError: Total number of attention heads (12) must be divisible by tensor parallel "
        "size (5)."
    )
    assert s.largest_max_model_len == 0 and s.smallest_gpu_memory_utilization is None
    assert any("(1, 2, 3, 4, 6, 12)" in n for n in s.notes)


@pytest.mark.parametrize("tp", [1, 2, 3, 4, 6, 12])
def test_a_tp_that_divides_the_heads_starts(tp):
    s = _startup("gpt2", tp)
    assert s.starts and s.error is None


def test_kv_heads_that_neither_divide_nor_are_divided_by_tp_do_not_start():
    # qwen2.5-7b: 28 query heads (divisible by 7 and 14), 4 K/V heads
    spec = resolve_model("qwen2.5-7b").spec
    assert spec is not None and (spec.text or spec).n_kv_heads == 4
    assert parallel_error(spec, tp=7)[0] == "AssertionError: 7 is not divisible by 4"
    assert parallel_error(spec, tp=14)[0] == "AssertionError: 14 is not divisible by 4"
    assert parallel_error(spec, tp=4) is None and parallel_error(spec, tp=2) is None
    assert not _startup("qwen2.5-7b", 7).starts


def test_llama_kv_heads_replicated_over_a_larger_tp_are_fine():
    spec = resolve_model("llama-3.1-8b").spec
    assert spec is not None
    assert parallel_error(spec, tp=16) is None  # 32 heads / 16, 8 K/V heads replicated twice


def test_the_cli_says_it_fails_exit_1_not_bad_input(capsys):
    assert main(["vllm", "gpt2", "--tensor-parallel-size", "5", "--gpu", "H100"]) == 1
    out = capsys.readouterr().out
    assert "FAILS: ValueError: Total number of attention heads (12) must be divisible" in out
    assert "STARTS" not in out
    # vLLM stops before loading the model: no KV-cache lines, no memory setting offered
    assert "KV cache" not in out and "--gpu-memory-utilization" not in out
    assert "--max-model-len" not in out
    assert main(["vllm", "gpt2", "-tp", "5", "--gpu", "H100", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["starts"] is False and "attention heads (12)" in data["error"]
