"""Per-rank invariants of traced multi-GPU, offload and tensor-parallel jobs.

The config is a small Llama whose matrices all hold at least 1e5 elements, so ZeRO-3 partitions
them (DeepSpeed keeps smaller parameters whole: ``stage3_param_persistence_threshold``). Expected
figures are computed here from the config's shapes, not read from the code under test.
"""

from __future__ import annotations

import pytest
from tests.conftest import TINY_LLAMA

from memfit.errors import SpecError
from memfit.estimate.trace.engine import trace_hf
from memfit.spec import WorkloadSpec

H, HEADS, KV, FF, V, LAYERS = 512, 8, 4, 1024, 1000, 2
HD = H // HEADS
CFG = dict(
    TINY_LLAMA,
    hidden_size=H,
    num_attention_heads=HEADS,
    num_key_value_heads=KV,
    intermediate_size=FF,
    vocab_size=V,
    num_hidden_layers=LAYERS,
)
BF16 = 2


def r512(n: float) -> int:
    return -(-int(n) // 512) * 512


def shapes(heads: int = HEADS, kv: int = KV, ff: int = FF, vocab: int = V) -> list[tuple[int, ...]]:
    """Every parameter's shape (embedding, per-layer q/k/v/o, gate/up/down, two norms; final norm,
    lm_head), as LlamaForCausalLM builds them."""
    layer = [
        (heads * HD, H),
        (kv * HD, H),
        (kv * HD, H),
        (H, heads * HD),
        (ff, H),
        (ff, H),
        (H, ff),
        (H,),
        (H,),
    ]
    return [(vocab, H)] + layer * LAYERS + [(H,), (vocab, H)]


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def estimate(**kw: object):  # type: ignore[no-untyped-def]
    # as validated: pure bf16 (the figures count bf16 grads); under ZeRO, DeepSpeed's own
    # 16-bit model with fp32 masters (bf16-mixed)
    zero = str(kw.get("shard", "")).startswith("zero")
    kw.setdefault("precision", "bf16-mixed" if zero else "bf16-true")
    return trace_hf(dict(CFG), WorkloadSpec(batch_size=1, seq_len=32, **kw), name="mid-llama")


@pytest.fixture(scope="module")
def single():  # type: ignore[no-untyped-def]
    return estimate()


def comp(e, phase: str, name: str) -> int:  # type: ignore[no-untyped-def]
    return e.phases[phase].components[name]


def test_zero3_keeps_a_partition_and_gathers_modules_around_their_use() -> None:
    e = estimate(gpus=4, shard="zero3")
    big = [s for s in shapes() if numel(s) >= 100_000]
    small = [s for s in shapes() if numel(s) < 100_000]
    partitions = sum(r512(-(-numel(s) // 4) * BF16) for s in big)
    persistent = sum(r512(numel(s) * BF16) for s in small)
    rope = 2 * 512  # the rotary inv_freq and original_inv_freq buffers
    # After backward every gathered module is released: 1/N of each partitioned matrix remains.
    assert comp(e, "optimizer", "parameters") == partitions + persistent + rope
    # The whole model (5.7M elements) is within one prefetch bucket (5e7), so the forward peak
    # holds every partition plus every matrix gathered once.
    gathered = sum(r512(numel(s) * BF16) for s in big)
    assert comp(e, "forward", "parameters") == partitions + persistent + rope + gathered
    # optimizer states: fp32 master + fp32 m, v of the rank's partition (12 B per element).
    n_trainable = sum(numel(s) for s in shapes())
    states = comp(e, "optimizer", "optimizer_states")
    assert abs(states - 12 * n_trainable / 4) < 512 * len(shapes()) * 3


def test_ddp_adds_bucket_copies_of_every_gradient(single) -> None:  # type: ignore[no-untyped-def]
    e = estimate(gpus=4, shard="ddp")
    grad_bytes = sum(numel(s) for s in shapes()) * BF16
    for phase in ("forward", "backward", "optimizer"):
        extra = e.phases[phase].peak_allocated_bytes - single.phases[phase].peak_allocated_bytes
        assert grad_bytes <= extra <= grad_bytes + 512 * 2, phase  # two buckets, 512 B blocks


def test_offload_moves_optimizer_states_and_masters_to_host_memory() -> None:
    on_gpu = estimate(gpus=4, shard="zero2")
    off = estimate(gpus=4, shard="zero2", offload="optimizer")
    n_part = -(-sum(numel(s) for s in shapes()) // 4)
    for phase in off.phases.values():
        assert phase.components["optimizer_states"] == 0
    assert comp(on_gpu, "optimizer", "optimizer_states") > 0
    # host: fp32 master (4) + fp32 m, v (8) + the fp32 gradient partition CPU Adam reads (4)
    assert abs(off.host_memory_bytes - 16 * n_part) < 512 * 3 * len(shapes())
    assert off.peak_allocated_bytes < on_gpu.peak_allocated_bytes
    assert on_gpu.host_memory_bytes == 0


def test_fsdp2_traced_holds_shards_plus_the_current_and_prefetched_block(single) -> None:  # type: ignore[no-untyped-def]
    e = estimate(gpus=4, shard="fsdp")
    sharded = sum(r512(-(-s[0] // 4) * numel(s[1:]) * BF16) for s in shapes()) + 2 * 512
    assert comp(e, "optimizer", "parameters") == sharded  # (+ the two rotary buffers)
    layer = sum(numel(s) for s in shapes()[1:10]) * BF16
    root = (2 * V * H + H) * BF16  # embedding, lm_head, final norm: the root stays unsharded
    gathered = comp(e, "forward", "parameters") - sharded
    # current + prefetched block, plus at most one flat all-gather buffer being copied out
    assert root + 2 * layer <= gathered <= root + 3 * layer + 512 * 40
    states = comp(e, "optimizer", "optimizer_states")
    assert abs(states - comp(single, "optimizer", "optimizer_states") / 4) < 512 * 2 * len(shapes())
    assert e.n_params == single.n_params


def test_fsdp_offload_params_moves_shards_grads_and_states_to_host() -> None:
    e = estimate(gpus=4, shard="fsdp", offload="params")
    assert comp(e, "optimizer", "optimizer_states") == 0
    sharded = sum(-(-s[0] // 4) * numel(s[1:]) * BF16 for s in shapes())
    # params + grads (bf16) + AdamW m, v (bf16) of the shards, at least
    assert e.host_memory_bytes >= 4 * sharded


def test_tensor_parallel_rank_holds_its_split_of_every_matrix(single) -> None:  # type: ignore[no-untyped-def]
    e = estimate(gpus=2, tp=2)
    vocab = -(-V // 256) * 256 // 2  # Megatron pads to 128 * tp, then splits
    per_rank = shapes(heads=HEADS // 2, kv=KV // 2, ff=FF // 2, vocab=vocab)
    expected = sum(r512(numel(s) * BF16) for s in per_rank) + 2 * 512  # + rotary buffers
    assert comp(e, "optimizer", "parameters") == expected
    assert e.n_params == single.n_params  # reported for the whole model


def test_tp_that_does_not_divide_the_heads_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match=r"tp \(3\) must divide num_attention_heads \(8\)"):
        estimate(gpus=3, tp=3)
    gpt2 = dict(
        model_type="gpt2",
        architectures=["GPT2LMHeadModel"],
        n_embd=128,
        n_layer=2,
        n_head=4,
        vocab_size=500,
    )
    with pytest.raises(SpecError, match="model_type 'gpt2'.*--engine analytic"):
        trace_hf(gpt2, WorkloadSpec(gpus=2, tp=2, precision="bf16-true"), name="gpt2")
