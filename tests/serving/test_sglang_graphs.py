"""SGLang's CUDA-graph memory (memfit.serving.sglang_graphs): the capture list of each release
series and the terms of "Capture cuda graph end ... mem usage", against the three published
captures of benchmarks/data/sglang_logs.jsonl (graphs within the issue's 20 %)."""

from __future__ import annotations

import json

import pytest
from benchmarks.sglang_logs import DATA as SGLANG_LOGS
from benchmarks.sglang_logs import check as check_log

from memfit.models import ModelSpec, resolve_model
from memfit.serving.cudagraphs import CAPTURE_PER_GRAPH
from memfit.serving.sglang import SglangStartup
from memfit.serving.sglang_defaults import gpu_memory_defaults
from memfit.serving.sglang_graphs import (
    ATTN_STATE_BYTES_PER_SLOT,
    CAPTURE_START_BYTES,
    PER_CAPTURED_COLLECTIVE_BYTES,
    SGLANG_PER_LAYER_BYTES,
    TRITON_STATE_BYTES_PER_SLOT,
    attn_state_bytes_per_slot,
    capture_batch_sizes,
    sglang_graph_bytes,
    shares_logits_buffer,
    triton_split_bytes,
)
from memfit.units import GiB, MiB


def test_each_series_captures_its_own_list() -> None:
    """0.4.x / 0.4.7-0.5.2 (get_batch_sizes_to_capture): 1, 2, 4, 8, then steps of 8, no 12;
    0.5.3+ (_generate_cuda_graph_batch_sizes) adds 12."""
    assert capture_batch_sizes(80, "0.4") == (1, 2, 4, 8, *range(16, 81, 8))
    assert capture_batch_sizes(80, "0.5")[:6] == (1, 2, 4, 8, 12, 16)
    assert capture_batch_sizes(8, "0.4.7") == (1, 2, 4, 8)


def test_large_gpus_capture_past_160_before_0_5_3() -> None:
    """0.4.10 leaves --cuda-graph-max-bs unset from 35 GiB: its list runs to 160, to 256 above
    90 GiB, to 512 above 160 GB (gpu_memory_defaults gives those ceilings); a --cuda-graph-max-bs
    beyond the list is reached in steps of 16."""
    h100, h200, b200 = 81559, 143771, 183359
    assert gpu_memory_defaults(h100, 1, "0.4.7")[1] == 160
    assert gpu_memory_defaults(h200, 1, "0.4.7")[1] == 256
    assert gpu_memory_defaults(b200, 8, "0.4.7")[1] == 512
    assert capture_batch_sizes(256, "0.4.7", h200)[-3:] == (240, 248, 256)
    assert capture_batch_sizes(512, "0.4.7", b200)[-2:] == (496, 512)
    assert capture_batch_sizes(192, "0.4.7", h100)[-3:] == (160, 176, 192)


def test_every_graph_keeps_its_fp32_logits_before_0_5() -> None:
    """One more captured size adds its output's bs x vocab x 4 bytes (0.4.x), one graph's own
    bytes and the attention state's larger rows; nothing else."""
    spec = resolve_model("llama-3.1-8b").spec
    small = sglang_graph_bytes(spec, (1, 2, 4, 8), context_len=131072)
    large = sglang_graph_bytes(spec, (1, 2, 4, 8, 16), context_len=131072)
    per_graph = CAPTURE_PER_GRAPH[0] + SGLANG_PER_LAYER_BYTES * 32
    attn = (16 - 8) * 131072 * ATTN_STATE_BYTES_PER_SLOT
    assert large - small == 16 * 128256 * 4 + per_graph + attn
    assert sglang_graph_bytes(spec, (), context_len=131072) == 0


def test_collectives_count_only_where_nccl_is_captured() -> None:
    spec = resolve_model("llama-3.1-8b").spec
    capture = (1, 2, 4, 8)
    plain = sglang_graph_bytes(spec, capture, context_len=8192)
    nccl = sglang_graph_bytes(spec, capture, context_len=8192, nccl_in_graph=True)
    assert nccl - plain == 4 * (2 * 32 + 1) * PER_CAPTURED_COLLECTIVE_BYTES


