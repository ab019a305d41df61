"""The rules of a job description: allowed values, one check per field, the rules between fields.

Each check names the field by its :class:`~memfit.spec.WorkloadSpec` name, the value and the rule;
the records of :mod:`memfit.spec.parts` and the WorkloadSpec run the same checks, so both refuse a
value with the same words. Pure Python, no imports beyond the standard library.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from memfit.errors import SpecError
from memfit.spec.hf_versions import version_problem
from memfit.spec.parallel_rules import PARALLEL_FIELD_RULES

Mode = Literal["train", "infer"]

#: Precision, as PyTorch Lightning names it (``Trainer(precision=...)``): ``*-mixed`` keeps fp32
#: master weights (parameters, gradients and optimizer states in fp32) and runs the step under
#: ``torch.autocast`` in the 16-bit dtype (``16-mixed`` adds a GradScaler); ``*-true`` stores the
#: weights, gradients and optimizer states in that dtype (no master copy). :data:`PRECISION_RULES`
#: says what each stores and computes in; :data:`PRECISION_ALIASES` the other names accepted.
PRECISIONS = ("bf16-mixed", "bf16-true", "16-mixed", "16-true", "32-true")
ATTENTIONS = ("eager", "sdpa", "flash")
#: Activation checkpointing of the repeated blocks. ``selective`` saves every matmul and attention
#: output; ``selective-op`` is torchtitan's per-op SAC (``activation_checkpoint.mode =
#: "selective"``, ``selective_ac_option = "op"``): attention outputs and every other matmul output
#: of a block saved (torchtitan ``parallelize_llama.py`` ``_custom_policy`` / ``_save_list`` at
#: 9dec370; ``SelectiveAC`` in ``distributed/activation_checkpoint.py`` at b5bcd76); ``offload``
#: is Unsloth's ``use_gradient_checkpointing="unsloth"`` (each layer's input kept in host RAM);
#: ``selective-layer`` is torchtitan's per-layer SAC (``mode = "selective"``,
#: ``selective_ac_option = "N"``, N a number, ``WorkloadSpec.selective_ac_option``): every N-th
#: block wrapped whole in ``checkpoint_wrapper``, the others not checkpointed (``_apply_layer_sac``
#: in ``torchtitan/distributed/activation_checkpoint.py`` at 114151ad4^, the last torchtitan that
#: has it; ``_apply_ac_to_transformer_block`` in ``parallelisms/parallelize_llama.py`` at 9dec370).
CHECKPOINTING = ("none", "full", "selective", "selective-op", "offload", "selective-layer")
#: ``--checkpointing selective-layer``: torchtitan's ``selective_ac_option`` default ("2": every
#: other layer, ``config_manager.py`` at 9dec370).
SELECTIVE_AC_OPTION_DEFAULT = 2
#: The ``--checkpointing`` name of torchtitan's per-layer SAC.
LAYER_SAC = "selective-layer"


def layer_sac_checkpointed(n_layers: int, every: int) -> tuple[bool, ...]:
    """Which of ``n_layers`` blocks torchtitan's per-layer SAC checkpoints, in order: the
    ``k``-th block wrapped (``k`` counted from 1 by one counter per process, over the blocks of
    every model part the process holds) where ``k % every == 0``, every block where ``every``
    is 0 (``if not ac_freq or _layer_sac_count % ac_freq == 0``)."""
    return tuple(every == 0 or k % every == 0 for k in range(1, n_layers + 1))


#: How the LM head's cross-entropy runs in training: ``full`` materialises the whole (B, S, V)
#: logits and their fp32 copy (transformers' ``ForCausalLMLoss``); ``chunked`` runs the LM head
#: and the cross-entropy a chunk of tokens at a time, each chunk's saved tensors kept for
#: backward (torchtune ``LinearCrossEntropyLoss`` / ``CEWithChunkedOutputLoss``); ``fused``
#: computes the loss and its gradients chunk by chunk inside the forward, keeping no logits
#: (Liger-Kernel ``LigerFusedLinearCrossEntropyLoss``, Unsloth's ``unsloth_fused_ce_loss``).
#: ``estimate/analytic/loss.py`` models each.
LOSSES = ("full", "chunked", "fused")
#: Whose kernels run the model's layers in training: ``hf`` (transformers' modules, peft's LoRA
#: layers) or ``unsloth`` (Unsloth's patched forward: its Triton RMSNorm and in-place RoPE, and
#: for LoRA without dropout or bias its fused autograd functions ``LoRA_QKV`` / ``LoRA_W`` /
#: ``LoRA_MLP``, unslothai/unsloth@015bdef0 ``unsloth/kernels/fast_lora.py``;
#: ``estimate/analytic/unsloth.py`` models them). ``unsloth`` defaults ``--checkpointing offload``
#: and ``--loss fused`` when the job does not set them (:data:`UNSLOTH_DEFAULTS`).
KERNELS = ("hf", "unsloth")
#: The shards a kernel family cannot run under; the planner leaves their layouts out (ZeRO-3's
#: parameter offload with them) and says why (:func:`kernel_shard_note`). Unsloth's fused LoRA
#: functions read the base weights straight off the projections (``apply_lora_mlp_swiglu`` /
#: ``apply_lora_qkv`` call ``get_lora_parameters(self.gate_proj)`` ..., which returns
#: ``base_layer.weight``, unslothai/unsloth@015bdef0 ``unsloth/kernels/fast_lora.py``,
#: ``unsloth/kernels/utils.py``) without running those modules' forward, and DeepSpeed ZeRO-3
#: gathers a module's own parameters only in that module's forward hook (``fetch_sub_module``:
#: ``iter_params(module, recurse=z3_leaf_module(module))``, microsoft/DeepSpeed@03aecee8
#: ``deepspeed/runtime/zero/partitioned_param_coordinator.py``): the kernels would read empty
#: partitions. Unsloth handles ZeRO-3 only to gather weights for generation (``unsloth/models/
#: rl.py``) and to count parameters; LLaMA-Factory refuses the pair ("Unsloth is incompatible
#: with DeepSpeed ZeRO-3", hiyouga/LLaMA-Factory@c867e280 ``src/llamafactory/hparams/
#: parser.py``). DDP, ZeRO-1/2 and FSDP (whose wrapped block is unsharded before its forward)
#: stay: Unsloth's docs name DDP and "Accelerate and DeepSpeed ... FSDP" as its multi-GPU paths
#: (unsloth.ai/docs/basics/multi-gpu-training-with-unsloth).
KERNEL_EXCLUDED_SHARDS: dict[str, tuple[str, ...]] = {"unsloth": ("zero3",)}


def kernel_shard_note(kernels: str) -> str | None:
    """The plan's line for the layouts left out for ``kernels`` (None: none are)."""
    shards = KERNEL_EXCLUDED_SHARDS.get(kernels)
    if not shards:
        return None
    return (
        f"kernels {kernels}: no {' / '.join(s.upper().replace('ZERO', 'ZeRO-') for s in shards)} "
        "layouts (nor its parameter offload): Unsloth's fused LoRA kernels read the projections' "
        "weights without their forward, where DeepSpeed ZeRO-3 gathers them, and LLaMA-Factory "
        "refuses Unsloth with ZeRO-3 (docs/decisions.md)"
    )


