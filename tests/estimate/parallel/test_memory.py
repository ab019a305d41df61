"""One GPU's bytes under pp / cp / ep: each term against its rule."""

import dataclasses

import pytest

from memfit.estimate.parallel.memory import (
    cp_buffer_bytes,
    layer_activation_bytes,
    layout_of,
    model_state_bytes,
    rank_bytes,
    rank_params,
)
from memfit.estimate.parallel.schedule import pipeline_ranks
from memfit.estimate.parallel.shape import read_shape
from memfit.models import resolve_model
from memfit.spec import WorkloadSpec


@pytest.fixture(scope="module")
def llama70():
    return read_shape(resolve_model("llama-3.1-70b").spec)


@pytest.fixture(scope="module")
def mixtral():
    return read_shape(resolve_model("mixtral-8x7b").spec)


def job(**kw):
    base = dict(gpus=64, tp=8, pp=4, seq_len=4096, grad_accum=8, attention="flash")
    return WorkloadSpec(**{**base, **kw})


def test_attention_count_left_over_from_the_model_is_q_k_v_o(llama70):
    """The attention block is what the model's own count leaves (shape.py); for Llama it must
    be the q, k, v, o projections exactly (8192 x 8192 twice, 8192 x 1024 twice)."""
    h, kv = 8192, 8 * 128
    assert llama70.attention_params == 2 * h * h + 2 * h * kv


def test_distributed_optimizer_costs_6_plus_12_over_dp_bytes_per_parameter(llama70):
    """Megatron's theoretical_memory_usage: 6 + 12 / dp with --use-distributed-optimizer."""
    lay = layout_of(job(gpus=128, shard="zero1"))  # dp 4
    n = 1_000_000_000
    assert sum(model_state_bytes(n, lay.dp, lay)) == pytest.approx(n * (6 + 12 / 4), rel=1e-6)
    lay = layout_of(job(gpus=32, shard="ddp"))  # dp 1: 18 bytes without it
    assert sum(model_state_bytes(n, 1, lay)) == pytest.approx(n * 18, rel=1e-6)


def test_first_rank_holds_embeddings_and_last_the_head(llama70):
    lay = layout_of(job())
    ranks = pipeline_ranks(80, pp=4, schedule="1f1b", virtual_stages=1, micro_batches=8)
    first, _ = rank_params(llama70, ranks[0], lay)
    middle, _ = rank_params(llama70, ranks[1], lay)
    per_layer = (llama70.attention_params + llama70.dense_mlp_params) // 8 + llama70.norm_params
    embed = llama70.embedding_params // 8
    assert first - ranks[0].n_layers * per_layer == embed
    assert middle == ranks[1].n_layers * per_layer


def test_context_parallelism_divides_activations_by_cp(llama70):
    one = layout_of(job(gpus=64, pp=1, tp=8, seq_len=8192))
    two = layout_of(job(gpus=64, pp=1, tp=8, cp=2, seq_len=8192))
    a1 = layer_activation_bytes(llama70, one, moe=False, how="none")
    a2 = layer_activation_bytes(llama70, two, moe=False, how="none")
    assert a2 * 2 == pytest.approx(a1, rel=1e-3)


def test_sequence_parallelism_divides_the_norm_tensors_by_tp(llama70):
    lay = layout_of(job(tp=8))
    sp = dataclasses.replace(lay, sequence_parallel=True)
    full_no, full_sp = (
        layer_activation_bytes(llama70, x, moe=False, how="full") for x in (lay, sp)
    )
    assert full_no == 8 * full_sp


def test_allgather_rotation_keeps_every_chunk_alltoall_two(llama70):
    base = job(gpus=64, pp=1, cp=4, seq_len=8192)
    gather = layout_of(base)
    ring = layout_of(dataclasses.replace(base, cp_rotate="alltoall"))
    local_kv = gather.tokens * 2 * llama70.kv_dim // 8 * 2
    assert cp_buffer_bytes(llama70, gather) - cp_buffer_bytes(llama70, ring) == (8 - 4) * local_kv
    assert cp_buffer_bytes(llama70, layout_of(job(pp=1))) == 0


def test_expert_parallelism_holds_n_experts_over_ep(mixtral):
    one = layout_of(job(gpus=64, tp=1, pp=1, ep=1))
    eight = layout_of(job(gpus=64, tp=1, pp=1, ep=8))
    ranks = pipeline_ranks(32, pp=1, schedule="1f1b", virtual_stages=1, micro_batches=1)
    _, e1 = rank_params(mixtral, ranks[0], one)
    _, e8 = rank_params(mixtral, ranks[0], eight)
    assert e1 == 8 * e8 == 32 * 8 * mixtral.expert_params


