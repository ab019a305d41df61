"""Predicted step time of a dp x tp x pp x cp (x ep) training layout (issue 30 item 3).

One optimizer step over the global batch, as the busiest pipeline rank sees it; the GPU's
dense 16-bit rate at the layout model's own fitted MFU (:data:`LAYOUT_FIT`, apart from
:mod:`memfit.plan.cost`'s single-GPU constants), the ring efficiency ``link_efficiency`` and
the memory-bound optimizer step of :mod:`memfit.plan.cost`, the links from :class:`Topology`::

    step    = compute · (1 + bubble) + p2p + tp · exposed + cp + ep + exposed(fsdp / dp) + opt
    compute = m · (F_stage / (tp · cp · rate · MFU) + passes · L_stage · layer_overhead)
    F_stage = (1 + 2) · (2 N_layer L_stage + 2 V h [last stage] + 2 L_stage s h · c_cp) · b s
              + recomputation                                            (6N rule, cost.py)

``m`` micro-batches of ``b`` sequences of ``s`` tokens per data-parallel replica; ``N_layer``
the matmul parameters one token passes in a layer (a MoE layer: its top-k routed experts and
the shared ones). ``L_stage = ceil(L / pp)``: the busiest stage holds the rounded-up share of
the layers and the last one also the output head (``V h``) — the pipeline runs at its pace
(the Llama 3 paper, §3.3.2, drops a layer from the first and last stages for this balance).
``c_cp = 1 + cp_attention_overhead · log2(cp)``: ring attention's partial blocks, merges and
causal load balancing make its attention slower than one fused kernel (fitted on torchtitan's
FSDP + CP tables). ``layer_overhead``: fixed time per layer, micro-batch and pass (launches,
syncs, small-kernel tails) that no FLOP count sees: it makes many small micro-batches, high tp
x cp and short sequences cost more. Recomputation adds a forward: ``full`` the whole layer
(matmuls + attention), ``selective`` the attention core only (Korthikanti et al. 2022 §5,
Megatron's ``--recompute-granularity selective``), as :func:`memfit.plan.cost.train_step_cost`
charges it.

Pipeline bubble, the idle share added to the compute
(:func:`memfit.estimate.parallel.layouts.bubble_fraction`, the one rule):

- ``gpipe`` / ``1f1b``: ``(pp - 1) / m`` (Narayanan et al. 2021, "Efficient Large-Scale
  Language Model Training on GPU Clusters", §2.2.1: bubble time fraction = ``(p - 1) / m``);
- ``interleaved-1f1b`` with ``v`` chunks per rank: ``(pp - 1) / (m v)`` (same paper §2.2.2);
- ``zbv`` / ``dualpipev``: 0 once ``m >= 2 pp`` (Qi et al. 2024, "Zero Bubble Pipeline
  Parallelism", arXiv:2401.10241 §6: ZB-V reaches zero bubble with enough micro-batches;
  DeepSeek-V3 report Table 2 puts DualPipe's bubble at ``(pp/2 - 1)(F&B + B - 3W)``, a
  fraction of one micro-batch), else as interleaved with ``v = 2``. torch.distributed.pipelining
  ships all five (``ScheduleGPipe``, ``Schedule1F1B``, ``ScheduleInterleaved1F1B``,
  ``ScheduleZBVZeroBubble``, ``ScheduleDualPipeV``; docs.pytorch.org/docs/stable/
  distributed.pipelining.html).

Communication, ring collectives at ``link · link_efficiency`` (a ring all-reduce moves
``2 (n - 1) / n`` of the buffer per GPU, all-gather / reduce-scatter / all-to-all ``(n - 1) / n``):

- **tp** (+ sequence parallelism): per layer and micro-batch two all-reduces of the ``b s / cp x
  h`` activations in the forward, two in the backward (Shoeybi et al. 2019 §3), two more per
  full recomputation; sequence parallelism swaps each for a reduce-scatter + all-gather of the
  same volume (Korthikanti et al. 2022 §4.2.2). Always inside a node (:data:`TP_STAYS_IN_NODE`);
  ``tp_exposed`` of it not hidden (``tp_overlap_exposed`` with Megatron's
  ``--tp-comm-overlap`` or torchtitan's async TP; the planner prices plain TP, torchtitan's
  and Megatron's default).
- **cp** ring attention: each layer's K/V (``b s / cp x kv_dim / tp``) passes ``cp - 1`` hops
  in the forward, K/V plus dK/dV in the backward (Liu et al. 2023, Ring Attention); overlapped
  with the layer's attention compute, only the excess counts, plus a latency per ring step
  (:data:`CP_HOP_LATENCY_S`) that short sequences cannot hide.
- **ep** all-to-all: dispatch and combine of ``b s / cp x top_k`` token copies per MoE layer in
  the forward and again in the backward; not overlapped (DualPipe's overlap is not modelled).
- **pp** point-to-point: a micro-batch's activations forward and its gradient back per chunk
  boundary, over the inter-node link when a replica's ``tp cp dp`` ranks fill a node.
- **fsdp** (FSDP2 over the ``dp x cp`` ranks, torchtitan's ``MixedPrecisionPolicy(bf16, fp32)``):
  a bf16 all-gather of the rank's parameters for the forward and the backward and an fp32
  reduce-scatter of its gradients — per micro-batch without a pipeline (as cost.py), once per
  step with one (torchtitan keeps a stage unsharded across micro-batches); prefetched under the
  compute, only the excess counts.
- **zero1** (Megatron's distributed optimizer): one fp32 reduce-scatter of the gradients under
  the last micro-batch's backward (``--overlap-grad-reduce``) and a bf16 all-gather of the
  parameters under the next step's first forward (``--overlap-param-gather``); **ddp**: one
  fp32 all-reduce under the last micro-batch's backward.

Data-parallel and FSDP collectives run inside the node when their group (``tp x cp x dp`` ranks
with tp innermost, torchtitan's ``ParallelDims`` mesh order) fits in ``gpus_per_node``, else at
the inter-node link (one NIC per GPU, :data:`SCALE_OUT_GBPS_PER_GPU`). Congestion is not
modelled.

Calibration: the free constants (:class:`LayoutConstants`) are fitted by
``benchmarks/layout_step_time_calibration.py`` on 48 published multi-GPU throughputs
(``benchmarks/data/layout_throughput_published.jsonl``: torchtitan on 8-512 H100 / H200,
Megatron-LM on 48-6,144 H100 and 32-3,072 A100, Llama 3 on 8,192-16,384 H100): median
|error| 7 % on all points and on the held-out third, worst -35 % (torchtitan's Llama 3 8B at
TP 8); docs/accuracy.md "Layout step time". The figure ranks layouts; it is a calibrated
roofline, not a measurement of the user's cluster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from memfit.estimate.parallel.layouts import LayoutChoice, bubble_fraction
from memfit.estimate.parallel.schedule import chunks_per_rank
from memfit.estimate.parallel.shape import DecoderShape
from memfit.plan.cost import COST_CONSTANTS, OPTIMIZER_STEP_BYTES, Rates

#: Inter-node bandwidth per GPU, one direction, GB/s, by generation: one NIC per GPU in the
#: vendors' reference nodes. DGX A100: 8x ConnectX-6 200 Gb/s (25 GB/s;
#: docs.nvidia.com/dgx/dgxa100-user-guide/introduction-to-dgxa100.html); DGX H100 / DGX B200:
#: 8x ConnectX-7 400 Gb/s (50 GB/s; docs.nvidia.com/dgx/dgxh100-user-guide/
#: introduction-to-dgxh100.html, docs.nvidia.com/dgx/dgxb200-user-guide/
#: introduction-to-dgxb200.html); AMD Instinct MI300X / MI325X / MI355X platforms: one 400 GbE
#: NIC per GPU (AMD Pollara 400 / ConnectX-7 reference designs, 50 GB/s). Volta, Turing and Ada
#: (no reference node with a NIC per GPU): memfit's assumption, 100 Gb/s per GPU (12.5 GB/s).
SCALE_OUT_GBPS_PER_GPU: dict[str, float] = {
    "volta": 12.5,
    "turing": 12.5,
    "ada": 12.5,
    "ampere": 25.0,
    "hopper": 50.0,
    "blackwell": 50.0,
    "cdna3": 50.0,
    "cdna4": 50.0,
}
#: GPUs in one node where the catalog gives no ``scale_up_gpus``: the 8-GPU HGX / OAM board
#: (memfit's assumption for PCIe servers too; ``--gpus-per-node`` overrides).
DEFAULT_GPUS_PER_NODE = 8
#: Megatron's and torchtitan's guidance: tensor parallelism inside the NVLink domain only.
TP_STAYS_IN_NODE = True
#: Bytes per element: activations and gathered weights in bf16, gradient reductions in fp32
#: (torchtitan's FSDP2 ``reduce_dtype=float32``; Megatron's fp32 ``main_grad`` buffer).
ACT_BYTES, PARAM_BYTES, GRAD_REDUCE_BYTES = 2, 2, 4
#: Latency of one ring-attention step (a send / receive of the next K/V block and its
#: attention kernel's launch): cost.py's small-message NCCL latency on NVLink
#: (``tp_allreduce_latency_s``, fitted on decode; nccl-tests report ~10-30 us).
CP_HOP_LATENCY_S = COST_CONSTANTS["tp_allreduce_latency_s"][0]
#: Forward passes of a layer's all-reduces: forward 1, backward 1 (the input gradient); each
#: pass all-reduces twice (attention, MLP).
TP_ALLREDUCES_PER_PASS = 2


@dataclass(frozen=True, kw_only=True)
class LayoutConstants:
    """The free constants of the layout step-time model (module docstring, "Calibration").

    ``mfu_by_arch``: model-FLOPs utilization of the matmuls and attention of large per-GPU
    work, per GPU generation (a generation missing takes ``MFU_FALLBACK_ARCH``'s);
    ``layer_overhead_s``: fixed time per layer, micro-batch and pass (launches, syncs, the
    tails of small kernels) that no FLOP count sees; ``tp_exposed``: share of the
    tensor-parallel collectives not hidden under compute (``tp_overlap_exposed`` with
    Megatron's ``--tp-comm-overlap`` / torchtitan's async TP); ``cp_attention_overhead``:
    extra attention time per doubling of the context-parallel degree (ring steps, partial
    softmax merges, causal load balancing)."""

    mfu_by_arch: dict[str, float]
    layer_overhead_s: float
    tp_exposed: float
    tp_overlap_exposed: float
    cp_attention_overhead: float

    def mfu(self, arch: str) -> float:
        fallback = MFU_FALLBACK_ARCH.get(arch, "hopper")
        return self.mfu_by_arch.get(arch, self.mfu_by_arch[fallback])


#: Generations without a fitted layout MFU take a fitted one's (no multi-GPU point of theirs).
MFU_FALLBACK_ARCH = {
    "volta": "ampere",
    "turing": "ampere",
    "ada": "ampere",
    "blackwell": "hopper",
    "cdna3": "hopper",
    "cdna4": "hopper",
}

#: Fitted by ``benchmarks/layout_step_time_calibration.py --fit`` on the published multi-GPU
#: throughputs of ``benchmarks/data/layout_throughput_published.jsonl`` (torchtitan 8-512
#: H100 / H200, Megatron-LM 48-6,144 H100 and 32-3,072 A100, Llama 3 on 8,192-16,384 H100);
#: errors per point in ``benchmarks/results/layout_step_time_calibration.md`` (median |error|
#: 7 % on all 48 points and on the 16 held out, worst +36 % / -35 %) and docs/accuracy.md
#: "Layout step time". ``tp_exposed`` is fitted on torchtitan's plain / async TP pairs, the
#: rest on two thirds of the points. Apart from :mod:`memfit.plan.cost`'s single-GPU
#: constants (its Hopper MFU was fitted on 500 W parts).
LAYOUT_FIT = LayoutConstants(
    mfu_by_arch={"hopper": 0.61, "ampere": 0.57},
    layer_overhead_s=146e-6,
    tp_exposed=0.34,
    tp_overlap_exposed=0.0,
    cp_attention_overhead=0.42,
)


@dataclass(frozen=True, kw_only=True)
class Topology:
    """The GPU's links: ``intra_bps`` inside a node (NVLink / Infinity Fabric / PCIe, one
    direction), ``inter_bps`` between nodes (the GPU's NIC, one direction)."""

    gpus_per_node: int
    intra_bps: float
    inter_bps: float

    @classmethod
    def of(cls, gpu: Any, gpus_per_node: int | None = None) -> Topology:
        rates = Rates.of(gpu)
        per_node = gpus_per_node or getattr(gpu, "scale_up_gpus", None) or DEFAULT_GPUS_PER_NODE
        inter = SCALE_OUT_GBPS_PER_GPU.get(getattr(gpu, "arch", ""), 12.5) * 1e9
        return cls(
            gpus_per_node=per_node, intra_bps=rates.link_bps, inter_bps=min(inter, rates.link_bps)
        )

    def link(self, span: int) -> float:
        """Ring bandwidth of a group spanning ``span`` consecutive ranks (B/s)."""
        bps = self.intra_bps if span <= self.gpus_per_node else self.inter_bps
        return bps * COST_CONSTANTS["link_efficiency"][0]


#: The layout the cost model prices (degrees, batch split, schedule, sharding).
LayoutShape = LayoutChoice


@dataclass(frozen=True, kw_only=True)
class LayoutCost:
    """Predicted seconds per optimizer step and its parts; ``tokens_per_s`` over all GPUs."""

    step_s: float
    tokens_per_s: float
    bubble: float
    parts_s: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        return {
            "step_s": self.step_s,
            "tokens_per_s": self.tokens_per_s,
            "bubble": self.bubble,
            "parts_s": dict(self.parts_s),
        }


def active_matmul_params(shape: DecoderShape) -> int:
    """Matmul parameters one token passes: attention, dense MLPs, top-k routed + shared experts,
    routers, the output head (the input embedding is a lookup)."""
    per_dense = shape.attention_params + shape.dense_mlp_params
    n_moe = shape.n_layers - shape.n_dense_layers if shape.moe else 0
    per_moe = shape.attention_params + shape.top_k * shape.expert_params
    per_moe += shape.shared_params + shape.router_params
    return (shape.n_layers - n_moe) * per_dense + n_moe * per_moe + shape.embedding_params


def rank_params(shape: DecoderShape, lay: LayoutShape) -> float:
    """Parameters one GPU holds unsharded (its pipeline stage's share, tp / ep slices)."""
    n_moe = shape.n_layers - shape.n_dense_layers if shape.moe else 0
    dense = shape.n_layers * (shape.attention_params + shape.norm_params)
    dense += (shape.n_layers - n_moe) * shape.dense_mlp_params
    dense += n_moe * (shape.shared_params + shape.router_params)
    dense += shape.embedding_params * (1 if shape.tied else 2)
    experts = n_moe * shape.n_experts * shape.expert_params
    return (dense / lay.tp + experts / lay.ep) / lay.pp


def stage_layers(shape: DecoderShape, lay: LayoutShape) -> int:
    """Layers of the busiest pipeline rank: the stages split the layers as evenly as they can
    (``ceil(L / pp)``; torchtitan's and Megatron's default split)."""
    return math.ceil(shape.n_layers / lay.pp)


def layout_step_cost(
    shape: DecoderShape,
    lay: LayoutShape,
    rates: Rates,
    topo: Topology,
    *,
    consts: LayoutConstants = LAYOUT_FIT,
    tp_overlap: bool = False,
    matmul_speedup: float = 1.0,
) -> LayoutCost:
    """One optimizer step of ``lay`` (module docstring); ``tp_overlap`` prices the TP
    collectives as overlapped (Megatron ``--tp-comm-overlap``, torchtitan async TP);
    ``matmul_speedup`` divides the matmul time (Float8 linears; the calibration's only)."""
    b, s, h = lay.micro_batch, lay.seq_len, shape.hidden
    m, n_layers = lay.grad_accum, stage_layers(shape, lay)
    tokens = b * s
    rate = rates.flops.get("bf16", rates.flops["fp16"]) * consts.mfu(rates.arch)
    mm_fwd, head_fwd, attn_fwd = _stage_forward_flops(shape, lay, n_layers)
    attn_fwd *= 1.0 + consts.cp_attention_overhead * math.log2(lay.cp)
    mm_fwd /= matmul_speedup
    head_fwd /= matmul_speedup
    recompute = {"none": 0.0, "selective": attn_fwd, "full": mm_fwd + attn_fwd}[lay.checkpointing]
    passes = 3 + (lay.checkpointing == "full")
    micro_s = (3 * (mm_fwd + head_fwd + attn_fwd) + recompute) / (lay.tp * lay.cp * rate)
    micro_s += passes * n_layers * consts.layer_overhead_s
    attn_layer_s = (3 * attn_fwd + (attn_fwd if lay.checkpointing != "none" else 0.0)) / (
        lay.tp * lay.cp * n_layers * rate
    )
    v = chunks_per_rank(lay.pp_schedule, lay.pp_virtual_stages) if lay.pp > 1 else 1
    bubble = bubble_fraction(lay.pp_schedule, pp=lay.pp, micro_batches=m, virtual=v)
    parts = {"compute": m * micro_s, "bubble": m * micro_s * bubble}
    act = tokens / lay.cp * h * ACT_BYTES
    tp_passes = 2 + (lay.checkpointing == "full")
    tp_ring = 2.0 * (lay.tp - 1) / lay.tp
    exposed = consts.tp_overlap_exposed if tp_overlap else consts.tp_exposed
    tp_s = tp_passes * TP_ALLREDUCES_PER_PASS * n_layers * tp_ring * act / topo.link(lay.tp)
    parts["tp"] = m * tp_s * exposed
    parts["cp"] = m * n_layers * _cp_exposed_s(shape, lay, topo, attn_layer_s)
    parts["ep"] = m * _ep_s(shape, lay, topo, tp_passes)
    parts["pp_p2p"] = _p2p_s(lay, topo, act, v)
    params = rank_params(shape, lay)
    parts["fsdp_dp"] = _sharding_exposed_s(lay, topo, params, m * micro_s, micro_s)
    shards = lay.dp * lay.cp if lay.shard in ("fsdp", "zero1") else 1
    opt_bytes = OPTIMIZER_STEP_BYTES["adamw"] * params / shards
    parts["optimizer"] = opt_bytes / (rates.memory_bps * COST_CONSTANTS["mbu"][0])
    step = sum(parts.values())
    tokens_step = tokens * m * lay.dp
    return LayoutCost(step_s=step, tokens_per_s=tokens_step / step, bubble=bubble, parts_s=parts)


def _stage_forward_flops(
    shape: DecoderShape, lay: LayoutShape, n_layers: int
) -> tuple[float, float, float]:
    """Forward FLOPs of one micro-batch on the busiest pipeline rank: its layers' matmuls, the
    output head (on the last stage, which also holds the most layers when they do not divide
    evenly) and its layers' attention (causal: ``2 s h`` per token and layer)."""
    tokens = lay.micro_batch * lay.seq_len
    per_layer = (active_matmul_params(shape) - shape.embedding_params) / shape.n_layers
    mm = 2.0 * per_layer * n_layers * tokens
    head = 2.0 * shape.embedding_params * tokens
    attn = 2.0 * n_layers * lay.seq_len * shape.hidden * tokens
    return mm, head, attn


def _cp_exposed_s(
    shape: DecoderShape, lay: LayoutShape, topo: Topology, attn_layer_s: float
) -> float:
    """One layer's ring-attention traffic beyond its attention compute (one micro-batch), and
    the latency of each ring step (:data:`CP_HOP_LATENCY_S`: a step waits for its block, which
    a short sequence's tiny blocks cannot hide)."""
    if lay.cp == 1:
        return 0.0
    kv = 2 * lay.micro_batch * lay.seq_len / lay.cp * shape.kv_dim / lay.tp * ACT_BYTES
    hops = lay.cp - 1
    # forward: K/V round the ring; backward: K/V again and dK/dV back (fp32 accumulators in
    # torch's ring attention are local; the wire carries the compute dtype)
    wire = hops * kv * (1 + 2) / topo.link(lay.tp * lay.cp)
    rings = 2 + (lay.checkpointing != "none")  # forward, backward, a recomputed forward
    return max(0.0, wire - attn_layer_s) + rings * hops * CP_HOP_LATENCY_S


def _ep_s(shape: DecoderShape, lay: LayoutShape, topo: Topology, passes: int) -> float:
    """The MoE all-to-alls of one micro-batch on this rank's MoE layers."""
    if lay.ep == 1 or not shape.moe:
        return 0.0
    n_moe = (shape.n_layers - shape.n_dense_layers) / lay.pp
    copies = lay.micro_batch * lay.seq_len / lay.cp * shape.top_k * shape.hidden * ACT_BYTES
    share = (lay.ep - 1) / lay.ep
    # dispatch + combine per pass (forward, backward, a full recompute's forward)
    return passes * 2 * n_moe * share * copies / topo.link(lay.tp * lay.ep)


def _p2p_s(lay: LayoutShape, topo: Topology, act: float, v: int) -> float:
    """Activations forward and gradients back across each of this rank's chunk boundaries."""
    if lay.pp == 1:
        return 0.0
    per = act / lay.tp  # sequence-parallel stages send the tp-split sequence
    link = topo.link(2 * lay.tp * lay.cp * lay.dp)  # two neighbouring stages
    return lay.grad_accum * v * 2 * per / link


def _sharding_exposed_s(
    lay: LayoutShape, topo: Topology, params: float, compute_s: float, micro_s: float
) -> float:
    """FSDP / ZeRO-1 / DDP traffic of one step beyond the compute it hides under."""
    n = lay.dp * lay.cp
    if n == 1:
        return 0.0
    link = topo.link(lay.tp * n)
    share = (n - 1) / n
    if lay.shard == "fsdp":
        rounds = lay.grad_accum if lay.pp == 1 else 1
        wire = rounds * share * params * (2 * PARAM_BYTES + GRAD_REDUCE_BYTES) / link
        return max(0.0, wire - compute_s)
    if lay.shard == "zero1":
        # reduce-scatter under the last micro-batch's backward (--overlap-grad-reduce), the
        # parameter all-gather under the next step's first forward (--overlap-param-gather)
        wire = share * params * (GRAD_REDUCE_BYTES + PARAM_BYTES) / link
        return max(0.0, wire - micro_s)
    # ddp: one ring all-reduce of the fp32 gradients under the last micro-batch's backward
    wire = 2 * share * params * GRAD_REDUCE_BYTES / link
    return max(0.0, wire - micro_s * 2 / 3)


__all__ = [
    "DEFAULT_GPUS_PER_NODE",
    "SCALE_OUT_GBPS_PER_GPU",
    "LayoutCost",
    "LayoutShape",
    "Topology",
    "active_matmul_params",
    "LAYOUT_FIT",
    "LayoutConstants",
    "bubble_fraction",
    "layout_step_cost",
    "rank_params",
    "stage_layers",
]
