"""The workload flags: one table of every flag that describes a job, as the commands spell it.

Each :class:`Flag` row says the option as users type it, where argparse stores it, its type,
choices, default and help, the field it sets (a :class:`~memfit.spec.WorkloadSpec` field, or a
``PlanRequest`` field for the planner's own spellings) and the commands that take it. From this
table come every argparse block of the workload flags (``memfit.cli.add_flags``), the flag
strings the planner and the doctor print (:func:`workload_flags`), the workload a parsed command
line describes (:func:`workload_kwargs`), and so the descriptions in ``docs/cli.md`` (rendered
from ``--help``). Data and pure functions only: :mod:`memfit.cli` parses argv.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from memfit.spec import (
    ATTENTIONS,
    CACHE_IMPLEMENTATIONS,
    CHECKPOINTING,
    KERNELS,
    LOSSES,
    MODES,
    OFFLOADS,
    OPTIMIZERS,
    PRECISION_NAMES,
    QUANTS,
    SHARDS,
    TASKS,
    WorkloadSpec,
    with_kernel_defaults,
)
from memfit.spec.diffusion import DIFFUSION_QUANTS, FORMATS
from memfit.spec.media import MediaSpec
from memfit.spec.parallel_rules import CP_ROTATES, FLOAT8_RECIPES, PP_SCHEDULES
from memfit.spec.rules import FSDP_STATE_DICT_TYPES

#: The exit codes of every command: 0 ok, 1 a valid "does not fit", 2 bad input.
EXIT_OK, EXIT_DOES_NOT_FIT, EXIT_BAD_INPUT = 0, 1, 2

#: ``int``: a whole number; ``ints``: a whole number, repeatable (a list); ``choice``: one of
#: ``choices``; ``switch``: present or not; ``text``: free text.
Kind = Literal["int", "ints", "choice", "switch", "text"]

#: Commands that describe one job with the estimate's flags (``memfit plan`` and ``upgrade``
#: search over techniques and take only the job's shape).
ESTIMATE_LIKE = ("estimate", "fit", "doctor")
EVERY = (*ESTIMATE_LIKE, "plan", "upgrade")
PLANNERS = ("plan", "upgrade")


def _targets(text: str) -> Any:
    """``--lora-targets q,v`` or ``q_proj,v_proj`` as a tuple of roles and module names (or
    ``all-linear``; roles are mapped to the model's names by ``pipeline.lora_by_role``)."""
    if not text or text == "all-linear":
        return "all-linear"
    return tuple(t.strip() for t in text.split(",") if t.strip())


def _modules(text: str) -> tuple[str, ...]:
    """``--lora-modules-to-save embed_tokens,lm_head`` as a tuple of module names."""
    return tuple(t.strip() for t in str(text).split(",") if t.strip())


def _probability(text: Any) -> Any:
    """``--lora-dropout 0.1`` as a float; other text is passed on for the spec to refuse with
    its rule (a probability in [0, 1))."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        return float(text)
    try:
        return float(str(text).strip())
    except ValueError:
        return text


def _reshard_after_forward(text: Any) -> Any:
    """``--reshard-after-forward true|false|N`` as FSDP2 takes it (a bool or an int); other
    text is passed on for the spec to refuse with its rule."""
    if isinstance(text, bool | int):
        return text
    low = str(text).strip().lower()
    if low in ("true", "false"):
        return low == "true"
    return int(low) if low.isdigit() else text


@dataclass(frozen=True, kw_only=True)
class Flag:
    """One flag. ``field``: what it sets on ``target``; ``always``: the flag strings name it
    even at its default; ``needs``: it is written only when that field is set (not None);
    ``group``: flags of one group exclude each other; ``parse``: text to the field's value."""

    name: str
    dest: str
    kind: Kind
    field: str
    commands: tuple[str, ...]
    default: Any = None
    choices: tuple[str, ...] | None = None
    help: str | None = None
    target: Literal["workload", "request", "pipeline", "media"] = "workload"
    always: bool = False
    needs: str | None = None
    group: str | None = None
    parse: Callable[[Any], Any] | None = None


FLAGS: tuple[Flag, ...] = (
    Flag(
        name="--mode",
        dest="mode",
        kind="choice",
        choices=MODES,
        default="train",
        field="mode",
        commands=EVERY,
        always=True,
    ),
    Flag(
        name="--batch",
        dest="batch",
        kind="int",
        default=1,
        help="micro-batch size (default 1)",
        field="batch_size",
        commands=ESTIMATE_LIKE,
        always=True,
    ),
    Flag(
        name="--seq",
        dest="seq",
        kind="int",
        default=512,
        help="sequence length (default 512)",
        field="seq_len",
        commands=EVERY,
        always=True,
    ),
    Flag(
        name="--batch",
        dest="batch",
        kind="int",
        help="train: micro-batch per GPU (fixed); infer: concurrent requests",
        field="batch_size",
        target="request",
        commands=PLANNERS,
        group="batch",
    ),
    Flag(
        name="--grad-accum",
        dest="grad_accum",
        kind="int",
        default=1,
        help="micro-batches per optimizer step (default 1); the estimate is of one micro-batch "
        "(gradients of earlier ones count when they are kept, not set to None)",
        field="grad_accum",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--global-batch",
        dest="global_batch",
        kind="int",
        help="train: samples per optimizer step, "
        "split into GPUs x micro-batch x gradient accumulation",
        field="global_batch",
        target="request",
        commands=PLANNERS,
        group="batch",
    ),
    Flag(
        name="--new-tokens",
        dest="new_tokens",
        kind="int",
        default=0,
        help="infer: tokens to generate after the prompt (default 0: prefill only)",
        field="new_tokens",
        commands=EVERY,
    ),
    Flag(
        name="--num-beams",
        dest="num_beams",
        kind="int",
        default=1,
        help="infer: generate(num_beams=K) beam search: the inputs and the KV cache are "
        "expanded to batch x K (default 1)",
        field="num_beams",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--cache-implementation",
        dest="cache_implementation",
        kind="choice",
        default="dynamic",
        choices=CACHE_IMPLEMENTATIONS,
        help="infer: generate()'s cache: dynamic (DynamicCache, default) or static (StaticCache "
        "preallocated for prompt + new tokens)",
        field="cache_implementation",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--prefill-chunk-size",
        dest="prefill_chunk_size",
        kind="int",
        help="infer: generate(prefill_chunk_size=N): the prompt runs through the model N tokens "
        "at a time into the cache (default: one pass)",
        field="prefill_chunk_size",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--precision",
        dest="precision",
        kind="choice",
        choices=PRECISION_NAMES,
        help="Lightning's names: bf16-mixed (default to train: fp32 master weights, bf16 "
        "autocast, as HF Trainer bf16=True), bf16-true (default to infer: bf16 weights; to "
        "train: pure bf16 states), 16-mixed, 16-true, 32-true; aliases bf16 (train: bf16-mixed, "
        "infer: bf16-true), fp16 / 16 (16-mixed / 16-true), fp32 / 32, amp-bf16, amp-fp16",
        field="precision",
        commands=ESTIMATE_LIKE,
        always=True,
    ),
    Flag(
        name="--attention",
        dest="attention",
        kind="choice",
        choices=ATTENTIONS,
        default="sdpa",
        field="attention",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--checkpointing",
        dest="checkpointing",
        kind="choice",
        choices=CHECKPOINTING,
        help="selective: every matmul and attention output saved; selective-op: torchtitan's "
        'per-op SAC (activation_checkpoint.mode "selective", selective_ac_option "op": every '
        "other matmul output and the attention outputs saved); full: each block recomputed; "
        "selective-layer: torchtitan's per-layer SAC, every N-th block recomputed "
        "(--selective-ac-option N)",
        field="checkpointing",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--loss",
        dest="loss",
        kind="choice",
        choices=LOSSES,
        help="the LM head's cross-entropy in training: full (the whole logits and their fp32 "
        "copy, transformers' default; with --kernels unsloth: fused), chunked (torchtune "
        "LinearCrossEntropyLoss / CEWithChunkedOutputLoss: LM head and loss a chunk of tokens "
        "at a time), fused "
        "(Liger's fused linear cross-entropy, Unsloth's fused CE, Cut Cross-Entropy: no logits "
        "kept)",
        field="loss",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--kernels",
        dest="kernels",
        kind="choice",
        choices=KERNELS,
        help="whose kernels run the layers in training: hf (transformers' modules and peft's "
        "LoRA layers, the default) or unsloth (Unsloth's FastLanguageModel: fast RMSNorm / "
        "RoPE, fused LoRA QKV / O / MLP; also --checkpointing offload and --loss fused unless "
        "given; plan keeps them in every plan)",
        field="kernels",
        commands=EVERY,
    ),
    Flag(
        name="--optimizer",
        dest="optimizer",
        kind="choice",
        choices=(*OPTIMIZERS, "prodigy"),
        help="train: default adamw (foreach, torch's CUDA default); prodigy: diffusion training "
        "only (the diffusers scripts' --optimizer prodigy)",
        field="optimizer",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--lora-rank",
        dest="lora_rank",
        kind="int",
        field="lora_rank",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--lora-targets",
        dest="lora_targets",
        kind="text",
        help="comma-separated roles (q,k,v,o,gate,up,down, attention, mlp), module names or "
        "all-linear (default all-linear)",
        field="lora_targets",
        commands=EVERY,
        needs="lora_rank",
        parse=_targets,
    ),
    Flag(
        name="--lora-modules-to-save",
        dest="lora_modules_to_save",
        kind="text",
        help="comma-separated modules trained in full beside the adapters (peft's "
        "modules_to_save, axolotl's lora_modules_to_save), e.g. embed_tokens,lm_head when new "
        "tokens are added: peft keeps the original and a trainable copy of each",
        field="lora_modules_to_save",
        commands=EVERY,
        needs="lora_rank",
        parse=_modules,
    ),
    Flag(
        name="--lora-dropout",
        dest="lora_dropout",
        kind="text",
        help="peft's lora_dropout (default 0): above 0 each adapter keeps a dropped copy of its "
        "input and the dropout mask for backward (TRL / axolotl / Answer.AI fsdp_qlora "
        "examples use 0.05-0.1)",
        field="lora_dropout",
        commands=EVERY,
        needs="lora_rank",
        parse=_probability,
    ),
    Flag(
        name="--transformers-version",
        dest="transformers_version",
        kind="text",
        help="the transformers release the job ran, for a published measurement made with an "
        "older one (default: the installed one's rules); before 4.46 a Llama / Mistral forward "
        "returns fp32 logits (memfit.spec.hf_versions)",
        field="transformers_version",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--peft-version",
        dest="peft_version",
        kind="text",
        help="the peft release the job ran (default: the installed one's rules); before 0.12 "
        "LoRA adapters stay in the base layer's dtype (bf16 on a bf16 base), not fp32 "
        "(memfit.spec.hf_versions)",
        field="peft_version",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--freeze",
        dest="freeze",
        kind="int",
        help="freeze the embeddings and the first N layers",
        field="freeze_layers",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--quant",
        dest="quant",
        kind="choice",
        choices=(*QUANTS, *DIFFUSION_QUANTS),
        default="none",
        help="weight format (train: QLoRA, needs --lora-rank; default none; diffusion "
        "pipelines: the denoiser's, also torchao-*/gguf-* formats; plan / upgrade: the job's "
        "own, kept as asked)",
        field="quant",
        commands=EVERY,
    ),
    Flag(
        name="--group-size",
        dest="group_size",
        kind="int",
        default=128,
        help="int4-gptq / int4-awq quantization group size (default 128)",
        field="quant_group_size",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--prepare-kbit",
        dest="prepare_kbit",
        kind="switch",
        default=False,
        help="QLoRA through peft's prepare_model_for_kbit_training, as TRL's SFTTrainer runs it: "
        "unquantized parameters (embeddings, norms, LM head) and activations in fp32",
        field="prepare_kbit",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--optimizer-in-bwd",
        dest="optimizer_in_bwd",
        kind="switch",
        default=False,
        help="the optimizer steps each parameter during backward, as its gradient is ready, "
        "and frees it (torchtune optimizer_in_bwd: True; torch's "
        "register_post_accumulate_grad_hook pattern): no full set of gradients; needs "
        "grad_accum 1",
        field="optimizer_in_bwd",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--gpus",
        dest="gpus",
        kind="int",
        default=1,
        help="GPUs in the job (default 1)",
        field="gpus",
        commands=EVERY,
    ),
    Flag(
        name="--shard",
        dest="shard",
        kind="choice",
        choices=SHARDS,
        help="how data-parallel ranks hold the model (default ddp when gpus / tp > 1)",
        field="shard",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--offload",
        dest="offload",
        kind="choice",
        choices=OFFLOADS,
        default="none",
        help="keep optimizer states (or also params) in host RAM; needs a ZeRO/FSDP --shard",
        field="offload",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--tp",
        dest="tp",
        kind="int",
        default=1,
        help="tensor-parallel degree (default 1)",
        field="tp",
        commands=ESTIMATE_LIKE,
    ),
    # -- FSDP2 / HSDP (par-a) --
    Flag(
        name="--dp-replicate",
        dest="dp_replicate",
        kind="int",
        default=1,
        help="HSDP: replicas of the FSDP2-sharded model (torchtitan's "
        "data_parallel_replicate_degree); the model is sharded over gpus / tp / dp-replicate "
        "(default 1; needs --shard fsdp)",
        field="dp_replicate",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--reshard-after-forward",
        dest="reshard_after_forward",
        kind="text",
        default=True,
        help="FSDP2's fully_shard(reshard_after_forward=): true (default) frees each block's "
        "gathered parameters after its forward, false keeps them to backward, N reshards to N "
        "ranks (needs --shard fsdp)",
        field="reshard_after_forward",
        commands=ESTIMATE_LIKE,
        parse=_reshard_after_forward,
    ),
    Flag(
        name="--zero-hpz-partition-size",
        dest="zero_hpz_partition_size",
        kind="int",
        default=1,
        help="ZeRO++ hpZ (DeepSpeed's zero_hpz_partition_size): ZeRO-3 also keeps each "
        "parameter's 16-bit partition over this many ranks, usually the GPUs per node "
        "(default 1: off; needs --shard zero3)",
        field="zero_hpz_partition_size",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--fsdp-version",
        dest="fsdp_version",
        kind="int",
        default=2,
        help="which PyTorch FSDP runs --shard fsdp: 2 (default; fully_shard, per-parameter "
        "shards, as torchtitan) or 1 (FullyShardedDataParallel: a flat parameter per wrapped "
        "block, accelerate's fsdp_version: 1, HF Trainer's fsdp, Lightning's FSDPStrategy; with "
        "--grad-accum > 1 each rank holds every trainable block's unsharded gradient)",
        field="fsdp_version",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--fsdp-lora-wrap",
        dest="fsdp_lora_wrap",
        kind="choice",
        choices=("peft", "block"),
        default="peft",
        help="FSDP1 units of a LoRA job's adapters: peft (default; peft's "
        "fsdp_auto_wrap_policy, each lora_A/lora_B its own unit, as HF Trainer / TRL wrap a "
        "PEFT model) or block (inside their decoder block's flat parameter with the frozen "
        "weights, use_orig_params=True, as LitGPT's FSDPStrategy(auto_wrap_policy={Block}): "
        "every block then gets a gradient; needs --fsdp-version 1)",
        field="fsdp_lora_wrap",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--fsdp-state-dict-type",
        dest="fsdp_state_dict_type",
        kind="choice",
        choices=FSDP_STATE_DICT_TYPES,
        default=None,
        help="the FSDP1 state-dict type the run writes its checkpoints with (accelerate's "
        "fsdp_state_dict_type; HF Trainer saves one per save_strategy): SHARDED_STATE_DICT "
        "clones every rank's chunk of every parameter while the state dict is built, kept on "
        "the GPU before accelerate 0.31 (--accelerate-version), moved to the CPU one by one "
        "since; FULL_STATE_DICT gathers unit by unit to the CPU; adds that phase (needs "
        "--fsdp-version 1; default: no checkpoint phase)",
        field="fsdp_state_dict_type",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--accelerate-version",
        dest="accelerate_version",
        kind="text",
        help="the accelerate release that saves the run's FSDP1 checkpoints (default: the "
        "installed one's rules); before 0.31 a SHARDED_STATE_DICT save keeps every copy on the "
        "GPU (memfit.spec.hf_versions)",
        field="accelerate_version",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--task",
        dest="task",
        kind="choice",
        choices=TASKS,
        default="auto",
        field="task",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--prepare-kbit",
        dest="prepare_kbit",
        kind="switch",
        default=False,
        help="QLoRA plans run peft's prepare_model_for_kbit_training (as TRL's SFTTrainer does): "
        "embeddings, norms and LM head in fp32",
        field="prepare_kbit",
        target="request",
        commands=PLANNERS,
    ),
    Flag(
        name="--optimizer-in-bwd",
        dest="optimizer_in_bwd",
        kind="switch",
        default=False,
        help="the job steps its optimizer in backward (torchtune optimizer_in_bwd: True), kept "
        "by the plan: plans on one GPU without gradient accumulation",
        field="optimizer_in_bwd",
        target="request",
        commands=PLANNERS,
    ),
    Flag(
        name="--loss",
        dest="loss",
        kind="choice",
        choices=LOSSES,
        help="the job's training cross-entropy (full, the default; with --kernels unsloth: "
        "fused; chunked: torchtune LinearCrossEntropyLoss, fused: Liger / Unsloth), kept by the "
        "plan; the fused one is also tried as a memory-only change (same loss, no logits kept)",
        field="loss",
        target="request",
        commands=PLANNERS,
    ),
    Flag(
        name="--lora-rank",
        dest="lora_rank",
        kind="ints",
        help="the job is LoRA at these ranks (repeat), kept by every plan; left out: the job is "
        "a full fine-tune and LoRA r16 / r64 are result-changing options (plan: --allow lora)",
        field="lora_ranks",
        target="request",
        commands=PLANNERS,
    ),
    Flag(
        name="--precision",
        dest="precision",
        kind="choice",
        choices=PRECISION_NAMES,
        help="the job's precision, kept by the plan (default: bf16-mixed to train, bf16-true to "
        "infer; 16-bit on GPUs without bf16); bf16-true for a bf16-mixed job needs --allow "
        "pure-bf16",
        field="precision",
        target="request",
        commands=PLANNERS,
    ),
    Flag(
        name="--optimizer",
        dest="optimizer",
        kind="choice",
        choices=(*OPTIMIZERS, "prodigy"),
        help="the job's optimizer, kept by the plan (default adamw; its fused kernel is "
        "memory-only, 8-bit states need --allow 8bit-optim; prodigy: diffusion training only)",
        field="optimizer",
        target="request",
        commands=PLANNERS,
    ),
    Flag(
        name="--attention",
        dest="attention",
        kind="choice",
        choices=ATTENTIONS,
        default="sdpa",
        help="the job's attention kernel (default sdpa)",
        field="attention",
        target="request",
        commands=PLANNERS,
    ),
    # image and speech models (estimate vit-base-patch16-224 --image-size 384): docs/vision.md
    Flag(
        name="--image-size",
        dest="image_size",
        kind="int",
        help="image models (ViT, DeiT, DINOv2, Swin, ConvNeXt, SigLIP, DETR): pixels per side "
        "(default: the config's image_size; DETR 800)",
        field="image_size",
        target="media",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--num-channels",
        dest="num_channels",
        kind="int",
        help="image models: channels per pixel (default: the config's num_channels, 3)",
        field="num_channels",
        target="media",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--audio-seconds",
        dest="audio_seconds",
        kind="text",
        help="Whisper: seconds of audio per sample (default 30: one window; train: at most 30; "
        "infer: longer audio is transcribed window by window, generate()'s long-form)",
        field="audio_seconds",
        target="media",
        commands=ESTIMATE_LIKE,
    ),
    # diffusion pipelines (memfit estimate flux.1-dev --mode infer ...): docs/diffusion.md
    Flag(
        name="--height",
        dest="height",
        kind="int",
        help="diffusion pipelines: image height in pixels (default 1024)",
        field="height",
        target="pipeline",
        commands=("estimate",),
    ),
    Flag(
        name="--width",
        dest="width",
        kind="int",
        help="diffusion pipelines: image width in pixels (default 1024)",
        field="width",
        target="pipeline",
        commands=("estimate",),
    ),
    Flag(
        name="--num-frames",
        dest="num_frames",
        kind="int",
        help="video diffusion pipelines (WanPipeline): num_frames (default 81; a count with "
        "n - 1 not divisible by 4 is rounded down, as the pipeline does)",
        field="num_frames",
        target="pipeline",
        commands=("estimate",),
    ),
    Flag(
        name="--steps",
        dest="steps",
        kind="int",
        help="diffusion pipelines: num_inference_steps (default 28; does not change the peak)",
        field="steps",
        target="pipeline",
        commands=("estimate",),
    ),
    Flag(
        name="--pipeline-offload",
        dest="pipeline_offload",
        kind="choice",
        choices=("none", "model", "sequential", "group"),
        help="diffusion pipelines: diffusers' enable_model_cpu_offload (model), "
        "enable_sequential_cpu_offload (sequential) or enable_group_offload (group); default none",
        field="offload",
        target="pipeline",
        commands=("estimate",),
    ),
    Flag(
        name="--vae-slicing",
        dest="vae_slicing",
        kind="switch",
        default=False,
        help="diffusion pipelines: vae.enable_slicing() (decode one image at a time)",
        field="vae_slicing",
        target="pipeline",
        commands=("estimate",),
    ),
    Flag(
        name="--vae-tiling",
        dest="vae_tiling",
        kind="switch",
        default=False,
        help="diffusion pipelines: vae.enable_tiling() (decode in tiles of the VAE config's size)",
        field="vae_tiling",
        target="pipeline",
        commands=("estimate",),
    ),
    Flag(
        name="--offload-type",
        dest="offload_type",
        kind="choice",
        choices=("block_level", "leaf_level"),
        help="diffusion pipelines, --pipeline-offload group: diffusers' offload_type (default "
        "block_level)",
        field="offload_type",
        target="pipeline",
        commands=("estimate",),
    ),
    Flag(
        name="--num-blocks-per-group",
        dest="num_blocks_per_group",
        kind="int",
        help="diffusion pipelines, group offload block_level: blocks per group (default 1)",
        field="num_blocks_per_group",
        target="pipeline",
        commands=("estimate",),
    ),
    Flag(
        name="--use-stream",
        dest="use_stream",
        kind="switch",
        default=False,
        help="diffusion pipelines, group offload: use_stream=True (prefetches the next group)",
        field="use_stream",
        target="pipeline",
        commands=("estimate",),
    ),
    Flag(
        name="--vae-precision",
        dest="vae_precision",
        kind="choice",
        choices=("bf16", "fp16", "fp32"),
        help="diffusion pipelines: the VAE loaded in its own dtype (AutoencoderKL*.from_pretrained("
        "torch_dtype=...) passed as vae=, as the Wan 2.2 model card does with fp32); default "
        "--precision",
        field="vae_precision",
        target="pipeline",
        commands=("estimate",),
    ),
    Flag(
        name="--layerwise-casting",
        dest="layerwise_casting",
        kind="choice",
        choices=("fp8",),
        help="diffusion pipelines: denoiser.enable_layerwise_casting(storage_dtype="
        "float8_e4m3fn, compute_dtype=--precision)",
        field="layerwise_casting",
        target="pipeline",
        commands=("estimate",),
    ),
    Flag(
        name="--text-encoder-quant",
        dest="text_encoder_quant",
        kind="choice",
        choices=("none", *(q for q in FORMATS if not q.startswith("gguf"))),
        help="diffusion pipelines: the largest text encoder's weight format (FLUX/SD3: the T5)",
        field="text_encoder_quant",
        target="pipeline",
        commands=("estimate",),
    ),
    Flag(
        name="--attention-slicing",
        dest="attention_slicing",
        kind="switch",
        default=False,
        help="diffusion pipelines: pipe.enable_attention_slicing() (slice_size auto)",
        field="attention_slicing",
        target="pipeline",
        commands=("estimate",),
    ),
    Flag(
        name="--no-text-encoder-3",
        dest="drop_text_encoder_3",
        kind="switch",
        default=False,
        help="SD3 pipelines: from_pretrained(..., text_encoder_3=None), no T5 (zeros in its place)",
        field="drop_text_encoder_3",
        target="pipeline",
        commands=("estimate",),
    ),
    # diffusion training (memfit estimate flux.1-dev --mode train ...): docs/diffusion.md
    Flag(
        name="--resolution",
        dest="resolution",
        kind="int",
        help="diffusion training: the scripts' --resolution, square images in pixels "
        "(default 1024)",
        field="resolution",
        target="pipeline",
        commands=(*ESTIMATE_LIKE, "plan"),
    ),
    Flag(
        name="--train-text-encoder",
        dest="train_text_encoder",
        kind="switch",
        default=False,
        help="diffusion training: the scripts' --train_text_encoder (LoRA on the CLIP encoders)",
        field="train_text_encoder",
        target="pipeline",
        commands=(*ESTIMATE_LIKE, "plan"),
    ),
    Flag(
        name="--cache-latents",
        dest="cache_latents",
        kind="switch",
        default=False,
        help="diffusion training: the FLUX LoRA script's --cache_latents (VAE run once, freed)",
        field="cache_latents",
        target="pipeline",
        commands=(*ESTIMATE_LIKE, "plan"),
    ),
    Flag(
        name="--max-sequence-length",
        dest="max_sequence_length",
        kind="int",
        help="diffusion training, FLUX: the scripts' --max_sequence_length of T5 (default 512)",
        field="max_sequence_length",
        target="pipeline",
        commands=(*ESTIMATE_LIKE, "plan"),
    ),
    # pipeline, context and expert parallelism (torchtitan's [parallelism] keys; the parallel
    # closed form, memfit.estimate.parallel, answers a job that uses them)
    Flag(
        name="--pp",
        dest="pp",
        kind="int",
        help="pipeline-parallel degree (torchtitan pipeline_parallel_degree; default 1); "
        "--grad-accum is the pipeline's micro-batch count",
        field="pp",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--pp-schedule",
        dest="pp_schedule",
        kind="text",
        help=f"pipeline schedule: {', '.join(PP_SCHEDULES)} (or torchtitan's names: GPipe, 1F1B, "
        "Interleaved1F1B, ZBVZeroBubble, DualPipeV; default 1f1b)",
        field="pp_schedule",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--pp-virtual-stages",
        dest="pp_virtual_stages",
        kind="int",
        help="model chunks per pipeline rank for interleaved-1f1b (Megatron's "
        "--virtual-pipeline-model-parallel-size)",
        field="pp_virtual_stages",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--cp",
        dest="cp",
        kind="int",
        help="context-parallel degree: ring attention over the sequence (torchtitan "
        "context_parallel_degree; default 1)",
        field="cp",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--cp-rotate",
        dest="cp_rotate",
        kind="choice",
        choices=CP_ROTATES,
        help="how ring attention moves K/V (torchtitan context_parallel_rotate_method; "
        "default allgather)",
        field="cp_rotate",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--ep",
        dest="ep",
        kind="int",
        help="expert-parallel degree for a MoE model (torchtitan expert_parallel_degree; "
        "default 1)",
        field="ep",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--etp",
        dest="etp",
        kind="int",
        help="expert tensor-parallel degree, 1 or --tp (torchtitan "
        "expert_tensor_parallel_degree; default 1)",
        field="etp",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--sp",
        dest="sequence_parallel",
        kind="switch",
        default=False,
        help="sequence parallelism with --tp (Megatron --sequence-parallel, off by default "
        "there; torchtitan always runs TP with it): norms and the residual stream split over "
        "the tp ranks; answered by the per-rank closed form",
        field="sequence_parallel",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--async-tp",
        dest="async_tp",
        kind="switch",
        default=False,
        help="async tensor parallelism with --tp --sp --compile (torchtitan "
        "--parallelism.enable_async_tensor_parallel: torch's micro-pipelined TP fuses the "
        "sequence-parallel all-gathers / reduce-scatters with their matmuls over a "
        "SymmetricMemory workspace, outside the caching allocator: counted in the device "
        "figure); answered by the per-rank closed form",
        field="async_tp",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--float8",
        dest="float8",
        kind="choice",
        choices=FLOAT8_RECIPES,
        help="torchao Float8 training of the blocks' linears as torchtitan applies it "
        "(float8.recipe_name: tensorwise, its default, or rowwise); GPUs with fp8 only; "
        "answered by the per-rank closed form",
        field="float8",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--float8-all-gather",
        dest="float8_all_gather",
        kind="switch",
        default=False,
        help="FSDP2 all-gathers the Float8 linears' weights in fp8 (torchtitan "
        "float8.enable_fsdp_float8_all_gather; --float8 tensorwise --shard fsdp)",
        field="float8_all_gather",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--compile",
        dest="compile",
        kind="switch",
        default=False,
        help="the transformer blocks run under torch.compile (torchtitan compile.enable, "
        "torchtune compile: True, HF torch_compile=True): AOTAutograd's min-cut partitioner "
        "saves less for backward than eager autograd (measured per block kind; "
        "benchmarks/results/compile_saved.md); training, analytic engine and per-rank closed "
        "form only",
        field="compile",
        commands=ESTIMATE_LIKE,
    ),
    Flag(
        name="--selective-ac-option",
        dest="selective_ac_option",
        kind="int",
        help="with --checkpointing selective-layer: checkpoint every N-th block, the others "
        "not at all (torchtitan activation_checkpoint.mode selective, selective_ac_option N; "
        "default 2; 0: every block)",
        field="selective_ac_option",
        commands=ESTIMATE_LIKE,
    ),
)


def flags_for(command: str, *names: str) -> list[Flag]:
    """The rows ``command`` takes: all of them in table order, or those named, in that order."""
    rows = [f for f in FLAGS if command in f.commands]
    if not names:
        return rows
    by_name = {f.name: f for f in rows}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise KeyError(f"memfit {command} takes no workload flag {', '.join(unknown)}")
    return [by_name[n] for n in names]


def workload_kwargs(values: Mapping[str, Any], command: str = "estimate") -> dict[str, Any]:
    """The :class:`WorkloadSpec` keywords of a parsed command line (``vars(args)``): a flag
    left at None leaves the field to the WorkloadSpec's default."""
    kwargs: dict[str, Any] = {}
    for f in flags_for(command):
        value = values.get(f.dest)
        if f.target != "workload" or value is None:
            continue
        kwargs[f.field] = f.parse(value) if f.parse else value
    if values.get("lora_targets") and values.get("lora_rank") is None:
        kwargs["lora_rank"] = 0  # reported as "lora_rank must be positive" with the other problems
    return with_kernel_defaults(kwargs)


#: The fields other defaults depend on (the optimizer on the mode, the sharding on the layout).
DEFAULTS_DEPEND_ON = ("mode", "gpus", "tp")


def workload_flags(w: WorkloadSpec, *, explicit: tuple[str, ...] = ()) -> str:
    """``w`` as ``memfit estimate`` flags: the shape and the precision always, every other flag
    only where ``w`` differs from what the parser would default to (given its mode and
    layout), and the fields in ``explicit`` even at their default."""
    plain = WorkloadSpec()
    implied = WorkloadSpec(**{k: getattr(w, k) for k in DEFAULTS_DEPEND_ON})
    out: list[str] = []
    for f in flags_for("estimate"):
        if f.target == "pipeline":  # diffusion: not WorkloadSpec
            continue
        if f.target == "media":  # the job's images / audio (WorkloadSpec.media), when set
            value = getattr(w.media, f.field)
            out += (
                []
                if value is None
                else [f"{f.name} {value:g}" if f.field == "audio_seconds" else f"{f.name} {value}"]
            )
            continue
        value = getattr(w, f.field)
        if value is None or (f.needs is not None and getattr(w, f.needs) is None):
            continue
        default = getattr(plain if f.field in DEFAULTS_DEPEND_ON else implied, f.field)
        if not (f.always or f.field in explicit or value != default):
            continue
        if f.kind == "switch":
            out += [f.name] if value else []
        elif isinstance(value, tuple):
            out += [f"{f.name} {','.join(value)}"] if value else []
        else:
            out.append(f"{f.name} {value}")
    return " ".join(out)


def _number(text: Any) -> Any:
    """``text`` as a float, or unchanged for the spec to reject with its rule."""
    try:
        return float(text)
    except ValueError:
        return text


def media_kwargs(values: Mapping[str, Any]) -> dict[str, Any]:
    """The :class:`~memfit.spec.media.MediaSpec` keywords of a parsed command line (the
    ``media`` rows; ``--audio-seconds`` as a number, else kept for the spec to reject)."""
    out: dict[str, Any] = {}
    for f in FLAGS:
        value = values.get(f.dest)
        if f.target == "media" and value is not None and f.field not in out:
            out[f.field] = _number(value) if f.field == "audio_seconds" else value
    return out


#: The longest whole number a flag takes, in digits: past int64 (19 digits), so a value like
#: ``--lora-rank 10**30`` still reaches its field's range rule and its message, and far below the
#: 4,300 digits where Python's ``int()`` itself refuses. Longer text is refused before ``int()``
#: reads it, its value quoted cut (:func:`quoted`).
MAX_INT_DIGITS = 40
#: The most characters of a refused value quoted in a message.
QUOTE_CHARS = 40


def quoted(text: str) -> str:
    """``text`` as a message quotes a value: ``repr``, cut to :data:`QUOTE_CHARS` characters."""
    if len(text) <= QUOTE_CHARS:
        return repr(text)
    return f"{text[:QUOTE_CHARS]!r}… ({len(text):,} characters)"


def integer(text: str) -> int:
    """An argparse type: a whole number of at most :data:`MAX_INT_DIGITS` digits (the specs
    check its range)."""
    digits = text.strip().lstrip("+-").replace("_", "")
    if len(digits) > MAX_INT_DIGITS:
        raise argparse.ArgumentTypeError(
            f"expected a whole number of at most {MAX_INT_DIGITS} digits, got {quoted(text)}"
        )
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {quoted(text)}") from None
    return value


def positive_int(text: str) -> int:
    """An argparse type: a whole number of 1 or more."""
    value = integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected 1 or more, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """An argparse type: a whole number of 0 or more."""
    value = integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {value}")
    return value


def count_at_most(upper: int, what: str) -> Callable[[str], int]:
    """An argparse type: a whole number from 1 to ``upper`` (``what`` names the limit in the
    message, e.g. "GPUs" for :data:`memfit.spec.rules.MAX_GPUS`)."""

    def parse(text: str) -> int:
        value = positive_int(text)
        if value > upper:
            raise argparse.ArgumentTypeError(f"expected at most {upper:,} {what}, got {value:,}")
        return value

    parse.__name__ = "count_at_most"  # the fuzz suite picks values by the type's name
    return parse


def finite_float(text: str) -> float:
    """An argparse type: a finite number (``inf``, ``nan`` and values past 1e300 refused: they
    reach arithmetic that turns them into an OverflowError or a silent NaN)."""
    if len(text) > 64:
        raise argparse.ArgumentTypeError(f"expected a number, got {quoted(text)}")
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {quoted(text)}") from None
    if not math.isfinite(value) or abs(value) > MAX_FLOAT:
        raise argparse.ArgumentTypeError(f"expected a finite number, got {quoted(text)}")
    return value


#: The largest magnitude :func:`finite_float` takes (far beyond any fraction, GiB or rate).
MAX_FLOAT = 1e300
#: TCP ports: 1 to 65535 (0 would ask the OS for any free port, which the page could not name).
MAX_PORT = 65535


def port(text: str) -> int:
    """An argparse type: a TCP port, 1 to :data:`MAX_PORT`."""
    value = positive_int(text)
    if value > MAX_PORT:
        raise argparse.ArgumentTypeError(f"expected a port from 1 to {MAX_PORT}, got {value}")
    return value


def add_flags(parser: argparse.ArgumentParser, command: str, *names: str) -> None:
    """Add the workload flags ``command`` takes (all, or those named) from the one table,
    :data:`memfit.flags.FLAGS`."""
    groups: dict[str, Any] = {}
    for f in flags_for(command, *names):
        where: Any = parser
        if f.group is not None:
            if f.group not in groups:
                groups[f.group] = parser.add_mutually_exclusive_group()
            where = groups[f.group]
        kwargs: dict[str, Any] = {"dest": f.dest, "default": f.default, "help": f.help}
        if f.kind == "switch":
            kwargs["action"] = "store_true"
        elif f.kind == "ints":
            kwargs.update(type=integer, action="append")
        elif f.kind == "int":
            kwargs["type"] = integer
        elif f.kind == "choice":
            kwargs["choices"] = f.choices
        where.add_argument(f.name, **kwargs)


def workload_from_args(args: argparse.Namespace) -> Any:
    """The ``WorkloadSpec`` of the workload flags (estimate, fit and doctor share them), with
    the media flags as its ``media``."""
    values = vars(args)
    return WorkloadSpec(**workload_kwargs(values), media=MediaSpec(**media_kwargs(values)))