#: What ``FastLanguageModel`` does unless told otherwise, as memfit flags: ``get_peft_model``'s
#: ``use_gradient_checkpointing = "unsloth"`` (its default, unslothai/unsloth@015bdef0
#: ``unsloth/models/llama.py``) is ``--checkpointing offload``; ``CausalLM_fast_forward`` calls
#: ``unsloth_fused_ce_loss`` whenever labels are given (Unsloth 2025.8 and later,
#: unslothai/unsloth@806bee2433) is ``--loss fused``.
UNSLOTH_DEFAULTS = (("checkpointing", "offload"), ("loss", "fused"))


def with_kernel_defaults(fields: Mapping[str, Any]) -> dict[str, Any]:
    """``fields`` (:class:`WorkloadSpec` / ``PlanRequest`` keywords, a field absent or None being
    unset) with :data:`UNSLOTH_DEFAULTS` filled in where ``kernels`` is ``unsloth`` in training,
    and ``kernel_defaults`` naming the ones filled in. The one rule ``memfit estimate`` / ``fit``
    / ``doctor`` / ``plan`` / ``upgrade`` and the Python API share:
    ``WorkloadSpec(**with_kernel_defaults({"kernels": "unsloth", "lora_rank": 16}))``."""
    out = dict(fields)
    if out.get("kernels") != "unsloth" or out.get("mode", "train") not in (None, "train"):
        return out
    applied = tuple((k, v) for k, v in UNSLOTH_DEFAULTS if out.get(k) is None)
    out.update(dict(applied))
    out["kernel_defaults"] = applied
    return out


OPTIMIZERS = (
    "adamw",
    "adamw-fused",
    "adamw-8bit",
    "paged-adamw-8bit",
    "paged-adamw-32bit",
    "adafactor",
    "lion",
    "muon",
    "sgd",
    "sgd-momentum",
    "none",
)
#: Weight formats: bitsandbytes LLM.int8 / NF4 (± double quant) / FP4, GPTQ and AWQ packed int4,
#: FP8 (per-tensor scales on Linears, 128x128 blocks on MoE experts), MXFP4 (gpt-oss experts, as
#: transformers' Mxfp4 integration stores them). ``none`` keeps the precision's dtype.
QUANTS = ("none", "int8", "nf4", "nf4-dq", "fp4", "int4-gptq", "int4-awq", "fp8", "mxfp4")
#: How data-parallel ranks hold the model: ``ddp`` replicates it; ZeRO-1/2/3 partition optimizer
#: states / + gradients / + parameters; ``fsdp`` is PyTorch FSDP2 (fully sharded, like ZeRO-3).
SHARDS = ("none", "ddp", "zero1", "zero2", "zero3", "fsdp")
#: What lives in host RAM instead of the GPU: optimizer states (+ fp32 master weights), or those
#: and the parameters too (ZeRO-3 / FSDP only).
OFFLOADS = ("none", "optimizer", "params")


@dataclass(frozen=True, kw_only=True)
class PrecisionRule:
    """What one precision stores and computes in (dtype names as torch spells them)."""

    params: str  # dtype of the parameters (fp32: the master weights themselves)
    compute: str  # dtype the matmuls run in
    autocast: bool  # the step runs under torch.autocast(dtype=compute)
    grad_scaler: bool  # torch.amp.GradScaler scales the loss (fp16 autocast)

    @property
    def master_weights(self) -> bool:
        """An fp32 copy of the weights is what the optimizer updates."""
        return self.params == "float32"


#: THE precision table: every engine, the planner, the exports and ``apply`` read dtypes from it.
#: ``*-mixed`` as Lightning's MixedPrecision plugin and HF Trainer's ``bf16=True`` / ``fp16=True``
#: run it on an fp32 model (torch.autocast; Micikevicius et al. 2018 for the fp32 masters and
#: loss scaling); ``*-true`` as Lightning's HalfPrecision plugin (``model.to(dtype)``).
PRECISION_RULES: dict[str, PrecisionRule] = {
    "bf16-mixed": PrecisionRule(
        params="float32", compute="bfloat16", autocast=True, grad_scaler=False
    ),
    "bf16-true": PrecisionRule(
        params="bfloat16", compute="bfloat16", autocast=False, grad_scaler=False
    ),
    "16-mixed": PrecisionRule(params="float32", compute="float16", autocast=True, grad_scaler=True),
    "16-true": PrecisionRule(
        params="float16", compute="float16", autocast=False, grad_scaler=False
    ),
    "32-true": PrecisionRule(
        params="float32", compute="float32", autocast=False, grad_scaler=False
    ),
}

