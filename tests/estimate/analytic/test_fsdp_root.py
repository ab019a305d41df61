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
#: the grid's FSDP2 jobs (benchmarks/fastpath_grid.py JOBS) on the bundled configs with an
#: untied LM head as large as a block or more (olmo-2-7b: 100352 x 4096 embeddings and head)
UNTIED = ("olmo-2-7b", "mistral-nemo-12b", "llama-3.1-8b", "phi-4")
#: llama-2-7b's root (32000 x 4096, twice) is about a block's size: its peak is inside a block,
#: where the rank view places the block's most gathered copies at every point (over, the safe
#: side: +1.6 % mixed_fsdp, +10.5 % lora_fsdp)
OVER = ("llama-2-7b",)
FSDP_JOBS = ("mixed_fsdp", "mixed_ckpt_fsdp", "lora_fsdp")


def _two_layers(name: str) -> dict:
    config = dict(resolve_model(name).config)
    config["num_hidden_layers"] = 2
    return config


def _rows() -> list[dict]:
    rows: dict[tuple[str, str, str], dict] = {}
    for line in GRID.read_text(encoding="utf-8").splitlines():
        if line.strip():
            r = json.loads(line)
            rows[(r["family"], r["origin"], r["job"])] = r
    return [r for r in rows.values() if r["family"] in UNTIED + OVER and r["job"] in FSDP_JOBS]


@pytest.mark.parametrize("row", _rows(), ids=lambda r: f"{r['family']}-{r['job']}")
def test_the_analytic_fsdp2_peak_is_the_traced_one_with_an_untied_head(row: dict) -> None:
    """The trace runs FSDP2 itself (a fake process group); the analytic answer now lies within
    0.5 % of its allocated peak on every such grid row (before: -11 % to -24 %, the root's
    all-gather output and its unsharded gradients missing), and never under it on llama-2-7b."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.fastpath_grid import _workload

    config = _two_layers(row["family"])
    w = _workload(row["job"], row["family"], config["model_type"], batch=5, seq=row["seq"])
    est = estimate_analytic(config, w)
    traced = row["trace"]["allocated_bytes"]
    if row["family"] in OVER:
        assert est.peak_allocated_bytes >= traced
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
