"""memfit.serving.cudagraphs: vLLM's CUDA-graph memory against the figures its logs printed.

The logged figures are the llm-d-planner vLLM v0.19.0 H100 runs (github.com/jgchn/llm-d-planner,
accuracy/results/v0.19.0/logs/ at commit 6417620b: the DEBUG lines "Estimated FULL CUDA graph
memory: X MiB first-capture + (51-1) x Y MiB per-graph" and "Graph capturing finished … took
X GiB")."""

from __future__ import annotations

import pytest

from memfit.errors import SpecError
from memfit.hardware.catalog import get_gpu
from memfit.models import ModelSpec, resolve_model
from memfit.serving import simulate_startup
from memfit.serving.command import hub_id
from memfit.serving.cudagraphs import (
    CAPTURE_PER_GRAPH,
    FA_MAX_SPLITS_FOR_CUDA_GRAPH,
    CudaGraphPlan,
    default_max_capture_size,
    fa_split_workspace_bytes,
    is_mm_prefix_lm,
    plan_cudagraphs,
)
from memfit.serving.startup import graph_shape
from memfit.serving.vision import served_spec
from memfit.spec.serving import VllmConfig
from memfit.units import GiB, MiB

H100_LOG_TOTAL = int(79.19 * GiB)  # "79.19 GiB" in the llm-d-planner v0.19.0 H100 logs


def _spec(name: str, *, served: bool = False) -> ModelSpec:
    spec = resolve_model(name).spec
    assert spec is not None
    return served_spec(spec, hub_id(name)) if served else spec


def _workspace(name: str, tp: int) -> int:
    layers, moe, heads, dv, fa = graph_shape(_spec(name), tp=tp, pp=1, minor=19)
    assert fa
    return fa_split_workspace_bytes(largest_full=512, n_heads_per_rank=heads, head_dim_v=dv)


@pytest.mark.parametrize(
    ("name", "tp", "logged_mib"),
    [
        ("llama-3.1-8b", 1, 260),
        ("llama-3.1-8b", 2, 132),
        ("llama-3.1-8b", 4, 70),
        ("qwen2.5-7b", 1, 228),
        ("qwen2.5-7b", 4, 60),
        ("phi-4", 1, 328),
        ("qwen2.5-72b", 4, 142),
        ("deepseek-v2-lite", 1, 522),  # MLA: 16 heads x the 512-wide kv_lora_rank latent
    ],
)
def test_split_workspace_is_the_full_modes_logged_first_capture(
    name: str, tp: int, logged_mib: int
) -> None:
    # The first FULL capture is the workspace plus that graph's own memory, which the same logs
    # sample at 2-14 MiB per graph: the workspace must sit at most 16 MiB below the logged figure.
    ws = _workspace(name, tp)
    assert 0 <= logged_mib * MiB - ws <= 16 * MiB


def test_split_workspace_is_32_fp32_splits_of_the_largest_full_batch() -> None:
    assert FA_MAX_SPLITS_FOR_CUDA_GRAPH == 32
    # out_accum [32, 512, 32 heads, 128] + softmax_lse_accum [32, 512, 32], 4 bytes each
    assert (
        fa_split_workspace_bytes(largest_full=512, n_heads_per_rank=32, head_dim_v=128)
        == 32 * 512 * 32 * (128 + 1) * 4
    )


def test_a_smaller_max_num_seqs_shrinks_the_workspace_with_the_largest_full_graph() -> None:
    def plan(seqs: int) -> tuple[int, int]:
        p = plan_cudagraphs(
            minor=19,
            engine="v1",
            max_num_seqs=seqs,
            max_num_batched_tokens=8192,
            n_layers=32,
            enforce_eager=False,
            n_heads_per_rank=32,
            head_dim_v=128,
        )
        return p.n_graphs, p.capture_bytes

    (n512, c512), (n128, c128) = plan(512), plan(128)
    per_graph = CAPTURE_PER_GRAPH[0] + 32 * CAPTURE_PER_GRAPH[1]
    ws = fa_split_workspace_bytes(largest_full=512, n_heads_per_rank=32, head_dim_v=128)
    # fewer graphs (piecewise sizes up to 2 x 128, FULL up to 128) and a quarter of the workspace
    assert c512 - c128 == (n512 - n128) * per_graph + ws * 3 // 4


def test_moe_layers_add_their_own_per_graph_term() -> None:
    def capture(moe: int) -> int:
        return plan_cudagraphs(
            minor=19,
            engine="v1",
            max_num_seqs=1024,
            max_num_batched_tokens=8192,
            n_layers=48,
            enforce_eager=False,
            n_moe_layers=moe,
        ).capture_bytes

    assert capture(48) - capture(0) == 102 * 48 * CAPTURE_PER_GRAPH[2]
    assert CAPTURE_PER_GRAPH[2] > 0


