"""The fast path against the full trace on many model families (issue 11, a benchmark).

For each family — tiny configs built with transformers' own config classes
(``benchmarks/tiny_models.py``) and a few bundled real configs — and each job (training: plain,
LoRA, full checkpointing; inference), the grid estimates the same job with the derived engine
(``--engine derived``: forms solved from traces at batch 1-3 or 2-4, then replayed), the analytic
engine where the model type has a hand-written program, and the full trace (``--engine trace``)
at a batch size the derived form was **not** traced at (``--batch``, default 5), and writes peak
allocated and peak reserved bytes with each fast engine's error against the trace. A job an
engine refuses (NotModelledError) is a row saying so, with the reason; a job the trace itself
cannot run is a row with its error. Nothing is left out. Writes
``benchmarks/results/fastpath_grid.md`` and ``.jsonl`` (quoted in docs/accuracy.md).

    PYTHONPATH=src .venv/bin/python benchmarks/fastpath_grid.py            # default size
    PYTHONPATH=src .venv/bin/python benchmarks/fastpath_grid.py --jobs 4 --no-real
    PYTHONPATH=src .venv/bin/python benchmarks/fastpath_grid.py --types llama,qwen3 --out /tmp/g

Forms are built into a fresh cache directory (``--cache-dir`` to reuse one), so every row is
derived by the code under test. Precision is pure bf16 (``bf16-true``) for every job but
``mixed`` (``bf16-mixed``, the full fine-tune's default): the MoE families' grouped matmul takes
bf16 only (docs/accuracy.md §14).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))

from benchmarks.tiny_models import TYPES, generates, write_tiny  # noqa: E402

#: The GPUs of the grid's sharded jobs (``mixed_zero3``, ``mixed_fsdp``, ...): the fast path
#: validates them at this count only (``memfit.estimate.fastpath.JOB_LAYOUT``).
SHARD_GPUS = 8
#: Jobs per family: name -> WorkloadSpec fields (batch and seq set by the command line).
JOBS: dict[str, dict[str, Any]] = {
    "train": {"mode": "train"},
    "lora": {"mode": "train", "lora_rank": 8},
    "ckpt": {"mode": "train", "checkpointing": "full"},
    "infer": {"mode": "infer"},
    # issue 32: the full fine-tune's default precision, and LoRA with checkpointing
    "mixed": {"mode": "train", "precision": "bf16-mixed"},
    "lora_ckpt": {"mode": "train", "lora_rank": 8, "checkpointing": "full"},
    # issue 32 (whisperan): the full fine-tune's default precision with full checkpointing (the
    # README's ``memfit estimate whisper-small --batch 16 --seq 448 --checkpointing full``)
    "mixed_ckpt": {"mode": "train", "precision": "bf16-mixed", "checkpointing": "full"},
    # issue 32: a plan's micro-batches under gradient accumulation hold the earlier ones'
    # gradients (``zero_grad_set_to_none=False``, memfit.plan.space): the LoRA plans' jobs
    "lora_held": {"mode": "train", "lora_rank": 8, "zero_grad_set_to_none": False},
    "lora_ckpt_held": {
        "mode": "train",
        "lora_rank": 8,
        "checkpointing": "full",
        "zero_grad_set_to_none": False,
    },
    # issue 32: the LoRA plan with selective checkpointing (the recomputed attention)
    "lora_selckpt_held": {
        "mode": "train",
        "lora_rank": 8,
        "checkpointing": "selective",
        "zero_grad_set_to_none": False,
    },
    # issue 32: the full fine-tune's plan on one GPU (bf16-mixed, DeepSpeed ZeRO-2 with the
    # optimizer offloaded to host RAM, gradients held under accumulation)
    "mixed_offload_held": {
        "mode": "train",
        "precision": "bf16-mixed",
        "shard": "zero2",
        "offload": "optimizer",
        "zero_grad_set_to_none": False,
    },
    # issue 32: inference at serving size (SCALED: 4x the batch and the sequence, 16 new
    # tokens): the KV cache and the attention's temporaries large enough to fragment the
    # allocator's segments, which the short ``infer`` job does not show
    "infer_long": {"mode": "infer"},
    # peft's LoRA dropout (TRL's and LitGPT's default 0.05, axolotl's examples): the LoRA jobs
    # with lora_dropout 0.1 (the probability changes no byte; above 0 each adapter keeps a
    # dropped copy of its input and a bool mask)
    **{
        f"{job}_dropout": {**fields, "lora_dropout": 0.1}
        for job, fields in (
            ("lora", {"mode": "train", "lora_rank": 8}),
            ("lora_ckpt", {"mode": "train", "lora_rank": 8, "checkpointing": "full"}),
            ("lora_held", {"mode": "train", "lora_rank": 8, "zero_grad_set_to_none": False}),
            (
                "lora_ckpt_held",
                {
                    "mode": "train",
                    "lora_rank": 8,
                    "checkpointing": "full",
                    "zero_grad_set_to_none": False,
                },
            ),
            (
                "lora_selckpt_held",
                {
                    "mode": "train",
                    "lora_rank": 8,
                    "checkpointing": "selective",
                    "zero_grad_set_to_none": False,
                },
            ),
        )
    },
    # QLoRA (issue 32): the LoRA jobs on a base stored by bitsandbytes in 4-bit NF4 (``--quant
    # nf4``; ``nf4-dq``: with double quantization), compute in bf16, peft's adapters; no
    # prepare_model_for_kbit_training (memfit's default QLoRA: bf16-true, prepare_kbit False)
    "qlora": {"mode": "train", "lora_rank": 8, "quant": "nf4"},
    "qlora_ckpt": {"mode": "train", "lora_rank": 8, "quant": "nf4", "checkpointing": "full"},
    "qlora_dq_ckpt": {
        "mode": "train",
        "lora_rank": 8,
        "quant": "nf4-dq",
        "checkpointing": "full",
    },
    # the QLoRA plans' jobs under gradient accumulation (gradients held, as ``lora_held``)
    **{
        f"{job}_held": {**fields, "zero_grad_set_to_none": False}
        for job, fields in (
            ("qlora", {"mode": "train", "lora_rank": 8, "quant": "nf4"}),
            (
                "qlora_ckpt",
                {"mode": "train", "lora_rank": 8, "quant": "nf4", "checkpointing": "full"},
            ),
            (
                "qlora_dq_ckpt",
                {"mode": "train", "lora_rank": 8, "quant": "nf4-dq", "checkpointing": "full"},
            ),
        )
    },
}
#: LoRA on part of the linear layers (issue 32: ``--lora-targets q,v`` is peft's default for
#: Llama-style models, attention-only and MLP-only are LitGPT's ``lora_query/...`` switches and
#: axolotl's ``lora_target_modules``): each LoRA job with the targets by role, suffix -> targets.
#: The fast path's ``*_part`` job (any targets named by role) is judged on all three
#: (:data:`JUDGED_AS`).
PART_TARGETS: dict[str, tuple[str, ...]] = {
    "part": ("q", "v"),
    "part_attn": ("attention",),
    "part_mlp": ("mlp",),
}
#: The LoRA jobs the part-target and 8-bit AdamW variants are run for (their fields).
LORA_BASE: dict[str, dict[str, Any]] = {
    job: JOBS[job]
    for job in ("lora", "lora_ckpt", "lora_held", "lora_ckpt_held", "lora_selckpt_held")
}
JOBS.update(
    {
        f"{job}_{suffix}": {**fields, "lora_targets": targets}
        for job, fields in LORA_BASE.items()
        for suffix, targets in PART_TARGETS.items()
    }
)
#: bitsandbytes' 8-bit AdamW (issue 32: Unsloth's default ``optim="adamw_8bit"``, axolotl's
#: ``optimizer: adamw_bnb_8bit``; the trace's stand-in is ``estimate/trace/optimizers.py``):
#: the full fine-tunes, the LoRA jobs and the QLoRA jobs with ``optimizer="adamw-8bit"``. A
#: tensor under 4096 elements keeps 32-bit states (``min_8bit_size``), so the tiny configs
#: (width 32) barely reach the 8-bit path: these jobs are judged only with a row of a bundled
#: config at its real width (:data:`NEEDS_REAL_WIDTH`).
OPTIM_8BIT_BASE = (
    "train", "ckpt", "mixed", "lora", "lora_ckpt", "lora_held", "lora_ckpt_held",
    "lora_selckpt_held", "qlora", "qlora_ckpt", "qlora_held", "qlora_ckpt_held",
)  # fmt: skip
JOBS.update({f"{job}_8bit": {**JOBS[job], "optimizer": "adamw-8bit"} for job in OPTIM_8BIT_BASE})
#: Grid jobs a model type passes only with at least one row of a bundled config (real widths).
NEEDS_REAL_WIDTH = frozenset(f"{job}_8bit" for job in OPTIM_8BIT_BASE)
#: An image model at another image size than its config's (issue 32: ``--image-size 384`` on a
#: 224-pixel ViT; ``memfit.models.media`` writes the size into the config, so the patch grid
#: and the position table follow it): these jobs at ``image_size`` = the config's x
#: IMAGE_SCALE, down to a multiple of the patch (224 -> 384; the tiny configs' 32 -> 48).
IMG_BASE = ("train", "mixed", "ckpt", "infer", "lora", "lora_ckpt", "lora_held", "lora_ckpt_held")
IMAGE_SCALE = (12, 7)
JOBS.update({f"{job}_img": JOBS[job] for job in IMG_BASE})
#: Eager attention (issue 32: ``--attention eager``, ``attn_implementation="eager"``: the
#: attention matrix materialised, softmax in fp32; what transformers recommends for Gemma 2
#: training, and older setups' default): these jobs with ``attention="eager"``; the fast path's
#: ``infer_eager`` is judged with its serving-size rows too (:data:`JUDGED_AS`), as is
#: ``infer_flash``.
EAGER_BASE = (
    "train", "mixed", "ckpt", "lora", "lora_ckpt", "lora_held", "lora_ckpt_held", "infer",
    "infer_long",
)  # fmt: skip
JOBS.update({f"{job}_eager": {**JOBS[job], "attention": "eager"} for job in EAGER_BASE})
#: FlashAttention-2 (``--attention flash``, ``attn_implementation="flash_attention_2"``:
#: axolotl's ``flash_attention: true``, Unsloth): the same jobs with ``attention="flash"``.
JOBS.update({f"{job}_flash": {**JOBS[job], "attention": "flash"} for job in EAGER_BASE})
#: fp16 (issue 32, fp16grid): on a GPU without bf16 (T4, V100: Colab, Kaggle) memfit's defaults
#: are the fp16 counterparts (``memfit.spec.rules.FP16_COUNTERPART``: a full fine-tune
#: ``16-mixed``, with torch.amp.GradScaler; LoRA / QLoRA ``16-true``): these jobs with the
#: job's precision (``bf16-true`` unless it names one) replaced by its counterpart.
FP16_BASE = (
    "mixed", "lora", "lora_ckpt", "lora_held", "lora_ckpt_held", "lora_selckpt_held", "qlora",
    "qlora_ckpt", "qlora_dq_ckpt", "qlora_held", "qlora_ckpt_held", "qlora_dq_ckpt_held",
)  # fmt: skip
_FP16 = {"bf16-mixed": "16-mixed", "bf16-true": "16-true"}  # spec.rules.FP16_COUNTERPART
JOBS.update(
    {
        f"{job}_fp16": {**JOBS[job], "precision": _FP16[JOBS[job].get("precision", "bf16-true")]}
        for job in FP16_BASE
    }
)
#: fp16 inference and the fp16 variants (issue 32, fp16infer): on a T4 / V100 an inference job
#: runs in ``16-true`` (``spec.rules.FP16_COUNTERPART`` of ``bf16-true``): ``infer_fp16`` and
#: its serving-size ``infer_long_fp16`` (SCALED, judged together: JUDGED_AS). The variants the
#: bf16 jobs have on the fast path, on the fp16 jobs: LoRA dropout, LoRA targets by role
#: (PART_TARGETS), 8-bit AdamW (at real width: NEEDS_REAL_WIDTH), another image size, eager /
#: flash attention; each named ``<fp16 job>_<variant>`` (``lora_fp16_dropout``, ...), as
#: ``memfit.estimate.fastpath.grid_job`` chains them.
JOBS["infer_fp16"] = {"mode": "infer", "precision": "16-true"}
JOBS["infer_long_fp16"] = {"mode": "infer", "precision": "16-true"}
FP16_LORA = ("lora_fp16", "lora_ckpt_fp16", "lora_held_fp16", "lora_ckpt_held_fp16",
             "lora_selckpt_held_fp16")  # fmt: skip
JOBS.update({f"{job}_dropout": {**JOBS[job], "lora_dropout": 0.1} for job in FP16_LORA})
JOBS.update(
    {
        f"{job}_{suffix}": {**JOBS[job], "lora_targets": targets}
        for job in FP16_LORA
        for suffix, targets in PART_TARGETS.items()
    }
)
FP16_8BIT_BASE = ("mixed_fp16", *FP16_LORA, "qlora_fp16", "qlora_ckpt_fp16", "qlora_held_fp16",
                  "qlora_ckpt_held_fp16")  # fmt: skip
JOBS.update({f"{job}_8bit": {**JOBS[job], "optimizer": "adamw-8bit"} for job in FP16_8BIT_BASE})
NEEDS_REAL_WIDTH |= frozenset(f"{job}_8bit" for job in FP16_8BIT_BASE)
FP16_IMG_BASE = ("mixed_fp16", "infer_fp16", "lora_fp16", "lora_ckpt_fp16", "lora_held_fp16",
                 "lora_ckpt_held_fp16")  # fmt: skip
JOBS.update({f"{job}_img": JOBS[job] for job in FP16_IMG_BASE})
FP16_ATTENTION_BASE = ("mixed_fp16", "lora_fp16", "lora_ckpt_fp16", "lora_held_fp16",
                       "lora_ckpt_held_fp16", "infer_fp16", "infer_long_fp16")  # fmt: skip
JOBS.update(
    {
        f"{job}_{attention}": {**JOBS[job], "attention": attention}
        for attention in ("eager", "flash")
        for job in FP16_ATTENTION_BASE
    }
)
#: fp16's reserved bytes part from bf16's at real width (bloom-560m / qwen2.5-0.5b
#: ``mixed_fp16``: docs/accuracy.md, "Fast path: the fp16 jobs of GPUs without bf16"), so every
#: fp16infer job is judged only with a row of a bundled config at its real width too.
NEEDS_REAL_WIDTH |= frozenset(
    job for job in JOBS if "fp16" in job and job not in {f"{b}_fp16" for b in FP16_BASE}
)
#: Issue 32 (shardgrid): the sharded jobs people run, over SHARD_GPUS GPUs (rank 0's bytes):
#: the full fine-tune in bf16-mixed under DeepSpeed ZeRO-3 / ZeRO-2 / ZeRO-1 and FSDP2
#: (torchtitan's bf16/fp32 policy), the same with full checkpointing, and LoRA at memfit's
#: default precision for each (ZeRO: bf16-mixed, DeepSpeed's bf16 optimizer; FSDP2: bf16-true).
#: Last in JOBS: the fast path's tables add them after the others (fastpath.SHARD_VALIDATED).
JOBS.update(
    {
        f"{base}_{shard}": {**fields, "gpus": SHARD_GPUS, "shard": shard}
        for base, fields, shards in (
            ("mixed", {"mode": "train", "precision": "bf16-mixed"},
             ("zero3", "zero2", "zero1", "fsdp")),
            ("mixed_ckpt", {"mode": "train", "precision": "bf16-mixed", "checkpointing": "full"},
             ("zero3", "fsdp")),
            ("lora", {"mode": "train", "precision": "bf16-mixed", "lora_rank": 8}, ("zero3",)),
        )
        for shard in shards
    }
)  # fmt: skip
JOBS["lora_fsdp"] = {
    "mode": "train",
    "precision": "bf16-true",
    "lora_rank": 8,
    "gpus": SHARD_GPUS,
    "shard": "fsdp",
}
#: The sharded jobs over SHARD_GPUS GPUs need a real-width row too: on the tiny configs a ZeRO
#: rank's peak is DeepSpeed's 5e8-element reduce bucket (973 MiB of a 973 MiB peak) and an
#: FSDP2 rank's under 25 MiB, so they show nothing of the gathers or the root group.
NEEDS_REAL_WIDTH |= frozenset(j for j, f in JOBS.items() if f.get("gpus") == SHARD_GPUS)
#: Issue 32 (helper "fsdpcounts"): the FSDP2 jobs at the other GPU counts people launch
#: (``memfit.estimate.fastpath.FSDP_GPU_COUNTS``): ``<job>_g<N>`` is ``<job>`` over N GPUs. What
#: depends on the count (each parameter's dim-0 shard padded to ``ceil(dim0 / N)`` rows, the root
#: group's all-gather and reduce-scatter buffers, whose segments the caching allocator may or may
#: not find again) is judged by rows at each count, at real widths only (the tiny configs' FSDP2
#: peak is under 25 MiB).
FSDP_GPU_COUNTS = (2, 4, 16, 32, 64)
FSDP_JOBS = ("mixed_fsdp", "mixed_ckpt_fsdp", "lora_fsdp")
JOBS.update({f"{job}_g{n}": {**JOBS[job], "gpus": n} for job in FSDP_JOBS for n in FSDP_GPU_COUNTS})
NEEDS_REAL_WIDTH |= frozenset(f"{job}_g{n}" for job in FSDP_JOBS for n in FSDP_GPU_COUNTS)
#: Jobs run at a multiple of the command line's batch size and sequence length: job ->
#: (batch factor, sequence factor, new tokens where the model generates). The tiny configs'
#: 256 positions hold 4 x 32 + 16.
SCALED: dict[str, tuple[int, int, int]] = {
    job: (4, 4, 16)
    for job in (
        "infer_long", "infer_long_eager", "infer_long_flash", "infer_long_fp16",
        "infer_long_fp16_eager", "infer_long_fp16_flash",
    )
}  # fmt: skip
#: Issue 32 (moeinfer): generation as people run DeepSeek-V2 and gpt-oss (``memfit estimate
#: deepseek-v2-lite --mode infer --seq 4096 --new-tokens 64``): 4x the sequence and 64 new tokens
#: (a decode long enough that gpt-oss's sliding layers' caches pass their window), at the grid's
#: batch. Evidence beside ``infer`` / ``infer_long`` for the MoE families' inference (their rows
#: only; not judged as ``infer``: the other families have no rows of it).
JOBS["infer_gen"] = {"mode": "infer"}
SCALED["infer_gen"] = (1, 4, 64)
#: gpt-oss as its checkpoints ship (``quantization_config: mxfp4``: ``memfit estimate
#: gpt-oss-20b --mode infer`` runs with ``quant="mxfp4"``): inference with the routed experts in
#: MXFP4 (``memfit.estimate.fastpath.INFER_QUANT_JOBS``), and at serving size (judged together).
JOBS["infer_mxfp4"] = {"mode": "infer", "quant": "mxfp4"}
JOBS["infer_long_mxfp4"] = {"mode": "infer", "quant": "mxfp4"}
SCALED["infer_long_mxfp4"] = SCALED["infer_long"]
#: Grid jobs that stand for another job of ``memfit.estimate.fastpath`` (its ``grid_job``): the
#: fast path validates that job for a model type only where the rows of every grid job that
#: stands for it pass (``validated_table``, ``settles_table``).
JUDGED_AS: dict[str, str] = {"infer_long": "infer", "infer_long_mxfp4": "infer_mxfp4"}
JUDGED_AS.update(
    {f"{job}_{suffix}": f"{job}_part" for job in LORA_BASE for suffix in ("part_attn", "part_mlp")}
)
JUDGED_AS.update({"infer_long_eager": "infer_eager", "infer_long_flash": "infer_flash"})
JUDGED_AS.update(
    {"infer_long_fp16": "infer_fp16", "infer_long_fp16_eager": "infer_fp16_eager",
     "infer_long_fp16_flash": "infer_fp16_flash"}
)  # fmt: skip
JUDGED_AS.update(
    {f"{job}_{suffix}": f"{job}_part" for job in FP16_LORA for suffix in ("part_attn", "part_mlp")}
)
#: Families where peft's ``all-linear`` cannot run (refused, exit 2: Llama 4's router subclasses
#: nn.Linear and returns a tuple; peft itself rejects Mamba's out_proj): their ``lora`` job names
#: the targets (by role, or the module names).
LORA_TARGETS: dict[str, tuple[str, ...]] = {
    "llama4_text": ("attention", "mlp"),
    "llama-4-scout-text": ("attention", "mlp"),
    "mamba": ("in_proj", "x_proj", "dt_proj"),
    "falcon_h1": ("attention", "mlp"),
}
#: Bundled real configs (src/memfit/models/configs), one per architecture, at their real widths
#: but cut to ``--real-depth`` layers (default 2; the row says the depth): (name, seq).
REAL: tuple[tuple[str, int], ...] = (
    ("qwen3-0.6b", 128), ("qwen3-30b-a3b", 128), ("deepseek-v2-lite", 64), ("gemma-3-1b", 128),
    ("gpt-oss-20b", 128), ("llama-4-scout-text", 128), ("phi-4", 128), ("olmo-2-7b", 128),
    ("mistral-nemo-12b", 128), ("t5-small", 64), ("roberta-base", 128), ("whisper-base", 32),
    ("vit-base-patch16-224", 128), ("swin-tiny-patch4-window7-224", 128),
)  # fmt: skip
#: Layer-count keys cut for the real configs (the ones present are set to the depth).
_DEPTH_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers",
               "encoder_layers", "decoder_layers")  # fmt: skip
NEW_TOKENS = 4
#: The default families (``--all``: every type in tiny_models): every kind the issue names, the
#: families people train and serve today first.
DEFAULT = (
    "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi", "phi3", "gpt2",
    "gpt_neox", "opt", "bloom", "falcon", "granite", "olmo2", "cohere", "starcoder2", "smollm3",
    "mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss", "llama4_text", "deepseek_v3",
    "deepseek_v2", "jamba", "falcon_h1", "mamba", "bert", "roberta", "deberta-v2", "t5", "bart",
    "vit", "convnext", "swin", "whisper", "wav2vec2",
)  # fmt: skip
#: The bytes compared, and their short names in the rows' error keys.
FIELDS = (("allocated_bytes", "alloc"), ("reserved_bytes", "reserved"))


def _workload(
    job: str, family: str, model_type: str, *, batch: int, seq: int, config: Any = None
) -> Any:
    from memfit.spec import MediaSpec, WorkloadSpec

    batch_factor, seq_factor, new_tokens = SCALED.get(job, (1, 1, NEW_TOKENS))
    fields = {"precision": "bf16-true", **JOBS[job], "batch_size": batch * batch_factor,
              "seq_len": seq * seq_factor}  # fmt: skip
    lora_like = job in ("lora", "lora_ckpt") or job.endswith("_dropout") or job.startswith("qlora")
    lora_like = lora_like or (job.endswith(("_8bit", "_fp16")) and "lora_rank" in JOBS[job])
    if lora_like and family in LORA_TARGETS and "lora_targets" not in JOBS[job]:
        fields["lora_targets"] = LORA_TARGETS[family]
    if JOBS[job]["mode"] == "infer" and generates(model_type):
        fields["new_tokens"] = new_tokens
    if job.endswith("_img"):
        fields["media"] = MediaSpec(image_size=scaled_image_size(config or {}))
    return WorkloadSpec(**fields)


def scaled_image_size(config: dict[str, Any]) -> int:
    """An ``*_img`` job's image size: the config's x IMAGE_SCALE, down to a patch multiple."""
    size, patch = int(config.get("image_size", 224)), int(config.get("patch_size", 16))
    return size * IMAGE_SCALE[0] // IMAGE_SCALE[1] // patch * patch


def real_config(name: str, depth: int) -> dict[str, Any]:
    """The bundled config ``name`` with its layer counts cut to ``depth`` (layer_types sliced)."""
    from memfit.models import resolve_model

    config = dict(resolve_model(name).config)
    n = config.get("num_hidden_layers")
    for key in _DEPTH_KEYS:
        if isinstance(config.get(key), int) and config[key] > depth:
            config[key] = depth
    for key, value in list(config.items()):  # per-layer lists (layer_types, no_rope_layers ...)
        if isinstance(value, list) and n and len(value) == n:
            config[key] = value[:depth]
    return config


def _one(engine: str, source: Any, w: Any) -> dict[str, Any]:
    """One engine's answer: bytes and wall time, or why it did not answer."""
    from memfit.errors import MemfitError, NotModelledError
    from memfit.estimate.policy import run_engine

    started = time.perf_counter()
    try:
        est = run_engine(engine, source, w, None)
    except NotModelledError as exc:
        return {"status": "refused", "reason": _line(exc), "wall_s": _since(started)}
    except MemfitError as exc:
        return {"status": "error", "reason": _line(exc), "wall_s": _since(started)}
    except Exception as exc:  # a crash of the library is a finding: shown, never dropped
        return {"status": "crash", "reason": f"{type(exc).__name__}: {_line(exc)}",
                "wall_s": _since(started)}  # fmt: skip
    out = {
        "status": "ok",
        "allocated_bytes": est.peak_allocated_bytes,
        "reserved_bytes": est.peak_reserved_bytes,
        "wall_s": _since(started),
    }
    # FSDP2's root buffers and Whisper's staging segment, which the analytic rule reserves
    # beyond its ratio (its every point: analytic/api.py)
    info = (est.trace or {}).get("analytic", {})
    stranded = int(info.get("fsdp_stranded_bytes", 0)) + int(info.get("staging_stranded_bytes", 0))
    if engine == "analytic" and stranded:
        out["stranded_bytes"] = int(stranded)
    return out


