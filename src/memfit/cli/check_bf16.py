"""A ``bf16: true`` job file on a GPU without bf16 (Turing, Volta: ``GPU.supports_bf16`` False):
``memfit check`` says it does not run as written there, estimates the job as the fix writes it
(``bf16: false``, ``fp16: true``: the same bytes, fp16 with loss scaling) and puts that edit in
front of every fix it offers.

What the frameworks do with it (Hugging Face's Trainer runs HF / TRL, LLaMA-Factory and axolotl
files; each gates ``bf16`` on ``transformers.utils.is_torch_bf16_gpu_available``):

- ``TrainingArguments.__post_init__`` raises :data:`TRANSFORMERS_REFUSAL` where that check says
  no (transformers 5.23 ``src/transformers/training_args.py``, read in the installed package).
  Until huggingface/transformers#25879 (2023) the check was transformers' own: compute capability
  >= 8 and CUDA >= 11 ("You need torch>=1.10, using Ampere GPU with cuda>=11.0"), so every
  T4 / V100 run of such a file stopped there.
- Since then it is ``torch.cuda.is_bf16_supported()``, whose default ``including_emulation=True``
  (torch 2.13 ``torch/cuda/__init__.py``; pytorch/pytorch#124996 shows torch 2.2 still answering
  False on a V100) falls back to creating a bf16 tensor, which a T4 can: the Trainer then runs
  bf16 *emulated* — no bf16 tensor-core matmuls, and SDPA without its flash and memory-efficient
  kernels (``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``
  ``can_use_mem_efficient_attention``: bf16 only from sm80), so attention takes the math path
  that holds the seq x seq scores. memfit's estimate of the bf16 job is not what runs there.

Either way the file as written does not run on that GPU as its author meant; the fix is fp16.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from memfit.cli.check_fix import CheckFix, KeyChange, file_value
from memfit.jobfiles import FileEdit, Job, plan_edits
from memfit.jobfiles.files import reread

#: The formats whose ``bf16`` key Hugging Face's Trainer reads (TrainingArguments).
BF16_FORMATS = ("hf", "llamafactory", "axolotl")
#: transformers 5.23 ``TrainingArguments.__post_init__`` (installed package), CUDA available.
TRANSFORMERS_REFUSAL = (
    "Your setup doesn't support bf16/gpu. You need to assign use_cpu if you want to train the "
    "model on CPU. You need Ampere+ GPU with cuda>=11.0."
)


def bf16_file(job: Job) -> Any:
    """The file whose ``bf16: true`` the Trainer reads (None: none)."""
    return next(
        (f for f in job.files if f.format in BF16_FORMATS and f.reader.flat.get("bf16") is True),
        None,
    )


def bf16_problem(job: Job, workload: Any, gpu: Any) -> str | None:
    """Why the files do not run as written on ``gpu`` (None: they do)."""
    f = bf16_file(job)
    if (
        gpu is None
        or gpu.supports_bf16
        or f is None
        or not str(workload.precision).startswith("bf16")
    ):
        return None
    return (
        f"the files do not run as written on {gpu.name}: {f.path} sets bf16: true and "
        f"{gpu.name} has no bf16 (compute capability < 8.0). Hugging Face's Trainer raises "
        f'ValueError "{TRANSFORMERS_REFUSAL}" where torch reports no bf16 (older transformers '
        "or torch); newer ones run bf16 emulated, in fp32 arithmetic and with attention off "
        "its flash / memory-efficient kernels (bf16 needs sm80 there), which no estimate here "
        "counts. The fix sets fp16: true (fp16 with loss scaling)"
    )


def to_fp16(job: Job, workload: Any) -> tuple[Job, list[FileEdit], list[KeyChange]]:
    """The files with ``bf16: false, fp16: true`` (and a bfloat16 load dtype as float16 for an
    adapter job, float32 for a full fine-tune: ``memfit.jobfiles.edit._amp``), read again: the
    job the fix starts from, the edits and the keys they set."""
    amp = "fp16" if workload.lora_rank is not None else "fp16-fp32-weights"
    # every file that names bf16 (the training arguments, an accelerate or DeepSpeed config
    # beside them: files that disagree on the precision do not combine)
    edits = [e for f in job.files for e in plan_edits([f], {"amp": amp}, {})[0]]
    keys = [
        KeyChange(file=e.path, key=k, old=file_value(job, e.path, k), new=v)
        for e in edits
        for k, v in e.keys
    ]
    return reread(job, {e.path: e.new_text for e in edits}), edits, keys


def in_front(fix: CheckFix, edits: list[FileEdit], keys: list[KeyChange], before: Any) -> CheckFix:
    """``fix`` (made on the fp16 files) as an edit of the original files: the fp16 edit first,
    its keys first, and the precision change among what the edited files read as (``before``:
    the precision as written)."""
    if fix.other is not None:
        fix = replace(fix, other=in_front(fix.other, edits, keys, before))
    if not fix.found:
        return fix
    by_path = {e.path: e for e in fix.edits}
    merged = []
    for e in edits:
        later = by_path.pop(e.path, None)
        if later is None:
            merged.append(e)
        else:  # the later edit was made on the fp16 text: from the original, both edits
            merged.append(replace(later, old_text=e.old_text, keys=e.keys + later.keys))
    merged += list(by_path.values())  # files the fp16 edit left: their original text
    changes = dict(fix.changes)
    if fix.workload is not None and "precision" not in changes:
        changes = {"precision": (before, fix.workload.precision), **changes}
    return replace(fix, edits=merged, keys=keys + fix.keys, changes=changes)


def fp16_only(
    edits: list[FileEdit], keys: list[KeyChange], workload: Any, est: Any, before: Any
) -> CheckFix:
    """The fix when the fp16 files fit: the fp16 edit alone."""
    return CheckFix(
        edits=edits,
        keys=keys,
        changes={"precision": (before, workload.precision)},
        estimate=est,
        plan="fp16 on a GPU without bf16",
        workload=workload,
    )