#: Other names accepted for ``precision``, resolved once (:func:`resolve_precision`) to
#: (the meaning to train, the meaning to infer). Training follows Lightning, which maps
#: ``"bf16"`` to ``bf16-mixed`` and ``"16"`` to ``16-mixed``
#: (``_convert_precision_to_unified_args``), and HF Trainer, whose ``bf16=True`` /
#: ``fp16=True`` are autocast over fp32 master weights: the larger, safe figure. Inference has
#: no master weights: ``bf16`` is what ``torch_dtype=bfloat16`` and vLLM's ``--dtype bfloat16``
#: mean, the weights stored in bf16 (``bf16-true``). The ``amp-*`` names (memfit before the
#: Lightning names) always meant autocast over fp32 weights.
PRECISION_ALIASES: dict[str, tuple[str, str]] = {
    "bf16": ("bf16-mixed", "bf16-true"),
    "fp16": ("16-mixed", "16-true"),
    "16": ("16-mixed", "16-true"),
    "fp32": ("32-true", "32-true"),
    "32": ("32-true", "32-true"),
    "amp-bf16": ("bf16-mixed", "bf16-mixed"),
    "amp-fp16": ("16-mixed", "16-mixed"),
}
#: Every name ``--precision`` accepts (canonical first).
PRECISION_NAMES = PRECISIONS + tuple(PRECISION_ALIASES)
#: What ``precision=None`` means for a full fine-tune and for inference: mixed precision to
#: train, bf16 weights to infer (:func:`default_precision` for adapters and GPUs without bf16).
DEFAULT_PRECISION = {"train": "bf16-mixed", "infer": "bf16-true"}
#: Checkpoint dtypes (``config.json``'s ``dtype`` / ``torch_dtype``) stored in 16 bits.
HALF_CHECKPOINT_DTYPES = ("bfloat16", "float16")


#: The fp16 counterpart of each bf16 precision name (Lightning's ``precision=`` spellings): what
#: a GPU without bf16 tensor cores runs instead (``hardware.precision.precision_on``), the same two
#: bytes per element. The one mapping; every default and every proposal goes through it.
FP16_COUNTERPART = {"bf16-mixed": "16-mixed", "bf16-true": "16-true"}


def _half(precision: str, bf16: bool) -> str:
    return precision if bf16 else FP16_COUNTERPART[precision]


def default_precision(
    mode: Any, *, adapters: bool = False, bf16: bool = True, checkpoint_dtype: str | None = None
) -> str:
    """The precision a job runs in when the user names none, as the ecosystem runs it.

    - Inference: the weights in bf16 (``16-true`` on a GPU without bf16).
    - A full fine-tune: ``bf16-mixed`` (fp32 masters under autocast: HF Trainer's ``bf16=True``
      on an fp32 model, Lightning's default mixed plugin); ``16-mixed`` without bf16.
    - LoRA / QLoRA (``adapters``): the frozen base in its checkpoint dtype with the adapters in
      fp32 — transformers >= 5 loads a checkpoint in its own dtype (``dtype="auto"`` is the
      default), peft keeps the adapters in fp32 (``autocast_adapter_dtype=True``), and TRL,
      axolotl, Unsloth and LitGPT load the base in bf16. For a 16-bit checkpoint (or one whose
      dtype is unknown: every current LLM ships bf16) that is ``bf16-true`` (``16-true`` on a
      GPU without bf16; the engines keep peft's fp32 adapters); for an fp32 checkpoint the base
      stays fp32 under autocast, ``bf16-mixed`` / ``16-mixed``.
    """
    if mode == "infer":
        return _half("bf16-true", bf16)
    half_base = checkpoint_dtype is None or checkpoint_dtype in HALF_CHECKPOINT_DTYPES
    if adapters and half_base:
        return _half("bf16-true", bf16)
    return _half("bf16-mixed", bf16)


def default_precision_note(
    precision: str, mode: Any, *, adapters: bool = False, checkpoint_dtype: str | None = None
) -> str:
    """Why ``precision`` was chosen when the user named none (one line for the output)."""
    if mode == "infer":
        return f"precision {precision}: the default to infer (16-bit weights); --precision sets it"
    no_bf16 = "" if precision.startswith("bf16") else " (this GPU has no bf16: fp16 instead)"
    if adapters and precision.endswith("-true"):
        dtype = checkpoint_dtype or "16-bit"
        if not precision.startswith("bf16"):
            dtype += ", loaded as fp16: this GPU has no bf16"
        return (
            f"precision {precision}: the default for LoRA / QLoRA: the frozen base in its "
            f"checkpoint dtype ({dtype}) as transformers >= 5's from_pretrained, axolotl and "
            "Unsloth load it, the adapters in fp32 (peft's autocast_adapter_dtype); TRL's "
            "SFTTrainer loads float32 unless model_init_kwargs sets dtype (--precision "
            "bf16-mixed for that); --precision sets it"
        )
    if adapters:
        return (
            f"precision {precision}: the default for LoRA on an fp32 checkpoint{no_bf16}: the base "
            "stays fp32 (its checkpoint dtype) under autocast; --precision sets it"
        )
    return (
        f"precision {precision}: the default for a full fine-tune{no_bf16}: fp32 master weights "
        "under autocast (HF Trainer bf16=True / fp16=True); --precision sets it"
    )