def test_gpipe_keeps_more_than_1f1b_and_1f1b_peaks_on_an_end_rank(llama70):
    ranks = {}
    for schedule in ("gpipe", "1f1b"):
        lay = layout_of(job(pp_schedule=schedule, grad_accum=16))
        stages = pipeline_ranks(80, pp=4, schedule=schedule, virtual_stages=1, micro_batches=16)
        ranks[schedule] = [rank_bytes(llama70, s, lay) for s in stages]
    gpipe = max(r.activations_bytes for r in ranks["gpipe"])
    one_f = [r.activations_bytes for r in ranks["1f1b"]]
    assert gpipe > 3 * max(one_f)
    assert one_f[0] > one_f[1] > one_f[2]


def test_torch_pipelining_keeps_a_receive_buffer_per_micro_batch_megatron_per_chunk(llama70):
    from memfit.estimate.parallel.memory import p2p_bytes

    stages = pipeline_ranks(80, pp=4, schedule="1f1b", virtual_stages=1, micro_batches=16)
    middle = stages[1]
    fsdp = layout_of(job(gpus=128, shard="fsdp", grad_accum=16))
    megatron = layout_of(job(gpus=128, shard="zero1", grad_accum=16))
    boundary = fsdp.tokens * llama70.hidden * 2
    assert p2p_bytes(llama70, middle, fsdp) == 2 * 16 * boundary  # fwd + grad, every micro-batch
    assert p2p_bytes(llama70, middle, megatron) == 2 * boundary