def _line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 160 else text[:157] + "..."


def _since(t: float) -> float:
    return round(time.perf_counter() - t, 3)


def _error_pct(fast: dict[str, Any], trace: dict[str, Any], field: str) -> float | None:
    if fast.get("status") != "ok" or trace.get("status") != "ok" or not trace[field]:
        return None
    return 100.0 * (fast[field] - trace[field]) / trace[field]


def run_family(
    item: tuple[str, str, str, int, tuple[str, ...]],
    batch: int,
    sink: str | None = None,
    derived: bool = True,
) -> list[dict]:
    """Every job of one family (run in a worker process: forms stay in its memory); each row is
    appended to the JSONL file ``sink`` as soon as it is measured (one line per write).
    ``derived=False`` (``--skip-derived``): the derived engine is not run (it traces three more
    batch sizes per row); the row says so (status "skipped")."""
    family, kind, origin, seq, jobs = item
    from memfit.estimate.analytic import supports
    from memfit.models import resolve_model, take_media

    folder = Path(tempfile.mkdtemp(prefix="memfit-grid-"))
    if origin == "tiny":
        source = resolve_model(str(write_tiny(folder, family)))
    else:  # "bundled-<depth>": the bundled config cut to <depth> layers
        path = folder / family / "config.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(real_config(family, int(origin.split("-")[1]))))
        source = resolve_model(str(path.parent))
    model_type = str(source.config.get("model_type"))
    has_analytic = bool(supports(source.config))
    started = time.perf_counter()
    rows = []
    for job in jobs:
        w = _workload(job, family, model_type, batch=batch, seq=seq, config=source.config)
        job_source = take_media(source, w.media) if w.media.is_set else source
        row: dict[str, Any] = {"family": family, "kind": kind, "origin": origin, "job": job,
                               "batch": w.batch_size, "seq": w.seq_len, "grid_batch": batch,
                               "new_tokens": w.new_tokens,
                               "lora_targets": w.lora_targets if w.lora_rank else None}  # fmt: skip
        if w.media.is_set:
            row["image_size"] = w.media.image_size
        row["trace"] = _one("trace", job_source, w)
        row["derived"] = (
            _one("derived", job_source, w)
            if derived
            else {"status": "skipped", "reason": "not run (--skip-derived)"}
        )
        row["analytic"] = _one("analytic", job_source, w) if has_analytic else {"status": "none"}
        for eng in ("derived", "analytic"):
            for field, key in FIELDS:
                row[f"{eng}_{key}_err_pct"] = _error_pct(row[eng], row["trace"], field)
        row["job_wall_s"] = _since(started) - sum(r["job_wall_s"] for r in rows)
        row["commit"] = _commit()
        rows.append(row)
        if sink is not None:
            with open(sink, "a", encoding="utf-8") as f:
                f.write(json.dumps(row, sort_keys=True) + "\n")
    return rows