#: ZeRO stages run by DeepSpeed, whose bf16 / fp16 optimizers keep fp32 master weights in the
#: partitioned optimizer state over a 16-bit model (ZeRO §3.1: 2 + 2 + 12 bytes per parameter).
DEEPSPEED_SHARDS = ("zero1", "zero2", "zero3")


def resolve_precision(value: Any, mode: Any) -> Any:
    """The canonical name of ``value`` for ``mode`` (None: :data:`DEFAULT_PRECISION`); anything
    else is returned as given, for :data:`FIELD_RULES` to refuse."""
    infer = mode == "infer"
    if value is None:
        return DEFAULT_PRECISION["infer" if infer else "train"]
    if isinstance(value, str) and value.lower() in PRECISION_ALIASES:
        return PRECISION_ALIASES[value.lower()][1 if infer else 0]
    return value


#: FSDP2's ``MixedPrecisionPolicy`` a ``*-mixed`` job runs under ``--shard fsdp``: (param_dtype,
#: reduce_dtype), as torchtitan applies it (``torchtitan/distributed/fsdp.py``
#: ``apply_fsdp_to_decoder`` at pytorch/torchtitan b5bcd76: ``MixedPrecisionPolicy(param_dtype,
#: reduce_dtype)`` from
#: ``training.mixed_precision_param = "bfloat16"`` / ``mixed_precision_reduce = "float32"``,
#: ``torchtitan/config/configs.py``): fp32 sharded parameters (the masters) and optimizer states,
#: the unsharded parameters all-gathered in bf16 for forward and backward (no autocast), the
#: gradients reduce-scattered in fp32 into fp32 sharded gradients. accelerate's FSDP2 path runs
#: the same casts (``fsdp2_prepare_model`` upcasts trainable parameters to fp32 and
#: ``FullyShardedDataParallelPlugin.set_mixed_precision`` sets param_dtype = reduce_dtype = bf16,
#: accelerate 1.15): memfit counts the fp32 reduce (the larger).
FSDP_MIXED_POLICY: dict[str, tuple[str, str]] = {
    "bf16-mixed": ("bfloat16", "float32"),
    "16-mixed": ("float16", "float32"),
}


def run_precision(precision: str, shard: str | None) -> str:
    """The precision the step's tensors are stored in, for the engines. Under DeepSpeed ZeRO a
    ``*-mixed`` job runs as DeepSpeed's bf16 / fp16 optimizer does: the model in the 16-bit dtype
    (the ``*-true`` tensors) with fp32 master weights in the partitioned optimizer state, which the
    sharding models add (``estimate.sharding.FP32_MASTER_BYTES``). Under FSDP2 a ``*-mixed`` job
    runs as :data:`FSDP_MIXED_POLICY`: forward and backward compute on 16-bit unsharded
    parameters (the ``*-true`` tensors) while the sharded parameters, their gradients and the
    optimizer states stay fp32 (the trace engine builds the model in fp32 and lets FSDP2 cast;
    the analytic rank view adds the fp32 shards). Elsewhere: ``precision``."""
    if shard in (*DEEPSPEED_SHARDS, "fsdp") and precision in ("bf16-mixed", "16-mixed"):
        return precision.replace("-mixed", "-true")
    return precision


def fsdp_mixed_policy(precision: str, shard: str | None) -> tuple[str, str] | None:
    """FSDP2's (param_dtype, reduce_dtype) for this job (:data:`FSDP_MIXED_POLICY`), or None
    where FSDP2 runs without a cast (another shard, or a ``*-true`` / ``32-true`` precision)."""
    if shard != "fsdp":
        return None
    return FSDP_MIXED_POLICY.get(precision)


def precision_rule(precision: str, shard: str | None = None) -> PrecisionRule:
    """:data:`PRECISION_RULES` of the precision as run (:func:`run_precision`)."""
    return PRECISION_RULES[run_precision(precision, shard)]


def precision_rules(mode: str, precision: Any, shard: str | None) -> list[str]:
    """``*-true`` 16-bit training under DeepSpeed ZeRO is the same run as ``*-mixed``: its bf16 /
    fp16 optimizers keep fp32 masters whatever the model's dtype (Lightning passes
    ``bf16-true`` to it as ``bf16: {enabled: true}``). Non-empty where that applies: the planner
    skips the duplicate, and a WorkloadSpec says so in its warnings
    (:func:`deepspeed_true_note`) instead of refusing the name."""
    if mode == "train" and shard in DEEPSPEED_SHARDS and precision in ("bf16-true", "16-true"):
        mixed = precision.replace("-true", "-mixed")
        return [
            f"precision ({precision!r}) with shard {shard!r}: DeepSpeed ZeRO keeps fp32 master "
            f"weights for a 16-bit model (16 bytes per parameter with AdamW), so pure 16-bit "
            f"states do not exist there; use --precision {mixed}, or --shard fsdp for sharded "
            "pure 16-bit training"
        ]
    return []


def deepspeed_true_note(precision: str, shard: str) -> str:
    """The line a ``*-true`` ZeRO job prints: it runs as DeepSpeed runs a 16-bit model."""
    key = "bf16" if precision.startswith("bf16") else "fp16"
    return (
        f"precision {precision} with shard {shard}: DeepSpeed's {key} optimizer "
        f'("{key}": {{"enabled": true}}) keeps fp32 master weights and Adam states in the '
        "partitioned optimizer state whatever the model's dtype (Lightning passes "
        f"{precision} to it the same way), so this is the run --precision "
        f"{precision.replace('-true', '-mixed')} names: 2 + 2 + 12 bytes per parameter"
    )


