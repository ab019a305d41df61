"""What SGLang's "Load weight end ... mem usage" holds beyond the weights: the caching allocator's
unreleased segment tails and the fp32 rotary cache (memfit.serving.sglang_load), against the
published logs in benchmarks/data/sglang_logs.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memfit.models import ModelSpec, resolve_model
from memfit.serving.layout import rank_weights
from memfit.serving.sglang_load import load_overhead_bytes, load_tensor_sizes, replay_load
from memfit.units import GiB, MiB

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "sglang_logs.jsonl"


def _spec(name: str) -> ModelSpec:
    spec = resolve_model(name).spec
    assert spec is not None
    return spec


def _qwq() -> ModelSpec:
    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    return ModelSpec.from_config(next(r for r in rows if r["id"] == "qwq-32b-l4-tp4")["config"])


def test_power_of_two_llama_tensors_leave_no_tails_and_its_rope_cache_stays_fp32() -> None:
    # Llama-3.1-8B: every weight is a whole number of 2 MiB (48, 32, 224, 112 MiB a layer)
    r = replay_load(_spec("llama-3.1-8b"), tp=1, dtype_bytes=2)
    assert r is not None
    assert r.reserved_bytes - r.allocated_bytes < 2 * MiB
    assert r.rope_bytes == 131072 * 128 * 4  # max_position x rotary_dim, fp32


def test_qwq_at_tp_4_keeps_the_tails_of_its_odd_sized_shards() -> None:
    # per rank: o_proj 12.5 MiB in a 14 MiB segment, qkv 17.5 in 18, gate_up 135 in 136,
    # down 67.5 in 68: 3.5 MiB a layer x 64 layers
    r = replay_load(_qwq(), tp=4, dtype_bytes=2)
    assert r is not None
    assert r.reserved_bytes - r.allocated_bytes == pytest.approx(64 * 3.5 * MiB, abs=4 * MiB)


@pytest.mark.parametrize(
    ("name", "logged_gib"),
    [("qwq", 15.54), ("qwen3-14b", 7.08)],  # 4 x L4 (SGLang 0.4.3); 4 x RTX 4090 (June 2026)
)
def test_the_overhead_closes_the_tp_4_logs_to_within_half_a_percent(
    name: str, logged_gib: float
) -> None:
    spec = _qwq() if name == "qwq" else _spec(name)
    weights = rank_weights(spec, tp=4, pp=1, dtype="bfloat16", quantization=None).weights_bytes
    extra = load_overhead_bytes(spec, tp=4, dtype_bytes=2)
    assert extra is not None
    assert abs(weights + extra - logged_gib * GiB) / (logged_gib * GiB) < 0.005
    # the 0.25 GiB fitted before on the QwQ log alone, now derived: tails + fp32 rope
    assert 0.15 * GiB < extra < 0.3 * GiB


def test_layouts_the_replay_does_not_draw_return_none() -> None:
    assert load_tensor_sizes(_spec("deepseek-v2-lite"), tp=1, dtype_bytes=2) is None  # MLA


@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen3-0.6b", "qwen3-14b", "qwq", "qwen2.5-7b"])
def test_the_compact_replay_reserves_what_the_full_allocator_replay_does(name: str) -> None:
    from memfit.estimate.allocator.caching import CachingAllocatorSim
    from memfit.serving.sglang_load import FREE_TEMPORARIES

    spec = _qwq() if name == "qwq" else _spec(name)
    tp = 4 if name in ("qwq", "qwen3-14b") else 1
    sizes = load_tensor_sizes(spec, tp=tp, dtype_bytes=2)
    assert sizes is not None
    sim, live = CachingAllocatorSim(), []
    for n in sizes:
        if n == FREE_TEMPORARIES:
            for key in live[-4:-1]:
                sim.free(key)
            continue
        live.append(len(live))
        sim.malloc(live[-1], n)
    sim.empty_cache()
    r = replay_load(spec, tp=tp, dtype_bytes=2)
    assert r is not None
    assert r.reserved_bytes == sim.reserved_bytes
    # the replay counts tensor bytes; torch's stats also count the 512 B rounding and the
    # remainders (at most 1 MiB) a block keeps unsplit
    assert 0 <= sim.allocated_bytes - r.allocated_bytes <= len(sizes) * 2**20


def _rows() -> dict[str, dict]:
    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    return {r["id"]: r for r in rows}


@pytest.mark.parametrize(
    "log_id", ["llama-3.1-8b-h100-docs", "llama-3.1-8b-h100-pr4760", "qwen3-0.6b-rtx5080-2025-08"]
)
def test_tp_1_linux_logs_hold_the_first_kernels_and_land_within_one_percent(log_id: str) -> None:
    """At TP 1 no NCCL warm-up runs before "Load weight begin", so the first kernels' memory is
    in "mem usage": without it the three native-Linux TP-1 logs are 0.06-0.09 GiB above the
    replay (Qwen3-0.6B on an RTX 5080: -5.2 %); with it, within 1 % and not above the log by more
    than the log's rounding (the constant is fitted on these logs)."""
    from memfit.serving.sglang_load import first_kernels_bytes

    row = _rows()[log_id]
    spec = _spec(row["model"])
    weights = rank_weights(spec, tp=1, pp=1, dtype="bfloat16", quantization=None).weights_bytes
    extra = load_overhead_bytes(spec, tp=1, dtype_bytes=2)
    assert extra is not None
    logged = row["logged"]["weights_gb"] * GiB
    without = weights + extra - first_kernels_bytes(tp=1)
    assert (logged - without) > 0.05 * GiB  # the gap the term closes
    assert abs(weights + extra - logged) / logged < 0.01
    assert weights + extra - logged < 0.005 * GiB


