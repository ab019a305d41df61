"""Per-GPU bytes of model states under data parallelism, ZeRO, FSDP, offload and tensor parallelism.

Torch-free arithmetic shared by the analytic engine and the trace engine (which applies the same
rules to a traced timeline in ``trace/distributed.py``). Every count here is per data-parallel
rank; ``dp`` is the data-parallel degree (``gpus / tp``).

What each setup keeps on one GPU (Rajbhandari et al., "ZeRO", arXiv:1910.02054, §5.1-5.2 and
Table 1; PyTorch FSDP2 ``fully_shard`` docs; DeepSpeed ZeRO-Offload, arXiv:2101.06840):

==========  ==========  ==========  =========================  ================================
shard       parameters  gradients   optimizer states (+fp32    host RAM with ``--offload``
                                    master weights)
==========  ==========  ==========  =========================  ================================
none, ddp   full        full        full                       -
zero1       full        full        1/dp                       optimizer: states + masters
zero2       full        1/dp        1/dp                       optimizer: + fp32 gradient part
zero3       1/dp        1/dp        1/dp                       params: + parameter partition
fsdp        1/dp        1/dp        1/dp                       params: params, grads, states
==========  ==========  ==========  =========================  ================================

On top of these partitions a GPU holds communication buffers (DDP gradient buckets, ZeRO's
contiguous-gradient bucket) and, under ZeRO-3/FSDP, the parameters gathered for the blocks being
computed; the trace engine places those in time.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memfit.errors import SpecError
from memfit.models.model_spec import ModelSpec
from memfit.units import MiB

# ----------------------------------------------------------------------------- defaults, cited
#: DeepSpeed ``zero_optimization`` defaults, in elements (numel), as the code sets them:
#: ``deepspeed/runtime/zero/config.py`` (``DeepSpeedZeroConfig``, read at microsoft/DeepSpeed
#: 50c6d6f). The config-json docs page (docs/_pages/config-json.md) lists 5e8 and 1e6 for the two
#: stage-3 values marked *; the code, which is what runs, uses 5e7 and 1e5.
DEEPSPEED_DEFAULTS: dict[str, int] = {
    "reduce_bucket_size": 500_000_000,  # Field(pp_int(5e8))
    "allgather_bucket_size": 500_000_000,  # Field(pp_int(5e8))
    "stage3_prefetch_bucket_size": 50_000_000,  # * Field(pp_int(5e7))
    "stage3_param_persistence_threshold": 100_000,  # * Field(pp_int(1e5)): smaller stay whole
    "stage3_max_live_parameters": 1_000_000_000,  # Field(pp_int(1e9))
    "stage3_max_reuse_distance": 1_000_000_000,  # Field(pp_int(1e9))
}
#: DeepSpeed's ``contiguous_gradients`` default (True) copies gradients into one bucket of
#: ``reduce_bucket_size`` elements as they are produced; ``overlap_comm`` defaults to True for
#: stage 3 only (``overlap_comm_valid``), where it doubles that bucket in stages 1-2.
DEEPSPEED_CONTIGUOUS_GRADIENTS = True

#: The optimizer names DeepSpeed ZeRO runs as its own Adam (FusedAdam on the device,
#: DeepSpeedCPUAdam with ``offload_optimizer``) over its flat fp32 partitions: the rank-0 rewrite
#: counts no parameter-sized step temporaries for them (``rank_replay``), and one traced step
#: serves both names (:func:`traced_step_workload`).
DEEPSPEED_ADAM = ("adamw", "adamw-fused")


def traced_step_workload(workload: Any) -> Any:
    """The workload whose step the trace engine runs for ``workload``: the same, except that a
    ZeRO job naming ``adamw-fused`` traces torch's ``adamw`` step. DeepSpeed steps its own Adam
    for both names, so the two traced torch steps differed only in what the rewrite drops or
    moves to the host (torch's per-parameter ``step`` tensors: 335 KB of host RAM on a 36-layer
    8B model, benchmarks/fastpath_speed.py's config) — and tracing one saves a plan a derived
    form per stack (the derived cache key applies the same rule)."""
    if workload.shard in ("zero1", "zero2", "zero3") and workload.optimizer == "adamw-fused":
        return dataclasses.replace(workload, optimizer="adamw")
    return workload


#: ``torch.nn.parallel.DistributedDataParallel(bucket_cap_mb=25)``; the first bucket (the last
#: parameters, whose gradients are ready first) is capped at ``dist._DEFAULT_FIRST_BUCKET_BYTES``
#: (1 MiB). With ``gradient_as_bucket_view=False`` (the default) the buckets are flat copies held
#: for the life of the process, in addition to the parameters' ``.grad``.
DDP_BUCKET_CAP_BYTES = 25 * MiB
DDP_FIRST_BUCKET_BYTES = 1 * MiB

#: ZeRO §3.1: mixed-precision Adam keeps fp16 parameters (2 B) and gradients (2 B) plus K = 12
#: bytes of optimizer state per parameter (fp32 master weights, momentum, variance: 4 + 4 + 4).
ZERO_PAPER_PARAM_BYTES = 2
ZERO_PAPER_GRAD_BYTES = 2
ZERO_PAPER_K = 12
#: fp32 master weights kept by ZeRO (and DeepSpeed's bf16/fp16 optimizers) next to the states.
FP32_MASTER_BYTES = 4
#: DeepSpeed's CPU Adam (ZeRO-Offload) updates from fp32 gradients copied to host buffers
#: (arXiv:2101.06840 §4.1; DeepSpeed's estimator counts them in its 16 host bytes per parameter).
OFFLOAD_FP32_GRAD_BYTES = 4

#: Megatron-LM pads the vocabulary to a multiple of ``make_vocab_size_divisible_by * tp``
#: (default 128; megatron/training/tokenizer ``_vocab_size_with_padding``).
MEGATRON_VOCAB_DIVISIBLE_BY = 128

SHARDED = ("zero1", "zero2", "zero3", "fsdp")


# ----------------------------------------------------------------------------- model states
@dataclass(frozen=True, kw_only=True)
class ModelStateBytes:
    """Model states of one data-parallel rank: on the device, and in host RAM (offload)."""

    parameters_bytes: int
    gradients_bytes: int
    optimizer_states_bytes: int
    host_bytes: int = 0

    @property
    def device_bytes(self) -> int:
        return self.parameters_bytes + self.gradients_bytes + self.optimizer_states_bytes


def partition_numel(numel: int, dp: int) -> int:
    """Elements one rank holds of a flat partition (ZeRO pads every partition to equal size)."""
    _check_dp(dp)
    return -(-numel // dp)


def fsdp_shard_numel(shape: Sequence[int], dp: int) -> int:
    """Elements one rank holds of an FSDP2 parameter: dim 0 chunked into ``dp`` pieces, each
    padded to ``ceil(dim0 / dp)`` rows (``FSDPParam._init_sharded_param``)."""
    _check_dp(dp)
    if not shape:
        return 1
    rest = math.prod(shape[1:])
    return -(-shape[0] // dp) * rest


def hpz_secondary_bytes(numel: int, element_size: int, hpz: int) -> int:
    """ZeRO++ hpZ: the secondary partition DeepSpeed keeps of a partitioned ZeRO-3 parameter,
    ``tensor_size // num_ranks_in_param_group`` elements in the parameter's dtype, created the
    first time the parameter is released after a gather and kept from then on
    (``Init._partition_param_sec``, deepspeed/runtime/zero/partition_parameters.py at
    deepspeedai/DeepSpeed edaa722). 0 when hpZ is off (``hpz`` 1)."""
    if hpz <= 1:
        return 0
    return partition_numel(numel, hpz) * element_size


def zero3_persists(numel: int, threshold: int | None = None) -> bool:
    """ZeRO-3 keeps parameters below ``stage3_param_persistence_threshold`` whole on every rank."""
    limit = (
        DEEPSPEED_DEFAULTS["stage3_param_persistence_threshold"] if threshold is None else threshold
    )
    return numel < limit


def per_rank_model_states(
    n_params: int,
    *,
    shard: str,
    dp: int,
    offload: str = "none",
    param_bytes: float,
    grad_bytes: float,
    state_bytes: float,
    master_bytes: float = 0,
) -> ModelStateBytes:
    """Model states of one rank for ``n_params`` trainable parameters, partitioned as in the
    module docstring's table. ``state_bytes``: optimizer state per parameter (8 for fp32 Adam);
    ``master_bytes``: fp32 master copy per parameter (4 when parameters are 16-bit under ZeRO,
    0 otherwise). Offload ``optimizer`` moves states and masters to host RAM, with the fp32
    gradient partition the CPU optimizer reads; ``params`` moves the parameter partition (and,
    for FSDP's CPUOffloadPolicy, the gradient partition) too. Partitions are rounded up to whole
    elements (ZeRO pads to ``dp``)."""
    _check_dp(dp)
    if shard not in ("none", "ddp", *SHARDED):
        raise SpecError(f"shard ({shard!r}) must be one of none, ddp, {', '.join(SHARDED)}")
    part = partition_numel(n_params, dp)
    p_n = part if shard in ("zero3", "fsdp") else n_params
    g_n = part if shard in ("zero2", "zero3", "fsdp") else n_params
    o_n = part if shard in SHARDED else n_params
    params, grads = p_n * param_bytes, g_n * grad_bytes
    states = o_n * (state_bytes + master_bytes)
    host = 0.0
    if offload in ("optimizer", "params"):
        host += states
        states = 0
        if shard != "fsdp":
            host += o_n * OFFLOAD_FP32_GRAD_BYTES
            if shard in ("zero2", "zero3"):
                grads = 0  # reduced straight into the pinned host fp32 partition
    if offload == "params":
        host += params
        params = 0
        if shard == "fsdp":
            host += grads
            grads = 0
    return ModelStateBytes(
        parameters_bytes=round(params),
        gradients_bytes=round(grads),
        optimizer_states_bytes=round(states),
        host_bytes=round(host),
    )


def zero_paper_model_states_bytes(n_params: int, *, stage: int, dp: int) -> int:
    """ZeRO §5.1-5.2, Table 1: model-state bytes per device for mixed-precision Adam (2 + 2 + K
    bytes per parameter, K = 12): baseline (2+2+K)Ψ, P_os 4Ψ + KΨ/Nd, P_os+g 2Ψ + (2+K)Ψ/Nd,
    P_os+g+p (2+2+K)Ψ/Nd — computed exactly, without partition padding."""
    _check_dp(dp)
    per_param = ZERO_PAPER_PARAM_BYTES + ZERO_PAPER_GRAD_BYTES + ZERO_PAPER_K
    psi = n_params
    if stage == 0:
        return per_param * psi
    if stage == 1:
        return round(
            (ZERO_PAPER_PARAM_BYTES + ZERO_PAPER_GRAD_BYTES) * psi + ZERO_PAPER_K * psi / dp
        )
    if stage == 2:
        return round(
            ZERO_PAPER_PARAM_BYTES * psi + (ZERO_PAPER_GRAD_BYTES + ZERO_PAPER_K) * psi / dp
        )
    if stage == 3:
        return round(per_param * psi / dp)
    raise SpecError(f"ZeRO stage ({stage}) must be 0, 1, 2 or 3")


@dataclass(frozen=True, kw_only=True)
class DeepSpeedZero3Estimate:
    cpu_bytes: int
    gpu_bytes: int
    largest_layer_bytes: int


def deepspeed_zero3_estimate(
    total_params: int,
    largest_layer_params: int,
    *,
    gpus_per_node: int = 1,
    num_nodes: int = 1,
    offload_optimizer: bool,
    offload_params: bool,
    zero_init: bool = True,
    additional_buffer_factor: float = 1.5,
) -> DeepSpeedZero3Estimate:
    """DeepSpeed's own ``estimate_zero3_model_states_mem_needs`` (deepspeed/runtime/zero/stage3.py),
    reproduced term by term so memfit can be compared with it. Its accounting differs from ZeRO's
    16 bytes per parameter: 18 = 2 (fp16 params) + 4 (fp32 grads) + 12 (fp32 master, m, v), plus
    4 bytes per element of the largest layer (its gathered fp16 params and grads), and host RAM
    scaled by an ``additional_buffer_factor`` of 1.5."""
    total_gpus = num_nodes * gpus_per_node
    gpus_factor = 1 / num_nodes
    largest = 4 * largest_layer_params
    if offload_optimizer and offload_params:
        gpu = largest
        host_per_param = 18 * gpus_factor
        if not zero_init:
            host_per_param = max(4 * gpus_per_node, host_per_param)
        cpu = total_params * host_per_param * additional_buffer_factor
    elif offload_optimizer:
        gpu = largest + int(2 * total_params / total_gpus)
        host_per_param = 16 * gpus_factor
        if not zero_init:
            host_per_param = max(4 * gpus_per_node, host_per_param)
        cpu = total_params * host_per_param * additional_buffer_factor
    else:
        gpu = largest + int(18 * total_params / total_gpus)
        held = largest_layer_params if zero_init else total_params
        cpu = held * 4 * gpus_per_node * additional_buffer_factor
    return DeepSpeedZero3Estimate(
        cpu_bytes=int(cpu), gpu_bytes=int(gpu), largest_layer_bytes=largest
    )


# ----------------------------------------------------------------------------- buffers
def ddp_bucket_bytes(
    grad_bytes_in_order: Iterable[int],
    *,
    cap_bytes: int = DDP_BUCKET_CAP_BYTES,
    first_cap_bytes: int = DDP_FIRST_BUCKET_BYTES,
) -> list[int]:
    """Sizes of DDP's flat gradient buckets. ``grad_bytes_in_order``: each parameter's gradient
    bytes in bucketing order — the reverse of ``model.parameters()`` (gradients of the last layers
    are ready first). A bucket closes once it reaches its cap (the first one at
    ``first_cap_bytes``), as ``dist._compute_bucket_assignment_by_size`` does; one parameter larger
    than the cap gets a bucket of its own size."""
    buckets: list[int] = []
    current = 0
    cap = first_cap_bytes
    for n in grad_bytes_in_order:
        current += n
        if current >= cap:
            buckets.append(current)
            current = 0
            cap = cap_bytes
    if current:
        buckets.append(current)
    return buckets


def zero_ipg_bucket_numel(n_trainable: int, *, stage: int) -> int:
    """Elements of ZeRO's contiguous-gradient ("ipg") bucket. Stage 3 allocates
    ``reduce_bucket_size`` elements once at start-up (``DeepSpeedZeroOptimizer_Stage3``:
    ``torch.empty(self.reduce_bucket_size)``); stages 1-2 allocate it at each backward, doubled
    when ``overlap_comm`` is on (off by default below stage 3). memfit takes the documented size —
    it does not shrink for models smaller than the bucket."""
    if not DEEPSPEED_CONTIGUOUS_GRADIENTS or n_trainable == 0:
        return 0
    return DEEPSPEED_DEFAULTS["reduce_bucket_size"]


# ----------------------------------------------------------------------------- tensor parallel
def tp_vocab_per_rank(vocab_size: int, tp: int) -> int:
    """Rows of a vocab-parallel embedding / lm_head on one rank: Megatron pads the vocabulary to a
    multiple of ``128 * tp``, then splits it evenly."""
    multiple = MEGATRON_VOCAB_DIVISIBLE_BY * tp
    return -(-vocab_size // multiple) * multiple // tp


def tp_problems(
    tp: int, *, n_heads: int | None, n_kv_heads: int | None, intermediate_size: int | None
) -> list[str]:
    """Why ``tp`` cannot split these attention heads / MLP columns (Megatron requires each to
    divide evenly; the vocabulary is padded instead, see :func:`tp_vocab_per_rank`)."""
    p: list[str] = []
    if tp <= 1:
        return p
    for name, value in (
        ("num_attention_heads", n_heads),
        ("num_key_value_heads", n_kv_heads),
        ("intermediate_size", intermediate_size),
    ):
        if value is not None and value % tp:
            p.append(
                f"tp ({tp}) must divide {name} ({value}): tensor parallelism gives each rank "
                f"{name}/tp of them; use a --tp that divides {value}"
            )
    return p


#: Model types whose configs honour an explicit ``head_dim``: dividing their head counts by ``tp``
#: keeps the head size, so one tensor-parallel rank is the same model with heads, KV heads,
#: intermediate size and padded vocabulary divided by ``tp`` (both engines use this list).
TP_MODEL_TYPES = (
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "gemma",
    "gemma2",
    "gemma3_text",
    "olmo",
    "olmo2",
    "granite",
    "phi3",
)


def tp_config_problems(config: Mapping[str, Any] | ModelSpec, tp: int, *, engine: str) -> list[str]:
    """Why ``engine`` ("trace" or "analytic") cannot split this model ``tp`` ways: a model
    type outside :data:`TP_MODEL_TYPES`, or head / MLP counts ``tp`` does not divide."""
    spec = ModelSpec.of(config)
    if spec.model_type not in TP_MODEL_TYPES or spec.n_heads is None:
        hint = "; use --engine analytic for this model" if engine == "trace" else ""
        return [
            f"tp ({tp}) with model_type {spec.model_type!r}: the {engine} engine splits "
            f"Llama-style decoders ({', '.join(TP_MODEL_TYPES)}){hint}"
        ]
    return tp_problems(
        tp,
        n_heads=spec.n_heads,
        n_kv_heads=spec.n_kv_heads,
        intermediate_size=spec.intermediate_size,
    )


def tp_per_rank_config(config: dict[str, Any], tp: int) -> dict[str, Any]:
    """One tensor-parallel rank's config.json (Megatron without sequence parallelism:
    column-parallel q/k/v, gate, up; row-parallel o, down; vocab-parallel embedding and LM head,
    the vocabulary padded to a multiple of 128·tp; norms and the block's input/output
    replicated). A new dict; the input is not modified. The counts are the ModelSpec's (the
    config class's defaults where config.json omits them), written under the standard keys."""
    if tp == 1:
        return config
    spec = ModelSpec.from_config(config)
    heads, kv, head_dim, vocab = spec.n_heads, spec.n_kv_heads, spec.head_dim, spec.vocab_size
    if heads is None or kv is None or head_dim is None or vocab is None:
        raise SpecError(
            f"tp ({tp}): the config of model_type {spec.model_type!r} gives no head count, "
            "head_dim or vocab_size to split; add them to config.json"
        )
    d = copy.deepcopy(config)
    d["head_dim"] = head_dim
    d["num_attention_heads"] = heads // tp
    d["num_key_value_heads"] = kv // tp
    for key in ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size"):
        if d.get(key):
            d[key] = int(d[key]) // tp
    d["vocab_size"] = tp_vocab_per_rank(vocab, tp)
    return d


def _check_dp(dp: int) -> None:
    if not isinstance(dp, int) or dp < 1:
        raise SpecError(f"data-parallel degree ({dp!r}) must be a positive integer")


# ----------------------------------------------------------------------------- what a layout means
def layout_notes(workload: Any) -> list[str]:
    """The lines that say how this FSDP2 / ZeRO layout holds the model, and what differs between
    ``--shard fsdp`` and ``--shard zero3`` for the same job (both engines print them).

    The two fully sharded setups differ in three places (16-bit training, AdamW):

    - masters: FSDP2 under torchtitan's ``MixedPrecisionPolicy`` keeps the *sharded parameters*
      in fp32 (they are the masters; 4 B/param/dp) and the optimizer states fp32 (8); ZeRO-3
      keeps 16-bit partitions (2) plus fp32 masters and states in the optimizer (4 + 8) —
      the same 12 + 4 bytes per parameter per rank, held as different tensors.
    - gradients: FSDP2 reduce-scatters in ``reduce_dtype`` fp32 into fp32 sharded gradients
      (4 B/param/dp) through a per-block fp32 copy of the block's 16-bit gradients; ZeRO-3 keeps
      16-bit gradient partitions (2) plus its ``reduce_bucket_size`` (5e8 elements) contiguous
      bucket, and converts the partition to fp32 for the step.
    - gathered parameters: FSDP2 holds the running block, the next one's all-gather output and
      (backward) the prefetched block, whole blocks at a time; ZeRO-3 gathers module by module,
      prefetching up to ``stage3_prefetch_bucket_size`` (5e7) elements, keeping parameters
      under ``stage3_param_persistence_threshold`` (1e5) unpartitioned.
    """
    shard = getattr(workload, "shard", "none")
    if shard == "fsdp":
        policy = workload.fsdp_policy
        out = []
        if policy is not None:
            out.append(
                f"FSDP2 MixedPrecisionPolicy(param_dtype={policy[0]}, reduce_dtype={policy[1]}) "
                "as torchtitan applies it: fp32 sharded parameters (the masters), gradients and "
                f"Adam states; {policy[0]} unsharded parameters in forward/backward, no autocast; "
                f"each block's gradients copied to {policy[1]} for the reduce-scatter"
            )
        else:
            out.append(
                "FSDP2 without a cast (MixedPrecisionPolicy()): parameters, gathers, gradients "
                f"and reduce-scatter in the parameters' dtype ({workload.precision})"
            )
        rf = workload.reshard_after_forward
        if rf is not True:
            kept = "whole" if rf is False or rf == 1 else f"sharded over {rf} ranks"
            out.append(
                f"reshard_after_forward={rf}: every block's parameters stay {kept} from its "
                "forward to its backward (no all-gather in backward)"
            )
        if workload.dp_replicate > 1:
            out.append(
                f"HSDP: {workload.dp_replicate} replicas x {workload.dp_shard}-way shard; "
                f"model states are 1/{workload.dp_shard} per GPU, not 1/{workload.dp}"
            )
        if workload.is_train:
            out.append(
                "vs --shard zero3: ZeRO-3 keeps 16-bit partitions + fp32 masters in the "
                "optimizer (same 16 B/param), 16-bit gradient partitions + a 5e8-element "
                "reduce bucket (FSDP2: fp32 gradient shards + a per-block fp32 reduce-scatter "
                "copy), and gathers module by module with a 5e7-element prefetch (FSDP2: whole "
                "blocks, the running one and the next)"
            )
        return out
    out = []
    hpz = getattr(workload, "zero_hpz_partition_size", 1)
    if shard == "zero3" and hpz > 1:
        out.append(
            f"ZeRO++ hpZ (zero_hpz_partition_size {hpz}): each partitioned parameter also keeps "
            f"a 16-bit secondary partition over {hpz} ranks (1/{hpz} of it per GPU), so the "
            "backward all-gather stays inside that group"
        )
    if shard == "zero3" and workload.is_train:
        return out + [
            "vs --shard fsdp: FSDP2 (torchtitan's bf16/fp32 policy) keeps fp32 sharded "
            "parameters as the masters and fp32 gradient shards with a per-block fp32 "
            "reduce-scatter copy, where ZeRO-3 keeps 16-bit partitions + fp32 masters in the "
            "optimizer, 16-bit gradient partitions and a 5e8-element reduce bucket; FSDP2 "
            "gathers whole blocks (running + next), ZeRO-3 module by module with a "
            "5e7-element prefetch"
        ]
    return out
