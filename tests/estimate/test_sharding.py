"""Per-rank model-state arithmetic against published figures (ZeRO Table 1, DeepSpeed)."""

from __future__ import annotations

import json
from decimal import ROUND_FLOOR, ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest

from memfit.errors import SpecError
from memfit.estimate import sharding
from memfit.spec import WorkloadSpec
from memfit.units import GB, GiB, MiB

PUBLISHED = Path("/work/shared/calibration/published_measurements.jsonl")


def _rows(prefix: str) -> list[dict]:
    if not PUBLISHED.exists():
        pytest.skip("published_measurements.jsonl is not available here")
    rows = [json.loads(line) for line in PUBLISHED.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["id"].startswith(prefix)]


def _printed(value: float, like: float) -> set[Decimal]:
    """``value`` with as many decimals as the paper printed ``like``, rounded half-up and
    truncated: Table 1 rounds most cells (41.25 → 41.3) but truncates the 1T row
    (4011.72 → 4011, 2013.67 → 2013)."""
    places = Decimal(repr(like)).normalize()
    exp = Decimal(1).scaleb(min(places.as_tuple().exponent, 0))  # type: ignore[arg-type]
    v = Decimal(repr(value))
    return {v.quantize(exp, ROUND_HALF_UP), v.quantize(exp, ROUND_FLOOR)}


_PSI = {"7.5B": 7.5e9, "128B": 128e9, "1T": 1e12}


def _stage(sharding_text: str) -> int:
    return 0 if sharding_text == "plain DP" else int(sharding_text.split("ZeRO-")[1][0])


def test_zero_table1_model_states_are_reproduced_to_the_papers_printed_digits() -> None:
    rows = _rows("zero_t1_")
    assert len(rows) == 22
    for row in rows:
        psi = int(_PSI[row["model"].split()[0]])
        stage, nd = _stage(row["sharding"]), row["num_gpus"]
        got = sharding.zero_paper_model_states_bytes(psi, stage=stage, dp=nd) / GB
        assert Decimal(repr(row["value"])).normalize() in {
            d.normalize() for d in _printed(got, row["value"])
        }, (row["id"], got)


def test_general_per_rank_states_equal_the_paper_formula_for_mixed_precision_adam() -> None:
    # fp16 params and grads (2 B), fp32 Adam m, v (8 B) + fp32 master (4 B): K = 12.
    for stage, shard in enumerate(("ddp", "zero1", "zero2", "zero3")):
        for nd in (1, 4, 64, 1024):
            states = sharding.per_rank_model_states(
                7_500_000_000,
                shard=shard,
                dp=nd,
                param_bytes=2,
                grad_bytes=2,
                state_bytes=8,
                master_bytes=4,
            )
            paper = sharding.zero_paper_model_states_bytes(7_500_000_000, stage=stage, dp=nd)
            assert abs(states.device_bytes - paper) <= 16  # partitions padded to whole elements


# T0_3B is T5 v1.1 XL; the docs ran DeepSpeed's estimator on AutoModel (T5Model: encoder,
# decoder and the shared embedding, no lm_head). Counts from its config.json:
# d_model 2048, d_ff 5120 (gated), 32 heads x d_kv 64, 24 + 24 layers, vocab 32128.
_D, _FF, _INNER, _L, _V, _BUCKETS = 2048, 5120, 32 * 64, 24, 32128, 32
_ATTN = 4 * _D * _INNER
_ENC = _ATTN + 3 * _D * _FF + 2 * _D
_DEC = 2 * _ATTN + 3 * _D * _FF + 3 * _D
T0_3B_PARAMS = _V * _D + _L * (_ENC + _DEC) + 2 * _BUCKETS * 32 + 2 * _D  # + relative bias, norms
T0_3B_LARGEST = _V * _D  # the shared embedding


def test_t0_3b_parameter_count_matches_deepspeeds_printout() -> None:
    # "SW: Model with 2783M total params, 65M largest layer params." (int(x / 1e6))
    assert T0_3B_PARAMS // 10**6 == 2783 and T0_3B_LARGEST // 10**6 == 65


def test_deepspeed_zero3_estimator_figures_are_reproduced() -> None:
    rows = _rows("ds_est_t0_3b_")
    assert len(rows) == 6
    for row in rows:
        ident = row["id"]
        est = sharding.deepspeed_zero3_estimate(
            T0_3B_PARAMS,
            T0_3B_LARGEST,
            gpus_per_node=row["num_gpus"],
            offload_optimizer="opt_cpu" in ident,
            offload_params="param_cpu" in ident,
        )
        # DeepSpeed prints f"{x / 2**30:.2f}GB"
        assert f"{est.gpu_bytes / GiB:.2f}" == f"{row['value']:.2f}", ident
        per_cpu = float(row["notes"].split("per-CPU ")[1].split(" GB")[0])
        assert f"{est.cpu_bytes / GiB:.2f}" == f"{per_cpu:.2f}", ident