#: GPUs per job memfit will reason about.
MAX_GPUS = 1 << 16
TASKS = ("auto", "causal-lm", "seq-cls", "seq2seq")
MODES = ("train", "infer")
#: generate()'s ``cache_implementation``: the default DynamicCache (grows by torch.cat) or
#: StaticCache (preallocated at max_length = prompt + new tokens).
CACHE_IMPLEMENTATIONS = ("dynamic", "static")

#: The largest sequence memfit will accept: 16 Mi tokens. Beyond it no single GPU could hold even
#: the activations of one layer of the smallest bundled model, so such values are typos.
MAX_SEQ_LEN = 16 * 1024 * 1024
#: Likewise for batch size (samples per micro-batch).
MAX_BATCH_SIZE = 1 << 20


#: Dtypes a quantized layer may compute in when it differs from the precision's (the analytic
#: engine's names): set by the engine for peft's ``prepare_model_for_kbit_training``, which casts
#: the model around the quantized layers to fp32 but leaves them in the dtype they were loaded in.
COMPUTE_DTYPES = ("f32", "bf16", "f16")
#: Micro-batches per optimizer step memfit will reason about.
MAX_GRAD_ACCUM = 1 << 16
#: Largest quantization group size (a typo guard; GPTQ / AWQ use 32 to 128).
MAX_GROUP_SIZE = 1 << 20
#: Sharding modes that partition state across data-parallel ranks (and can offload it).
PARTITIONING_SHARDS = ("zero1", "zero2", "zero3", "fsdp")


# -- field rules: one check per flat field, shared by the records and WorkloadSpec -------------
Rule = Callable[[str, Any], "str | None"]


def _choice(allowed: tuple[str, ...]) -> Rule:
    def check(name: str, value: Any) -> str | None:
        if value in allowed:
            return None
        return f"{name} ({value!r}) must be one of {', '.join(allowed)}"

    return check


def _optional(rule: Rule) -> Rule:
    """``rule`` for a field whose None means "not set"."""

    def check(name: str, value: Any) -> str | None:
        return None if value is None else rule(name, value)

    return check


def _positive(upper: int, beyond: str = "is beyond what any GPU could hold") -> Rule:
    def check(name: str, value: Any) -> str | None:
        if not _is_int(value) or value < 1:
            return f"{name} ({value!r}) must be a positive integer"
        return f"{name} ({value}) {beyond} (max {upper})" if value > upper else None

    return check


#: The largest LoRA rank: wider than any model's layers (the widest bundled hidden size is
#: 16,384), so a larger value is a typo (``--lora-rank 10**30`` used to be accepted).
MAX_LORA_RANK = 1 << 16
#: The most layers ``freeze_layers`` may name (deeper than any model).
MAX_LAYERS = 1 << 16

# -- model config limits (memfit.models.model_spec refuses a config past them, naming the limit) --
# Each is far past any published model, so a value over it is a typo or a hostile file; each is a
# count some engine loops over or builds a list of.
#: Layers of one stack: the deepest bundled model has 126, the deepest published Transformer
#: 1,000 (DeepNet, Wang et al. 2022, arXiv:2203.00555). A layer count is a loop and list size in
#: every engine: 1e9 layers took 16.6 GB in ``memfit vllm``, 4e6 took 105 s in the analytic
#: engine, and the nearest-fit search grows faster than linearly (4,096 layers: 1.3 s, 16,384:
#: 44 s for ``estimate --gpu H100`` on the analytic engine, measured on the shared 2-core
#: development machine, 2026-12-06).
MAX_MODEL_LAYERS = 4096
#: Attention heads (query or K/V) per layer: the widest published models use 128.
MAX_HEADS = 1 << 16
#: Routed or shared experts per MoE layer: the most published is 384 (Kimi K2).
MAX_EXPERTS = 1 << 16
#: Vocabulary entries: the largest published vocabularies are ~262k (Gemma 3).
MAX_VOCAB = 1 << 24
#: Steps a variable-length run replays (``--run-steps``; the default is 1,000): ten times the
#: default. ``estimate gpt2 --seq-dist 300,100,1024`` took 57 s at 1,000 steps, 157 s at 10,000
#: and over 200 s at 100,000 (shared 2-core development machine, 2026-12-06); 1e9 steps went
#: past 6 GB before this limit.
MAX_RUN_STEPS = 10_000
#: Samples a variable-length run draws (steps x batch), each a list entry.
MAX_RUN_SAMPLES = 1 << 22


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _new_tokens(name: str, value: Any) -> str | None:
    if not _is_int(value) or value < 0:
        return f"{name} ({value!r}) must be an integer >= 0"
    return f"{name} ({value}) is beyond what any GPU could hold" if value > MAX_SEQ_LEN else None


def _lora_rank(name: str, value: Any) -> str | None:
    if value is not None and (not _is_int(value) or value < 1):
        return f"{name} ({value!r}) must be a positive integer or None"
    if value is not None and value > MAX_LORA_RANK:
        return f"{name} ({value}) is wider than any model's layers (max {MAX_LORA_RANK})"
    return None


def _count_or_zero(name: str, value: Any) -> str | None:
    if not _is_int(value) or value < 0:
        return f"{name} ({value!r}) must be an integer >= 0"
    return (
        f"{name} ({value}) is more than any model has (max {MAX_LAYERS})"
        if value > MAX_LAYERS
        else None
    )