def _commit() -> str:
    """The checkout's commit (``+`` when its tracked files differ from it; ``GRID_COMMIT``
    names it for a run from an exported copy)."""
    import subprocess

    if os.environ.get("GRID_COMMIT"):
        return os.environ["GRID_COMMIT"]

    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout

    return git("rev-parse", "--short", "HEAD").strip() + (
        "+" if git("status", "--porcelain", "-uno").strip() else ""
    )


def _items(args: argparse.Namespace) -> list[tuple[str, str, str, int, tuple[str, ...]]]:
    types = args.types.split(",") if args.types else list(TYPES if args.all else DEFAULT)
    jobs = tuple(args.jobs_list.split(","))
    items = [(t, TYPES[t][0], "tiny", args.seq, jobs) for t in types] if args.tiny else []
    if args.real:
        origin = f"bundled-{args.real_depth}"
        names = args.real_names.split(",") if args.real_names else [n for n, _ in REAL]
        seqs = dict(REAL)  # a bundled name not in REAL: sequence 128
        items += [(name, "real", origin, seqs.get(name, 128), jobs) for name in names]
    return items


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--types", help="comma-separated model types (default: all in tiny_models)")
    p.add_argument("--jobs-list", default=",".join(JOBS), help="which jobs (default: all)")
    p.add_argument("--batch", type=int, default=5, help="batch size compared (not traced)")
    p.add_argument("--seq", type=int, default=32, help="sequence length of the tiny models")
    p.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1), help="processes")
    p.add_argument("--real", action=argparse.BooleanOptionalAction, default=True,
                   help="also the bundled real configs (default: on)")  # fmt: skip
    p.add_argument("--tiny", action=argparse.BooleanOptionalAction, default=True,
                   help="the tiny configs of --types (default: on; off: bundled only)")  # fmt: skip
    p.add_argument("--real-depth", type=int, default=2,
                   help="layers the bundled real configs are cut to (default 2)")  # fmt: skip
    p.add_argument("--real-names", help="comma-separated bundled configs (default: all of REAL)")
    p.add_argument("--redo-failed", action="store_true",
                   help="with --resume: run again the jobs whose trace did not answer")  # fmt: skip
    p.add_argument("--redo", help="with --resume: comma-separated families measured again "
                   "(their rows are replaced by the new ones)")  # fmt: skip
    p.add_argument("--first", help="comma-separated families run first (the rest follow)")
    p.add_argument("--skip-derived", action="store_true",
                   help="run the trace and analytic engines only (the derived engine traces "
                   "three more batch sizes per row)")  # fmt: skip
    p.add_argument("--cache-dir", help="derived-form cache (default: a fresh temporary one)")
    p.add_argument("--out", default=str(RESULTS / "fastpath_grid"), help="output path stem")
    p.add_argument("--all", action="store_true", help="every type in tiny_models (default: 40)")
    p.add_argument("--resume", action="store_true", help="keep the rows already in .jsonl")
    p.add_argument("--render-only", action="store_true",
                   help="write the .md from the rows in .jsonl, run nothing")  # fmt: skip
    args = p.parse_args(argv)
    if args.batch in (1, 2, 3, 4):
        p.error(f"--batch ({args.batch}) must be > 4: the derived form traces batch 1-4")
    os.environ["MEMFIT_CACHE_DIR"] = args.cache_dir or tempfile.mkdtemp(prefix="memfit-grid-")
    items = _items(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    jsonl = out.with_suffix(".jsonl")
    rows = _done_rows(jsonl, args) if args.resume or args.render_only else []
    if not (args.resume or args.render_only):
        jsonl.write_text("")
    if args.redo_failed:
        rows = [r for r in rows if r["trace"]["status"] == "ok"]
    redo = set(args.redo.split(",")) if args.redo else set()
    done = {(r["family"], r["job"]) for r in rows if r["family"] not in redo}
    todo = [(*it[:4], tuple(j for j in it[4] if (it[0], j) not in done)) for it in items]
    todo = [it for it in todo if it[4] and not args.render_only]
    first = args.first.split(",") if args.first else []
    todo.sort(key=lambda it: first.index(it[0]) if it[0] in first else len(first))
    started = time.perf_counter()
    _run(todo, args, rows, str(jsonl), started)
    wall = _since(started)
    order = {it[0]: i for i, it in enumerate(items)}
    if args.render_only:  # every family with rows (a bundled config run by name too)
        for r in rows:
            order.setdefault(r["family"], len(order))
    rows = _latest(r for r in rows if r["family"] in order)
    rows.sort(key=lambda r: (order[r["family"]], list(JOBS).index(r["job"])
                             if r["job"] in JOBS else 9))  # fmt: skip
    have = {(r["family"], r["job"]) for r in rows}
    missing = [(it[0], j) for it in items for j in it[4] if (it[0], j) not in have]
    out.with_suffix(".md").write_text(render(rows, args, wall, missing))
    print(f"wrote {out.with_suffix('.md')} and .jsonl in {wall:.0f} s", file=sys.stderr)
    return 0


def _run(todo: list, args: argparse.Namespace, rows: list[dict], sink: str, started: float) -> None:
    """Run the families of ``todo`` in ``args.jobs`` processes; each worker appends its rows to
    the JSONL file ``sink`` job by job (so an interrupted run can be resumed), and ``rows``
    collects them. A worker that dies (the OS killed it) breaks the pool: the families it took
    down are run again one at a time, and the one that dies alone is a crash row."""
    pending, workers, n = list(todo), args.jobs, 0
    while pending:
        broken = []
        with concurrent.futures.ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {
                pool.submit(run_family, it, args.batch, sink, not args.skip_derived): it
                for it in pending
            }
            for fut in concurrent.futures.as_completed(futures):
                item = futures[fut]
                try:
                    rows.extend(fut.result())
                except concurrent.futures.process.BrokenProcessPool:
                    broken.append(item)
                    continue
                n += 1
                print(f"[{n}/{len(todo)}] {item[0]} ({_since(started):.0f} s)", file=sys.stderr)
        if broken and workers == 1:  # it died alone: a row says so, the rest go on
            (item, *pending) = broken
            crash = {"family": item[0], "job": "*", "kind": item[1], "origin": item[2],
                     "trace": {"status": "crash", "reason": "the worker process was killed "
                               "(out of memory?) while running this family"}}  # fmt: skip
            with open(sink, "a", encoding="utf-8") as f:
                f.write(json.dumps(crash, sort_keys=True) + "\n")
            rows.append(crash)
            continue
        pending, workers = broken, 1


def _latest(rows: Any) -> list[dict]:
    """The last row of each (family, job); a family's crash row only where it has no other."""
    last = {(r["family"], r["job"]): r for r in rows}
    measured = {f for f, j in last if j != "*"}
    return [r for (f, j), r in last.items() if j != "*" or f not in measured]


def _done_rows(jsonl: Path, args: argparse.Namespace) -> list[dict]:
    """The rows of an earlier run at the same batch size (``--resume``)."""
    if not jsonl.exists():
        return []
    rows = [json.loads(line) for line in jsonl.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("grid_batch", r.get("batch")) == args.batch]


def _family_wall_s(rows: list[dict]) -> float:
    return float(sum(r.get("job_wall_s", 0) for r in rows))


def _versions() -> str:
    import importlib.metadata as md

    parts = [f"python {platform.python_version()}"]
    for pkg in ("memfit", "torch", "transformers", "peft"):
        try:
            parts.append(f"{pkg} {md.version(pkg)}")
        except md.PackageNotFoundError:
            parts.append(f"{pkg} not installed")
    return ", ".join(parts)


def _worst(rows: list[dict], key: str) -> tuple[float, str] | None:
    vals = [(abs(r[key]), r[key], f"{r['family']} {r['job']}") for r in rows
            if r.get(key) is not None]  # fmt: skip
    if not vals:
        return None
    _a, v, where = max(vals)
    return v, where


def render(
    rows: list[dict], args: argparse.Namespace, wall_s: float, missing: list[tuple[str, str]]
) -> str:
    families = sorted({r["family"] for r in rows})
    compared = [r for r in rows if r.get("derived_alloc_err_pct") is not None]
    count = {s: sum(1 for r in rows if r.get("derived", {}).get("status") == s)
             for s in ("ok", "refused", "error", "crash", "skipped")}  # fmt: skip
    trace_bad = sum(1 for r in rows if r["trace"]["status"] != "ok")
    how = (
        "rendered from the rows of the .jsonl"
        if args.render_only
        else (f"{args.jobs} processes on {os.cpu_count()} CPUs, {wall_s:.0f} s")
    )
    lines = [
        "# Fast path vs full trace (issue 11)",
        "",
        f"Written by `benchmarks/fastpath_grid.py` ({' '.join(sys.argv[1:]) or 'default size'}); "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {_versions()}; {how}; per-job "
        f"wall times sum to {_family_wall_s(rows):.0f} s (load average at the end: "
        f"{os.getloadavg()[0]:.1f}).",
        "",
    ]
    for eng in ("derived", "analytic"):
        for field, label in (("alloc", "peak allocated"), ("reserved", "peak reserved")):
            w = _worst(rows, f"{eng}_{field}_err_pct")
            n = sum(1 for r in rows if r.get(f"{eng}_{field}_err_pct") is not None)
            text = "no row compared" if w is None else f"**{w[0]:+.3f} %** ({w[1]})"
            lines.append(f"- worst {eng} error, {label}: {text} over {n} rows")
    lines += [
        f"- {len(families)} families, {len(rows)} rows: derived answered {count['ok']} "
        f"({len(compared)} compared with a trace), refused {count['refused']}, failed "
        f"{count['error'] + count['crash']}, not run {count['skipped']}; the trace itself "
        f"failed on {trace_bad} rows",
        f"- rows by the memfit commit that measured them: {_by_commit(rows)}",
        "",
        f"Batch {args.batch} (never traced by the derived form: it traces batch 1-3, or 2-4 where "
        "batch 1 runs other kernels), bf16 weights; training = AdamW, `lora` = rank 8 on all "
        "linear layers, `ckpt` = full activation checkpointing, `lora_ckpt` = both, `mixed` = "
        "bf16-mixed (fp32 weights, the full fine-tune's default), `lora_held` / "
        "`lora_ckpt_held` = `lora` / `lora_ckpt` holding the earlier micro-batches' gradients "
        "(`zero_grad_set_to_none=False`: a plan's job under gradient accumulation), "
        "`lora_selckpt_held` = the same with selective checkpointing (issue 32: these run for "
        "the families with an analytic program; derived 'not run' = measured with "
        "`--skip-derived`), `mixed_offload_held` = `mixed` with DeepSpeed ZeRO-2 offloading the "
        "optimizer to host RAM, gradients held (the full fine-tune's plan on one GPU; a few "
        f"families); `infer` decodes {NEW_TOKENS} new "
        "tokens where the model generates (else one forward); `infer_long` = `infer` at 4 x the "
        "batch and the sequence, 16 new tokens (issue 32: serving size; the fast path validates "
        "inference where both pass). Error = (fast - trace) / trace.",
        "",
        "| family | kind | job | trace alloc | trace reserved | derived alloc (err) "
        "| derived reserved (err) | analytic alloc (err) | analytic reserved (err) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append("| " + " | ".join(_cells(r)) + " |")
    lines += render_default(rows)
    if missing:
        by: dict[str, list[str]] = {}
        for fam, job in missing:
            by.setdefault(fam, []).append(job)
        lines += ["", f"**Not run** ({len(missing)} jobs asked for but not measured by the runs "
                  "that wrote the .jsonl; `--resume` runs them): "
                  + "; ".join(f"{f}: {', '.join(js)}" for f, js in by.items())]  # fmt: skip

    def noted(res: dict) -> bool:  # a skipped engine is counted in the summary, not listed
        return bool(res.get("reason")) and res.get("status") != "skipped"

    notes = [r for r in rows if any(noted(r.get(e, {})) for e in ENGINES)]
    if notes:
        lines += ["", "Reasons (refusals and failures, first line of each message):", ""]
        for r in notes:
            for e in ENGINES:
                res = r.get(e, {})
                if noted(res):
                    lines.append(f"- {r['family']} {r['job']}, {e} {res['status']}: "
                                 f"{res['reason']}")  # fmt: skip
    return "\n".join(lines) + "\n"


ENGINES = ("trace", "derived", "analytic")


# -- the default engine (``--engine auto`` for one estimate), per family ---------------------------
def model_type_of(row: dict) -> str:
    """The model_type of a row's family: a tiny family is named by its type; a bundled config
    (``origin`` ``bundled-N``) by its name, whose config says it."""
    if not str(row.get("origin", "")).startswith("bundled-"):
        return str(row["family"])
    from memfit.models import resolve_model

    return str(resolve_model(row["family"]).config.get("model_type"))


def default_answer(row: dict, end: str | None = None) -> dict[str, Any] | None:
    """The analytic engine's default answer on a row, None without one. ``end``: the point of
    its reserved ratio range — None: the one ``estimate`` shows under auto (the median, the top
    for a checkpointed job: ``memfit.estimate.fastpath.shown_reserved_end``, a training row's
    capped at the top of its job class's band: ``fastpath.shown_answer``); "high": the top of
    the wide range (what the validation judges)."""
    from memfit.estimate.analytic.reserved import RESERVED_RATIO, reserved_rule

    a = row.get("analytic", {})
    if a.get("status") != "ok" or row["trace"]["status"] != "ok":
        return None
    shown = end is None
    if end is None:  # fastpath.shown_reserved_end: the top for every checkpointed job
        checkpointing = JOBS.get(row["job"], {}).get("checkpointing", "none")
        end = "high" if checkpointing != "none" else "mid"
    if JOBS.get(row["job"], {}).get("mode") == "infer":  # the engine's own rule (its floor)
        # the answer shown takes the parameters and the KV cache apart (INFER_RESERVED): their
        # bytes on this row, from the analytic engine's phases (None: the wide rule)
        parts = _infer_parts(row) if end == "mid" else None
        rule = reserved_rule(training=False, end=end, infer=parts)
        reserved, _range = rule.at(a["allocated_bytes"])
        return {"status": "ok", "allocated_bytes": a["allocated_bytes"],
                "reserved_bytes": reserved}  # fmt: skip
    median, _lowest, highest = RESERVED_RATIO["train"]
    ratio = highest if end == "high" else median
    # FSDP2: the root buffers' segments, at every point (reserved_rule's stranded_bytes)
    reserved = int(a["allocated_bytes"] * ratio) + int(a.get("stranded_bytes", 0))
    if shown:  # never above the top of the job class's band (fastpath.shown_answer)
        reserved = min(reserved, _band_top(row))
    return {"status": "ok", "allocated_bytes": a["allocated_bytes"],
            "reserved_bytes": reserved}  # fmt: skip


def _band_top(row: dict) -> int:
    """The top of the reserved band a training row's verdict is settled on (``end="band"``:
    its job class's, ``fastpath.band_class``, where the class has one and the row's model type
    settles it; the wide top elsewhere), at the row's analytic allocated bytes."""
    from memfit.estimate.analytic.reserved import class_band, reserved_rule
    from memfit.estimate.fastpath import SETTLES

    job = row["job"] if row["job"] in SETTLES.get(model_type_of(row), ()) else None
    job = job if class_band(job) is not None else None
    a = row["analytic"]
    rule = reserved_rule(
        training=True, end="band", job=job, stranded_bytes=int(a.get("stranded_bytes", 0))
    )
    return rule.at(a["allocated_bytes"])[0]


def _infer_parts(row: dict) -> Any:
    """The analytic engine's parts (``InferParts``: its phases' peaks, the parameters and the
    KV cache in them) of a grid inference row; None for a row
    ``benchmarks/infer_reserved.py --grid`` did not record (the wide rule)."""
    key = (row["family"], row["origin"], row["job"], int(row["analytic"]["allocated_bytes"]))
    return _parts_table().get(key)


@functools.cache
def _parts_table() -> dict[tuple[str, str, str, int], Any]:
    """(family, origin, job, analytic allocated bytes) -> the analytic engine's parts now, for
    the grid's inference rows ``benchmarks/infer_reserved.py --grid`` recorded (its engine
    check: the same allocated bytes as the row's)."""
    from benchmarks import infer_reserved

    rows = _recorded_grid_rows()
    points = infer_reserved.trace_points(rows)
    keys = [(r["family"], r["origin"], r["job"], int(r["analytic"]["allocated_bytes"]))
            for r in rows]  # fmt: skip
    return {k: p.parts for k, p in zip(keys, points, strict=True)}


def _recorded_grid_rows() -> list[dict]:
    """infer_reserved.jsonl's grid rows, the last of each (family, origin, job): a row the
    grid re-ran with a moved analytic engine is recorded again (``infer_reserved --grid``)."""
    path = RESULTS / "infer_reserved.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    rows = [json.loads(line) for line in lines if line.strip()]
    last = {(r["family"], r["origin"], r["job"]): r for r in rows if r.get("source") == "grid"}
    return list(last.values())


def validated_table(rows: list[dict]) -> dict[str, tuple[str, ...]]:
    """model_type -> the jobs whose every row has the default analytic answer within the
    tolerance of the trace (allocated within +-TOLERANCE, reserved no more than TOLERANCE
    under): what ``memfit.estimate.fastpath.VALIDATED`` must say. A job with a row the analytic
    engine refuses, or no row, is not validated."""
    from memfit.estimate.fastpath import TOLERANCE

    by: dict[tuple[str, str], list[bool]] = {}
    for r in _latest(rows):
        if r["job"] not in JOBS or r.get("analytic", {}).get("status") == "none":
            continue
        d = default_answer(r, "high")  # the band's top: what settles the verdict
        ok = _not_pending(r) and d is not None and all(
            lo <= (d[f] - r["trace"][f]) / r["trace"][f] <= hi
            for f, lo, hi in (("allocated_bytes", -TOLERANCE, TOLERANCE),
                              ("reserved_bytes", -TOLERANCE, float("inf")))
        )  # fmt: skip
        by.setdefault((model_type_of(r), r["job"]), []).append(ok)
    return _judged(_real_width_rule(by, rows))


def _not_pending(row: dict) -> bool:
    """False for a row of an inference variant its model type leaves to the trace
    (``memfit.estimate.fastpath.INFER_VARIANTS_PENDING``, :func:`infer_pending_table`): it
    cannot pass."""
    from memfit.estimate.fastpath import INFER_VARIANTS_PENDING

    job = JUDGED_AS.get(row["job"], row["job"])
    if not _judged_by_fit(row):
        return True
    return (model_type_of(row), job) not in INFER_VARIANTS_PENDING


def _judged_by_fit(row: dict) -> bool:
    """Whether the inference fit as it is judges ``row`` (``infer_reserved.judge``): a row of
    an inference variant, or an inference row of the MoE families whose programs were added
    after the fit (``infer_reserved.MOE_FAMILIES``: ``infer``, ``infer_long``, ``MOE_JOBS``;
    ``infer_reserved.WHISPER_FAMILIES``: ``infer``, ``infer_long``)."""
    from benchmarks import infer_reserved

    job = JUDGED_AS.get(row["job"], row["job"])
    if any(job == JUDGED_AS.get(v, v) for v in _variant_jobs()):
        return True
    moe_jobs = infer_reserved.FIT_JOBS + infer_reserved.MOE_JOBS
    if row["family"] in infer_reserved.WHISPER_FAMILIES:  # issue 32 (whisper2)
        return row["job"] in infer_reserved.FIT_JOBS
    return row["family"] in infer_reserved.MOE_FAMILIES and row["job"] in moe_jobs


def _variant_jobs() -> tuple[str, ...]:
    from benchmarks.infer_reserved import VARIANT_JOBS

    return VARIANT_JOBS


def infer_pending_table(rows: list[dict]) -> frozenset[tuple[str, str]]:
    """(model_type, fast-path job) of the inference variants (``infer_reserved.VARIANT_JOBS``)
    and of the MoE families' inference (:func:`_judged_by_fit`) with a grid row (both engines
    answered) on which the inference rule as fitted does not hold (``infer_reserved.judge``:
    the answer shown more than TOLERANCE under the trace's reserved bytes, or the band's top
    under them), or whose parts
    ``benchmarks/infer_reserved.py --grid`` has not recorded at the row's allocated bytes:
    what ``memfit.estimate.fastpath.INFER_VARIANTS_PENDING`` must say."""
    from benchmarks import infer_reserved

    recorded = infer_reserved.variant_rows() + infer_reserved.moe_rows()
    judged = infer_reserved.judge(recorded)
    holds = {
        (r["family"], r["origin"], r["job"], int(r["analytic"]["allocated_bytes"])): j["holds"]
        for r, j in zip(recorded, judged, strict=True)
    }
    out = set()
    for r in _latest(rows):
        if r["job"] not in infer_reserved.VARIANT_JOBS and not _judged_by_fit(r):
            continue
        if r.get("analytic", {}).get("status") != "ok" or r["trace"]["status"] != "ok":
            continue
        key = (r["family"], r["origin"], r["job"], int(r["analytic"]["allocated_bytes"]))
        if not holds.get(key, False):
            out.add((model_type_of(r), JUDGED_AS.get(r["job"], r["job"])))
    return frozenset(out)


def _real_width_rule(
    by: dict[tuple[str, str], list[bool]], rows: list[dict]
) -> dict[tuple[str, str], list[bool]]:
    """``by`` with a failing mark on each (model_type, job) of :data:`NEEDS_REAL_WIDTH` that has
    no row of a bundled config (real widths): the tiny rows alone do not judge those jobs."""
    real = {(model_type_of(r), r["job"]) for r in _latest(rows)
            if str(r.get("origin", "")).startswith("bundled-")}  # fmt: skip
    return {key: oks if key[1] not in NEEDS_REAL_WIDTH or key in real else [*oks, False]
            for key, oks in by.items()}  # fmt: skip


def _judged(by: dict[tuple[str, str], list[bool]]) -> dict[str, tuple[str, ...]]:
    """model_type -> the fast path's jobs whose every grid row passed (``by``: (model_type, grid
    job) -> each row's pass), where a job other grid jobs stand for (:data:`JUDGED_AS`) passes
    only with rows of each of them, all passing."""
    table: dict[str, list[str]] = {}
    for mt in sorted({mt for mt, _ in by}):
        for job in JOBS:
            if job in JUDGED_AS:
                continue
            grid_jobs = [job, *(g for g, j in JUDGED_AS.items() if j == job)]
            oks = [by.get((mt, g), []) for g in grid_jobs]
            if all(o and all(o) for o in oks):
                table.setdefault(mt, []).append(job)
    return {mt: tuple(jobs) for mt, jobs in table.items()}


def settles_table(rows: list[dict]) -> dict[str, tuple[str, ...]]:
    """model_type -> the jobs whose every row has the analytic engine's allocated bytes no more
    than TOLERANCE **under** the trace's (over by any amount): where a plan's "fits" may be
    settled on the job class's reserved band (``memfit.estimate.fastpath.SETTLES``; the band's
    top covers the trace's reserved bytes on every row, over-predicted allocations included, and
    an over-prediction cannot turn the trace's "fits" into "does not fit"). A job with a row the
    analytic engine refuses, or no row, does not settle."""
    from memfit.estimate.fastpath import TOLERANCE

    by: dict[tuple[str, str], list[bool]] = {}
    for r in _latest(rows):
        if r["job"] not in JOBS or r.get("analytic", {}).get("status") == "none":
            continue
        a, t = r.get("analytic", {}), r["trace"]
        ok = (
            _not_pending(r)
            and a.get("status") == "ok"
            and t["status"] == "ok"
            and (a["allocated_bytes"] >= t["allocated_bytes"] * (1 - TOLERANCE))
        )
        by.setdefault((model_type_of(r), r["job"]), []).append(ok)
    return _judged(_real_width_rule(by, rows))


def render_default(rows: list[dict]) -> list[str]:
    """The "Default engine" section: per family and job, which engine answers one ``estimate``
    of that job under auto, and its error against the trace (allocated, reserved)."""
    from memfit.estimate.fastpath import TOLERANCE, VALIDATED

    lines = [
        "",
        "## Default engine (`--engine auto`, one estimate)",
        "",
        "Which engine answers one `memfit estimate` of each job under `--engine auto` "
        "(`memfit.estimate.fastpath`): the analytic engine where every row of the model type's job "
        f"has the top of its band (reserved bytes at the top of the ratio range) within "
        f"{TOLERANCE:.0%} of the trace (allocated within +-{TOLERANCE:.0%}, reserved no more "
        f"than {TOLERANCE:.0%} under), else the trace (or a cached derived form: the trace's own "
        "bytes, error 0). The answer shown takes the median ratio (the top for a checkpointed "
        "job), which the 14 H200 measurements judge closest (docs/accuracy.md), never above the "
        "top of the job class's band (`fastpath.shown_answer`); the verdict is "
        "settled on the band's top, the trace confirms otherwise. Error of the answer shown = "
        "(default - trace) / trace.",
        "",
        "| family | model_type | job | default engine | alloc err | reserved err |",
        "|---|---|---|---|---|---|",
    ]
    errors: dict[str, list[float]] = {"alloc": [], "reserved": []}
    table = []
    for r in _latest(rows):
        if r["job"] not in JOBS or r["trace"]["status"] != "ok":
            continue
        mt = model_type_of(r)
        # a serving-size row (``infer_long*``) is answered as the job it stands for (JUDGED_AS)
        judged = JUDGED_AS.get(r["job"], r["job"]) in VALIDATED.get(mt, ())
        d = default_answer(r) if judged else None
        engine = "analytic" if d is not None else "trace"
        d = d or r["trace"]
        errs = [100.0 * (d[f] - r["trace"][f]) / r["trace"][f] for f, _ in FIELDS]
        for (_, key), e in zip(FIELDS, errs, strict=True):
            errors[key].append(e)
        table.append(f"| {r['family']} | {mt} | {r['job']} | {engine} | {errs[0]:+.3f} % "
                     f"| {errs[1]:+.3f} % |")  # fmt: skip
    n_fast = sum(1 for line in table if "| analytic |" in line)
    summary = (
        f"{n_fast} of {len(table)} rows answered by the analytic engine by default; default error "
        f"against the trace: allocated **{min(errors['alloc']):+.3f} %** to "
        f"{max(errors['alloc']):+.3f} %, reserved **{min(errors['reserved']):+.3f} %** to "
        f"{max(errors['reserved']):+.3f} % (the reserved bytes of tiny rows are the allocator's "
        "minimum segments, which the median ratio does not reach)."
    )
    return [*lines[:4], "", summary, *lines[4:], *table]


def _by_commit(rows: list[dict]) -> str:
    """How many rows each commit measured (rows written before commits were recorded: 'earlier')."""
    counts: dict[str, int] = {}
    for r in rows:
        key = r.get("commit") or "earlier (not recorded)"
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{n} at {c}" for c, n in counts.items())


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def _cells(r: dict) -> list[str]:
    t = r["trace"]
    kind = r.get("kind", "?")
    if str(r.get("origin", "")).startswith("bundled-"):  # a bundled config cut to N layers
        kind = f"bundled, {r['origin'].split('-')[1]} layers"
    job = r["job"] + (f" ({','.join(r['lora_targets'])})" if r.get("lora_targets")
                      and r["lora_targets"] != "all-linear" else "")  # fmt: skip
    cells = [r["family"], kind, job]
    if t["status"] == "ok":
        cells += [_mib(t["allocated_bytes"]), _mib(t["reserved_bytes"])]
    else:
        cells += [f"trace {t['status']}", "—"]
    for eng, short in (("derived", "derived"), ("analytic", "analytic")):
        res = r.get(eng, {"status": "?"})
        if res["status"] == "ok":
            for field, key in FIELDS:
                err = r.get(f"{short}_{key}_err_pct")
                pct = "" if err is None else f" ({err:+.3f} %)"
                cells.append(_mib(res[field]) + pct)
        elif res["status"] == "none":
            cells += ["no program", "—"]
        else:
            cells += [f"{res['status']} (see reasons)", "—"]
    return cells


if __name__ == "__main__":
    raise SystemExit(main())