def test_gemma3_is_an_mm_prefix_checkpoint_from_0_13_only_as_the_multimodal_type() -> None:
    assert is_mm_prefix_lm("gemma3", 19) and is_mm_prefix_lm("paligemma", 13)
    assert not is_mm_prefix_lm("gemma3", 12)  # before ModelConfig.is_mm_prefix_lm
    assert not is_mm_prefix_lm("gemma3_text", 19)  # a text-only checkpoint keeps FlashAttention
    assert not is_mm_prefix_lm("molmo2", 15) and is_mm_prefix_lm("molmo2", 16)
    assert not is_mm_prefix_lm("bagel", 17) and is_mm_prefix_lm("bagel", 18)
    assert not is_mm_prefix_lm("gemma3", 19, declared=False)  # the config's own flag wins
    assert is_mm_prefix_lm("gemma3", 16, declared=False)  # ... from 0.18


def test_gemma3_it_captures_no_split_workspace() -> None:
    *_, fa = graph_shape(_spec("gemma-3-12b", served=True), tp=1, pp=1, minor=19)
    assert not fa
    *_, fa = graph_shape(_spec("gemma-2-9b"), tp=1, pp=1, minor=19)
    assert fa


def _capture_gib(name: str, *, tp: int = 1, served: bool = False) -> float:
    config = VllmConfig(
        vllm_version="0.19.0",
        gpu_memory_utilization=0.95,
        max_model_len=8192,
        tensor_parallel_size=tp,
    )
    s = simulate_startup(
        _spec(name, served=served), get_gpu("H100"), config, total_bytes=H100_LOG_TOTAL
    )
    return s.cuda_graph_bytes / GiB


@pytest.mark.parametrize(
    ("name", "tp", "served", "logged_gib"),
    [
        ("llama-3.1-8b", 1, False, 0.91),
        ("llama-3.1-8b", 2, False, 0.76),
        ("llama-3.1-8b", 4, False, 0.67),
        ("gemma-3-4b", 1, True, 0.67),
        ("gemma-3-27b", 1, True, 1.14),
        ("deepseek-v2-lite", 1, False, 1.57),
    ],
)
def test_capture_is_within_issue_31s_20_percent_of_the_logged_capture(
    name: str, tp: int, served: bool, logged_gib: float
) -> None:
    # Issue 31's target for CUDA-graph memory is 20 %; these rows were outside it before the
    # workspace term (TP 4 +34 %, Gemma-3-4B +39 %, DeepSeek-V2-Lite -48 %). In-sample: the
    # per-graph constants are fitted on these logs among 34 (docs/accuracy.md section 9 gives
    # the leave-one-out errors).
    assert _capture_gib(name, tp=tp, served=served) == pytest.approx(logged_gib, rel=0.20)


def test_capture_shrinks_with_tensor_parallelism_as_the_logs_do() -> None:
    tp1, tp2, tp4 = (_capture_gib("llama-3.1-8b", tp=tp) for tp in (1, 2, 4))
    assert tp1 > tp2 > tp4


def test_max_cudagraph_capture_size_caps_both_modes_and_the_workspace() -> None:
    # vLLM 0.19 _set_cudagraph_sizes: a user max replaces min(2 x max_num_seqs, 512), capped by
    # max_num_batched_tokens; FULL decode graphs are the sizes up to max_num_seqs.
    plan = plan_cudagraphs(
        minor=19,
        engine="v1",
        max_num_seqs=1024,
        max_num_batched_tokens=8192,
        n_layers=32,
        enforce_eager=False,
        n_heads_per_rank=32,
        head_dim_v=128,
        max_capture_size=64,
    )
    assert (plan.n_piecewise, plan.n_full, plan.largest) == (11, 11, 64)  # 1, 2, 4, 8 … 64
    ws = fa_split_workspace_bytes(largest_full=64, n_heads_per_rank=32, head_dim_v=128)
    per_graph = CAPTURE_PER_GRAPH[0] + 32 * CAPTURE_PER_GRAPH[1]
    assert plan.capture_bytes == ws + 22 * per_graph


def test_max_cudagraph_capture_size_is_refused_before_0_13_with_the_release_named() -> None:
    config = VllmConfig(vllm_version="0.11", max_cudagraph_capture_size=64)
    with pytest.raises(SpecError, match=r"0\.13\+ flag.*vLLM 0\.11 has no such flag"):
        simulate_startup(_spec("llama-3.1-8b"), get_gpu("H100"), config)
    with pytest.raises(SpecError, match=r"--max-cudagraph-capture-size \(0\) must be 1 or more"):
        VllmConfig(max_cudagraph_capture_size=0)