def _lora_targets(name: str, value: Any) -> str | None:
    if value == "all-linear":
        return None
    ok = (
        isinstance(value, tuple)
        and len(value) > 0
        and all(isinstance(t, str) and t.strip() for t in value)
    )
    if ok:
        return None
    return (
        f"{name} ({value!r}) must be 'all-linear' or a non-empty list of roles (q, k, v, o, "
        "gate, up, down, attention, mlp) or module names"
    )


def _module_names(name: str, value: Any) -> str | None:
    ok = isinstance(value, tuple) and all(
        isinstance(t, str) and t.strip() and "," not in t for t in value
    )
    if ok:
        return None
    return (
        f"{name} ({value!r}) must be a list of module names (peft's modules_to_save, e.g. "
        "embed_tokens, lm_head)"
    )


def _switch(name: str, value: Any) -> str | None:
    return None if isinstance(value, bool) else f"{name} ({value!r}) must be True or False"


def _dropout(name: str, value: Any) -> str | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1:
        return None
    return f"{name} ({value!r}) must be a probability in [0, 1) (peft's LoraConfig.lora_dropout)"


def _compute_dtype(name: str, value: Any) -> str | None:
    if value is None or value in COMPUTE_DTYPES:
        return None
    return f"{name} ({value!r}) must be None or one of {', '.join(COMPUTE_DTYPES)}"


def _reshard_after_forward(name: str, value: Any) -> str | None:
    if isinstance(value, bool) or (isinstance(value, int) and 1 <= value <= MAX_GPUS):
        return None
    return (
        f"{name} ({value!r}) must be true, false or a positive integer (the group size FSDP2 "
        "reshards to after forward)"
    )


#: PyTorch's two FSDP implementations (``shard='fsdp'``): 2, ``fully_shard`` (per-parameter
#: DTensor shards; torchtitan, accelerate's ``fsdp_version: 2``), 1, ``FullyShardedDataParallel``
#: (one FlatParameter per wrapped module; accelerate's default ``fsdp_version``,
#: ``accelerate/commands/launch.py`` ``--fsdp_version`` default "1" at huggingface/accelerate
#: 16cb6eb8, HF Trainer's ``fsdp``, Lightning's FSDPStrategy).
FSDP_VERSIONS = (1, 2)


#: How FSDP1 wraps a LoRA job's adapters: ``peft`` — peft's ``fsdp_auto_wrap_policy``
#: (``peft/utils/other.py``: every leaf module whose weight requires grad, lora_A / lora_B, is a
#: unit of its own beside the decoder layers), which HF Trainer installs for a PEFT model under
#: FSDP (``transformers/distributed/fsdp.py`` ``update_fsdp_plugin_peft``, transformers 5.23);
#: ``block`` — the adapters flattened into their decoder block's unit with the frozen weights
#: (``use_orig_params=True``): Lightning's ``FSDPStrategy(auto_wrap_policy={Block})`` as LitGPT
#: ran LoRA until it moved to FSDP2, accelerate's TRANSFORMER_BASED_WRAP in a script of one's own.
FSDP_LORA_WRAPS = ("peft", "block")

#: The FSDP1 state-dict types a training job's checkpoints are written with (accelerate's
#: ``fsdp_state_dict_type``, ``accelerate/utils/constants.py`` ``FSDP_STATE_DICT_TYPE`` at
#: v0.28.0; ``FSDP.state_dict_type``): :mod:`memfit.estimate.fsdp1_save`. None: no checkpoint
#: written during the run (or not modelled).
FSDP_STATE_DICT_TYPES = ("FULL_STATE_DICT", "SHARDED_STATE_DICT")


def _fsdp_version(name: str, value: Any) -> str | None:
    if not isinstance(value, bool) and value in FSDP_VERSIONS:
        return None
    return f"{name} ({value!r}) must be 1 (FullyShardedDataParallel) or 2 (fully_shard)"


#: Every checked flat field and its rule, in the order problems are reported.
FIELD_RULES: dict[str, Rule] = {
    "mode": _choice(MODES),
    "precision": _choice(PRECISION_NAMES),
    "attention": _choice(ATTENTIONS),
    "checkpointing": _choice(CHECKPOINTING),
    "loss": _choice(LOSSES),
    "kernels": _choice(KERNELS),
    "optimizer": _choice(OPTIMIZERS),
    "task": _choice(TASKS),
    "quant": _choice(QUANTS),
    "shard": _choice(SHARDS),
    "offload": _choice(OFFLOADS),
    "quant_group_size": _positive(MAX_GROUP_SIZE),
    "gpus": _positive(MAX_GPUS),
    "tp": _positive(MAX_GPUS),
    "batch_size": _positive(MAX_BATCH_SIZE),
    "seq_len": _positive(MAX_SEQ_LEN),
    "new_tokens": _new_tokens,
    "lora_rank": _lora_rank,
    "lora_targets": _lora_targets,
    "lora_modules_to_save": _module_names,
    "lora_dropout": _dropout,
    "transformers_version": version_problem,
    "peft_version": version_problem,
    "accelerate_version": version_problem,
    "freeze_layers": _count_or_zero,
    "selective_ac_option": _count_or_zero,
    "zero_grad_set_to_none": _switch,
    "optimizer_in_bwd": _switch,
    "compile": _switch,
    "prepare_kbit": _switch,
    "quant_experts": _switch,
    "grad_accum": _positive(MAX_GRAD_ACCUM, "is more micro-batches per step than memfit models"),
    "quant_compute_dtype": _compute_dtype,
    "num_beams": _positive(MAX_BATCH_SIZE),
    "cache_implementation": _choice(CACHE_IMPLEMENTATIONS),
    "prefill_chunk_size": _optional(_positive(MAX_SEQ_LEN)),
    # pipeline, context and expert parallelism (memfit.spec.parallel_rules)
    **PARALLEL_FIELD_RULES,
    # -- FSDP2 / HSDP (par-a) --
    "dp_replicate": _positive(MAX_GPUS),
    "reshard_after_forward": _reshard_after_forward,
    "zero_hpz_partition_size": _positive(MAX_GPUS),
    # -- FSDP1 (issue 30) --
    "fsdp_version": _fsdp_version,
    "fsdp_lora_wrap": _choice(FSDP_LORA_WRAPS),
    "fsdp_state_dict_type": _optional(_choice(FSDP_STATE_DICT_TYPES)),
}


