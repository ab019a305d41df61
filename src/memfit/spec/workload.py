"""WorkloadSpec: one job as the flat keyword record users write, composed of the three parts."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from memfit.spec.media import MediaSpec
from memfit.spec.parallel_rules import (
    PARALLEL_DEFAULTS,
    model_parallel_size,
    parallel_job_rules,
    parallel_layout_rules,
    resolve_schedule,
)
from memfit.spec.parts import ParallelSpec, ShapeSpec, TechniqueSpec
from memfit.spec.rules import (
    DEEPSPEED_SHARDS,
    FIELD_RULES,
    PARTITIONING_SHARDS,
    Mode,
    deepspeed_true_note,
    default_precision,
    default_precision_note,
    default_shard,
    field_problems,
    fsdp_mixed_policy,
    fsdp_rules,
    fsdp_version_rules,
    generation_rules,
    hpz_rules,
    is_count,
    kbit_rules,
    layout_rules,
    offload_rules,
    precision_rules,
    prefill_rules,
    raise_if,
    resolve_precision,
    run_precision,
    shape_rules,
)


@dataclass(frozen=True, kw_only=True)
class WorkloadSpec:
    """One training step or one inference run, as the user's job executes it.

    ``precision``: Lightning's names (:data:`memfit.spec.rules.PRECISIONS`): ``*-mixed`` keeps
    fp32 master weights and runs the step under autocast (``16-mixed`` adds a GradScaler);
    ``*-true`` keeps weights, grads and optimizer states in that dtype. None:
    :func:`~memfit.spec.rules.default_precision` (``bf16-mixed`` for a full fine-tune,
    ``bf16-true`` for LoRA / QLoRA — the base in its checkpoint dtype, fp32 adapters — and to
    infer). The other names (``bf16``, ``fp16``, ``fp32``, ``amp-bf16``,
    ``amp-fp16``, ``16``, ``32``) are resolved once, here, by :func:`~memfit.spec.rules.
    resolve_precision` (``bf16`` trains as ``bf16-mixed``, infers as ``bf16-true``); the field
    then holds the canonical name. ``attention``: ``eager`` materialises the (B, H, S, S)
    scores, ``sdpa`` lets PyTorch pick the kernel a CUDA GPU would pick, ``flash`` forces
    FlashAttention-2.
    ``zero_grad_set_to_none`` is torch's default (True); HF Trainer before 4.x kept grads (False).
    ``prepare_kbit``: QLoRA through peft's ``prepare_model_for_kbit_training`` (what TRL's
    SFTTrainer calls on a quantized model): every unquantized half-precision parameter is cast
    to fp32, so the embeddings, norms and LM head, and the activations between the quantized
    layers, run in fp32. ``grad_accum``: micro-batches per optimizer step (the exports render it;
    the estimate is of one micro-batch, and counts the gradients the earlier micro-batches leave
    through ``zero_grad_set_to_none=False``, as the planner's workloads do).
    ``quant_compute_dtype``: see :class:`QuantSpec` (``compute_dtype``).

    The flat fields are the inputs; :attr:`shape`, :attr:`techniques` and :attr:`parallel` are
    the same values as the three records (built when read, so ``vars(w)`` stays the flat
    fields), and :meth:`of` composes a workload from them.
    """

    mode: Mode = "train"
    batch_size: int = 1
    seq_len: int = 512
    new_tokens: int = 0
    precision: str | None = None  # None: rules.default_precision (LoRA: bf16-true)
    attention: str = "sdpa"
    checkpointing: str = "none"
    optimizer: str | None = None  # None: "adamw" for train, "none" for infer
    lora_rank: int | None = None
    lora_targets: tuple[str, ...] | str = "all-linear"
    #: peft ``modules_to_save`` (:class:`~memfit.spec.parts.LoraSpec`): modules trained in full
    #: beside the adapters (a trainable copy next to the frozen original)
    lora_modules_to_save: tuple[str, ...] = ()
    #: peft ``LoraConfig.lora_dropout`` (:class:`~memfit.spec.parts.LoraSpec`): above 0 each
    #: adapter keeps a dropped copy of its input and the mask for backward
    lora_dropout: float = 0.0
    freeze_layers: int = 0
    task: str = "auto"
    zero_grad_set_to_none: bool = True
    #: the optimizer steps each parameter inside backward, as its gradient is accumulated
    #: (torchtune ``optimizer_in_bwd: True``; torch's ``register_post_accumulate_grad_hook``
    #: pattern): each gradient is freed right after its step, so no full set of gradients exists
    optimizer_in_bwd: bool = False
    #: the LM head's cross-entropy in training (rules.LOSSES): full logits, chunked, or fused
    loss: str = "full"
    #: whose kernels run the layers in training (rules.KERNELS): transformers' + peft's, or
    #: Unsloth's fast RMSNorm / RoPE and fused LoRA QKV / O / MLP (estimate.analytic.unsloth)
    kernels: str = "hf"
    #: the Unsloth defaults (rules.UNSLOTH_DEFAULTS) the door applied because the job did not
    #: set them, as (field, value) pairs; not part of the job's identity
    kernel_defaults: tuple[tuple[str, str], ...] = field(default=(), compare=False, repr=False)
    #: the transformer blocks run under ``torch.compile`` (torchtitan ``compile.enable``,
    #: torchtune ``compile: True``, HF ``torch_compile=True``): AOTAutograd's min-cut
    #: partitioner picks what a block saves for backward (``estimate.analytic.compile``)
    compile: bool = False
    #: ``checkpointing = "selective-layer"``: torchtitan's ``selective_ac_option`` N, every N-th
    #: block checkpointed (counted from 1; 0: every block, as torchtitan reads it)
    selective_ac_option: int = 2
    #: the transformers release the job ran, where its step differs from the installed one's in
    #: memory (:mod:`memfit.spec.hf_versions`: fp32 logits before 4.46); None: the installed one
    transformers_version: str | None = None
    #: the peft release the job ran (:mod:`memfit.spec.hf_versions`: before 0.12 the adapters
    #: stay in the base layer's dtype, not fp32); None: the installed one
    peft_version: str | None = None
    quant: str = "none"
    quant_group_size: int = 128
    prepare_kbit: bool = False
    gpus: int = 1
    shard: str | None = None  # None: "ddp" when there are data-parallel ranks, else "none"
    offload: str = "none"
    tp: int = 1
    grad_accum: int = 1
    quant_compute_dtype: str | None = None
    num_beams: int = 1
    cache_implementation: str = "dynamic"
    prefill_chunk_size: int | None = None  # GenerationConfig.prefill_chunk_size (None: one pass)
    #: whether a MoE model's routed experts are stored in ``quant`` too (False: a checkpoint
    #: whose experts transformers dequantizes at load, compressed-tensors' fused experts)
    quant_experts: bool = True
    #: what one image / audio sample is, for a vision or speech model (not set: its config says)
    media: MediaSpec = MediaSpec()
    # -- pipeline, context and expert parallelism: ParallelSpec's fields (spec.parallel_rules) --
    pp: int = 1
    pp_schedule: str = "1f1b"
    pp_virtual_stages: int = 1
    cp: int = 1
    cp_rotate: str = "allgather"
    ep: int = 1
    etp: int = 1
    #: tensor parallelism also splits the norms / residual stream along the sequence (Megatron
    #: ``--sequence-parallel``; torchtitan always with tp > 1): spec.parallel_rules
    sequence_parallel: bool = False
    #: torch's micro-pipelined (async) tensor parallelism over SymmetricMemory (torchtitan
    #: ``enable_async_tensor_parallel``; needs compile and sequence parallelism):
    #: spec.parallel_rules
    async_tp: bool = False
    #: torchao Float8 training of the blocks' linears (``tensorwise`` / ``rowwise``; ``none``)
    #: and FSDP2's fp8 all-gather of their weights: spec.parallel_rules
    float8: str = "none"
    float8_all_gather: bool = False
    # -- FSDP2 / HSDP (par-a) --
    #: HSDP: FSDP2 over a (replicate, shard) mesh; the model is sharded over dp / dp_replicate
    #: ranks (torchtitan's ``data_parallel_replicate_degree``); 1: plain FSDP
    dp_replicate: int = 1
    #: FSDP2's ``fully_shard(reshard_after_forward=...)``: True frees each block's unsharded
    #: parameters after its forward, False keeps them to backward, an int reshards to that group
    reshard_after_forward: bool | int = True
    #: ZeRO++ hpZ (DeepSpeed's ``zero_hpz_partition_size``): ZeRO-3 also keeps a 16-bit
    #: secondary partition of each parameter over this many ranks; 1: off
    zero_hpz_partition_size: int = 1
    # -- FSDP1 (issue 30) --
    #: Which PyTorch FSDP runs ``shard='fsdp'``: 2 (``fully_shard``, per-parameter DTensor
    #: shards, torchtitan) or 1 (``FullyShardedDataParallel``: one FlatParameter per wrapped
    #: block, as accelerate's ``fsdp_version: 1``, HF Trainer's ``fsdp``, Lightning's
    #: FSDPStrategy run it): :mod:`memfit.estimate.fsdp1`
    fsdp_version: int = 2
    #: FSDP1's units for a LoRA job's adapters: ``peft`` (peft's fsdp_auto_wrap_policy, HF
    #: Trainer's) or ``block`` (inside the decoder block's flat parameter, LitGPT's):
    #: :data:`~memfit.spec.rules.FSDP_LORA_WRAPS`
    fsdp_lora_wrap: str = "peft"
    #: The FSDP1 state-dict type the job writes its checkpoints with during training
    #: (accelerate's ``fsdp_state_dict_type``: FULL_STATE_DICT or SHARDED_STATE_DICT); None:
    #: no checkpoint phase is modelled (:mod:`memfit.estimate.fsdp1_save`)
    fsdp_state_dict_type: str | None = None
    #: The accelerate release that saves those checkpoints (:mod:`memfit.spec.hf_versions`:
    #: before 0.31 a SHARDED_STATE_DICT save keeps its copies on the GPU); None: the installed
    #: one's rules (a current release)
    accelerate_version: str | None = None
    #: True when ``precision`` was not given and :func:`~memfit.spec.rules.default_precision`
    #: chose it (the door may refine it by the GPU and the checkpoint's dtype, and says why);
    #: not part of the job's identity (no effect on equality, ``repr`` or cache keys)
    precision_defaulted: bool = field(default=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.precision is None:
            adapters = self.lora_rank is not None and self.shard not in DEEPSPEED_SHARDS
            object.__setattr__(self, "precision", default_precision(self.mode, adapters=adapters))
            object.__setattr__(self, "precision_defaulted", True)
        object.__setattr__(self, "precision", resolve_precision(self.precision, self.mode))
        if self.optimizer is None:
            object.__setattr__(self, "optimizer", "adamw" if self.mode == "train" else "none")
        object.__setattr__(self, "pp_schedule", resolve_schedule(self.pp_schedule))
        if self.shard is None:
            mp = model_parallel_size(vars(self))
            object.__setattr__(self, "shard", default_shard(self.gpus, mp))
        if isinstance(self.lora_targets, list):
            object.__setattr__(self, "lora_targets", tuple(self.lora_targets))
        if isinstance(self.lora_modules_to_save, list):
            object.__setattr__(self, "lora_modules_to_save", tuple(self.lora_modules_to_save))
        raise_if(self.problems())

    def settle_precision(
        self, *, bf16: bool = True, checkpoint_dtype: str | None = None
    ) -> tuple[WorkloadSpec, str | None]:
        """The job with its defaulted precision settled for the GPU (``bf16``: whether it has
        bf16) and the checkpoint's dtype, and the line that says which default applied and why
        (None: the precision was given, kept as is)."""
        if not self.precision_defaulted:
            return self, None
        # under DeepSpeed ZeRO an adapter job runs as its bf16 / fp16 optimizer does: the
        # *-mixed name (the 16-bit model, fp32 masters of what trains; rules.run_precision)
        adapters = self.lora_rank is not None and self.shard not in DEEPSPEED_SHARDS
        chosen = default_precision(
            self.mode, adapters=adapters, bf16=bf16, checkpoint_dtype=checkpoint_dtype
        )
        settled = self
        if chosen != self.precision:
            settled = replace(self, precision=chosen, precision_defaulted=True)
        note = default_precision_note(
            chosen, self.mode, adapters=adapters, checkpoint_dtype=checkpoint_dtype
        )
        if settled.fsdp_policy is not None:  # FSDP2 runs *-mixed as its policy, not autocast
            param, reduce = settled.fsdp_policy
            note = (
                f"precision {chosen}: the default for a full fine-tune, run under --shard fsdp "
                f"as FSDP2's MixedPrecisionPolicy(param_dtype={param}, reduce_dtype={reduce}) "
                "over fp32 shards (torchtitan's default); --precision sets it"
            )
        elif settled.shard in DEEPSPEED_SHARDS and chosen.endswith("-mixed"):
            key = "bf16" if chosen.startswith("bf16") else "fp16"
            note = (
                f"precision {chosen}: the default for a full fine-tune, run under --shard "
                f"{settled.shard} as DeepSpeed's {key} optimizer: a 16-bit model, fp32 master "
                "weights and Adam states in the partitioned optimizer state; --precision sets it"
            )
        return settled, note

    @classmethod
    def of(
        cls,
        *,
        shape: ShapeSpec | None = None,
        techniques: TechniqueSpec | None = None,
        parallel: ParallelSpec | None = None,
    ) -> WorkloadSpec:
        """The workload of three records (each left out: its defaults)."""
        return cls(
            **(shape or ShapeSpec()).flat(),
            **(techniques or TechniqueSpec()).flat(),
            **(parallel or ParallelSpec()).flat(),
        )

    @property
    def shape(self) -> ShapeSpec:
        return ShapeSpec(**{k: getattr(self, k) for k in SHAPE_FIELDS})

    @property
    def techniques(self) -> TechniqueSpec:
        return TechniqueSpec.from_flat(**{k: getattr(self, k) for k in TECHNIQUE_FIELDS})

    @property
    def parallel(self) -> ParallelSpec:
        return ParallelSpec(**{k: getattr(self, k) for k in PARALLEL_FIELDS})

    def problems(self) -> list[str]:
        values = {name: getattr(self, name) for name in FIELD_RULES}
        p = field_problems(values)
        if self.mode == "infer":
            p.extend(self._training_only_problems())
        p.extend(shape_rules(self.mode, self.new_tokens, self.grad_accum))
        p.extend(
            generation_rules(self.mode, self.new_tokens, self.num_beams, self.cache_implementation)
        )
        p.extend(prefill_rules(self.mode, self.prefill_chunk_size))
        if not isinstance(self.media, MediaSpec):
            p.append(
                f"media ({self.media!r}) must be a MediaSpec: pass "
                "memfit.spec.MediaSpec(image_size=..., audio_seconds=...)"
            )
        p.extend(self._technique_problems())
        p.extend(parallel_layout_rules(vars(self)))
        p.extend(parallel_job_rules(vars(self)))
        return p

    def _training_only_problems(self) -> list[str]:
        p: list[str] = []
        if self.optimizer != "none":
            p.append(
                f"optimizer ({self.optimizer!r}) contradicts mode 'infer': inference runs no "
                "optimizer; drop --optimizer or use --mode train"
            )
        if self.checkpointing != "none":
            p.append(
                f"checkpointing ({self.checkpointing!r}) only applies to mode 'train' "
                "(inference keeps no activations for backward)"
            )
        if self.lora_rank is not None:
            p.append("lora_rank is a training technique; it has no effect with mode 'infer'")
        if self.kernels != "hf":
            p.append(
                f"kernels ({self.kernels!r}) models Unsloth's training kernels; with mode "
                "'infer' drop --kernels (its inference path is not modelled)"
            )
        if self.freeze_layers:
            p.append("freeze_layers is a training technique; it has no effect with mode 'infer'")
        return p

    def _technique_problems(self) -> list[str]:
        """Combinations that cannot run (quantized training without adapters, offload without a
        sharding engine, tensor parallelism not dividing the GPUs)."""
        if not (is_count(self.gpus) and is_count(self.tp)):
            return []
        p = layout_rules(self.gpus, self.tp, self.shard, mp=model_parallel_size(vars(self)))
        if self.selective_ac_option != 2 and self.checkpointing != "selective-layer":
            p.append(
                f"selective_ac_option ({self.selective_ac_option}) is the block frequency of "
                "torchtitan's per-layer checkpointing: use it with --checkpointing "
                "selective-layer, or drop it"
            )
        p += kbit_rules(self.mode, self.quant, self.prepare_kbit)
        if self.mode == "train" and self.quant != "none" and self.lora_rank is None:
            p.append(
                f"quant ({self.quant!r}) with mode 'train' needs LoRA adapters (QLoRA): quantized "
                "base weights get no gradients; add --lora-rank, or use --quant none"
            )
        if self.mode == "train" and self.quant == "mxfp4":
            p.append(
                "quant 'mxfp4' with mode 'train': transformers' MXFP4 kernels (triton "
                "matmul_ogs) have no backward; fine-tuning loads the checkpoint with "
                "Mxfp4Config(dequantize=True), bf16 experts: use --quant none"
            )
        p += offload_rules(self.shard, self.offload)
        p += fsdp_rules(self.shard, self.dp, self.dp_replicate, self.reshard_after_forward)
        p += hpz_rules(self.shard, self.dp, self.zero_hpz_partition_size)
        p += fsdp_version_rules(vars(self))
        p += self._optimizer_in_bwd_problems()
        p += self._loss_problems()
        saved = self.lora_modules_to_save
        if saved and isinstance(saved, tuple) and (self.lora_rank is None or self.mode != "train"):
            p.append(
                f"lora_modules_to_save ({', '.join(map(str, saved))}) are trained "
                "beside LoRA adapters: it needs --lora-rank and --mode train (a full fine-tune "
                "trains every module already)"
            )
        if self.lora_dropout and (self.lora_rank is None or self.mode != "train"):
            p.append(
                f"lora_dropout ({self.lora_dropout}) is the LoRA adapters' dropout in training: "
                "it needs --lora-rank and --mode train"
            )
        if self.compile is True and self.mode != "train":
            p.append(
                "compile with mode 'infer': memfit models what torch.compile saves for backward "
                "in training; drop --compile"
            )
        if self.mode == "infer" and self.offload == "optimizer":
            p.append("offload 'optimizer' has no effect with mode 'infer' (there is no optimizer)")
        if self.mode == "infer" and self.shard in ("zero1", "zero2", "fsdp"):
            p.append(
                f"shard ({self.shard!r}) is a training setup; for inference use --tp, --shard "
                "zero3 (ZeRO-Inference) or ddp (one replica per GPU)"
            )
        return p

    def _loss_problems(self) -> list[str]:
        """A chunked / fused cross-entropy is a training loss (inference has no labels)."""
        if self.loss == "full" or self.mode == "train":
            return []
        return [
            f"loss {self.loss!r} is the training loss of a causal LM: it needs --mode train "
            "(inference computes no loss); drop --loss"
        ]

    def _optimizer_in_bwd_problems(self) -> list[str]:
        """What the optimizer step inside backward cannot be combined with (torchtune's
        ``full_finetune_single_device`` raises on gradient accumulation with it; a GradScaler
        must unscale every gradient before any step)."""
        if self.optimizer_in_bwd is not True:
            return []
        if self.mode != "train" or self.optimizer == "none":
            return [
                "optimizer_in_bwd needs a training job with an optimizer (--mode train, "
                "--optimizer other than none)"
            ]
        if self.grad_accum > 1:
            return [
                f"optimizer_in_bwd with grad_accum {self.grad_accum}: each parameter steps as "
                "soon as its gradient exists, so gradients cannot accumulate over micro-batches "
                "(torchtune refuses it too); use grad_accum 1 or drop --optimizer-in-bwd"
            ]
        if self.precision == "16-mixed":
            return [
                "optimizer_in_bwd with 16-mixed: the GradScaler must check every gradient before "
                "any parameter steps; use bf16 (bf16-mixed / bf16-true) or drop --optimizer-in-bwd"
            ]
        return []

    def warnings(self) -> list[str]:
        """Valid but probably unintended settings (reported in the estimate's ``notes``)."""
        w: list[str] = []
        sharded = self.shard in PARTITIONING_SHARDS
        # the states are sharded over the data- and context-parallel ranks (spec.parallel_rules)
        if sharded and self.dp * self.cp == 1 and self.offload == "none":
            w.append(
                f"shard {self.shard!r} over a single data-parallel rank partitions nothing: "
                "it saves memory only with --gpus > 1 or with --offload"
            )
        if precision_rules(self.mode, self.precision, self.shard):
            w.append(deepspeed_true_note(str(self.precision), str(self.shard)))
        if self.shard == "ddp" and self.dp == 1:
            w.append("shard 'ddp' with one data-parallel rank is a single-GPU run")
        if self.quant in ("nf4", "nf4-dq", "fp4") and self.precision == "32-true" and self.is_train:
            w.append(
                "4-bit base weights with fp32 compute: bitsandbytes dequantizes to fp32 for every "
                "matmul; QLoRA normally computes in bf16 (--precision bf16-mixed)"
            )
        if self.prepare_kbit and self.quant in ("int4-gptq", "fp8"):
            w.append(
                f"prepare_kbit with quant {self.quant!r}: peft's prepare_model_for_kbit_training "
                "skips the fp32 casts for GPTQ and torchao models, so it changes nothing here"
            )
        if self.quant == "fp8" and self.is_train:
            w.append(
                "fp8 here stores frozen base weights in fp8 (per-tensor scales); fp8 training "
                "recipes (transformer-engine) keep higher-precision masters and are not modelled"
            )
        # FSDP1's no_sync keeps unsharded gradients whatever zero_grad does: counted there
        if self.grad_accum > 1 and self.zero_grad_set_to_none and self.fsdp_version == 2:
            w.append(
                f"grad_accum {self.grad_accum} with zero_grad_set_to_none: the gradients of the "
                "earlier micro-batches are held through the later ones, which this estimate does "
                "not count; pass zero_grad_set_to_none=False (the planner does)"
            )
        return w

    @property
    def dp(self) -> int:
        """Data-parallel degree: ``gpus / (tp * pp * cp)``."""
        return self.gpus // model_parallel_size(vars(self))  # 1 for an invalid field

    @property
    def run_precision(self) -> str:
        """The precision the engines store the step's tensors in
        (:func:`~memfit.spec.rules.run_precision`: ``*-mixed`` under DeepSpeed ZeRO runs as
        DeepSpeed's 16-bit model with fp32 masters in the optimizer state)."""
        return run_precision(str(self.precision), self.shard)

    @property
    def fsdp_policy(self) -> tuple[str, str] | None:
        """FSDP2's (param_dtype, reduce_dtype) for this job, or None where FSDP2 does not cast
        (:func:`~memfit.spec.rules.fsdp_mixed_policy`)."""
        return fsdp_mixed_policy(str(self.precision), self.shard)

    @property
    def dp_shard(self) -> int:
        """Ranks one FSDP2 shard group spans: ``dp / dp_replicate`` (HSDP), else ``dp``."""
        return self.dp // self.dp_replicate if self.shard == "fsdp" else self.dp

    @property
    def is_train(self) -> bool:
        return self.mode == "train"

    @property
    def uses_optimizer(self) -> bool:
        return self.is_train and self.optimizer != "none"

    def normalized(self) -> dict[str, Any]:
        """The inputs as JSON-ready values (what ``--json`` prints under ``workload``; the
        micro-batch count per step is the exports' concern, not the estimate's; the media are
        printed as the estimate's ``inputs``)."""
        skip = ("grad_accum", "media", "precision_defaulted", "kernel_defaults")
        d = _as_dict(self, skip)
        if self.kernels == "hf":
            d.pop("kernels")
        if self.quant_compute_dtype is None:
            d.pop("quant_compute_dtype")
        if self.num_beams == 1:
            d.pop("num_beams")
        if self.cache_implementation == "dynamic":
            d.pop("cache_implementation")
        if self.prefill_chunk_size is None:
            d.pop("prefill_chunk_size")
        if self.quant_experts:
            d.pop("quant_experts")
        if not self.optimizer_in_bwd:
            d.pop("optimizer_in_bwd")
        if self.loss == "full":
            d.pop("loss")
        if not self.compile:
            d.pop("compile")
        if self.checkpointing != "selective-layer":
            d.pop("selective_ac_option")
        for name, default in PARALLEL_DEFAULTS.items():  # printed where a job uses them
            if d[name] == default:
                d.pop(name)
        if self.dp_replicate == 1:
            d.pop("dp_replicate")
        if self.reshard_after_forward is True:
            d.pop("reshard_after_forward")
        if self.zero_hpz_partition_size == 1:
            d.pop("zero_hpz_partition_size")
        if self.fsdp_version == 2:
            d.pop("fsdp_version")
        if self.fsdp_version == 2 or self.lora_rank is None:
            d.pop("fsdp_lora_wrap")
        if self.fsdp_state_dict_type is None:
            d.pop("fsdp_state_dict_type")
        if self.accelerate_version is None:
            d.pop("accelerate_version")
        if self.quant not in ("int4-gptq", "int4-awq"):
            d.pop("quant_group_size")
        if self.quant == "none" or self.mode != "train":
            d.pop("prepare_kbit")
        if self.mode == "infer":
            for k in ("optimizer", "lora_rank", "lora_targets", "freeze_layers", "checkpointing"):
                d.pop(k)
        elif self.lora_rank is None:
            d.pop("lora_targets")
        if not self.lora_modules_to_save or self.mode == "infer":
            d.pop("lora_modules_to_save", None)
        if not self.lora_dropout or self.lora_rank is None or self.mode == "infer":
            d.pop("lora_dropout", None)
        if self.transformers_version is None:
            d.pop("transformers_version", None)
        if self.peft_version is None:
            d.pop("peft_version", None)
        for key in ("lora_targets", "lora_modules_to_save"):
            if isinstance(d.get(key), tuple):
                d[key] = list(d[key])
        return d


#: The flat :class:`WorkloadSpec` fields of each part.
SHAPE_FIELDS: tuple[str, ...] = ("mode", "batch_size", "seq_len", "new_tokens", "task")
SHAPE_FIELDS += ("grad_accum", "num_beams", "cache_implementation", "prefill_chunk_size")
PARALLEL_FIELDS: tuple[str, ...] = ("gpus", "tp", "shard", "offload")
PARALLEL_FIELDS += tuple(PARALLEL_DEFAULTS)  # pp, pp_schedule, ..., etp
PARALLEL_FIELDS += ("dp_replicate", "reshard_after_forward", "zero_hpz_partition_size")  # par-a
PARALLEL_FIELDS += ("fsdp_version", "fsdp_lora_wrap")  # FSDP1 (issue 30)
PARALLEL_FIELDS += ("fsdp_state_dict_type",)  # FSDP1 checkpoints (issue 30, helper peft70b)
PARALLEL_FIELDS += ("accelerate_version",)  # the release saving them (helper fsdpsave)
TECHNIQUE_FIELDS = tuple(TechniqueSpec().flat())


#: Values ``dataclasses.asdict`` returns as they are (atomic: it copies them with deepcopy,
#: which returns the same object).
_ATOMIC = (str, int, float, bool, type(None))


def _as_dict(w: WorkloadSpec, skip: tuple[str, ...]) -> dict[str, Any]:
    """``dataclasses.asdict(w)`` but the fields ``skip``, without its recursion where every
    value kept is atomic or a tuple of atomic values (almost every job: an estimate's
    ``normalized()`` workload, ~1 000 a planner search, issue 32); by ``asdict`` otherwise."""
    out: dict[str, Any] = {}
    for name in _FIELD_NAMES:
        if name in skip:
            continue
        v = getattr(w, name)
        if isinstance(v, _ATOMIC) or (type(v) is tuple and all(isinstance(x, _ATOMIC) for x in v)):
            out[name] = v
        else:
            return {f: v for f, v in asdict(w).items() if f not in skip}
    return out


_FIELD_NAMES = tuple(f.name for f in fields(WorkloadSpec))
