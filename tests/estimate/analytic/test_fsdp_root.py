"""FSDP2's root group in the analytic engine (issue 32, shardgrid): ``fully_shard(model)``
holds the embeddings' and the LM head's all-gather output until the first block's copy-out,
and reduce-scatters their gradients only in the final backward callback (torch 2.13.0,
``torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py``: ``wait_for_unshard``,
``post_backward``; ``_fsdp_collectives.py``: ``foreach_reduce``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from memfit.estimate.analytic import estimate_analytic
from memfit.models import resolve_model
from memfit.spec import WorkloadSpec

ROOT = Path(__file__).resolve().parents[3]
GRID = ROOT / "benchmarks" / "results" / "fastpath_grid.jsonl"
sys.path.insert(0, str(ROOT))

from benchmarks.reserved_bands import latest_rows  # noqa: E402  (the grid: last row per key)

#: the grid's FSDP2 jobs (benchmarks/fastpath_grid.py JOBS) on the bundled configs with an
#: untied LM head as large as a block or more (olmo-2-7b: 100352 x 4096 embeddings and head)
UNTIED = ("olmo-2-7b", "mistral-nemo-12b", "llama-3.1-8b", "phi-4")
#: llama-2-7b's root (32000 x 4096, twice) is about a block's size: its peaks lie inside the
#: blocks, where the rank view's placement of the gathers is exact in forward (three copies
#: only at a block's copy-out) and the first block's backward prefetches nothing, but the
#: running block's backward keeps the prefetched copy at every point (over, the safe side:
#: mixed_fsdp +1.6 %; lora_fsdp +0.25 %, mixed_ckpt_fsdp +0.31 %, were +10.5 % / +2.9 %)
OVER = ("llama-2-7b",)
FSDP_JOBS = ("mixed_fsdp", "mixed_ckpt_fsdp", "lora_fsdp")


def _two_layers(name: str) -> dict:
    config = dict(resolve_model(name).config)
    config["num_hidden_layers"] = 2
    return config


def _rows() -> list[dict]:
    rows = latest_rows(GRID.read_text(encoding="utf-8").splitlines())
    return [r for r in rows if r["family"] in UNTIED + OVER and r["job"] in FSDP_JOBS]


@pytest.mark.parametrize("row", _rows(), ids=lambda r: f"{r['family']}-{r['job']}")
def test_the_analytic_fsdp2_peak_is_the_traced_one_with_an_untied_head(row: dict) -> None:
    """The trace runs FSDP2 itself (a fake process group); the analytic answer now lies within
    0.5 % of its allocated peak on every such grid row (before: -11 % to -24 %, the root's
    all-gather output and its unsharded gradients missing), and on llama-2-7b never under it
    nor more than 2 % over."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.fastpath_grid import _workload

    config = _two_layers(row["family"])
    w = _workload(row["job"], row["family"], config["model_type"], batch=5, seq=row["seq"])
    est = estimate_analytic(config, w)
    traced = row["trace"]["allocated_bytes"]
    if row["family"] in OVER:
        assert traced <= est.peak_allocated_bytes <= traced * 1.02
    else:
        assert est.peak_allocated_bytes == pytest.approx(traced, rel=0.005)


def test_a_full_fine_tune_reduce_scatters_the_root_at_the_end_of_backward() -> None:
    """bf16-mixed (fp32 masters, fp32 reduce): the end of backward holds the root's 16-bit
    gradients and their fp32 reduce-scatter input, 3 x the root's 16-bit bytes beyond the
    shards; LoRA's frozen root adds none, so its backward is not lifted."""
    config = _two_layers("olmo-2-7b")
    root_bytes = 2 * config["vocab_size"] * config["hidden_size"] * 2  # embeddings + head, bf16
    mixed = WorkloadSpec(gpus=8, shard="fsdp", precision="bf16-mixed", batch_size=1, seq_len=64)
    est = estimate_analytic(config, mixed)
    n = est.n_params
    shards = n * 4 // 8  # fp32 sharded parameters
    states = n * 8 // 8  # fp32 Adam moments, sharded
    assert est.phases["backward"].peak_allocated_bytes >= shards + states + 3 * root_bytes
    lora = WorkloadSpec(gpus=8, shard="fsdp", precision="bf16-true", lora_rank=8, seq_len=64)
    assert estimate_analytic(config, lora).peak_phase == "forward"


# -- reserved bytes: the root group's buffers the caching allocator takes segments for again