def field_problems(values: Mapping[str, Any]) -> list[str]:
    """The rules of :data:`FIELD_RULES` for the fields in ``values`` (by flat name), in the
    table's order."""
    rules = FIELD_RULES
    # the common case, every field valid, visits only ``values`` (a spec part checks a few of
    # the table's ~60 fields, thousands of times in one plan search: issue 32)
    if all(rules[name](name, value) is None for name, value in values.items() if name in rules):
        return []
    found = (rule(name, values[name]) for name, rule in rules.items() if name in values)
    return [text for text in found if text is not None]


def raise_if(problems: list[str]) -> None:
    if problems:
        raise SpecError.from_problems(problems)


def is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


# -- rules between fields ------------------------------------------------------------------
def shape_rules(mode: str, new_tokens: Any, grad_accum: Any) -> list[str]:
    p: list[str] = []
    if mode != "infer" and new_tokens and isinstance(new_tokens, int):
        p.append(
            f"new_tokens ({new_tokens}) only applies to mode 'infer' (generation); "
            "drop --new-tokens or use --mode infer"
        )
    if mode == "infer" and is_count(grad_accum) and grad_accum > 1:
        p.append(f"grad_accum ({grad_accum}) only applies to mode 'train' (no optimizer steps)")
    return p


def generation_rules(mode: str, new_tokens: Any, num_beams: Any, cache: Any) -> list[str]:
    """Beam search and the static cache are generate() settings: inference with new tokens."""
    p: list[str] = []
    generates = mode == "infer" and isinstance(new_tokens, int) and new_tokens > 0
    if is_count(num_beams) and num_beams > 1 and not generates:
        p.append(f"num_beams ({num_beams}) needs generation: --mode infer --new-tokens N")
    if cache == "static" and not generates:
        p.append("cache_implementation 'static' needs generation: --mode infer --new-tokens N")
    return p


def prefill_rules(mode: str, chunk: Any) -> list[str]:
    """``prefill_chunk_size`` is GenerationConfig's: the prompt of an inference run."""
    if chunk is not None and mode != "infer":
        return [
            f"prefill_chunk_size ({chunk}) only applies to mode 'infer' (generate() runs the "
            "prompt in chunks); drop --prefill-chunk-size or use --mode infer"
        ]
    return []


def layout_rules(gpus: int, tp: int, shard: str | None, *, mp: int | None = None) -> list[str]:
    """Tensor parallelism must divide the GPUs; data-parallel ranks need a sharding mode.
    ``mp``: the GPUs of one replica, ``tp * pp * cp`` (None: ``tp``)."""
    p: list[str] = []
    if gpus % tp:
        p.append(
            f"tp ({tp}) must divide gpus ({gpus}): each tensor-parallel group spans "
            "tp GPUs and the data-parallel degree is gpus / tp"
        )
    replica = mp or tp
    label = f"tp {tp}" if replica == tp else f"tp x pp x cp {replica}"
    dp = gpus // replica
    if shard == "none" and dp > 1:
        p.append(
            f"shard 'none' with {dp} data-parallel ranks (gpus {gpus} / {label}): "
            "say how the ranks hold the model with --shard ddp|zero1|zero2|zero3|fsdp"
        )
    return p


def offload_rules(shard: str | None, offload: str) -> list[str]:
    p: list[str] = []
    if offload != "none" and shard not in PARTITIONING_SHARDS:
        hint = "--shard zero3" if offload == "params" else "--shard zero2 (ZeRO-Offload)"
        p.append(
            f"offload ({offload!r}) needs a sharding engine that offloads "
            f"(got shard {shard!r}); use {hint}, also with --gpus 1"
        )
    if offload == "params" and shard in ("zero1", "zero2"):
        p.append(
            f"offload 'params' needs --shard zero3 or fsdp (shard {shard!r} keeps "
            "every parameter on each GPU)"
        )
    if offload == "optimizer" and shard == "fsdp":
        p.append(
            "offload 'optimizer' with shard 'fsdp': FSDP2's CPUOffloadPolicy offloads "
            "parameters, gradients and optimizer states together; use --offload params, or "
            "--shard zero2/zero3 for optimizer-only offload (ZeRO-Offload)"
        )
    return p


def fsdp_rules(
    shard: str | None, dp: int, dp_replicate: Any, reshard_after_forward: Any
) -> list[str]:
    """HSDP (``dp_replicate`` > 1) and ``reshard_after_forward`` are FSDP2's: a replicate degree
    divides the data-parallel ranks (torchtitan: ``dp_replicate * dp_shard``); an integer
    reshard size divides the shard group (``fully_shard``'s own rule,
    ``_fsdp_init._get_post_forward_mesh_info``)."""
    p: list[str] = []
    if not (is_count(dp_replicate) and (isinstance(reshard_after_forward, (bool, int)))):
        return p
    if shard != "fsdp":
        if dp_replicate != 1:
            p.append(
                f"dp_replicate ({dp_replicate}) is HSDP (FSDP2 over a replicate x shard mesh); "
                f"it needs --shard fsdp (got shard {shard!r})"
            )
        if reshard_after_forward is not True:
            p.append(
                f"reshard_after_forward ({reshard_after_forward!r}) is FSDP2's; it needs "
                f"--shard fsdp (got shard {shard!r})"
            )
        return p
    if dp % dp_replicate:
        p.append(
            f"dp_replicate ({dp_replicate}) must divide the data-parallel ranks ({dp}): HSDP "
            "shards over dp / dp_replicate ranks and replicates across the rest"
        )
        return p
    shard_size = dp // dp_replicate
    if not isinstance(reshard_after_forward, bool) and shard_size % reshard_after_forward:
        p.append(
            f"reshard_after_forward ({reshard_after_forward}) must divide the FSDP shard group "
            f"({shard_size} ranks), as fully_shard requires; use true, false or a divisor"
        )
    return p