def test_only_torch_pipelining_keeps_every_micro_batchs_logits(llama70):
    from memfit.estimate.parallel.memory import kept_outputs_bytes

    fsdp = layout_of(job(gpus=128, shard="fsdp", grad_accum=16))
    megatron = layout_of(job(gpus=128, shard="zero1", grad_accum=16))
    assert kept_outputs_bytes(llama70, fsdp) == 16 * fsdp.tokens * (128256 // 8) * 2
    assert kept_outputs_bytes(llama70, megatron) == 0


def _per_layer_saved_by_the_analytic_engine(config: dict, wl: WorkloadSpec) -> float:
    """Bytes per token one more layer adds to the analytic engine's forward activations (its
    op-by-op program of the transformers Llama block under the SAC policy)."""
    from memfit.estimate.analytic import estimate_analytic

    acts = []
    for n_layers in (2, 3):
        est = estimate_analytic(dict(config, num_hidden_layers=n_layers), wl)
        acts.append(est.phases["forward"].components["activations"])
    return (acts[1] - acts[0]) / (wl.batch_size * wl.seq_len)


@pytest.mark.parametrize("checkpointing", ["selective-op", "full"])
def test_op_sac_saves_what_the_analytic_program_stores(checkpointing):
    """torchtitan's per-op SAC (every other mm of the block and the attention kernel's outputs
    stored) counted two ways: the closed form's tensor list and the analytic engine's replay of
    the block's ops under the alternating policy (which tests/estimate/analytic/test_vs_trace.py
    holds to the trace of torch's own SAC). Within 1 % (the analytic count carries the SDPA
    kernel's RNG state, 16 bytes per call)."""
    from tests.estimate.analytic.configs import TINY

    from memfit.models.model_spec import ModelSpec

    config = TINY["mid-llama"]
    wl = WorkloadSpec(
        batch_size=2, seq_len=256, precision="bf16-true", optimizer="sgd",
        checkpointing=checkpointing,
    )  # fmt: skip
    shape = read_shape(ModelSpec.from_config(dict(config, num_hidden_layers=2)))
    lay = dataclasses.replace(layout_of(wl), attention="flash")
    closed = layer_activation_bytes(shape, lay, moe=False, how=checkpointing) / lay.tokens
    assert closed == pytest.approx(_per_layer_saved_by_the_analytic_engine(config, wl), rel=0.01)


def test_op_sac_under_tensor_parallelism_keeps_the_row_parallel_partial_sums(llama70):
    """Per layer of Llama-3.1-70B at tp 8 with sequence parallelism: op SAC drops wk, wo and
    w3's outputs and the norms', but w2's local output is a full-width partial sum (row-parallel:
    the reduce-scatter follows) and the reduce-scatter outputs are on torchtitan's save list, so
    under tp it keeps more than ``selective`` (which memfit counts after the reduction)."""
    lay = dataclasses.replace(layout_of(job()), sequence_parallel=True)
    per = {
        how: layer_activation_bytes(llama70, lay, moe=False, how=how) / lay.tokens / 2
        for how in ("selective", "selective-op", "full")
    }
    h, t = 8192, 8
    # input h/t + wq q/t + wv kv/t + w1 ffn/t + w2's partial sum h + SDPA out q/t + lse + 2 RS h/t
    want = h / t + h / t + 1024 / t + 28672 / t + h + h / t + 64 * 4 / 2 / t + 2 * h / t
    assert per["selective-op"] == pytest.approx(want)
    assert per["full"] < per["selective"] < per["selective-op"]


def test_fsdp_interleaved_rank_holds_one_chunks_unsharded_grads_in_one_round(llama70):
    """FSDP2 under torch's interleaved schedule: a chunk's fp32 unsharded gradients live from
    its first backward to its last (then REDUCE_GRAD reshards); with m = pp the rank finishes
    one chunk before starting the other, so it holds one chunk's, not both (the old accounting
    kept every chunk's all step); with m = 2 pp the backwards alternate and it holds both."""
    from memfit.estimate.parallel.memory import FSDP_PP_GRAD_ACCUM_BYTES

    def unsharded_grads(m):
        w = job(gpus=256, shard="fsdp", pp_schedule="interleaved-1f1b", pp_virtual_stages=2,
                grad_accum=m)  # fmt: skip
        lay = layout_of(w)
        stages = pipeline_ranks(80, pp=4, schedule="interleaved-1f1b", virtual_stages=2,
                                micro_batches=m)[1]  # fmt: skip
        dense, _ = rank_params(llama70, stages, lay)
        sharded = model_state_bytes(dense, lay.dp * lay.cp, lay)[1]
        per_chunk = [
            rank_params(llama70, dataclasses.replace(stages, chunks=(c,)), lay)[0]
            for c in stages.chunks
        ]
        return rank_bytes(llama70, stages, lay).gradients_bytes - sharded, per_chunk

    one_round, chunks = unsharded_grads(4)
    two_rounds, _ = unsharded_grads(8)
    assert one_round in {c * FSDP_PP_GRAD_ACCUM_BYTES for c in chunks}
    assert one_round < sum(chunks) * FSDP_PP_GRAD_ACCUM_BYTES
    assert two_rounds == sum(chunks) * FSDP_PP_GRAD_ACCUM_BYTES


def test_fsdp_pipeline_stage_holds_its_layers_bf16_grads_before_the_fold(llama70):
    """FSDP2 under a pipeline keeps the stage gathered and its fp32 gradients resident, but
    autograd still writes each layer's unsharded gradients in bf16, which FSDP2 adds to the fp32
    accumulator only in the block's post_backward: one layer's bf16 gradients (2 bytes per
    parameter on this GPU) sit beside the largest transient and the receive buffers. Before, the
    whole gathered term was dropped for a resident stage, these gradients with it."""
    from memfit.estimate.parallel.memory import p2p_bytes, transients

    w = job(gpus=64, shard="fsdp", grad_accum=8)  # dp 2 x tp 8 x pp 4, 1F1B
    lay = layout_of(w)
    stages = pipeline_ranks(80, pp=4, schedule="1f1b", virtual_stages=1, micro_batches=8)[1]
    per_layer = (llama70.attention_params + llama70.dense_mlp_params) // 8 + llama70.norm_params
    _, _, largest = transients(llama70, stages, lay)
    expected = largest + p2p_bytes(llama70, stages, lay) + per_layer * 2
    assert rank_bytes(llama70, stages, lay).temporary_bytes == expected


def test_fsdp2_without_sync_holds_a_blocks_bf16_grads_beside_the_fp32_accumulator():
    """The rule under unfolded_grad_bytes, observed on the installed torch (CPU, gloo, one
    rank; benchmarks/fsdp2_unfolded_grads.py in a subprocess): on the second micro-batch, inside
    a block's backward, the weight already differentiated has a bf16 unsharded .grad and every
    weight an fp32 accumulator; after the block's post_backward no bf16 .grad is left."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    out = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "fsdp2_unfolded_grads.py")],
        capture_output=True, text=True, timeout=120, check=True, cwd=root,
        env={**__import__("os").environ, "PYTHONPATH": str(root / "src")},
    )  # fmt: skip
    second = json.loads(out.stdout.splitlines()[-1])["micro_batches"][1]
    a, b = second["inside_block_backward"]
    assert b == ["bfloat16", "float32"] and a[1] == "float32"
    assert all(grad is None and acc == "float32" for grad, acc in second["after_backward"])