def _segment(n_bytes: int) -> int:
    """A large request's segment: rounded up to 2 MiB (PyTorch's CUDACachingAllocator.cpp,
    ``get_allocation_size``, for requests of 10 MiB and more)."""
    return -(-n_bytes // (2 << 20)) * (2 << 20)


def _stranded(est: object) -> int:
    """The segments the root's buffers take again (``fsdp_stranded_bytes``)."""
    info = est.trace["analytic"]  # type: ignore[attr-defined]
    return int(info.get("fsdp_segments_again_bytes", 0))


def test_a_full_fine_tune_reserves_the_roots_gather_and_fp32_reduce_input_once_more() -> None:
    """olmo-2-7b (untied 100352 x 4096 embeddings and head, a 4096 final norm; all divisible by
    8 ranks, so no padding): the root's all-gather output is its bf16 bytes, its reduce-scatter
    input the same elements in fp32; each is reserved again at its segment size, and the
    answer carries them beyond allocated x the ratio, and says so."""
    config = _two_layers("olmo-2-7b")
    n_root = 2 * config["vocab_size"] * config["hidden_size"] + config["hidden_size"]
    mixed = WorkloadSpec(gpus=8, shard="fsdp", precision="bf16-mixed", batch_size=1, seq_len=64)
    est = estimate_analytic(config, mixed)
    assert _stranded(est) == _segment(n_root * 2) + _segment(n_root * 4)
    assert est.peak_reserved_bytes >= est.peak_allocated_bytes + _stranded(est)
    assert "FSDP2's root-group buffers (its all-gather output" in " ".join(est.notes)


def test_lora_reserves_only_the_roots_gather_and_no_reshard_nothing() -> None:
    """LoRA's frozen root has no gradients to reduce-scatter: only the gather's segment; a root
    kept whole after forward (``reshard_after_forward=False``) is not gathered again; FSDP2's
    CPUOffloadPolicy keeps the Adam states on the host, so nothing carves the reduce input's
    segment; one GPU holds no such buffers."""
    config = _two_layers("olmo-2-7b")
    n_root = 2 * config["vocab_size"] * config["hidden_size"] + config["hidden_size"]
    lora = WorkloadSpec(gpus=8, shard="fsdp", precision="bf16-true", lora_rank=8, seq_len=64)
    assert _stranded(estimate_analytic(config, lora)) == _segment(n_root * 2)
    kept = WorkloadSpec(
        gpus=8, shard="fsdp", precision="bf16-mixed", seq_len=64, reshard_after_forward=False
    )
    assert _stranded(estimate_analytic(config, kept)) == _segment(n_root * 4)
    offload = WorkloadSpec(
        gpus=8, shard="fsdp", precision="bf16-mixed", seq_len=64, offload="params"
    )
    assert _stranded(estimate_analytic(config, offload)) == _segment(n_root * 2)
    assert _stranded(estimate_analytic(config, WorkloadSpec(precision="bf16-mixed"))) == 0


def _fsdp_rows() -> list[dict]:
    return [
        r
        for r in latest_rows(GRID.read_text(encoding="utf-8").splitlines())
        if r["job"] in FSDP_JOBS
        and r["trace"].get("status") == "ok"
        and r.get("analytic", {}).get("status") == "ok"
    ]


def test_the_range_top_covers_every_fsdp2_grid_row_and_needs_the_root_buffers() -> None:
    """On every grid row of the FSDP2 jobs whose analytic allocated bytes lie within the
    validation's tolerance of the trace's, the top of the analytic range (allocated x the wide
    ratio + the root buffers' segments, what ``fastpath_grid.validated_table`` judges) is no
    more than the tolerance under the trace's reserved bytes; without the root buffers the top
    lies more than 25 % under the trace on the real-width full fine-tunes (olmo-2-7b,
    mistral-nemo-12b, llama-3.1-8b, qwen3-8b cut to 2 layers reserve 1.83-1.85 x)."""
    from memfit.estimate.analytic.reserved import RESERVED_RATIO
    from memfit.estimate.fastpath import TOLERANCE

    high = RESERVED_RATIO["train"][2]
    judged = under_without = 0
    for r in _fsdp_rows():
        a, t = r["analytic"], r["trace"]
        if abs(a["allocated_bytes"] - t["allocated_bytes"]) > TOLERANCE * t["allocated_bytes"]:
            continue
        stranded = int(a.get("stranded_bytes", 0))
        top = int(a["allocated_bytes"] * high)
        assert top + stranded >= t["reserved_bytes"] * (1 - TOLERANCE), r["family"]
        judged += 1
        if r["job"] == "mixed_fsdp" and top < t["reserved_bytes"] * 0.75:
            assert stranded > 0
            under_without += 1
    assert judged >= 60 and under_without >= 4


@pytest.mark.parametrize(
    ("family", "job"),
    [
        ("llama-2-7b", "lora_fsdp"),  # peaks at the second block's copy-out (forward)
        ("llama-2-7b", "mixed_ckpt_fsdp"),  # peaks in the first block's backward: no prefetch
        ("qwen3-8b", "lora_fsdp"),  # peaks where backward gathers the root again
        ("roberta-base", "lora_fsdp"),
    ],
)
def test_the_gathers_are_placed_where_fsdp2_holds_them(family: str, job: str) -> None:
    """Where a block's gathers and the root's second gather sit decides these rows' peaks: the
    analytic allocated bytes lie within 0.5 % of the trace's (before: +10.5 %, +2.9 %, -2.8 %,
    -10.2 %: three gathered copies at every forward point, a prefetched copy in the first
    block's backward, no second gather of the root)."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.fastpath_grid import _workload

    rows = {(r["family"], r["job"]): r for r in _fsdp_rows()}
    row = rows[(family, job)]
    config = _two_layers(family)
    w = _workload(job, family, config["model_type"], batch=5, seq=row["seq"])
    est = estimate_analytic(config, w)
    assert est.peak_allocated_bytes == pytest.approx(row["trace"]["allocated_bytes"], rel=0.005)


def test_the_rule_holds_at_4_and_16_gpus_on_the_probed_rows() -> None:
    """``benchmarks/fsdp_gpu_counts.py``'s rows (the grid's 2-layer FSDP2 rows at 4 and 16
    GPUs, both engines): the analytic allocated bytes within the validation's tolerance, the top
    of its range over the trace's reserved bytes, on each; both counts probed."""
    from memfit.estimate.fastpath import TOLERANCE

    path = ROOT / "benchmarks" / "results" / "fsdp_gpu_counts.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for r in rows:
        traced = r["trace_allocated_bytes"]
        assert abs(r["analytic_allocated_bytes"] - traced) <= TOLERANCE * traced, r
        assert r["analytic_top_reserved_bytes"] >= r["trace_reserved_bytes"], r
        assert r["stranded_bytes"] > 0, r
    assert {r["gpus"] for r in rows} == {4, 16}