def test_the_fitted_constants_are_of_the_size_their_mechanisms_allow() -> None:
    """Capture start-up beyond the cuBLAS workspace and FlashInfer's wrappers (counted apart):
    lazily loaded kernels and first segments, some MiB; one captured NCCL collective: well under
    a MiB."""
    assert 5 * MiB < CAPTURE_START_BYTES < 50 * MiB
    assert 0.1 * MiB < PER_CAPTURED_COLLECTIVE_BYTES < 0.5 * MiB
    # SGLang's bytes per layer per graph: above vLLM's fitted 0.165 MiB, under 0.5 MiB
    assert CAPTURE_PER_GRAPH[1] < SGLANG_PER_LAYER_BYTES < 0.5 * MiB


@pytest.mark.parametrize(
    "log_id",
    [
        "qwq-32b-l4-tp4",
        "llama-3.1-8b-24gb-docker-2025-07",
        "qwen3-0.6b-rtx5080-2025-08",
        "llama-70b-h200-tp8",
        "grok-2-fp8-h100-tp8-2025-09",
        "qwen2.5-vl-7b-b200-2025-11",
        "qwen2.5-0.5b-h100-docs-ci-2026-02",
    ],
)
def test_published_captures_are_within_20_percent(log_id: str) -> None:
    """The four logged captures the constants were fitted on (0.93, 0.11, 0.11, 1.98 GB: the fit's
    residuals; the old flat 0.8 GiB allowance was +632 % on the two small ones) and the held-out
    Grok-2 (0.89 GB; -30 % before the Triton state and SGLang's per-layer bytes) and
    Qwen2.5-VL-7B (1.44 GB, TP 1 on a B200; -32 % before) and Qwen2.5-0.5B (0.07 GB, FA3 on an
    H100; +22 % before the cuBLAS workspace and FlashInfer's wrappers were counted apart) captures.
    Qwen3-30B-A3B: test_flashinfer_wrappers_put_the_b200_moe_capture_over_not_under."""
    rows = [json.loads(line) for line in SGLANG_LOGS.read_text().splitlines() if line.strip()]
    row = next(r for r in rows if r["id"] == log_id)
    assert abs(check_log(row)["graph_err_pct"]) < 20


def test_from_0_5_the_graphs_share_one_logits_buffer() -> None:
    """sgl-project/sglang#8579 (GLM-4.5-Air, TP 4): sharing next_token_logits_buffer took the
    capture from 5.16 to 2.89 GB; the per-graph logits memfit drops for it, for the list up to
    256 (a GPU over 90 GiB) and GLM-4.5-Air's 151,552-token vocabulary, are that 2.27 GB within
    3 %."""
    glm = ModelSpec.from_config(
        {"architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "hidden_size": 4096,
         "num_hidden_layers": 46, "num_attention_heads": 96, "num_key_value_heads": 8,
         "head_dim": 128, "vocab_size": 151552, "intermediate_size": 10944,
         "max_position_embeddings": 131072}
    )  # fmt: skip
    capture = capture_batch_sizes(256, "0.4.7", 143771)
    each = sglang_graph_bytes(glm, capture, context_len=131072)
    shared = sglang_graph_bytes(glm, capture, context_len=131072, shared_logits=True)
    assert abs((each - shared) / GiB / (5.16 - 2.89) - 1) < 0.03
    assert shares_logits_buffer("0.5") and shares_logits_buffer("0.5.1")
    assert not shares_logits_buffer("0.4.10") and not shares_logits_buffer("0.4.7")


def test_held_out_captures_are_scored_apart_from_the_fit() -> None:
    """The benchmark's summary names the held-out captures (not in GRAPH_FIT_LOGS) and their
    errors; the February-2026 Qwen2.5-0.5B capture (0.07 GB, bs 1-4, FA3 on an H100) is over
    (the capture start-up, 57 MiB, is most of it), never under; Grok-2 (compared on its graphs
    only) is scored with them."""
    from benchmarks.sglang_logs import GRAPH_FIT_LOGS, summary

    rows = [json.loads(line) for line in SGLANG_LOGS.read_text().splitlines() if line.strip()]
    results = [check_log(r) for r in rows]
    held = [r for r in results if "graph_err_pct" in r and r["id"] not in GRAPH_FIT_LOGS]
    assert [r["id"] for r in held] == [
        "qwen2.5-0.5b-h100-docs-ci-2026-02",
        "grok-2-fp8-h100-tp8-2025-09",
        "qwen3-30b-a3b-b200-tp4-2025-11",
        "qwen2.5-vl-7b-b200-2025-11",
    ]
    assert held[0]["graph_err_pct"] > 0
    line = next(x for x in summary(results) if "held out" in x)
    assert "qwen2.5-0.5b-h100-docs-ci-2026-02 +" in line
    assert "grok-2-fp8-h100-tp8-2025-09" in line
    kv = next(x for x in summary(results) if "comparable logs" in x)
    assert "3 compared on the CUDA graphs only" in kv


