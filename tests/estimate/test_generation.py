"""generate() beam search and StaticCache: estimated on both engines, checked against real
transformers on CPU (the cache it allocates)."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest

from memfit.errors import NotModelledError, SpecError
from memfit.estimate import estimate
from memfit.estimate.generation import _static_cache_bytes
from memfit.models import ModelSpec
from memfit.spec import WorkloadSpec

TINY = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 512,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": True,
}


def _infer(**kw: object) -> WorkloadSpec:
    return WorkloadSpec(mode="infer", precision="bf16", seq_len=1024, new_tokens=16, **kw)  # type: ignore[arg-type]


def test_beam_search_costs_what_batch_times_beams_costs() -> None:
    beams = estimate("qwen2.5-0.5b", _infer(num_beams=4), engine="analytic")
    batch = estimate("qwen2.5-0.5b", _infer(batch_size=4), engine="analytic")
    assert beams.peak_allocated_bytes == batch.peak_allocated_bytes
    assert beams.workload["num_beams"] == 4 and "beam search" in beams.notes[-1]


def test_static_cache_holds_the_full_length_from_the_prefill_on() -> None:
    dyn = estimate("qwen2.5-0.5b", _infer(batch_size=8), engine="analytic")
    static = estimate(
        "qwen2.5-0.5b", _infer(batch_size=8, cache_implementation="static"), engine="analytic"
    )
    full = 2 * 8 * 24 * 2 * 64 * 2 * (1024 + 16 - 1)  # K+V x batch x layers x kv heads x dim x bf16
    assert static.phases["prefill"].components["kv_cache"] == full
    assert dyn.phases["prefill"].components["kv_cache"] < full
    assert static.peak_allocated_bytes > dyn.peak_allocated_bytes


def test_beams_and_static_cache_need_generation() -> None:
    with pytest.raises(SpecError, match=r"num_beams \(2\) needs generation"):
        WorkloadSpec(mode="infer", num_beams=2)
    with pytest.raises(SpecError, match="cache_implementation 'static' needs generation"):
        WorkloadSpec(mode="train", cache_implementation="static")
    with pytest.raises(SpecError, match=r"cache_implementation \('paged'\) must be one of"):
        WorkloadSpec(mode="infer", new_tokens=4, cache_implementation="paged")


def test_static_cache_of_an_encoder_decoder_is_said_not_modelled() -> None:
    with pytest.raises(NotModelledError, match="decoder-only"):
        estimate("t5-small", _infer(cache_implementation="static"), engine="analytic")


@pytest.mark.slow  # imports transformers and builds a model (~30 s on this machine)
@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="no transformers")
def test_static_cache_bytes_match_what_transformers_allocates_on_cpu() -> None:
    import torch
    import transformers

    config = transformers.Qwen2Config(**{k: v for k, v in TINY.items() if k != "architectures"})
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).to(torch.bfloat16).eval()
    ids = torch.randint(0, 256, (3, 10))
    out = model.generate(
        ids, max_new_tokens=5, min_new_tokens=5, do_sample=False,
        cache_implementation="static", return_dict_in_generate=True,
    )  # fmt: skip
    cache = out.past_key_values
    measured = sum(
        t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)
    )
    source = SimpleNamespace(spec=ModelSpec.from_config(TINY))
    w = WorkloadSpec(mode="infer", precision="bf16", batch_size=3, seq_len=10, new_tokens=5)
    assert _static_cache_bytes(source, w) == measured
    beams = model.generate(
        ids, max_new_tokens=3, min_new_tokens=3, do_sample=False, num_beams=2,
        return_dict_in_generate=True,
    )  # fmt: skip
    assert beams.past_key_values.layers[0].keys.shape[0] == 3 * 2  # the cache runs at batch x K
