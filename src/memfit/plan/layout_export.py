"""A planned layout as each framework takes it: torchtitan, Megatron-LM, DeepSpeed, accelerate.

Keys are spelled as the frameworks' own parsers read them, at the commits named here (tests
check every key against the parser's field / flag list shipped in ``tests/plan/data``):

- **torchtitan 0.3.0** (PyPI, the installed release): runs are Python configurations
  (``Trainer.Config``; ``--module`` / ``--config``), the ``--section.option`` CLI overrides
  (tyro) still work. :func:`torchtitan_overrides` gives those overrides (``TrainingConfig`` /
  ``ParallelismConfig`` fields of ``torchtitan/config/configs.py``) and
  :func:`torchtitan_recipe` the same as the lines of a configuration function, with the
  activation-checkpointing policy (``torchtitan/distributed/activation_checkpoint.py``:
  ``FullAC`` / ``SelectiveAC`` / None), which the CLI takes only as a tyro subcommand. (The
  repository's main branch after 0.3.0, b5bcd76, renames the batch fields to token counts —
  ``training.num_tokens_per_microbatch_per_dp_rank`` — and ``num_pp_microbatches``: not
  exported.)
- **torchtitan 0.2.2** (73a0e69, the last release with TOML job files,
  ``torchtitan/config/job_config.py``): :func:`torchtitan_toml`.
- **Megatron-LM** (NVIDIA/Megatron-LM d98e8a6, ``megatron/training/arguments.py``, whose
  parser is built from its config dataclasses): :func:`megatron_args`.
- **DeepSpeed** (deepspeedai/DeepSpeed edaa722, ``deepspeed/runtime/config.py``,
  ``zero/config.py``, ``tensor_parallel/config.py``): :func:`deepspeed_layout_config`;
  pipeline stages are set in code (``PipelineModule(num_stages=...)``), not in the JSON.
- **accelerate** (>= 1.10, ``ParallelismConfig`` in the config file as
  ``parallelism_config_*`` keys; FSDP2 keys as :func:`memfit.plan.export.fsdp_config`):
  :func:`accelerate_layout_config`; it has no pipeline or expert parallelism.

A layout planned with Megatron's distributed optimizer (``shard = zero1``) exports to
torchtitan / accelerate as FSDP (neither has a ZeRO-1 mode): the notes say so, and that
``memfit estimate ... --shard fsdp`` gives its memory there.
"""

from __future__ import annotations

import math
from typing import Any

from memfit.estimate.parallel.layouts import LayoutPeak

#: torchtitan's schedule class names (``torch.distributed.pipelining.schedules``
#: ``get_schedule_class``) by memfit's names.
TORCHTITAN_SCHEDULES = {
    "gpipe": "GPipe",
    "1f1b": "1F1B",
    "interleaved-1f1b": "Interleaved1F1B",
    "zbv": "ZBVZeroBubble",
    "dualpipev": "DualPipeV",
}
#: What torchtitan adds to the layer count when it splits stages (``input_weight`` and
#: ``output_weight`` of ``generate_llm_fqn_per_model_part``: embeddings and head weigh a layer).
TORCHTITAN_EXTRA_LAYERS = 2
#: The commits the keys were read at.
SOURCES = {
    "torchtitan": "torchtitan 0.3.0 from PyPI (torchtitan/config/configs.py)",
    "torchtitan_toml": "pytorch/torchtitan v0.2.2 73a0e6979dd1 (torchtitan/config/job_config.py)",
    "megatron": "NVIDIA/Megatron-LM d98e8a64ddf3 (megatron/training/arguments.py)",
    "deepspeed": "deepspeedai/DeepSpeed edaa72212672 (deepspeed/runtime/config.py)",
    "accelerate": "huggingface/accelerate >= 1.10 (ParallelismConfig, config file keys)",
}


def _v(p: LayoutPeak) -> int:
    """Chunks per pipeline rank."""
    if p.pp == 1:
        return 1
    return 2 if p.pp_schedule in ("zbv", "dualpipev") else p.pp_virtual_stages