def hpz_rules(shard: str | None, dp: int, hpz: Any) -> list[str]:
    """ZeRO++'s hierarchical partitioning (``zero_hpz_partition_size``) is a ZeRO-3 setting whose
    secondary group divides the data-parallel ranks (DeepSpeed builds it from consecutive ranks,
    ``groups._create_zero_param_parallel_group``)."""
    if not is_count(hpz) or hpz == 1:
        return []
    if shard != "zero3":
        return [
            f"zero_hpz_partition_size ({hpz}) is ZeRO++'s hierarchical partitioning of ZeRO-3 "
            f"parameters; it needs --shard zero3 (got shard {shard!r})"
        ]
    if dp % hpz:
        return [
            f"zero_hpz_partition_size ({hpz}) must divide the data-parallel ranks ({dp}); "
            "DeepSpeed recommends the GPUs per node"
        ]
    return []


def fsdp_version_rules(values: dict[str, Any]) -> list[str]:
    """FSDP1 (``fsdp_version`` 1) is a ``shard='fsdp'`` setting that memfit models for a data-
    parallel decoder job (:mod:`memfit.estimate.fsdp1`); the settings only FSDP2 runs with here
    (torchtitan's tp / pp / cp / ep / Float8 layouts, HSDP-2's reshard group) are refused by
    name, as is a quantized base with its adapters inside the block's flat parameter
    (``fsdp_lora_wrap`` block). A quantized base under peft's wrap policy (transformers PR
    #29587's FSDP-QLoRA: frozen packed blocks, each lora_A / lora_B a unit of its own) is
    modelled. ``fsdp_state_dict_type`` (the checkpoint's FSDP1 state-dict type) needs FSDP1 and
    a training job."""
    version = values.get("fsdp_version", 2)
    wrap = values.get("fsdp_lora_wrap", "peft")
    sd_type = values.get("fsdp_state_dict_type")
    if version != 1:
        p0: list[str] = []
        if wrap != "peft":
            p0.append(
                f"fsdp_lora_wrap ({wrap!r}) is how FSDP1 wraps LoRA adapters; it needs "
                "--fsdp-version 1 (FSDP2 shards every parameter on its own)"
            )
        if sd_type is not None:
            p0.append(
                f"fsdp_state_dict_type ({sd_type!r}) is FSDP1's (FSDP.state_dict_type); it "
                "needs --fsdp-version 1 (FSDP2's checkpoints hold DTensor shards, no copy)"
            )
        return p0
    shard = values.get("shard")
    if shard != "fsdp":
        return [
            f"fsdp_version (1) sets which PyTorch FSDP runs --shard fsdp; it needs --shard fsdp "
            f"(got shard {shard!r})"
        ]
    p: list[str] = []
    rf = values.get("reshard_after_forward", True)
    if rf is not True:
        p.append(
            f"reshard_after_forward ({rf!r}) with fsdp_version 1: FSDP1 spells it as its "
            "sharding_strategy (SHARD_GRAD_OP, which memfit answers as --shard zero2); use "
            "--fsdp-version 2 for fully_shard's reshard_after_forward"
        )
    layout = ("tp", "pp", "cp", "ep")
    other = [f"{k} {values[k]}" for k in layout if is_count(values.get(k)) and values[k] > 1]
    if values.get("float8", "none") != "none":
        other.append(f"float8 {values['float8']}")
    if other:
        p.append(
            f"fsdp_version 1 with {', '.join(other)}: memfit models FSDP1 for data-parallel jobs "
            "only (these layouts run on FSDP2, as torchtitan does); use --fsdp-version 2"
        )
    quant = values.get("quant", "none")
    if quant != "none" and wrap != "peft":
        p.append(
            f"fsdp_version 1 with quant {quant!r} and fsdp_lora_wrap {wrap!r}: FSDP1 over a "
            "quantized base with the adapters in the block's flat parameter is not modelled; "
            "use --fsdp-lora-wrap peft (peft's fsdp_auto_wrap_policy, as HF Trainer runs "
            "FSDP-QLoRA) or --fsdp-version 2"
        )
    if sd_type is not None and values.get("mode", "train") != "train":
        p.append(
            f"fsdp_state_dict_type ({sd_type!r}) is the state-dict type of a training job's "
            f"checkpoints; mode is {values.get('mode')!r}"
        )
    return p


def kbit_rules(mode: str, quant: str, prepare_kbit: Any) -> list[str]:
    if prepare_kbit not in (True, False):
        return [f"prepare_kbit ({prepare_kbit!r}) must be true or false"]
    if prepare_kbit and (mode != "train" or quant == "none"):
        return [
            "prepare_kbit (peft's prepare_model_for_kbit_training) applies to QLoRA training: "
            "it needs --mode train and a --quant format; drop --prepare-kbit"
        ]
    return []


def default_shard(gpus: Any, tp: Any) -> str:
    dp = gpus // tp if is_count(gpus) and is_count(tp) else 1
    return "ddp" if dp > 1 else "none"
