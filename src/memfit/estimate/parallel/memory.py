"""Per-rank bytes of a training step under dp x tp x pp x cp (x ep), one pipeline rank at a time.

What one GPU holds (``t = tp``, ``c = cp``, ``T = micro_batch x seq / c`` tokens, ``A`` the
compute dtype's bytes, ``V`` the vocabulary, ``h`` the hidden width):

- **Model states** of its pipeline rank's layers, tensor-parallel slices (``1/t`` of every
  matrix, norms whole), embeddings on the rank holding chunk 0 and the norm + head on the rank
  holding the last chunk (:mod:`.schedule`); routed experts ``n_experts / ep`` per rank, each
  ``1/etp`` wide; router and shared experts on every rank. Dense parameters are sharded by the
  sharding mode over ``dp x cp`` ranks (torchtitan folds cp into the FSDP mesh, Megatron's
  distributed optimizer shards over the dp x cp group), expert parameters over the expert
  data-parallel group ``dp x cp x tp / (ep x etp)`` (Megatron's ``expert_data_parallel``,
  torchtitan's ``dp_shard_mod_ep``). Bytes per parameter: :data:`STATE_BYTES`.
- **Activations**: per layer and micro-batch (:func:`layer_activation_bytes`), times the
  layer-micro-batches in flight on the rank (:mod:`.schedule`), plus the loss's log-probs on the
  head rank. Context parallelism divides ``T`` by ``c``; sequence parallelism (where the job says
  so) divides the norm tensors by ``t``.
- **Temporaries** (:func:`transients`): the larger of the loss over the vocabulary
  (:data:`LOSS_BYTES_PER_LOGIT`; :data:`LOSS_PARALLEL_BYTES_PER_LOGIT` under torchtitan's loss
  parallel) and a layer's backward (the layer recomputed under full
  checkpointing + ring attention's K/V buffers, :func:`cp_buffer_bytes` + the MoE all-to-all
  buffers and grouped-GEMM workspace, :func:`ep_buffer_bytes`); plus FSDP / ZeRO-3's gathered
  layers (of a resident pipeline stage only the layer's bf16 gradients before FSDP2 folds them:
  :func:`unfolded_grad_bytes`) and the pipeline's receive buffers (:func:`p2p_bytes`).
- **The stack** (:attr:`Layout.torch_native`): ``fsdp`` / ``zero3`` jobs run as torchtitan runs
  them (FSDP2 keeps a pipeline stage unsharded between micro-batches, torch.distributed.pipelining
  keeps receive buffers and the last stage's logits per micro-batch, attention saves K/V
  expanded to the query heads); ``ddp`` / ``zero1`` as Megatron-core does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memfit.estimate.analytic.compile import dropped
from memfit.estimate.optim_states import optimizer_state_bytes
from memfit.estimate.parallel.schedule import RankStages
from memfit.estimate.parallel.shape import DecoderShape
from memfit.estimate.sharding import per_rank_model_states
from memfit.spec.rules import LAYER_SAC, SELECTIVE_AC_OPTION_DEFAULT, layer_sac_checkpointed
from memfit.units import MiB

#: Bytes per parameter (parameters, gradients, master copy) by precision family and sharding
#: mode; the optimizer's states come from :mod:`memfit.estimate.optim_states`, in fp32 where a
#: master copy exists. ``*-mixed``: Megatron-core keeps 16-bit parameters and an fp32 gradient
#: buffer (``main_grad``) with fp32 masters in the optimizer — 18 bytes with Adam, 6 + 12/dp with
#: the distributed optimizer (``theoretical_memory_usage.py``, NVIDIA/Megatron-LM 00caa53) — as
#: memfit's ``ddp`` / ``zero1``; DeepSpeed ZeRO-2/3 keep 16-bit gradients (ZeRO §5, 2 + 2 + 12);
#: FSDP2 as torchtitan runs it keeps fp32 sharded parameters and fp32 gradients
#: (``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``), casting a layer to bf16 when
#: it gathers it (counted as a temporary). ``*-true`` / ``32-true``: everything in that dtype.
STATE_BYTES: dict[tuple[str, str], tuple[int, int, int]] = {
    ("mixed", "none"): (2, 4, 4),
    ("mixed", "ddp"): (2, 4, 4),
    ("mixed", "zero1"): (2, 4, 4),
    ("mixed", "zero2"): (2, 2, 4),
    ("mixed", "zero3"): (2, 2, 4),
    ("mixed", "fsdp"): (4, 4, 0),
}
#: Bytes per logit at the loss on the head rank, per micro-batch, at its peak (the start of
#: backward): the fp32 log-probabilities ``cross_entropy`` keeps (4), the dense fp32 gradient
#: ``nll_loss`` hands back (4) and ``log_softmax``'s input gradient (4) — above the forward's
#: bf16 logits + fp32 copy + log-probabilities (10; torchtitan frees the logits before backward,
#: ``del pred`` in its train step). The log-probabilities stay saved until that micro-batch's
#: backward (:data:`LOSS_SAVED_BYTES`).
LOSS_BYTES_PER_LOGIT = 4 + 4 + 4
LOSS_SAVED_BYTES = 4
#: The same peak under loss parallelism, which torchtitan turns on with tensor parallelism
#: (``training.disable_loss_parallel`` False by default; the output head ``ColwiseParallel(
#: output_layouts=Shard(-1), use_local_output=False)`` and ``loss_parallel()`` around the step:
#: ``apply_tp`` in ``torchtitan/parallelisms/parallelize_llama.py`` and ``train.py`` at 9dec370).
#: torch's vocabulary-sharded cross entropy fuses the ``nll_loss`` and ``log_softmax`` backward
#: into ``(grad_input + torch.exp(x)) * grad_output`` over a dense ``zeros_like(x)``
#: (``_nll_loss_and_log_softmax_backward`` in ``torch/distributed/tensor/parallel/loss.py``):
#: the saved fp32 log-probabilities, the scattered zeros, ``exp(x)`` and their sum are live at
#: once, 4 fp32 copies of the logit shard — 16 bytes per logit where the fused CUDA
#: ``log_softmax`` backward needs 12 (measured on CPU through torch's own code in
#: ``tests/estimate/parallel/test_loss_peak.py``).
LOSS_PARALLEL_BYTES_PER_LOGIT = 4 + 4 + 4 + 4
#: torch.distributed.pipelining keeps the last stage's output (the logits, compute dtype) of
#: every micro-batch for the merged return (``_PipelineStageBase.forward_one_chunk``:
#: ``output_chunks.append``, pytorch 00722e6; ``save_forward_output`` defaults to True). Megatron
#: returns only the loss. Counted for FSDP pipelines (memfit's torchtitan-style layout).
PIPELINING_KEEPS_LAST_OUTPUTS = True
#: Ring attention accumulates dQ, dK and dV (and merges partial outputs) in fp32
#: (``torch.distributed.tensor.experimental._attention``: ``grad_query`` etc. ``float32``).
CP_ACCUM_BYTES = 4
#: cuBLAS workspaces of a grouped GEMM over the local experts: TransformerEngine's grouped
#: linear runs its GEMMs on 4 streams (``_NUM_MAX_CUBLAS_STREAMS``), each with the Hopper
#: cuBLAS workspace of 32 MiB (``get_cublas_workspace_size_bytes``) — a rule of thumb for
#: torch's ``_grouped_mm`` too.
GROUPED_GEMM_WORKSPACE_BYTES = 4 * 32 * MiB
#: Token copies a MoE layer keeps per routed slot: dropless routing (torchtitan's and Megatron's
#: defaults) is 1.0 on average; routing imbalance is not modelled (no expert-parallel point has
#: been measured: docs/accuracy.md).
MOE_CAPACITY = 1.0
#: FSDP2 accumulates a stage's unsharded gradients between pipeline micro-batches in its
#: ``reduce_dtype`` (fp32 as torchtitan sets it; :func:`fsdp_pipeline_resident_bytes`).
FSDP_PP_GRAD_ACCUM_BYTES = 4
#: Bytes of one token's id (int64) held by the embedding rank per micro-batch in flight.
TOKEN_ID_BYTES = 8
#: Micro-batches of p2p receive buffers a pipeline rank holds per chunk: one activation received
#: forward, one gradient received backward (Megatron ``p2p_communication.py`` allocates each
#: receive as it posts it).
P2P_BUFFERS = 2
#: Float8 training (torchao ``Float8Linear``, torchao 0.18 ``torchao/float8/float8_linear.py``):
#: ``matmul_with_hp_or_float8_args.forward`` saves the *high-precision* input and weight
#: (``ctx.save_for_backward(input_hp, weight_hp_t)``) under both recipes, so the saved
#: activations are the bf16 run's; its backward casts, per linear, the incoming gradient to fp8
#: twice (``grad_output`` for grad_input, row-major, and for grad_weight, column-major: 1 + 1
#: bytes per element) after an ``abs`` of it in the compute dtype for the amax
#: (``tensor_to_amax``: ``torch.max(torch.abs(x))``, ``torch.amax`` per row under rowwise; 2
#: bytes, eager). Bytes per element of the largest linear's gradient, at once: a rule of thumb
#: (no Float8 point without torch.compile has been measured: docs/accuracy.md).
FLOAT8_BWD_CAST_BYTES = 1 + 1 + 2
#: The torchtitan commit since which per-op SAC saves every Float8 linear's output, the rule
#: :func:`op_sac_per_token` follows (memfit models the current torchtitan; it has no notion of
#: an older one). 114151ad4 ("[SAC] Centralize selective AC policy and remove per-model op save
#: lists", #2357, 2026-03-23) builds the save set from torch's
#: ``get_default_op_list().compute_intensive_ops``, which lists ``aten._scaled_mm``. Before it
#: each model's ``_save_list`` held ``aten.mm`` (counted, every other one saved), the SDPA
#: kernels, ``reduce_scatter_tensor`` and ``aten.max`` (``abs`` too from bcebc0de5, 2024-11-26,
#: to 88247277c, 2025-02-06), never ``aten._scaled_mm``: a Float8 linear's output was
#: recomputed, none saved (``torchtitan/parallelisms/parallelize_llama.py`` at 9dec370,
#: ``torchtitan/models/llama3/parallelize_llama.py`` at e7c0cae). Published Float8 points run
#: under op SAC with such a torchtitan are therefore another job (``benchmarks/
#: multigpu_points.py``).
OP_SAC_SAVES_FLOAT8_SINCE = "114151ad4"
#: Bytes per element of a Float8 linear's weight gathered by FSDP2 with
#: ``enable_fsdp_float8_all_gather`` (``WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather``
#: casts the shard to fp8 and all-gathers ``float8_training_tensor._data``: torchao 0.18
#: ``torchao/float8/fsdp_utils.py``).
FLOAT8_GATHERED_BYTES = 1
#: Async TP (torch's micro-pipelined TP, torchtitan ``enable_async_tensor_parallel``): the fused
#: ``symm_mem::fused_all_gather_matmul`` asks the process group's SymmetricMemory workspace for
#: one input shard (``_pipelined_multi_all_gather_and_consume``: the sum of the shards' bytes)
#: and ``fused_matmul_reduce_scatter`` for two output chunks, double-buffered
#: (``_pipelined_produce_and_all2all``: ``out_chunks[0]`` bytes x 2); ``get_symm_mem_workspace``
#: grows the group's one workspace to the largest request and never shrinks it
#: (``torch/distributed/_symmetric_memory/__init__.py``, pytorch/pytorch 006b161). Its
#: ``_SymmetricMemory.empty_strided_p2p`` maps driver memory (``cuMemCreate``) outside the
#: caching allocator, the request plus a signal pad rounded up to the allocation granularity
#: (``CUDASymmetricMemoryAllocator::alloc``, ``torch/csrc/distributed/c10d/symm_mem/
#: CUDASymmetricMemory.cu``, pytorch 875165b): ``nvidia-smi`` sees it,
#: ``max_memory_reserved()`` does not. Output chunks double-buffered per request:
ASYNC_TP_RS_CHUNKS = 2
#: ``CU_MEM_ALLOC_GRANULARITY_RECOMMENDED`` on current NVIDIA GPUs (2 MiB pages) and the signal
#: pad's upper bound (``default_signal_pad_size`` = 32 blocks x 72 peers x 4 bytes,
#: ``CUDASymmetricMemoryTypes.hpp``; older releases 2 KiB), both a rounding here.
SYMM_MEM_GRANULARITY_BYTES = 2 * MiB
SYMM_MEM_SIGNAL_PAD_BYTES = 32 * 72 * 4
#: Bytes per element of the loss's own tensors (torchtitan's ``pred.flatten(0, 1).float()`` and
#: everything ``cross_entropy`` builds from it: log-probabilities, their gradients), fp32.
LOSS_TENSOR_BYTES = 4


@dataclass(frozen=True, kw_only=True)
class Layout:
    """The degrees and the step of one job, as the closed form reads them."""

    tp: int
    pp: int
    cp: int
    ep: int
    etp: int
    dp: int
    micro_batch: int
    seq_len: int
    micro_batches: int
    schedule: str
    shard: str
    precision: str
    optimizer: str
    checkpointing: str
    attention: str
    cp_rotate: str
    sequence_parallel: bool
    float8: str = "none"
    float8_all_gather: bool = False
    #: ``--async-tp``: the SymmetricMemory workspace (:func:`symm_mem_workspace_bytes`)
    async_tp: bool = False
    #: ``--compile``: the blocks run under torch.compile (:func:`compile_dropped_elements`)
    compile: bool = False
    #: ``--checkpointing selective-layer``: every N-th block of a rank checkpointed
    #: (:func:`rank_layer_policies`)
    selective_ac_option: int = SELECTIVE_AC_OPTION_DEFAULT

    @property
    def tokens(self) -> int:
        """Tokens of one micro-batch on one rank (the sequence cut by cp)."""
        return self.micro_batch * self.seq_len // self.cp

    @property
    def act_bytes(self) -> int:
        return 4 if self.precision == "32-true" else 2

    @property
    def torch_native(self) -> bool:
        """The job runs as torchtitan runs it (FSDP2 / ZeRO-3-style sharding, therefore
        torch.distributed.pipelining, torch's ring attention and torchtitan's model code), not
        as Megatron-core does (``ddp`` / ``zero1``: its DDP or distributed optimizer,
        TransformerEngine attention, its own p2p schedule)."""
        return self.shard in ("fsdp", "zero3")

    @property
    def expert_dp(self) -> int:
        return max(1, self.dp * self.cp * self.tp // (self.ep * self.etp))


@dataclass(frozen=True, kw_only=True)
class RankBytes:
    """One GPU of pipeline rank ``rank``: its components (disjoint, summing to the peak) and
    what the temporary is (the largest transient's name)."""

    rank: int
    parameters_bytes: int
    gradients_bytes: int
    optimizer_states_bytes: int
    activations_bytes: int
    temporary_bytes: int
    temporary_kind: str
    #: On the head rank of a torch-native job whose loss tensors outgrow every block the rest
    #: of the step frees: ``(rest_bytes, loss_segment_bytes)`` at the loss
    #: (:func:`loss_reserve_parts`), which the engine turns into reserved bytes apart; None
    #: elsewhere.
    loss_reserve: tuple[int, int] | None = None

    @property
    def peak_allocated_bytes(self) -> int:
        return (
            self.parameters_bytes
            + self.gradients_bytes
            + self.optimizer_states_bytes
            + self.activations_bytes
            + self.temporary_bytes
        )

    def components(self) -> dict[str, int]:
        return {
            "parameters": self.parameters_bytes,
            "gradients": self.gradients_bytes,
            "optimizer_states": self.optimizer_states_bytes,
            "activations": self.activations_bytes,
            "kv_cache": 0,
            "temporary": self.temporary_bytes,
        }


# ----------------------------------------------------------------------------- parameters
def rank_params(shape: DecoderShape, stages: RankStages, lay: Layout) -> tuple[int, int]:
    """(dense, expert) parameter elements one GPU of this pipeline rank holds before sharding."""
    t = lay.tp
    dense = expert = 0
    for layer in stages.layers:
        dense += shape.attention_params // t + shape.norm_params
        if shape.is_moe_layer(layer):
            dense += shape.router_params + shape.shared_params // t
            expert += (shape.n_experts // lay.ep) * (shape.expert_params // lay.etp)
        else:
            dense += shape.dense_mlp_params // t
    vocab_part = shape.embedding_params // t
    if stages.embedding:
        dense += vocab_part
    if stages.head:
        dense += shape.hidden  # final norm
        if not (shape.tied and stages.embedding):
            dense += vocab_part
    return dense, expert


def model_state_bytes(n_params: int, group: int, lay: Layout) -> tuple[int, int, int]:
    """(parameters, gradients, optimizer states + masters) bytes of ``n_params`` sharded over
    ``group`` ranks by the job's sharding mode (:data:`STATE_BYTES`)."""
    shard = lay.shard if lay.shard != "none" or group == 1 else "ddp"
    if lay.precision.endswith("-mixed"):
        param_b, grad_b, master_b = STATE_BYTES[("mixed", shard)]
        state_dtype = "float32"
    else:
        width = 4 if lay.precision == "32-true" else 2
        param_b, grad_b, master_b = width, width, 0
        state_dtype = "float32" if width == 4 else "bfloat16"
    probe = 1 << 20
    per = optimizer_state_bytes(lay.optimizer, (probe,), state_dtype, round_to=1) / probe
    states = per_rank_model_states(
        n_params,
        shard=shard,
        dp=max(group, 1),
        param_bytes=param_b,
        grad_bytes=grad_b,
        state_bytes=per,
        master_bytes=master_b,
    )
    return states.parameters_bytes, states.gradients_bytes, states.optimizer_states_bytes


# ----------------------------------------------------------------------------- activations
def layer_activation_bytes(shape: DecoderShape, lay: Layout, *, moe: bool, how: str) -> int:
    """Bytes one transformer layer saves for backward for one micro-batch on one GPU.

    Per token, in elements of the compute dtype (Korthikanti et al. 2022, "Reducing Activation
    Recomputation in Large Transformer Models", §4, redone for pre-norm SwiGLU / GQA blocks as
    torchtitan's and Megatron's fused kernels run them, FlashAttention keeping no scores):

    - ``none``: the two norms' inputs and outputs ``4h`` (:func:`norm_elements`);
      q, k, v and the attention output ``2q + 2kv`` and the softmax statistics (fp32, one per
      head), ``/t`` (``kv`` as :func:`attention_kv_width`: the query's width where torchtitan
      expands grouped K/V); a gated MLP's gate, up, activation and product ``4 ffn``
      (plain: ``2 ffn``), ``/t``. A MoE layer: the router's fp32 logits and probabilities,
      per routed slot the dispatched token ``h``, the expert's hidden ``4 ffn_e / etp`` and its
      output ``h``, and the shared experts as a gated MLP. Eager attention adds its
      ``heads x seq`` probabilities.
    - ``selective`` (per-op checkpointing: matmul and attention outputs saved, elementwise ops
      recomputed): the norm outputs and the MLP's activation and product are recomputed.
    - ``selective-op`` (torchtitan's per-op SAC, :func:`op_sac_per_token`): the layer's input,
      the attention kernel's output and statistics and every other matmul's output.
    - ``full``: the layer's input only, ``h`` (``/t`` with sequence parallelism).

    Under ``--compile`` the tensors torch.compile does not keep are taken off
    (:func:`compile_dropped_elements`).
    """
    eager = _eager_layer_bytes(shape, lay, moe=moe, how=how)
    if not lay.compile or moe:
        return eager
    return eager - int(lay.tokens * compile_dropped_elements(shape, lay, how) * lay.act_bytes)


def compile_dropped_elements(shape: DecoderShape, lay: Layout, how: str) -> float:
    """Elements per token a dense layer's saved set loses under torch.compile, as this closed
    form counts the saved set: the measured compile - eager difference of the model type's
    layer (:func:`memfit.estimate.analytic.compile.dropped`) less what this closed form never
    counted. Without checkpointing: RMSNorm's fp32 copies (this closed form counts fused norms)
    are not here to drop; the SiLU output (``ffn / t``) is. Under ``selective`` the block's
    last linear output was never counted; under ``selective-op`` it is (w2's full-width partial
    sum ``h``, and under sequence parallelism its reduce-scatter output ``h / t``), dropped
    where the measurement drops it. Under full checkpointing nothing (the input is kept)."""
    if how not in ("none", "selective-op"):
        return 0.0
    delta = dropped(shape.model_type, how)
    if how == "none":
        return float(-delta[2] / 2) * shape.ffn / lay.tp  # 2 bytes per 16-bit element
    last_linear = shape.hidden + (shape.hidden / lay.tp if lay.sequence_parallel else 0)
    return float(-delta[0] / 2) * last_linear


def _eager_layer_bytes(shape: DecoderShape, lay: Layout, *, moe: bool, how: str) -> int:
    t, a_b, tokens = lay.tp, lay.act_bytes, lay.tokens
    rep_div = t if lay.sequence_parallel else 1
    if how == "full":
        return tokens * shape.hidden * a_b // rep_div
    if how == "selective-op" and not moe:
        return int(tokens * op_sac_per_token(shape, lay) * a_b)
    sel = how in ("selective", "selective-op")  # a MoE layer under op SAC: as ``selective``
    norms = norm_elements(shape, lay, recompute_outputs=sel)
    attn = (2 * shape.q_dim + 2 * attention_kv_width(shape, lay)) // t
    stats = shape.n_heads * 4 // (a_b * t)
    if lay.attention == "eager":
        attn += shape.n_heads * lay.seq_len // t
    gated_mlp_terms = 2 if sel else 4
    per_matrix_terms = gated_mlp_terms if shape.gated else gated_mlp_terms // 2
    if moe:
        slots = shape.top_k * MOE_CAPACITY
        expert = slots * (2 * shape.hidden + per_matrix_terms * shape.expert_ffn / lay.etp)
        router = 2 * shape.n_experts * 4 / a_b
        mlp = expert + router + per_matrix_terms * shape.shared_ffn / t
    else:
        mlp = per_matrix_terms * shape.ffn / t
    per_token = norms + attn + stats + mlp
    return int(tokens * per_token * a_b)


def norm_elements(shape: DecoderShape, lay: Layout, *, recompute_outputs: bool) -> float:
    """Elements per token the two norms of a block leave saved: their inputs (the block's input
    and the residual after attention, ``h`` each) and, unless recomputed, their outputs (the
    inputs of the q/k/v and up/gate matmuls, ``h`` each). Sequence parallelism splits the inputs
    by ``t``; the outputs too as Megatron runs it (its column-parallel linear saves the
    sequence-sharded input and all-gathers it again in backward: ``LinearWithGradAccumulation
    AndAsyncCommunication``, Megatron-LM ``tensor_parallel/layers.py``), but not under
    torchtitan's DTensor plan: ``PrepareModuleInput`` all-gathers the norm's ``Shard(1)`` output
    to ``Replicate`` and autograd saves the gathered tensor as the matmuls' input (``apply_tp``,
    torchtitan ``parallelize_llama.py`` at 9dec370)."""
    t = lay.tp if lay.sequence_parallel else 1
    inputs = 2 * shape.hidden / t
    if recompute_outputs:
        return inputs
    return inputs + 2 * shape.hidden / (1 if lay.torch_native else t)


def op_sac_per_token(shape: DecoderShape, lay: Layout) -> float:
    """Elements per token (compute dtype) a dense pre-norm block saves under torchtitan's
    per-op SAC (``selective_ac_option = "op"``; ``_custom_policy`` / ``_save_list`` in
    ``torchtitan/parallelisms/parallelize_llama.py`` at 9dec370): the policy counts the block's
    ``aten.mm`` calls — wq, wk, wv, wo, then w1, w3, w2 of a gated MLP (w1, w2 of a plain one) —
    and saves the odd-numbered ones' outputs, so wq ``q/t``, wv ``kv/t`` (grouped: the
    projection's output, before ``repeat_kv``), w1 ``ffn/t`` and w2: a row-parallel matmul's
    local output is the full-width partial sum ``h`` (``h`` without tp). It saves the flash /
    efficient SDPA kernel's output ``q/t`` and its fp32 log-sum-exp (one per head), and the
    ``reduce_scatter_tensor`` outputs of sequence parallelism (wo's and w2's, ``h/t`` each).
    The checkpoint keeps the block's input ``h`` (``/t`` with sequence parallelism). Norms,
    RoPE, ``repeat_kv``, SiLU and the residual adds are recomputed in backward."""
    t, a_b = lay.tp, lay.act_bytes
    rep_div = t if lay.sequence_parallel else 1
    mms = [shape.q_dim, shape.kv_dim, shape.kv_dim, shape.hidden]  # wq wk wv wo
    mms += [shape.ffn, shape.ffn, shape.hidden] if shape.gated else [shape.ffn, shape.hidden]
    # column-parallel outputs are 1/t wide; row-parallel ones (wo, w2) full-width partial sums
    split = [t, t, t, 1, t, t, 1] if shape.gated else [t, t, t, 1, t, 1]
    # Float8 linears run aten._scaled_mm, which torchtitan's policy saves always (on torch's
    # compute-intensive list, ``_get_default_save_ops``) and does not count among the mms it
    # alternates (``mm_ops``: aten.mm, aten.linear): every linear output is kept (torchtitan
    # ``torchtitan/distributed/activation_checkpoint.py`` at b5bcd76), as torchtitan does since
    # :data:`OP_SAC_SAVES_FLOAT8_SINCE`; older torchtitan recomputed them (its docstring)
    every = 1 if lay.float8 != "none" else 2
    saved_mm = sum(n / d for i, (n, d) in enumerate(zip(mms, split, strict=True)) if i % every == 0)
    attention_out = shape.q_dim / t + shape.n_heads * 4 / (a_b * t)
    reduce_scatter = 2 * shape.hidden / t if lay.sequence_parallel else 0
    return shape.hidden / rep_div + saved_mm + attention_out + reduce_scatter


def attention_kv_width(shape: DecoderShape, lay: Layout) -> int:
    """Elements of one token's keys (= values) as attention receives them: torchtitan's
    Llama / Qwen attention expands grouped K/V to the query's heads (``repeat_kv``) before SDPA,
    which saves the expanded tensors; Megatron / TransformerEngine pass them grouped."""
    return shape.q_dim if lay.torch_native else shape.kv_dim


def rank_activation_bytes(shape: DecoderShape, stages: RankStages, lay: Layout) -> int:
    """Saved activations of the micro-batches in flight on this rank (module docstring)."""
    layers = stages.layers
    if not layers and not (stages.embedding or stages.head):
        return 0
    per_layer = [
        layer_activation_bytes(shape, lay, moe=shape.is_moe_layer(i), how=how)
        for i, how in zip(layers, rank_layer_policies(stages, lay), strict=True)
    ]
    mean = sum(per_layer) / len(per_layer) if per_layer else 0
    total = stages.in_flight_layers * mean
    per_chunk = -(-stages.in_flight // len(stages.chunks))
    if stages.embedding:
        total += per_chunk * lay.tokens * TOKEN_ID_BYTES
    if stages.head:
        logits = shape.vocab // lay.tp * LOSS_SAVED_BYTES
        saved = lay.tokens * (logits + shape.hidden * lay.act_bytes)
        total += head_in_flight(lay) * saved
        total += kept_outputs_bytes(shape, lay)
    return int(total)


def rank_layer_policies(stages: RankStages, lay: Layout) -> list[str]:
    """Each of this rank's layers' checkpointing, in order. ``selective-layer``: torchtitan
    applies its per-layer SAC per process, one counter over the blocks of every model part the
    rank holds (``_layer_sac_count``, ``rules.layer_sac_checkpointed``): ``full`` on the blocks
    it wraps, ``none`` on the others; every other policy: the job's on every layer."""
    if lay.checkpointing != LAYER_SAC:
        return [lay.checkpointing] * len(stages.layers)
    wrapped = layer_sac_checkpointed(len(stages.layers), lay.selective_ac_option)
    return ["full" if w else "none" for w in wrapped]


def kept_outputs_bytes(shape: DecoderShape, lay: Layout) -> int:
    """The last stage's logits of every micro-batch, kept by torch.distributed.pipelining for
    its merged output (:data:`PIPELINING_KEEPS_LAST_OUTPUTS`; FSDP pipelines only)."""
    if not PIPELINING_KEEPS_LAST_OUTPUTS or lay.pp == 1 or not lay.torch_native:
        return 0
    return lay.micro_batches * lay.tokens * (shape.vocab // lay.tp) * lay.act_bytes


def head_in_flight(lay: Layout) -> int:
    """Micro-batches whose loss the head rank keeps: all of them under GPipe (every forward
    runs before any backward), else one (the last stage runs each micro-batch's backward right
    after its forward)."""
    return lay.micro_batches if lay.schedule == "gpipe" and lay.pp > 1 else 1


# ----------------------------------------------------------------------------- temporaries
def loss_parallel(lay: Layout) -> bool:
    """Whether the loss runs vocabulary-parallel as torchtitan runs it with tensor parallelism
    (torch's ``loss_parallel``; :data:`LOSS_PARALLEL_BYTES_PER_LOGIT`). Megatron-core's
    ``vocab_parallel_cross_entropy`` (``ddp`` / ``zero1`` layouts here) keeps the 12 bytes."""
    return lay.torch_native and lay.tp > 1


def loss_bytes_per_logit(lay: Layout) -> int:
    """Peak bytes per logit of the loss on the head rank (saved log-probabilities included)."""
    return LOSS_PARALLEL_BYTES_PER_LOGIT if loss_parallel(lay) else LOSS_BYTES_PER_LOGIT


def cp_buffer_bytes(shape: DecoderShape, lay: Layout) -> int:
    """Ring attention's buffers for one layer on one GPU (0 without context parallelism).

    ``allgather`` (torchtitan's default rotate method) gathers the K/V of all ``cp`` chunks
    of the sequence for the layer and, in backward, their gradients: ``2 x cp`` local K/V sizes.
    ``alltoall`` passes one chunk at a time: the chunk in use and the one arriving, for K/V and
    for their gradients, ``4`` local sizes. Both accumulate dQ, dK, dV in fp32
    (:data:`CP_ACCUM_BYTES`)."""
    if lay.cp == 1:
        return 0
    # torch's ring attention runs SDPA kernels on K/V with the query's heads (torchtitan
    # expands grouped K/V with repeat_kv first); Megatron's TransformerEngine rotates them grouped
    width = attention_kv_width(shape, lay)
    local_kv = lay.tokens * 2 * width // lay.tp * lay.act_bytes
    chunks = 2 * lay.cp if lay.cp_rotate == "allgather" else 4
    accum = lay.tokens * (shape.q_dim + 2 * shape.kv_dim) // lay.tp * CP_ACCUM_BYTES
    return chunks * local_kv + accum


def ep_buffer_bytes(shape: DecoderShape, lay: Layout) -> int:
    """A MoE layer's transients on one GPU: the all-to-all send buffer of the permuted tokens
    and the combine's receive buffer, ``tokens x top_k x h`` each (x :data:`MOE_CAPACITY`), and
    the grouped GEMM's workspace (0 for a dense model)."""
    if not shape.moe:
        return 0
    slots = int(lay.tokens * shape.top_k * MOE_CAPACITY)
    return 2 * slots * shape.hidden * lay.act_bytes + GROUPED_GEMM_WORKSPACE_BYTES


def _largest_gathered_params(shape: DecoderShape, stages: RankStages, lay: Layout) -> int:
    """Parameters (on this GPU) of the largest transformer layer this rank gathers."""
    biggest = 0
    for layer in stages.layers[:2] + stages.layers[-1:]:
        n = shape.attention_params // lay.tp + shape.norm_params
        if shape.is_moe_layer(layer):
            n += shape.router_params + shape.shared_params // lay.tp
            n += (shape.n_experts // lay.ep) * (shape.expert_params // lay.etp)
        else:
            n += shape.dense_mlp_params // lay.tp
        biggest = max(biggest, n)
    return biggest


def _gathers(stages: RankStages, lay: Layout) -> bool:
    return lay.shard in ("zero3", "fsdp") and lay.dp * lay.cp > 1 and bool(stages.layers)


def gathered_bytes(shape: DecoderShape, stages: RankStages, lay: Layout) -> int:
    """FSDP / ZeRO-3's unsharded layers: the layer computed and the one prefetched in the
    compute dtype, and in backward one layer's unsharded gradients before the reduce-scatter
    (cast to fp32 for it under torchtitan's ``reduce_dtype``): 2 x 2 + (2 + 4) bytes per
    parameter of the largest module gathered on this rank — a transformer layer, or the
    embeddings / output head where the rank holds them (0 when nothing is sharded)."""
    if not _gathers(stages, lay):
        return 0
    biggest = _largest_gathered_params(shape, stages, lay)
    gathered = 2 * lay.act_bytes  # the layer computed and the one prefetched
    if lay.float8_all_gather:  # the blocks' linears in fp8 (the norms' few weights ignored)
        gathered = 2 * FLOAT8_GATHERED_BYTES
    per_layer = biggest * (gathered + lay.act_bytes + 4)
    if stages.embedding or stages.head:  # the vocabulary matrices are gathered whole too (bf16:
        # torchtitan's Float8 converter skips the output head; embeddings are no Linear)
        vocab = shape.embedding_params // lay.tp
        per_layer = max(per_layer, vocab * (2 * lay.act_bytes + lay.act_bytes + 4))
    return per_layer


def unfolded_grad_bytes(shape: DecoderShape, stages: RankStages, lay: Layout) -> int:
    """The part of :func:`gathered_bytes` an FSDP2 pipeline stage holds on top of its resident
    parameters and fp32 gradients: the unsharded gradients of the layer in backward, in the
    compute dtype, before FSDP2 folds them into the fp32 accumulator.

    Autograd writes each unsharded parameter's ``.grad`` in its dtype (bf16 under torchtitan's
    ``param_dtype``); FSDP2 adds it to ``unsharded_accumulated_grad`` (fp32, ``reduce_dtype``)
    and drops it only in the block's ``post_backward`` (``FSDPParam.
    accumulate_unsharded_grad_if_needed`` / ``to_accumulated_grad_if_needed`` in torch's
    ``_fsdp_param.py``, called from ``FSDPParamGroup.post_backward``), the same moment a
    stage without a pipeline reduce-scatters them — so one layer's bf16 gradients count here
    as :func:`gathered_bytes` counts them without a pipeline (``act_bytes`` per parameter of
    the largest layer, or of the vocabulary matrix on the embedding / head rank). What a
    resident stage does not hold again: the gathered layer and the prefetched one (already
    resident) and the fp32 reduce-scatter copy (no reduce-scatter between micro-batches)."""
    if not _gathers(stages, lay):
        return 0
    n = _largest_gathered_params(shape, stages, lay)
    if stages.embedding or stages.head:
        n = max(n, shape.embedding_params // lay.tp)
    return n * lay.act_bytes


def fsdp_pipeline_resident_bytes(dense: int, expert: int, lay: Layout) -> int:
    """FSDP2 under a pipeline schedule keeps a stage unsharded between its micro-batches:
    ``torch.distributed.pipelining``'s stage runs every backward but the last without gradient
    sync and without resharding (``backward_maybe_with_nosync``: ``set_requires_gradient_sync``,
    ``set_reshard_after_backward`` False), so the stage's parameters stay gathered in the
    compute dtype and its unsharded gradients accumulate in the reduce dtype (fp32:
    ``FSDPParam.to_accumulated_grad_if_needed``) — :data:`FSDP_PP_RESIDENT_BYTES` per
    parameter. 0 without FSDP / ZeRO-3, without a pipeline or with one micro-batch. A rank of
    several chunks holds each chunk's gradients only between its first and last backward
    (:func:`worst_moment`)."""
    if lay.shard not in ("zero3", "fsdp") or lay.pp == 1 or lay.micro_batches == 1:
        return 0
    return (dense + expert) * (lay.act_bytes + FSDP_PP_GRAD_ACCUM_BYTES)


def worst_moment(shape: DecoderShape, stages: RankStages, lay: Layout) -> tuple[int, int, int]:
    """``(activations, unsharded parameters, unsharded parameters + gradients)`` bytes of a
    rank holding several chunks of an FSDP pipeline at its worst backward
    (:class:`~memfit.estimate.parallel.schedule.Moment`): every chunk stays gathered from its
    first forward (torchtitan: ``reshard_after_forward=False`` under pp, ``apply_fsdp`` in
    ``torchtitan/parallelisms/parallelize_llama.py`` at 9dec370) and is resharded with its
    gradients reduce-scattered after its last backward (``REDUCE_GRAD`` /
    ``perform_reduce_grad``, torch 2.13 ``torch/distributed/pipelining/stage.py``); a chunk's
    unsharded fp32 gradients exist only between its first and last backward. At a backward
    every chunk has run forwards (the warm-up reaches each), so all are gathered."""
    per_chunk = []
    for c in stages.chunks:
        d, e = rank_params(shape, RankStages(rank=stages.rank, chunks=(c,), in_flight=0), lay)
        per_chunk.append((d + e) * lay.act_bytes)
    params = sum(per_chunk)
    grad_scale = FSDP_PP_GRAD_ACCUM_BYTES / lay.act_bytes
    best = (-1, 0, 0)
    for m in dict.fromkeys(stages.moments):  # a steady 1F1B phase repeats one moment
        act = rank_activation_bytes(shape, stages.at(m), lay)
        grads = int(sum(p * grad_scale for p, live in zip(per_chunk, m.grads, strict=True) if live))
        if act + grads > best[0] + best[2] - best[1] or best[0] < 0:
            best = (act, params, params + grads)
    return best


def transients(shape: DecoderShape, stages: RankStages, lay: Layout) -> tuple[int, str, int]:
    """The largest transient on this rank, its name and its own bytes (total: plus the gathered
    FSDP layers and the p2p receive buffers). A layer's backward holds its recomputed
    activations (full checkpointing), ring attention's buffers and the MoE all-to-all buffers
    at once; the loss over the vocabulary comes at another moment."""
    options: dict[str, int] = {"none": 0}
    if stages.head:
        name = "loss over the vocabulary" + (" (loss parallel)" if loss_parallel(lay) else "")
        options[name] = (
            lay.tokens * (shape.vocab // lay.tp) * (loss_bytes_per_logit(lay) - LOSS_SAVED_BYTES)
        )
    parts: list[tuple[str, int]] = []
    if "full" in rank_layer_policies(stages, lay) or (
        lay.checkpointing == "selective-op" and stages.layers
    ):
        moe = any(shape.is_moe_layer(i) for i in stages.layers)
        recompute = layer_activation_bytes(shape, lay, moe=moe, how="none")
        if lay.checkpointing == "selective-op":  # what the policy did not store is recomputed
            recompute -= layer_activation_bytes(shape, lay, moe=moe, how="selective-op")
        parts.append((f"one layer recomputed ({lay.checkpointing} checkpointing)", recompute))
    parts.append(("ring attention K/V buffers", cp_buffer_bytes(shape, lay)))
    if lay.float8 != "none" and stages.layers:
        widest = max(shape.hidden, shape.ffn // lay.tp)
        parts.append(
            ("Float8 casts of a linear's gradient", lay.tokens * widest * FLOAT8_BWD_CAST_BYTES)
        )
    if any(shape.is_moe_layer(i) for i in stages.layers):
        parts.append(
            ("MoE all-to-all buffers + grouped-GEMM workspace", ep_buffer_bytes(shape, lay))
        )
    named = [name for name, n in parts if n]
    if named:
        options[" + ".join(named)] = sum(n for _, n in parts)
    kind = max(options, key=lambda k: options[k])
    total = options[kind] + gathered_bytes(shape, stages, lay) + p2p_bytes(shape, stages, lay)
    return total, kind, options[kind]


def p2p_bytes(shape: DecoderShape, stages: RankStages, lay: Layout) -> int:
    """The pipeline's receive buffers on this rank, one stage-boundary tensor each
    (``tokens x h``, ``/t`` where sequence parallelism shards the boundary).

    torch.distributed.pipelining (FSDP pipelines here, as torchtitan runs them) allocates one
    forward receive buffer per micro-batch for every stage but the first and one gradient
    receive buffer per micro-batch for every stage but the last when the schedule starts, and
    keeps them (``PipelineStage._prepare_forward_infra`` / ``_prepare_backward_infra``: "TODO:
    create args_recv_info lazily", pytorch 00722e6). Megatron allocates each receive as it
    posts it: :data:`P2P_BUFFERS` per chunk."""
    if lay.pp == 1:
        return 0
    boundary = lay.tokens * shape.hidden * lay.act_bytes
    if lay.sequence_parallel:
        boundary //= lay.tp
    if not lay.torch_native:
        return P2P_BUFFERS * len(stages.chunks) * boundary
    ends = sum(int(not c.embedding) + int(not c.head) for c in stages.chunks)
    return ends * lay.micro_batches * boundary


def symm_mem_workspace_bytes(shape: DecoderShape, lay: Layout) -> int:
    """Async TP's SymmetricMemory workspace on one GPU (0 without async TP): outside the caching
    allocator, so in the device figure only (:data:`ASYNC_TP_RS_CHUNKS`).

    Under sequence parallelism every fused all-gather gathers a ``tokens / t x h`` shard (the
    norms' outputs into wq/wk/wv and w1/w3, the final norm into the output head, the incoming
    gradient of wo and w2 in backward) and every fused reduce-scatter scatters a ``tokens x h``
    output into ``t`` chunks of ``tokens / t x h`` (wo, w2 forward; the column-parallel inputs'
    gradient in backward), both in the compute dtype, so the largest request is the
    reduce-scatter's two chunks: ``2 x tokens / t x h`` elements. A Float8 job's fused
    ``_scaled_mm`` ops request the same (bf16 outputs; fp8 shards are smaller). Rounded up with
    the signal pad to :data:`SYMM_MEM_GRANULARITY_BYTES`. One workspace per tensor-parallel
    group; torchtitan's job has one."""
    if not lay.async_tp:
        return 0
    request = async_tp_request_bytes(shape, lay) + SYMM_MEM_SIGNAL_PAD_BYTES
    pages = -(-request // SYMM_MEM_GRANULARITY_BYTES)
    return pages * SYMM_MEM_GRANULARITY_BYTES


def async_tp_request_bytes(shape: DecoderShape, lay: Layout) -> int:
    """The largest ``min_size`` a block's fused ops pass to ``get_symm_mem_workspace``: a
    reduce-scatter's two ``tokens / t x h`` output chunks (:func:`symm_mem_workspace_bytes`)."""
    return ASYNC_TP_RS_CHUNKS * (lay.tokens // lay.tp) * shape.hidden * lay.act_bytes


# ----------------------------------------------------------------------------- the loss's segments
def forward_transient_bytes(shape: DecoderShape, lay: Layout) -> int:
    """The most a dense block's forward holds at once on one GPU beyond what it keeps, when it
    keeps nothing (full checkpointing): a gated MLP's gate and up outputs and their product,
    ``3 ffn / t`` elements per token (``2 ffn / t`` plain); with sequence parallelism, a
    row-parallel linear's (wo's, w2's) full-width partial sums ``h`` and the copy
    ``reduce_scatter_tensor`` makes of them to scatter along the sequence (``scatter_dim != 0``:
    ``torch.cat(torch.chunk(x, group_size, dim=scatter_dim))``, torch's
    ``distributed/_functional_collectives.py``, in the 2024 releases and in 2.13 as
    ``_chunk_or_narrow_cat``), ``2 h``. torchtitan's embeddings (``RowwiseParallel(
    output_layouts=Shard(1))``, ``apply_tp`` at 9dec370) make the same pair."""
    mlp = (3 if shape.gated else 2) * shape.ffn / lay.tp
    row = 2 * shape.hidden if lay.tp > 1 and lay.sequence_parallel else shape.hidden
    return int(lay.tokens * max(mlp, row) * lay.act_bytes)


def loss_segment_bytes(shape: DecoderShape, lay: Layout) -> int | None:
    """The caching allocator's segments the loss holds on the head rank of a torch-native job,
    or None where blocks the rest of the step frees can serve its tensors.

    torchtitan's loss (``cross_entropy(pred.flatten(0, 1).float(), labels)``, ``train.py`` at
    9dec370) runs on tensors of ``tokens x vocab / t`` elements, fp32
    (:data:`LOSS_TENSOR_BYTES`): far larger than anything a block allocates
    (:func:`forward_transient_bytes`' largest tensor, ``max(h, ffn / t)`` per token). The
    caching allocator hands a request only a free block at least as large (best fit,
    ``get_free_block`` in ``c10/cuda/CUDACachingAllocator.cpp``; memfit's replay,
    :mod:`memfit.estimate.allocator.caching`) and never merges blocks across segments, so each
    of the loss's fp32 tensors live at its peak gets a segment of its own (the peak's bytes per
    logit, :func:`loss_bytes_per_logit`), and the bf16 logits' segment, freed before backward
    (``del pred``), stays cached beside them: none of the fp32 tensors fits in it. Under a
    pipeline, torch.distributed.pipelining keeps the logits (:func:`kept_outputs_bytes`):
    allocated, so not counted here."""
    if not lay.torch_native or shape.moe:
        return None
    widest = max(shape.hidden, shape.ffn // lay.tp) * lay.act_bytes
    if (shape.vocab // lay.tp) * LOSS_TENSOR_BYTES <= widest:
        return None
    logits = lay.tokens * (shape.vocab // lay.tp)
    freed_logits = 0 if kept_outputs_bytes(shape, lay) else logits * lay.act_bytes
    return logits * loss_bytes_per_logit(lay) + freed_logits


def loss_reserve_parts(
    shape: DecoderShape, stages: RankStages, lay: Layout, held_bytes: int
) -> tuple[int, int] | None:
    """``(rest_bytes, loss_segment_bytes)`` on the head rank when the loss peaks: what the rest
    of the step holds as the caching allocator sees it — ``held_bytes`` (this rank's bytes at
    the loss, the loss's own fp32 tensors excluded) plus a block's forward transient, whose
    segments the forward left cached (:func:`forward_transient_bytes`) — and the loss's own
    segments (:func:`loss_segment_bytes`). The engine reserves the first at the calibrated
    ratio and the second as it is. None off the head rank or where the loss shares segments."""
    if not stages.head or not stages.layers:
        return None
    segments = loss_segment_bytes(shape, lay)
    if segments is None:
        return None
    return held_bytes + forward_transient_bytes(shape, lay), segments


def rank_bytes(shape: DecoderShape, stages: RankStages, lay: Layout) -> RankBytes:
    """Every component of one GPU of pipeline rank ``stages.rank``."""
    dense, expert = rank_params(shape, stages, lay)
    p1, g1, o1 = model_state_bytes(dense, lay.dp * lay.cp, lay)
    p2, g2, o2 = model_state_bytes(expert, lay.expert_dp, lay) if expert else (0, 0, 0)
    temporary, kind, largest = transients(shape, stages, lay)
    resident = fsdp_pipeline_resident_bytes(dense, expert, lay)
    if resident:  # the gathered layers are part of the resident stage; the layer's bf16
        # gradients before FSDP2 folds them into the fp32 accumulator are not
        temporary -= gathered_bytes(shape, stages, lay) - unfolded_grad_bytes(shape, stages, lay)
    unsharded_params = resident * lay.act_bytes // (lay.act_bytes + FSDP_PP_GRAD_ACCUM_BYTES)
    activations = rank_activation_bytes(shape, stages, lay)
    if resident and len(stages.chunks) > 1 and stages.moments:
        activations, unsharded_params, resident = worst_moment(shape, stages, lay)
    # at the loss: everything but the largest transient and the current micro-batch's saved
    # log-probabilities (the loss's own tensors, in its segments)
    held = p1 + p2 + o1 + o2 + g1 + g2 + resident + activations + temporary - largest
    held -= lay.tokens * (shape.vocab // lay.tp) * LOSS_SAVED_BYTES if stages.head else 0
    return RankBytes(
        rank=stages.rank,
        parameters_bytes=p1 + p2 + unsharded_params,
        gradients_bytes=g1 + g2 + resident - unsharded_params,
        optimizer_states_bytes=o1 + o2,
        activations_bytes=activations,
        temporary_bytes=temporary,
        temporary_kind=kind,
        loss_reserve=loss_reserve_parts(shape, stages, lay, held),
    )


def layout_of(w: Any) -> Layout:
    """The :class:`Layout` of a :class:`~memfit.spec.WorkloadSpec`."""
    sp = bool(getattr(w, "sequence_parallel", False) or getattr(w, "sp", False))
    return Layout(
        tp=w.tp,
        pp=w.pp,
        cp=w.cp,
        ep=w.ep,
        etp=w.etp,
        dp=w.dp,
        micro_batch=w.batch_size,
        seq_len=w.seq_len,
        micro_batches=w.grad_accum,
        schedule=w.pp_schedule,
        shard=w.shard,
        precision=str(w.precision),
        optimizer=w.optimizer,
        checkpointing=w.checkpointing,
        attention=w.attention,
        cp_rotate=w.cp_rotate,
        sequence_parallel=sp and w.tp > 1,
        float8=getattr(w, "float8", "none"),
        float8_all_gather=bool(getattr(w, "float8_all_gather", False)),
        async_tp=bool(getattr(w, "async_tp", False)) and sp and w.tp > 1,
        compile=bool(getattr(w, "compile", False)),
        selective_ac_option=int(getattr(w, "selective_ac_option", SELECTIVE_AC_OPTION_DEFAULT)),
    )


__all__ = [
    "Layout",
    "RankBytes",
    "async_tp_request_bytes",
    "cp_buffer_bytes",
    "ep_buffer_bytes",
    "layer_activation_bytes",
    "layout_of",
    "rank_bytes",
    "symm_mem_workspace_bytes",
]
