"""SglangConfig: launch_server's flags, validated once, every problem named with its flag."""

from __future__ import annotations

import pytest

from memfit.errors import SpecError
from memfit.spec import SglangConfig


def test_the_defaults_are_sglangs_and_leave_gpu_dependent_ones_unset() -> None:
    c = SglangConfig()
    assert (c.tp_size, c.page_size, c.kv_cache_dtype) == (1, 1, "auto")
    assert c.mem_fraction_static is None and c.chunked_prefill_size is None
    assert c.cuda_graph_max_bs is None


def test_every_problem_is_reported_together_with_its_flag() -> None:
    with pytest.raises(SpecError) as err:
        SglangConfig(tp_size=0, context_length=0, chunked_prefill_size=-5)
    text = str(err.value)
    assert "--tp-size (0) must be 1 or more" in text
    assert "--context-length (0) must be 1 or more" in text
    assert "--chunked-prefill-size (-5) must be 1 or more, or -1" in text


def test_a_mem_fraction_outside_0_1_is_refused() -> None:
    with pytest.raises(
        SpecError, match=r"--mem-fraction-static \(1.5\) must be a number in \(0, 1\)"
    ):
        SglangConfig(mem_fraction_static=1.5)


def test_an_unknown_kv_cache_dtype_lists_sglangs_choices() -> None:
    with pytest.raises(
        SpecError, match=r"--kv-cache-dtype \('fp8'\) must be one of auto, fp8_e5m2"
    ):
        SglangConfig(kv_cache_dtype="fp8")


def test_an_unmodelled_quantization_is_named() -> None:
    with pytest.raises(SpecError, match=r"--quantization \('gguf'\) is not modelled for SGLang"):
        SglangConfig(quantization="gguf")


def test_expert_parallel_must_divide_tensor_parallel() -> None:
    with pytest.raises(SpecError, match=r"--ep-size \(3\) must divide --tp-size \(8\)"):
        SglangConfig(tp_size=8, ep_size=3)


def test_dp_attention_splits_attention_over_tp_over_dp_gpus() -> None:
    assert SglangConfig(tp_size=8, dp_size=8, enable_dp_attention=True).attn_tp_size == 1
    assert SglangConfig(tp_size=8, dp_size=8).attn_tp_size == 8
    with pytest.raises(SpecError, match=r"--dp-size \(3\) must divide --tp-size \(8\)"):
        SglangConfig(tp_size=8, dp_size=3, enable_dp_attention=True)


def test_an_unmodelled_version_is_refused() -> None:
    with pytest.raises(SpecError, match=r"--sglang-version \('0.3'\) must be an SGLang release"):
        SglangConfig(sglang_version="0.3")
    with pytest.raises(SpecError, match=r"--sglang-version \('0.6.1'\) must be an SGLang release"):
        SglangConfig(sglang_version="0.6.1")


@pytest.mark.parametrize(
    ("version", "series"),
    [
        ("0.4.1", "0.4"),
        ("0.4.6.post2", "0.4"),
        ("0.4.7", "0.4.7"),
        ("0.4.10", "0.4.7"),
        ("0.5.2", "0.4.7"),
        ("0.5.3", "0.5"),
        ("0.5.19", "0.5"),
        ("0.5", "0.5"),
        ("0.4", "0.4"),
    ],
)
def test_a_release_maps_to_the_series_of_its_default_rule(version: str, series: str) -> None:
    assert SglangConfig(sglang_version=version).series == series