def test_gpt_oss_sets_its_own_largest_capture_size() -> None:
    assert default_max_capture_size("gpt_oss", 10) is None
    assert default_max_capture_size("gpt_oss", 11) == 992  # vllm#25508
    assert default_max_capture_size("gpt_oss", 12) == 1024  # vllm#28345
    assert default_max_capture_size("gpt_oss", 34) == 1024
    assert default_max_capture_size("llama", 19) is None
    plan = plan_cudagraphs(
        minor=19,
        engine="v1",
        max_num_seqs=1024,
        max_num_batched_tokens=8192,
        n_layers=24,
        enforce_eager=False,
        max_capture_size=default_max_capture_size("gpt_oss", 19),
    )
    # the llm-d-planner v0.19.0 gpt-oss-20b run: PIECEWISE 83 (largest 1024), FULL 83
    assert (plan.n_piecewise, plan.n_full, plan.largest) == (83, 83, 1024)


def test_gpt_oss_20b_capture_is_within_20_percent_out_of_the_fitted_set() -> None:
    # results_raw.csv (llm-d-planner, commit 30ec05f7): "took 1.84 GiB" with 166 graphs; the
    # per-graph constants were fitted on the 102-graph runs only, so this checks the scaling
    # with the graph count and the 1024-wide workspace (memfit: -10 %).
    assert _capture_gib("gpt-oss-20b") == pytest.approx(1.84, rel=0.20)


@pytest.mark.parametrize(
    ("tp", "capture_gib", "estimate_gib"),
    [(1, 1.50, 1.19), (2, 1.26, 1.04)],
)
def test_the_mla_term_fitted_on_deepseek_v2_lite_holds_for_kimi_vl(
    tp: int, capture_gib: float, estimate_gib: float
) -> None:
    # Held out of the MLA term's fit: Kimi-VL-A3B-Instruct on vLLM 0.19.0, H100, 102 graphs
    # (llm-d-planner accuracy/results/v0.19.0/results_raw.csv at commit 3c876c8a:
    # cuda_graph_actual_gib 1.50 / 1.26, cuda_graph_estimated_gib 1.19 / 1.04 at TP 1 / 2). Its
    # text stack has DeepSeek-V2-Lite's shape: 27 MLA layers (26 fused-MoE), 16 heads, a 512-wide
    # latent (the logs' op counts and their 522 MiB FULL first capture). Capture within 10 %;
    # vLLM's estimate, an extrapolation of 2 MiB-step samples, within 20 % and never under.
    def plan(mla: int) -> CudaGraphPlan:
        return plan_cudagraphs(
            minor=19,
            engine="v1",
            max_num_seqs=1024,
            max_num_batched_tokens=8192,
            n_layers=27,
            enforce_eager=False,
            n_heads_per_rank=16 // tp,
            head_dim_v=512,
            n_moe_layers=26,
            n_mla_layers=mla,
        )

    with_term, without = plan(27), plan(0)
    assert with_term.n_graphs == 102
    assert with_term.capture_bytes / GiB == pytest.approx(capture_gib, rel=0.10)
    assert without.capture_bytes / GiB < 0.90 * capture_gib  # the shortfall the term closes
    assert estimate_gib <= with_term.estimate_bytes / GiB <= 1.20 * estimate_gib


def test_vllm_estimate_misses_are_within_its_own_2_mib_sampling_step() -> None:
    """vLLM's estimate is first capture + (n - 1) x one sampled per-graph difference, a whole
    number of 2 MiB pages (docs/accuracy.md, "vLLM's graph estimate"). memfit's mean per graph
    sits within one page of the sample on most logs and within 1.5 pages on all but the two that
    sampled a 20 MiB allocator segment (>= 3 pages under). Descriptive over the logs the
    constants were fitted on: it fails if the constants or the data move the residuals out of
    the sample's step."""
    from benchmarks.vllm_startup import compare, load, pages_per_sampled_graph

    rows = [compare(r) for r in load()]
    pages = {
        c["id"]: pages_per_sampled_graph(*c["graph_est"], c["graph_counts"])
        for c in rows
        if c["graph_est"][1] is not None and c["graph_counts"]
    }
    assert len(pages) >= 38
    assert sum(abs(p) <= 1.0 for p in pages.values()) >= 33
    assert all(p <= 1.5 for p in pages.values())
    under = sorted(i for i, p in pages.items() if p < -1.5)
    assert under == ["pln_l31_8b_tp2", "pln_mistral_small_w8a8_tp2"]
    assert all(pages[i] <= -3.0 for i in under)
    # one page per extrapolated graph: 50 + 50 graphs x 2 MiB = 0.195 GiB
    assert pages_per_sampled_graph(1.0 + 100 * 2 / 1024, 1.0, [51, 51]) == pytest.approx(1.0)
