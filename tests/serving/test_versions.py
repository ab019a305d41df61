"""The vLLM version matrix: every minor release since 0.4 maps to a modelled row, each row's
constants are the values its cited source gives, and the installed vLLM (when importable) agrees."""

from __future__ import annotations

import importlib.util

import pytest

from memfit.errors import NotModelledError, SpecError
from memfit.hardware.catalog import get_gpu
from memfit.models import resolve_model
from memfit.serving import VERSIONS, get_version, simulate_startup
from memfit.serving.versions import LATEST_MINOR
from memfit.spec.serving import VllmConfig
from memfit.units import GiB, MiB

#: (row, sampler B/logit, non-torch TP=1, non-torch TP>1, hybrid, tokens from concurrency,
#: CUDA graphs in the budget, the figure's source): written out from the cited logs, so that a
#: constant changed without its source fails here.
CITED = [
    ("0.6", 4.0, int(1.79 * GiB), int(3.58 * GiB), False, False, False, "pull/10511"),
    ("0.9", 38.3, 130 * MiB, int(0.55 * GiB), False, False, False, "llm-d-benchmark"),
    ("0.11", 38.3, 130 * MiB, int(0.55 * GiB), True, False, False, "llm-d-benchmark"),
    ("0.19", 14.9, int(0.25 * GiB), int(2.1 * GiB), True, True, False, "llm-d-planner"),
    ("0.20", 14.9, int(0.25 * GiB), int(2.1 * GiB), True, True, True, "pypi.org/project/vllm"),
    # 0.34: the extensible KV cache returns a 0 graph estimate (graphs are measured instead)
    ("0.34", 14.9, int(0.25 * GiB), int(2.1 * GiB), True, True, False, "vllm/0.34.0"),
]


@pytest.mark.parametrize(("row", "sampler", "nt1", "ntp", "hybrid", "conc", "cg", "src"), CITED)
def test_each_rows_constants_are_its_cited_values(
    row: str, sampler: float, nt1: int, ntp: int, hybrid: bool, conc: bool, cg: bool, src: str
) -> None:
    v = VERSIONS[row]
    assert (v.sampler_bytes_per_logit, v.non_torch_bytes, v.non_torch_tp_bytes) == (
        sampler, nt1, ntp,
    )  # fmt: skip
    assert (v.hybrid_allocator, v.tokens_from_concurrency, v.cudagraph_in_budget) == (
        hybrid, conc, cg,
    )  # fmt: skip
    assert src in v.source and v.source.startswith("https://")
    assert v.covers, f"row {row} says nothing of what was read"


def test_every_table_row_is_in_the_matrix() -> None:
    assert {c[0] for c in CITED} == set(VERSIONS)


@pytest.mark.parametrize("minor", range(4, LATEST_MINOR + 1))
def test_every_minor_release_up_to_the_current_one_is_modelled(minor: int) -> None:
    v = get_version(f"0.{minor}.0")
    assert v.engine == ("v0" if minor < 8 else "v1")
    assert v.cudagraph_in_budget == (20 <= minor < 34)
    assert v.hybrid_allocator == (minor >= 10)
    assert v.extensible_kv_cache == (minor >= 34)


def test_a_release_after_the_current_one_is_said_not_modelled_with_the_range() -> None:
    with pytest.raises(
        NotModelledError, match=rf"memfit models vLLM 0.4 to 0.{LATEST_MINOR}.*0.{LATEST_MINOR}"
    ):
        get_version(f"0.{LATEST_MINOR + 1}.0")
    with pytest.raises(SpecError, match=rf"memfit models vLLM 0.4 to 0.{LATEST_MINOR}"):
        get_version("0.3.3")


def test_from_0_20_the_cuda_graph_estimate_comes_out_of_the_kv_budget() -> None:
    spec = resolve_model("llama-3.1-8b").spec
    assert spec is not None
    runs = {  # the same utilization (0.20's default is 0.92, 0.19's 0.9)
        v: simulate_startup(
            spec,
            get_gpu("H100"),
            VllmConfig(max_model_len=8192, vllm_version=v, gpu_memory_utilization=0.9),
        )
        for v in ("0.19", "0.20")
    }
    gap = runs["0.19"].available_kv_bytes - runs["0.20"].available_kv_bytes
    assert gap == runs["0.20"].cuda_graph_estimate_bytes > 0
    assert any("Estimated CUDA graph memory" in line for line in runs["0.20"].log_lines())
    eager = simulate_startup(
        spec,
        get_gpu("H100"),
        VllmConfig(
            max_model_len=8192, vllm_version="0.20", enforce_eager=True, gpu_memory_utilization=0.9
        ),
    )
    assert eager.available_kv_bytes == runs["0.19"].available_kv_bytes


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_the_installed_vllm_maps_to_a_row_that_agrees_with_it() -> None:  # pragma: no cover
    import vllm  # type: ignore[import-not-found]
    import vllm.envs as envs  # type: ignore[import-not-found]

    row = get_version(vllm.__version__)
    has_estimate = hasattr(envs, "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS")
    if row.extensible_kv_cache:  # the estimate is 0 with the extensible KV cache
        from vllm.config import CacheConfig  # type: ignore[import-not-found]

        assert hasattr(CacheConfig, "resolved_gpu_memory_utilization")
    elif row.cudagraph_in_budget:
        assert has_estimate and bool(envs.VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS)
    elif has_estimate:
        assert not bool(envs.VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS)
