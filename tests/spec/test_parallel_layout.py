"""Pipeline, context and expert parallelism fields of ParallelSpec / WorkloadSpec."""

import pytest

from memfit.errors import SpecError
from memfit.spec import ParallelSpec, WorkloadSpec


def test_data_parallel_degree_divides_out_tp_pp_and_cp():
    w = WorkloadSpec(gpus=1024, tp=8, pp=8, cp=2, seq_len=8192, grad_accum=16)
    assert w.dp == 8
    assert w.parallel.dp == 8
    assert w.parallel.pp == 8 and w.parallel.cp == 2


def test_torchtitan_schedule_names_resolve_to_memfits():
    p = ParallelSpec(gpus=8, pp=4, pp_schedule="Interleaved1F1B", pp_virtual_stages=2)
    assert p.pp_schedule == "interleaved-1f1b"
    assert ParallelSpec(gpus=8, pp=4, pp_schedule="ZBVZeroBubble").pp_schedule == "zbv"
    assert ParallelSpec(gpus=8, pp=4, pp_schedule="DualPipeV").pp_schedule == "dualpipev"


def test_default_shard_counts_the_replica_not_only_tp():
    # 8 GPUs in one pipeline of 8 stages: no data-parallel ranks, so no sharding mode needed
    assert ParallelSpec(gpus=8, pp=8).shard == "none"
    assert ParallelSpec(gpus=16, pp=8).shard == "ddp"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(gpus=8, pp=3), r"tp x pp x cp \(1 x 3 x 1 = 3\) must divide gpus \(8\)"),
        (dict(gpus=8, pp=2, pp_schedule="bogus"), r"pp_schedule \('bogus'\) must be one of"),
        (dict(gpus=8, pp=0), r"pp \(0\) must be a positive integer"),
        (dict(gpus=8, ep=3), r"ep x etp \(3 x 1\) must divide dp x cp x tp \(8\)"),
        (dict(gpus=8, tp=4, etp=2), r"etp \(2\) must be 1 or tp \(4\)"),
        (dict(gpus=8, pp=2, pp_schedule="interleaved-1f1b"), r"needs pp_virtual_stages >= 2"),
        (dict(gpus=8, pp=2, pp_virtual_stages=2), r"applies to pp_schedule 'interleaved-1f1b'"),
        (dict(gpus=8, cp=2, cp_rotate="ring"), r"cp_rotate \('ring'\) must be one of"),
    ],
)
def test_bad_layouts_are_refused_with_the_rule(kwargs, message):
    with pytest.raises(SpecError, match=message):
        ParallelSpec(**kwargs)
    with pytest.raises(SpecError, match=message):
        WorkloadSpec(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(gpus=8, cp=2, seq_len=514), r"seq_len \(514\) must be a multiple of 2 x cp \(4\)"),
        (dict(gpus=8, cp=2, attention="eager"), r"attention 'eager' with cp > 1"),
        (dict(gpus=8, pp=2, shard="zero3"), r"supports ZeRO stage 0-1 only"),
        (dict(mode="infer", gpus=2, pp=2), r"with mode 'infer'"),
        (dict(gpus=2, pp=2, lora_rank=8), r"lora_rank with pp/cp/ep > 1"),
        (dict(gpus=2, pp=2, checkpointing="offload"), r"checkpointing 'offload' with pp/cp"),
        (dict(gpus=2, pp=2, loss="fused"), r"loss \('fused'\) with pp/cp/ep > 1"),
    ],
)
def test_job_rules_of_the_layout(kwargs, message):
    with pytest.raises(SpecError, match=message):
        WorkloadSpec(**kwargs)


def test_single_gpu_jobs_print_no_parallel_fields():
    assert "pp" not in WorkloadSpec().normalized()
    assert WorkloadSpec(gpus=2, pp=2).normalized()["pp"] == 2


def test_sharding_over_context_parallel_ranks_is_not_warned_about():
    w = WorkloadSpec(gpus=8, cp=8, seq_len=8192, shard="fsdp")
    assert w.dp == 1
    assert not any("partitions nothing" in x for x in w.warnings())
    assert any("partitions nothing" in x for x in WorkloadSpec(shard="fsdp").warnings())