def test_the_first_kernels_count_only_at_tp_1_on_a_linux_host_before_0_5_8() -> None:
    from memfit.serving.sglang_load import FIRST_KERNELS_BYTES, first_kernels_bytes

    spec = _spec("qwen3-0.6b")
    linux = load_overhead_bytes(spec, tp=1, dtype_bytes=2)
    windows = load_overhead_bytes(spec, tp=1, dtype_bytes=2, windows_host=True)
    newest = load_overhead_bytes(spec, tp=1, dtype_bytes=2, sglang_version="0.5")
    assert linux is not None and windows is not None
    assert linux - windows == linux - newest == FIRST_KERNELS_BYTES == 64 * MiB
    assert first_kernels_bytes(tp=2) == first_kernels_bytes(tp=1, windows_host=True) == 0


@pytest.mark.parametrize(
    ("version", "in_load"),
    [("0.4", True), ("0.4.1", True), ("0.4.6.post2", True), ("0.4.7", True), ("0.4.10", True),
     ("0.5.3", True), ("0.5.6.post2", True), ("0.5.7", True),
     ("0.5.8", False), ("0.5.9", False), ("0.5.12", False), ("0.5", False)],
)  # fmt: skip
def test_from_0_5_8_the_first_kernel_runs_before_load_begin(version: str, in_load: bool) -> None:
    """0.5.8's GroupCoordinator builds a CUDA ``active_ranks`` tensor for every group, world
    size 1 included (absent from the 0.5.6 / 0.5.7 wheels); "0.5" is the newest series."""
    from memfit.serving.sglang_load import first_kernels_in_load

    assert first_kernels_in_load(version) is in_load


@pytest.mark.parametrize(
    "log_id", ["qwen2.5-0.5b-h100-docs-ci-2026-02", "llama-3.1-8b-h100-docs-ci-lora-2026-02"]
)
def test_the_2026_docs_ci_loads_hold_no_first_kernels(log_id: str) -> None:
    """SGLang's docs CI of February 2026 logs 0.09 GB at "Init torch distributed ends" (TP 1) and a
    load equal to the replay: with the 0.4-era term the 0.5B model would be 6 % over."""
    from benchmarks.sglang_logs import check

    row = _rows()[log_id]
    assert row["logged"]["init_distributed_gb"] > 0.05
    assert abs(check(row)["weights_err_pct"]) < 1
    spec = _spec(row["model"])
    old = load_overhead_bytes(spec, tp=1, dtype_bytes=2, sglang_version="0.5.6")
    new = load_overhead_bytes(spec, tp=1, dtype_bytes=2, sglang_version="0.5")
    assert old is not None and new is not None and old - new == 64 * MiB


def test_the_windows_host_logs_are_not_given_the_first_kernels() -> None:
    """The three Windows-desktop logs (WSL2, Docker Desktop) keep -0.002 to 0.04 GiB beyond the
    replay: with the Linux term they would be over by up to 0.064 GiB (Qwen3-0.6B: +4 %), and its
    KV tokens under by 4 %."""
    from benchmarks.sglang_logs import check

    windows = [r for r in _rows().values() if r.get("host") == "windows"]
    assert len(windows) == 3
    for row in windows:
        out = check(row)
        assert out["weights_err_pct"] < 0.5
        assert abs(out["tokens_given_avail_err_pct"]) < 3