def _layers_per_stage(p: LayoutPeak, n_layers: int) -> int | None:
    """torchtitan's ``pipeline_parallel_layers_per_stage`` for multi-chunk schedules: None
    where its default gives the layout's chunks (two per rank for every multi-stage schedule,
    ``torchtitan/distributed/pipeline_parallel.py`` ``pipeline_llm``), else a value whose
    ``ceil((layers + 2) / layers_per_stage)`` stages are exactly ``pp x chunks`` (torchtitan
    refuses a count the pipeline ranks do not divide; a plain ``ceil`` of the quotient can give
    one: 32 layers over 4 x 2 stages of 5 is 7 stages)."""
    v = _v(p)
    if v <= 2:
        return None
    total, stages = n_layers + TORCHTITAN_EXTRA_LAYERS, p.pp * v
    return next((k for k in range(1, total + 1) if math.ceil(total / k) == stages), None)


def _fsdp_pipeline(p: LayoutPeak) -> dict[str, Any]:
    """torchtitan reshards FSDP2's parameters after forward except under a pipeline
    (``fsdp_reshard_after_forward = "default"``, ``apply_fsdp``); memfit's layouts are
    estimated resharded (``WorkloadSpec.reshard_after_forward``), so a pipeline layout says
    ``always`` to run as planned."""
    return {"fsdp_reshard_after_forward": "always"} if p.pp > 1 and p.dp * p.cp > 1 else {}


def torchtitan_values(p: LayoutPeak, *, seq_len: int, global_batch: int, n_layers: int) -> dict:
    """``{section: {field: value}}`` of torchtitan 0.3.0 (fields left at their default out;
    sequence parallelism is its default, ``enable_sequence_parallel = True``). Batch: torchtitan
    accumulates ``global_batch_size / (local_batch_size x dp)`` steps; under a pipeline the
    local batch is cut into ``pipeline_parallel_microbatch_size`` micro-batches."""
    par: dict[str, Any] = {"data_parallel_shard_degree": p.dp}
    if p.tp > 1:
        par["tensor_parallel_degree"] = p.tp
    if p.pp > 1:
        par["pipeline_parallel_degree"] = p.pp
        par["pipeline_parallel_schedule"] = TORCHTITAN_SCHEDULES[p.pp_schedule]
        par["pipeline_parallel_microbatch_size"] = p.micro_batch
        lps = _layers_per_stage(p, n_layers)
        if lps is not None:
            par["pipeline_parallel_layers_per_stage"] = lps
        par.update(_fsdp_pipeline(p))
    if p.cp > 1:
        par["context_parallel_degree"] = p.cp
    if p.ep > 1:
        par["expert_parallel_degree"] = p.ep
    local = global_batch // p.dp if p.pp > 1 else p.micro_batch
    training = {"local_batch_size": local, "global_batch_size": global_batch, "seq_len": seq_len}
    return {"training": training, "parallelism": par}


def torchtitan_overrides(
    p: LayoutPeak, *, seq_len: int, global_batch: int, n_layers: int
) -> list[str]:
    """The ``--section.option value`` CLI overrides of torchtitan 0.3.0 (tyro over its config
    dataclasses; a bool field would be a ``--flag`` / ``--no-flag`` pair, none is exported)."""
    out = []
    for section, fields in torchtitan_values(
        p, seq_len=seq_len, global_batch=global_batch, n_layers=n_layers
    ).items():
        for k, v in fields.items():
            out += [f"--{section}.{k}", _cli(v)]
    return out