def test_triton_keeps_int64_indices_and_split_accumulators_from_0_5() -> None:
    """--attention-backend triton (layers/attention/triton_backend.py): int32 kv indices in the
    0.4.6.post2 / 0.4.10 wheels, int64 in 0.5.1 / 0.5.3, a uint8 mask either way; plus the fp32
    split-KV logits and LSEs of max_bs x heads x 8 splits. Grok-2 at TP 8 (bs 160, 8 heads of
    128 a rank, context 131072): 0.18 GiB of state where FlashInfer's would be 0.10, which is
    what the log's 0.24 GB before the first capture (with the 0.08 GiB logits buffer) asks."""
    assert attn_state_bytes_per_slot("0.5.2", "hopper", "triton") == TRITON_STATE_BYTES_PER_SLOT
    assert TRITON_STATE_BYTES_PER_SLOT == 9
    assert attn_state_bytes_per_slot("0.4.10", "hopper", "triton") == 5
    assert attn_state_bytes_per_slot("0.5", "hopper", "fa3") == 4
    assert attn_state_bytes_per_slot("0.4.6.post2", "ampere", "fa3") == 8
    assert triton_split_bytes(160, 8, 128) == 160 * 8 * 8 * 129 * 4
    state = 160 * 131072 * 9 + triton_split_bytes(160, 8, 128)
    logits = 160 * 131072 * 4
    assert abs((state + logits) / GiB - 0.24) < 0.03


def test_the_attention_backend_flag_changes_only_the_graph_state() -> None:
    """memfit sglang --attention-backend triton: the capture grows by Triton's state over the
    default's; weights and KV tokens are the same; an unknown backend is refused by name."""
    from memfit.errors import SpecError
    from memfit.hardware.catalog import get_gpu
    from memfit.serving.sglang import simulate_sglang
    from memfit.serving.sglang_command import launch_command
    from memfit.spec.sglang import SglangConfig

    spec = resolve_model("llama-3.1-8b").spec
    base = simulate_sglang(spec, get_gpu("H100"), SglangConfig())
    triton = simulate_sglang(spec, get_gpu("H100"), SglangConfig(attention_backend="triton"))
    assert triton.max_total_num_tokens == base.max_total_num_tokens
    bs, ctx = max(base.capture_bs), base.context_length
    assert triton.cuda_graph_bytes - base.cuda_graph_bytes == (
        bs * ctx * (9 - 5) + triton_split_bytes(bs, 32, 128)
    )
    assert "--attention-backend triton" in launch_command(
        "llama-3.1-8b", SglangConfig(attention_backend="triton")
    )
    with pytest.raises(SpecError, match=r"--attention-backend \('flashmla'\) is not modelled"):
        SglangConfig(attention_backend="flashmla")


def test_fa3_keeps_two_page_tables_on_hopper_before_0_5() -> None:
    """0.4.6.post2 / 0.4.10 FlashAttentionBackend.init_cuda_graph_state: page_table and
    page_table_draft_decode, int32 each (8 B a slot); 0.5.1+ keep one (FlashInfer's 5 B is
    counted); off Hopper FlashInfer's 5 B in every release. (Beside them, the per-batch-size
    page-table copies: test_fa3_before_0_5_keeps_a_page_table_copy_per_captured_batch_size.)"""
    from memfit.hardware.catalog import get_gpu
    from memfit.serving.sglang import simulate_sglang
    from memfit.serving.sglang_graphs import (
        FA3_04_STATE_BYTES_PER_SLOT,
        attn_state_bytes_per_slot,
        fa3_page_table_copy_bytes,
    )
    from memfit.spec.sglang import SglangConfig

    assert attn_state_bytes_per_slot("0.4.10", "hopper") == FA3_04_STATE_BYTES_PER_SLOT == 8
    assert attn_state_bytes_per_slot("0.4", "hopper") == 8
    assert attn_state_bytes_per_slot("0.5", "hopper") == ATTN_STATE_BYTES_PER_SLOT == 5
    assert attn_state_bytes_per_slot("0.4.9", "ada") == 5
    spec = resolve_model("llama-3.1-8b").spec
    run = simulate_sglang(spec, get_gpu("H100"), SglangConfig(sglang_version="0.4.9"))
    flashinfer = sglang_graph_bytes(spec, run.capture_bs, context_len=run.context_length)
    copies = fa3_page_table_copy_bytes(run.capture_bs, run.context_length)
    assert (
        run.cuda_graph_bytes - flashinfer == 3 * max(run.capture_bs) * run.context_length + copies
    )


