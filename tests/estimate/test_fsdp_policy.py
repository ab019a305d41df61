"""FSDP2 as torchtitan runs it: MixedPrecisionPolicy(bf16, fp32) over fp32 shards,
reshard_after_forward, HSDP — the analytic rank view's arithmetic and the spec's rules.

Expected figures are computed here from the config's shapes (a Llama with 2 blocks), not read
from the code under test; the trace agreement lives in analytic/test_vs_trace.py."""

from __future__ import annotations

import pytest
from tests.estimate.analytic.configs import TINY

from memfit.errors import SpecError
from memfit.estimate.analytic.api import estimate_analytic
from memfit.estimate.sharding import layout_notes
from memfit.flags import _reshard_after_forward
from memfit.spec import ParallelSpec, WorkloadSpec

CFG = TINY["mid-llama"]


def _n_params() -> int:
    h, ff, v = CFG["hidden_size"], CFG["intermediate_size"], CFG["vocab_size"]
    hd = h // CFG["num_attention_heads"]
    kv = CFG["num_key_value_heads"] * hd
    layer = 2 * h * h + 2 * kv * h + 3 * ff * h + 2 * h
    return CFG["num_hidden_layers"] * layer + 2 * v * h + h


def _wl(**kw: object) -> WorkloadSpec:
    return WorkloadSpec(**{"batch_size": 1, "seq_len": 32, "gpus": 4, "shard": "fsdp", **kw})


def test_bf16_mixed_under_fsdp_is_torchtitans_policy_not_autocast() -> None:
    wl = _wl(precision="bf16-mixed")
    assert wl.fsdp_policy == ("bfloat16", "float32")
    assert wl.run_precision == "bf16-true"  # forward/backward tensors are the 16-bit model's
    assert _wl(precision="bf16-true").fsdp_policy is None
    assert WorkloadSpec(gpus=4, shard="zero3").fsdp_policy is None


def test_fsdp_mixed_keeps_fp32_shards_gradients_and_adam_states_per_rank() -> None:
    e = estimate_analytic(dict(CFG), _wl(precision="bf16-mixed"))
    opt = e.phases["optimizer"].components
    n = _n_params()
    # fp32 masters (4 B), fp32 gradient shards (4 B), fp32 Adam m + v (8 B), each / 4 ranks;
    # dim-0 padding and the 512 B allocator rounding make the figure slightly larger
    assert 4 * n / 4 <= opt["parameters"] <= 4 * n / 4 * 1.01
    assert 4 * n / 4 <= opt["gradients"] <= 4 * n / 4 * 1.01
    assert 8 * n / 4 <= opt["optimizer_states"] <= 8 * n / 4 * 1.01
    pure = estimate_analytic(dict(CFG), _wl(precision="bf16-true")).phases["optimizer"]
    assert opt["parameters"] == pytest.approx(2 * pure.components["parameters"], rel=0.01)


def test_reshard_after_forward_false_holds_every_block_at_the_turn() -> None:
    on = estimate_analytic(dict(CFG), _wl(precision="bf16-mixed"))
    off = estimate_analytic(dict(CFG), _wl(precision="bf16-mixed", reshard_after_forward=False))
    h, ff = CFG["hidden_size"], CFG["intermediate_size"]
    hd = h // CFG["num_attention_heads"]
    kv = CFG["num_key_value_heads"] * hd
    block_bf16 = (2 * h * h + 2 * kv * h + 3 * ff * h + 2 * h) * 2
    grown = off.phases["forward"].components["parameters"]
    grown -= on.phases["forward"].components["parameters"]
    # n blocks + 2 in flight instead of 3: one more block with 2 layers
    assert grown == pytest.approx((CFG["num_hidden_layers"] - 1) * block_bf16, rel=0.01)


def test_hsdp_shards_over_the_shard_group_only() -> None:
    hsdp = estimate_analytic(dict(CFG), _wl(gpus=8, dp_replicate=2, precision="bf16-mixed"))
    fsdp4 = estimate_analytic(dict(CFG), _wl(gpus=4, precision="bf16-mixed"))
    for comp in ("parameters", "gradients", "optimizer_states"):
        a = hsdp.phases["optimizer"].components[comp]
        assert a == fsdp4.phases["optimizer"].components[comp]


def test_fsdp_layout_rules_name_the_field_the_value_and_the_fix() -> None:
    with pytest.raises(SpecError, match=r"dp_replicate \(2\) is HSDP .* needs --shard fsdp"):
        WorkloadSpec(gpus=8, shard="zero3", dp_replicate=2)
    with pytest.raises(SpecError, match=r"dp_replicate \(3\) must divide the data-parallel"):
        WorkloadSpec(gpus=8, shard="fsdp", dp_replicate=3)
    with pytest.raises(SpecError, match=r"reshard_after_forward \(3\) must divide the FSDP shard"):
        ParallelSpec(gpus=8, shard="fsdp", reshard_after_forward=3)
    with pytest.raises(SpecError, match=r"reshard_after_forward \('x'\) must be true, false"):
        WorkloadSpec(gpus=8, shard="fsdp", reshard_after_forward="x")  # type: ignore[arg-type]


def test_reshard_flag_reads_true_false_and_group_sizes() -> None:
    assert _reshard_after_forward("false") is False
    assert _reshard_after_forward("True") is True
    assert _reshard_after_forward("4") == 4
    assert _reshard_after_forward("sometimes") == "sometimes"  # the spec refuses it


def test_fsdp_and_zero3_each_say_how_they_differ_from_the_other() -> None:
    fsdp = " ".join(layout_notes(_wl(precision="bf16-mixed")))
    zero3 = " ".join(layout_notes(WorkloadSpec(gpus=4, shard="zero3")))
    for text in (fsdp, zero3):
        assert "masters" in text and "reduce" in text and "prefetch" in text
    assert "vs --shard zero3" in fsdp and "vs --shard fsdp" in zero3
    assert layout_notes(WorkloadSpec(gpus=4, shard="ddp")) == []


def test_the_trace_engine_prints_the_same_difference_lines() -> None:
    from memfit.estimate.trace.distributed import notes

    fsdp = notes(_wl(precision="bf16-mixed"))
    assert any("MixedPrecisionPolicy(param_dtype=bfloat16" in line for line in fsdp)
    assert any(line.startswith("vs --shard zero3") for line in fsdp)
    zero3 = notes(WorkloadSpec(gpus=4, shard="zero3"))
    assert any(line.startswith("vs --shard fsdp") for line in zero3)


def test_the_default_precision_note_says_how_fsdp_and_zero_run_it() -> None:
    _, fsdp = WorkloadSpec(gpus=4, shard="fsdp").settle_precision()
    assert fsdp is not None and "MixedPrecisionPolicy(param_dtype=bfloat16" in fsdp
    _, zero = WorkloadSpec(gpus=4, shard="zero2").settle_precision()
    assert zero is not None and "DeepSpeed's bf16 optimizer" in zero
    _, one = WorkloadSpec().settle_precision()
    assert one is not None and "autocast" in one