def test_deepspeed_estimator_differs_from_zero_accounting_by_fp32_grads_and_largest_layer() -> None:
    # DeepSpeed counts 18 B/param (fp32 grad partition) + 4 B per element of the largest layer;
    # ZeRO's (and memfit's) model states are 16 B/param. Nothing else differs.
    for gpus in (1, 2):
        ds = sharding.deepspeed_zero3_estimate(
            T0_3B_PARAMS,
            T0_3B_LARGEST,
            gpus_per_node=gpus,
            offload_optimizer=False,
            offload_params=False,
        )
        ours = sharding.per_rank_model_states(
            T0_3B_PARAMS,
            shard="zero3",
            dp=gpus,
            param_bytes=2,
            grad_bytes=2,
            state_bytes=8,
            master_bytes=4,
        )
        diff = ds.gpu_bytes - ours.device_bytes
        assert abs(diff - (2 * T0_3B_PARAMS / gpus + 4 * T0_3B_LARGEST)) <= 16


def test_zero3_offload_host_bytes_are_deepspeeds_18_bytes_per_param_without_its_buffer_factor() -> (
    None
):
    n, dp = 1_000_000_000, 8
    both = sharding.per_rank_model_states(
        n,
        shard="zero3",
        dp=dp,
        offload="params",
        param_bytes=2,
        grad_bytes=2,
        state_bytes=8,
        master_bytes=4,
    )
    opt = sharding.per_rank_model_states(
        n,
        shard="zero3",
        dp=dp,
        offload="optimizer",
        param_bytes=2,
        grad_bytes=2,
        state_bytes=8,
        master_bytes=4,
    )
    assert both.host_bytes == 18 * n // dp and both.device_bytes == 0
    assert opt.host_bytes == 16 * n // dp and opt.device_bytes == 2 * n // dp


def test_ddp_buckets_close_at_1_mib_first_then_25_mib() -> None:
    sizes = [MiB // 2] * 3 + [10 * MiB] * 6
    assert sharding.ddp_bucket_bytes(sizes) == [MiB, MiB // 2 + 30 * MiB, 30 * MiB]
    assert sharding.ddp_bucket_bytes([300 * MiB]) == [300 * MiB]


def test_fsdp_pads_dim0_and_zero_pads_the_flat_partition() -> None:
    assert sharding.fsdp_shard_numel((10, 3), 4) == 3 * 3
    assert sharding.partition_numel(10, 4) == 3
    assert sharding.zero3_persists(99_999) and not sharding.zero3_persists(100_000)


def test_megatron_vocab_padding() -> None:
    # GPT-2's 50257 tokens become Megatron's well-known 50304 (a multiple of 128).
    assert sharding.tp_vocab_per_rank(50257, 1) == 50304
    assert sharding.tp_vocab_per_rank(32000, 8) * 8 == 32768


def test_tp_must_divide_heads_kv_heads_and_intermediate() -> None:
    problems = sharding.tp_problems(3, n_heads=32, n_kv_heads=8, intermediate_size=11008)
    assert any("num_attention_heads (32)" in p for p in problems)
    assert any("num_key_value_heads (8)" in p for p in problems)
    assert not sharding.tp_problems(8, n_heads=32, n_kv_heads=8, intermediate_size=11008)


def test_bad_degrees_and_combinations_are_spec_errors() -> None:
    with pytest.raises(SpecError, match=r"data-parallel degree \(0\)"):
        sharding.partition_numel(10, 0)
    with pytest.raises(SpecError, match="CPUOffloadPolicy offloads parameters, gradients"):
        WorkloadSpec(gpus=4, shard="fsdp", offload="optimizer")
    with pytest.raises(SpecError, match=r"tp \(3\) must divide gpus \(4\)"):
        WorkloadSpec(gpus=4, tp=3)


def test_a_tp_rank_keeps_the_config_class_head_dim_and_kv_heads() -> None:
    # Gemma2Config: head_dim 256 whatever the width; MistralConfig: 8 K/V heads when omitted
    gemma2 = {"model_type": "gemma2", "hidden_size": 512, "num_attention_heads": 8}
    rank = sharding.tp_per_rank_config({**gemma2, "vocab_size": 1000}, 2)
    assert (rank["head_dim"], rank["num_attention_heads"], rank["num_key_value_heads"]) == (
        256,
        4,
        2,
    )
    mistral = {"model_type": "mistral", "num_attention_heads": 32, "vocab_size": 1000}
    assert sharding.tp_per_rank_config(mistral, 4)["num_key_value_heads"] == 8 // 4
    problems = sharding.tp_config_problems(mistral, 16, engine="trace")
    assert len(problems) == 1 and "tp (16) must divide num_key_value_heads (8)" in problems[0]