def _deepseek_v3_run(version: str, gpu: str = "H200", backend: str | None = None) -> SglangStartup:
    from memfit.hardware.catalog import get_gpu
    from memfit.serving.sglang import simulate_sglang
    from memfit.spec.sglang import SglangConfig

    config = SglangConfig(
        sglang_version=version, tp_size=8, cuda_graph_max_bs=256, attention_backend=backend
    )
    return simulate_sglang(resolve_model("deepseek-v3").spec, get_gpu(gpu), config)


def test_fa3_before_0_5_keeps_a_page_table_copy_per_captured_batch_size() -> None:
    """flashattention_backend.py (0.4.6.post2, 0.4.10 wheels): the normal-decode capture stores
    ``page_table[req_pool_indices, :]``, a bs x context int32 copy, per batch size; 0.5.1
    (sgl-project/sglang#8567) a view. FA3 is the Hopper default for MLA from 0.4.6; Triton (the
    default off Hopper, or asked for) keeps no copies; 0.4.4 predates FA3's default (#5210, in
    the 0.4.5 series)."""
    from memfit.serving.sglang_graphs import fa3_page_table_copy_bytes, keeps_fa3_page_table_copies

    run = _deepseek_v3_run("0.4.6.post2")
    copies = fa3_page_table_copy_bytes(run.capture_bs, run.context_length)
    assert run.context_length == 163840
    assert copies == sum(run.capture_bs) * 163840 * 4
    triton = _deepseek_v3_run("0.4.6.post2", backend="triton")
    assert run.capture_bs == triton.capture_bs
    assert keeps_fa3_page_table_copies("0.4.10", "hopper")
    assert keeps_fa3_page_table_copies("0.4.3", "ampere", "fa3")
    assert not keeps_fa3_page_table_copies("0.4.4", "hopper")
    assert keeps_fa3_page_table_copies("0.4.5.post1", "hopper")
    assert not keeps_fa3_page_table_copies("0.4.10", "ada")
    assert not keeps_fa3_page_table_copies("0.4.10", "hopper", "triton")
    assert not keeps_fa3_page_table_copies("0.5.1", "hopper", "fa3")
    # the Hopper default is FA3 for MLA and for is_fa3_default_architecture's MHA set only
    assert keeps_fa3_page_table_copies("0.4.9", "hopper", architecture="LlamaForCausalLM")
    assert not keeps_fa3_page_table_copies("0.4.9", "hopper", architecture="Phi3ForCausalLM")
    assert keeps_fa3_page_table_copies("0.4.9", "hopper", architecture="Phi3ForCausalLM", mla=True)
    assert keeps_fa3_page_table_copies("0.4.9", "hopper", "fa3", architecture="Phi3ForCausalLM")
    # page_size-token pages shrink the table's rows
    assert fa3_page_table_copy_bytes((1, 2), 1000, page_size=64) == 3 * 16 * 4


def test_the_fa3_copies_account_for_the_drop_sglang_8567_measured() -> None:
    """sgl-project/sglang#8567 (GLM-4.5-Air, TP 4, context 131072; list to 256 as
    sgl-project/sglang#8579's logits drop on the same command implies): 5.16 -> 3.22 GB, a
    1.94 GiB drop (SGLang's "GB" is GiB). The copies of the 0.4.7-series list to 256: 2.07 GiB,
    +6.5 % (tolerance 10 %: one published pair, not a fit)."""
    from memfit.serving.sglang_graphs import fa3_page_table_copy_bytes

    capture = capture_batch_sizes(256, "0.4.7", 143771)
    drop = fa3_page_table_copy_bytes(capture, 131072) / GiB
    assert drop == pytest.approx(5.16 - 3.22, rel=0.10)
    assert drop > 5.16 - 3.22  # over, not under