def _cli(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


#: torchtitan 0.3's activation-checkpointing policy per memfit checkpointing mode (a tyro
#: subcommand on the CLI: ``activation_checkpoint:full``; a config object in Python).
TORCHTITAN_AC = {"none": "None", "selective": "SelectiveAC.Config()", "full": "FullAC.Config()"}


def torchtitan_recipe(p: LayoutPeak, *, seq_len: int, global_batch: int, n_layers: int) -> str:
    """The layout as the lines of a torchtitan 0.3 configuration function."""
    lines = ["config = <your base config>()  # e.g. torchtitan_recipes.llama3"]
    for section, fields in torchtitan_values(
        p, seq_len=seq_len, global_batch=global_batch, n_layers=n_layers
    ).items():
        lines += [f"config.{section}.{k} = {v!r}" for k, v in fields.items()]
    lines.append(f"config.activation_checkpoint = {TORCHTITAN_AC[p.checkpointing]}")
    return "\n".join(lines)


def torchtitan_toml(p: LayoutPeak, *, seq_len: int, global_batch: int, n_layers: int) -> str:
    """The layout as torchtitan 0.2.2's TOML job file sections (the last TOML-era release)."""
    per_replica = global_batch // p.dp
    local = per_replica if p.pp > 1 else p.micro_batch
    par: dict[str, Any] = {"data_parallel_shard_degree": p.dp, "tensor_parallel_degree": p.tp}
    par["pipeline_parallel_degree"] = p.pp
    if p.pp > 1:
        par["pipeline_parallel_schedule"] = TORCHTITAN_SCHEDULES[p.pp_schedule]
        par["pipeline_parallel_microbatch_size"] = p.micro_batch
        lps = _layers_per_stage(p, n_layers)
        if lps is not None:
            par["pipeline_parallel_layers_per_stage"] = lps
        par.update(_fsdp_pipeline(p))
    par["context_parallel_degree"] = p.cp
    if p.ep > 1:
        par["expert_parallel_degree"] = p.ep
    ac: dict[str, Any] = {"mode": p.checkpointing}
    if p.checkpointing == "selective":
        ac["selective_ac_option"] = "op"
    sections = {
        "training": {
            "local_batch_size": local,
            "global_batch_size": global_batch,
            "seq_len": seq_len,
        },  # fmt: skip
        "parallelism": par,
        "activation_checkpoint": ac,
    }
    out = []
    for name, fields in sections.items():
        out.append(f"[{name}]")
        out += [f"{k} = {_toml(v)}" for k, v in fields.items()]
        out.append("")
    return "\n".join(out)


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return f'"{v}"' if isinstance(v, str) else str(v)


#: Megatron's ``--recompute-*`` flags per memfit checkpointing mode: full recomputes every layer
#: (``uniform`` over 1-layer groups), selective the attention core (Korthikanti et al. 2022).
MEGATRON_RECOMPUTE = {
    "none": [],
    "selective": ["--recompute-granularity", "selective"],
    "full": ["--recompute-granularity", "full", "--recompute-method", "uniform",
             "--recompute-num-layers", "1"],
}  # fmt: skip


def megatron_args(p: LayoutPeak, *, seq_len: int, global_batch: int, n_layers: int) -> list[str]:
    """``pretrain_gpt.py`` arguments of the layout (Megatron-LM runs 1F1B and interleaved
    1F1B: a V-schedule layout is exported as interleaved with its 2 chunks per rank)."""
    args = ["--tensor-model-parallel-size", str(p.tp), "--pipeline-model-parallel-size", str(p.pp)]
    v = _v(p)
    if v > 1:
        args += ["--num-layers-per-virtual-pipeline-stage", str(max(1, n_layers // (p.pp * v)))]
    args += ["--context-parallel-size", str(p.cp)]
    if p.ep > 1:
        args += ["--expert-model-parallel-size", str(p.ep)]
    if p.tp > 1:
        args.append("--sequence-parallel")
    if p.shard == "zero1":
        args.append("--use-distributed-optimizer")
    elif p.shard == "fsdp" and p.dp * p.cp > 1:
        args += ["--use-torch-fsdp2"]
    args += MEGATRON_RECOMPUTE[p.checkpointing]
    args += ["--micro-batch-size", str(p.micro_batch), "--global-batch-size", str(global_batch)]
    args += ["--seq-length", str(seq_len), "--bf16"]
    return args


def megatron_notes(p: LayoutPeak, n_layers: int) -> list[str]:
    notes = []
    if p.pp_schedule in ("zbv", "dualpipev") and p.pp > 1:
        notes.append(
            f"Megatron-LM has no {p.pp_schedule} schedule: exported as interleaved 1F1B with 2 "
            "chunks per rank (its bubble is (pp-1)/(2m), not zero)"
        )
    if _v(p) > 1 and n_layers % (p.pp * _v(p)):
        notes.append(
            f"{n_layers} layers do not split evenly into {p.pp * _v(p)} virtual stages: set "
            "--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers"
        )
    return notes


def deepspeed_layout_config(p: LayoutPeak, *, global_batch: int) -> dict[str, Any]:
    """The DeepSpeed JSON of the layout (ZeRO-3 for FSDP, ZeRO-1 for the distributed optimizer
    and under a pipeline, which DeepSpeed's pipeline engine requires)."""
    stage = 3 if p.shard == "fsdp" and p.pp == 1 else 1
    cfg: dict[str, Any] = {
        "train_batch_size": global_batch,
        "train_micro_batch_size_per_gpu": p.micro_batch,
        "gradient_accumulation_steps": p.grad_accum,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": stage},
    }
    if p.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": p.tp}
    if p.cp > 1:
        cfg["sequence_parallel_size"] = p.cp
    if p.checkpointing != "none":
        cfg["activation_checkpointing"] = {
            "partition_activations": p.tp > 1,
            "contiguous_memory_optimization": False,
        }
    return cfg


def deepspeed_notes(p: LayoutPeak) -> list[str]:
    notes = []
    if p.pp > 1:
        notes.append(
            f"pipeline: build the model as deepspeed.pipe.PipelineModule(layers, num_stages={p.pp})"
            " (DeepSpeed runs its own 1F1B-style schedule; the JSON has no stage count)"
        )
    if p.cp > 1:
        notes.append(
            "sequence_parallel_size is DeepSpeed-Ulysses (all-to-all over heads), not ring "
            "attention: the degree is the same, the buffers differ"
        )
    if p.checkpointing == "selective":
        notes.append("DeepSpeed checkpoints whole layers (deepspeed.checkpointing.checkpoint)")
    if p.ep > 1:
        notes.append(f"experts: deepspeed.moe.layer.MoE(ep_size={p.ep}) in the model code")
    return notes


def accelerate_layout_config(p: LayoutPeak, *, n_nodes: int) -> dict[str, Any] | None:
    """The ``accelerate launch --config_file`` YAML (as a dict) of the layout; None under a
    pipeline or expert parallelism (accelerate has neither)."""
    if p.pp > 1 or p.ep > 1:
        return None
    gpus = p.dp * p.tp * p.cp
    return {
        "distributed_type": "FSDP",
        "num_machines": n_nodes,
        "num_processes": gpus,
        "mixed_precision": "bf16",
        "fsdp_config": {
            "fsdp_version": 2,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_reshard_after_forward": True,
            "fsdp_activation_checkpointing": p.checkpointing != "none",
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        },
        "parallelism_config": {
            "parallelism_config_dp_replicate_size": 1,
            "parallelism_config_dp_shard_size": p.dp,
            "parallelism_config_tp_size": p.tp,
            "parallelism_config_cp_size": p.cp,
        },
    }


def _torchtitan_notes(p: LayoutPeak, shard_note: list[str]) -> list[str]:
    notes = list(shard_note)
    if p.checkpointing == "selective":
        notes.append(
            "torchtitan's SelectiveAC is per-op (saves matmul outputs, recomputes the rest): "
            "memfit estimated attention-core recomputation (Megatron's selective)"
        )
    return notes


def export_layout(
    p: LayoutPeak, *, seq_len: int, global_batch: int, n_layers: int, n_nodes: int
) -> dict[str, Any]:
    """Every export of the layout, with the notes of each and the commits the keys follow."""
    kw = {"seq_len": seq_len, "global_batch": global_batch, "n_layers": n_layers}
    shard_note = (
        ["planned with Megatron's distributed optimizer (zero1); this framework has no ZeRO-1 "
         "mode: FSDP is the nearest, check it with `memfit estimate ... --shard fsdp`"]
        if p.shard == "zero1" else []
    )  # fmt: skip
    acc = accelerate_layout_config(p, n_nodes=n_nodes)
    return {
        "torchtitan": {
            "overrides": torchtitan_overrides(p, **kw),
            "recipe": torchtitan_recipe(p, **kw),
            "notes": _torchtitan_notes(p, shard_note),
        },
        "torchtitan_toml": torchtitan_toml(p, **kw),
        "megatron": {"args": megatron_args(p, **kw), "notes": megatron_notes(p, n_layers)},
        "deepspeed": {
            "config": deepspeed_layout_config(p, global_batch=global_batch),
            "notes": deepspeed_notes(p),
        },
        "accelerate": {
            "config": acc,
            "notes": [*shard_note] if acc else ["accelerate has no pipeline / expert parallelism"],
        },
        "sources": dict(SOURCES),
    }


__all__ = [
    "SOURCES",
    "accelerate_layout_config",
    "deepspeed_layout_config",
    "export_layout",
    "megatron_args",
    "torchtitan_overrides",
    "torchtitan_recipe",
    "torchtitan_toml",
]
