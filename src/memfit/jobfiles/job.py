"""A combined :class:`~memfit.jobfiles.files.Job` as memfit's inputs: the MODEL argument and
the :class:`~memfit.spec.WorkloadSpec` (validated by the spec, with the file and key in the
message when a value breaks a rule)."""

from __future__ import annotations

from typing import Any

from memfit.errors import SpecError
from memfit.jobfiles.files import Job
from memfit.jobfiles.torchtitan import chunks_per_rank
from memfit.spec import WorkloadSpec
from memfit.spec.parallel_rules import resolve_schedule

#: Job fields that are WorkloadSpec fields.
WORKLOAD_FIELDS = (
    "mode",
    "batch_size",
    "seq_len",
    "grad_accum",
    "precision",
    "checkpointing",
    "optimizer",
    "lora_rank",
    "lora_targets",
    "lora_modules_to_save",
    "quant",
    "prepare_kbit",
    "attention",
    "shard",
    "offload",
    "gpus",
    "freeze_layers",
    # FSDP2 / HSDP (par-a)
    "dp_replicate",
    "reshard_after_forward",
    "zero_hpz_partition_size",
    "optimizer_in_bwd",
    "loss",
    "kernels",
    "compile",
    # FSDP1 (issue 30)
    "fsdp_version",
    "fsdp_lora_wrap",
    "fsdp_state_dict_type",
    # tensor / pipeline / context / expert parallelism, Float8 (torchtitan files)
    "tp",
    "sequence_parallel",
    "async_tp",
    "pp",
    "pp_schedule",
    "pp_virtual_stages",
    "cp",
    "cp_rotate",
    "ep",
    "etp",
    "float8",
    "float8_all_gather",
    "selective_ac_option",
    # peft's LoRA dropout (the frameworks' lora_dropout keys)
    "lora_dropout",
)


def model_of(job: Job, override: str | None = None) -> str:
    if override:
        return override
    model = job.value("model")
    if not model and job.value("_model_refused"):  # a model the file names, not bundled
        raise SpecError(str(job.value("_model_refused")))
    if not model:
        names = ", ".join(f.reader.file for f in job.files)
        raise SpecError(
            f"no model in {names} (base_model / model_name_or_path / checkpoint_dir): pass "
            "--model NAME"
        )
    return str(model)


def workload_of(
    job: Job, *, overrides: dict[str, Any] | None = None, n_layers: int | None = None
) -> WorkloadSpec:
    kwargs: dict[str, Any] = {
        name: job.fields[name].value for name in WORKLOAD_FIELDS if name in job.fields
    }
    kwargs.update({k: v for k, v in (overrides or {}).items() if v is not None})
    if "seq_len" not in kwargs:
        raise SpecError(
            "the files give no sequence length (max_length / sequence_len / cutoff_len / "
            "max_seq_len / max_seq_length): pass --seq N"
        )
    split = job.value("_pp_layers_per_stage")
    if kwargs.get("pp", 1) > 1 and "pp_virtual_stages" not in kwargs:
        # torchtitan's stages per rank: from pipeline_parallel_layers_per_stage and the layer
        # count, else its default for the schedule (one chunk, or two for a looped schedule)
        if split is not None and n_layers is None:
            raise SpecError("pipeline_parallel_layers_per_stage needs the model's layer count")
        schedule = resolve_schedule(kwargs.get("pp_schedule", "1f1b"))
        if schedule == "interleaved-1f1b":
            kwargs["pp_virtual_stages"] = chunks_per_rank(
                schedule, kwargs["pp"], split, n_layers or 0
            )
    freeze = kwargs.get("freeze_layers", 0)
    if isinstance(freeze, int) and freeze < 0:  # LLaMA-Factory: the last N layers train
        if n_layers is None:
            raise SpecError("freeze_trainable_layers needs the model's layer count")
        kwargs["freeze_layers"] = max(0, n_layers + freeze)
    try:
        return WorkloadSpec(**kwargs)
    except SpecError as exc:
        where = "; ".join(s.describe() for s in job.fields.values() if s.field in str(exc))
        raise SpecError(f"{exc}{' — from ' + where if where else ''}") from None
