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