def test_deepseek_v3_capture_is_within_the_issue_band_of_sglang_5893() -> None:
    """DeepSeek-V3 at TP 8 on H200s, SGLang 0.4.6-era, bs 1-256 (sgl-project/sglang#5893,
    "mem usage=6.22 GB", as read by an earlier session; the log is not in benchmarks/data). Was
    3.26 GiB (-48 %) before the FA3 page-table copies; now within the issue's 20 %. Held out:
    no constant was fitted on it."""
    run = _deepseek_v3_run("0.4.6.post2")
    logged = 6.22
    got = run.cuda_graph_bytes / GiB
    assert abs(got - logged) / logged < 0.20
    assert _deepseek_v3_run("0.5.1").cuda_graph_bytes < run.cuda_graph_bytes - 2 * GiB


def test_the_capture_streams_cublas_workspace_is_torchs_default_for_the_gpu() -> None:
    # aten/src/ATen/cuda/CublasHandlePool.cpp (pytorch/pytorch@26a39059): 4096 KiB x 8 on
    # compute capability 9.0 exactly, else ":4096:2:16:8"
    from memfit.serving.sglang_graphs import cublas_workspace_bytes

    assert cublas_workspace_bytes((9, 0)) == 32 * MiB
    assert cublas_workspace_bytes((10, 0)) == cublas_workspace_bytes((8, 9)) == 8 * MiB + 128 * 1024
    assert cublas_workspace_bytes(None) == 32 * MiB  # unknown: the larger


def test_flashinfer_keeps_a_wrapper_per_batch_size_where_it_is_sglangs_default() -> None:
    from memfit.serving.sglang_graphs import runs_flashinfer_decode

    qwen2 = "Qwen2ForCausalLM"
    assert not runs_flashinfer_decode("0.5", "hopper", architecture=qwen2)  # FA3 on Hopper
    assert not runs_flashinfer_decode("0.5", "hopper", mla=True)
    assert runs_flashinfer_decode("0.5", "hopper", architecture="Phi3ForCausalLM")
    assert runs_flashinfer_decode("0.4.4", "hopper", architecture=qwen2)  # before FA3's default
    assert runs_flashinfer_decode("0.5", "blackwell", architecture=qwen2)  # 0.5.5.post1 wheel
    assert runs_flashinfer_decode("0.5", "ada")
    assert not runs_flashinfer_decode("0.5", "ada", "triton")
    assert runs_flashinfer_decode("0.5", "hopper", "flashinfer", architecture=qwen2)


def test_the_qwen_0_5b_capture_is_within_20_percent_across_its_two_decimal_window() -> None:
    """The docs-CI log's memory_usage "graph": 0.07, round() to two decimals of GiB: the capture
    lies in [0.065, 0.075) GiB. memfit was +14 % to +31 % over that window (87.4 MiB): the
    fitted start-up carried the two small fit logs' FlashInfer wrappers (4 x 8 MiB) and their
    8 MiB cuBLAS workspace, where this FA3 run on an H100 keeps no wrapper and a 32 MiB one."""
    rows = [json.loads(line) for line in SGLANG_LOGS.read_text().splitlines() if line.strip()]
    row = next(r for r in rows if r["id"] == "qwen2.5-0.5b-h100-docs-ci-2026-02")
    pred_gib = (1 + check_log(row)["graph_err_pct"] / 100) * 0.07
    assert 0.065 * 0.8 < pred_gib < 0.075 * 1.2 and pred_gib < 0.065 * 1.2


def test_flashinfer_wrappers_put_the_b200_moe_capture_over_not_under() -> None:
    """Qwen3-30B-A3B at TP 4 on a B200 (SGLang main of 2025-11-09; the 0.5.5.post1 wheel of the
    next day still picks FlashInfer for MHA off Hopper): 52 wrappers x 8 MiB take it from +0.1 %
    to +26 % (docs/accuracy.md, helper servegraph): over, the safe side, and not fitted away."""
    rows = [json.loads(line) for line in SGLANG_LOGS.read_text().splitlines() if line.strip()]
    row = next(r for r in rows if r["id"] == "qwen3-30b-a3b-b200-tp4-2025-11")
    assert 0 < check_log(row)["graph_err_pct"] < 30
