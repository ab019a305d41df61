"""DeepSpeed JSON (deepspeed.ai/docs/config-json: ``zero_optimization.stage``,
``offload_optimizer.device``, ``offload_param.device``, ``train_micro_batch_size_per_gpu``,
``gradient_accumulation_steps``, ``bf16.enabled``, ``fp16.enabled``; ``"auto"`` defers to the
training config) and accelerate's config YAML (``distributed_type``, ``num_processes``,
``mixed_precision``, ``fsdp_config``, ``deepspeed_config``), as ``accelerate config`` writes it."""

from __future__ import annotations

from typing import Any

from memfit.jobfiles.names import MIXED
from memfit.jobfiles.reader import KeyReader, Warning_, as_bool, as_int, is_auto, is_unset

DS_NO_EFFECT = (
    "optimizer.params",
    "scheduler",
    "gradient_clipping",
    "steps_per_print",
    "wall_clock_breakdown",
    "zero_optimization.overlap_comm",
    "zero_optimization.contiguous_gradients",
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.allgather_bucket_size",
    "zero_optimization.reduce_scatter",
    "zero_optimization.allgather_partitions",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
    "zero_optimization.stage3_max_live_parameters",
    "zero_optimization.stage3_max_reuse_distance",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save",
    "zero_optimization.sub_group_size",
    "zero_optimization.round_robin_gradients",
    "zero_optimization.offload_optimizer.pin_memory",
    "zero_optimization.offload_param.pin_memory",
    "train_batch_size",
    "fp16.loss_scale",
    "fp16.loss_scale_window",
    "fp16.initial_scale_power",
    "fp16.hysteresis",
    "fp16.min_loss_scale",
    "fp16.auto_cast",
    "bf16.immediate_grad_update",
    "zero_allow_untested_optimizer",
    "communication_data_type",
    "prescale_gradients",
    "gradient_predivide_factor",
)


def read_deepspeed(r: KeyReader) -> None:
    stage = r.take("zero_optimization.stage", 0)
    if is_auto(stage):
        stage = 0
    stage = as_int(r, "zero_optimization.stage", stage, low=0)
    if stage not in (0, 1, 2, 3):
        raise r.fail("zero_optimization.stage", stage, "must be 0, 1, 2 or 3")
    opt_dev, par_dev = _zero_layout(
        r,
        stage,
        (
            "zero_optimization.stage",
            "zero_optimization.offload_optimizer.device",
            "zero_optimization.offload_param.device",
        ),
    )
    for dev, key in ((opt_dev, "offload_optimizer"), (par_dev, "offload_param")):
        if dev == "nvme":
            r.warnings.append(
                _w(
                    r,
                    f"zero_optimization.{key}.device",
                    "NVMe offload is estimated as CPU offload (GPU side is the same)",
                )
            )
    hpz = r.take("zero_optimization.zero_hpz_partition_size", 1)
    if not is_auto(hpz) and as_int(r, "zero_optimization.zero_hpz_partition_size", hpz) > 1:
        r.set(
            "zero_hpz_partition_size",
            as_int(r, "zero_optimization.zero_hpz_partition_size", hpz),
            "zero_optimization.zero_hpz_partition_size",
            hpz,
        )
    for key, field in (
        ("train_micro_batch_size_per_gpu", "batch_size"),
        ("gradient_accumulation_steps", "grad_accum"),
    ):
        v = r.take(key, "auto")
        if not is_auto(v):
            r.set(field, as_int(r, key, v), key, v)
    for key, dtype in (("bf16.enabled", "bf16"), ("fp16.enabled", "fp16")):
        v = r.take(key, False)
        if not is_auto(v) and as_bool(r, key, v):
            r.set("precision", MIXED[dtype], key, v)
    opt = r.take("optimizer.type", None)
    if isinstance(opt, str) and opt.lower() not in ("adamw", "adam", "auto"):
        r.warnings.append(
            _w(r, "optimizer.type", f"DeepSpeed optimizer {opt} is estimated as AdamW")
        )
    r.not_modelled(
        "activation_checkpointing",
        "DeepSpeed's own activation checkpointing "
        "(partitioned / CPU checkpointing); use gradient_checkpointing in the trainer",
    )
    r.no_effect(DS_NO_EFFECT)


def _zero_layout(r: KeyReader, stage: int, keys: tuple[str, str, str]) -> tuple[Any, Any]:
    """ZeRO stage and offload devices (the DeepSpeed JSON and accelerate's plugin name them
    differently): ``keys`` = (stage, optimizer offload device, parameter offload device)."""
    stage_key, opt_key, par_key = keys
    if stage:
        r.set("shard", f"zero{stage}", stage_key, stage)
    opt_dev = r.take(opt_key, "none")
    par_dev = r.take(par_key, "none")
    if par_dev in ("cpu", "nvme"):
        r.set("offload", "params", par_key, par_dev)
    elif opt_dev in ("cpu", "nvme"):
        r.set("offload", "optimizer", opt_key, opt_dev)
    return opt_dev, par_dev


def _w(r: KeyReader, key: str, message: str) -> Any:
    return Warning_(key=key, file=r.file, message=message)


ACCELERATE_NO_EFFECT = (
    "compute_environment",
    "debug",
    "downcast_bf16",
    "machine_rank",
    "main_training_function",
    "num_machines",
    "rdzv_backend",
    "same_network",
    "tpu_env",
    "tpu_use_cluster",
    "tpu_use_sudo",
    "use_cpu",
    "main_process_ip",
    "main_process_port",
    "gpu_ids",
    "enable_cpu_affinity",
    "fsdp_config.fsdp_auto_wrap_policy",
    "fsdp_config.fsdp_backward_prefetch",
    "fsdp_config.fsdp_forward_prefetch",
    "fsdp_config.fsdp_sync_module_states",
    "fsdp_config.fsdp_use_orig_params",
    "fsdp_config.fsdp_transformer_layer_cls_to_wrap",
    "fsdp_config.fsdp_cpu_ram_efficient_loading",
    "deepspeed_config.deepspeed_multinode_launcher",
    "deepspeed_config.zero3_init_flag",
    "deepspeed_config.zero3_save_16bit_model",
    "deepspeed_config.gradient_clipping",
)


def _fsdp2_layout(r: KeyReader, strategy: str) -> None:
    """accelerate's FSDP2 names onto memfit's FSDP2 fields: ``fsdp_reshard_after_forward``
    (a bool under ``fsdp_version: 2``; FSDP1 strategy names there are read as the sharding
    strategy above) and ``HYBRID_SHARD`` — FSDP inside a node, replicated across
    ``num_machines`` (HSDP, accelerate's ``FullyShardedDataParallelPlugin``)."""
    raw = r.take("fsdp_config.fsdp_reshard_after_forward", None)
    if isinstance(raw, bool) or str(raw).lower() in ("true", "false"):
        value = raw if isinstance(raw, bool) else str(raw).lower() == "true"
        if value is False:
            r.set("reshard_after_forward", False, "fsdp_config.fsdp_reshard_after_forward", raw)
    machines = r.take("num_machines", 1)
    if strategy in ("4", "HYBRID_SHARD") and isinstance(machines, int) and machines > 1:
        r.set("dp_replicate", int(machines), "num_machines", machines)


def _fsdp_version(r: KeyReader) -> None:
    """``fsdp_config.fsdp_version``: 1 when absent, as accelerate runs it (``accelerate launch
    --fsdp_version`` default "1"; ``FullyShardedDataParallelPlugin`` reads ``FSDP_VERSION``
    with default "1": huggingface/accelerate 16cb6eb8). FSDP1 applies to ``--shard fsdp``
    (FULL_SHARD / HYBRID_SHARD); the other strategies are read as ddp / zero2 above."""
    raw = r.take("fsdp_config.fsdp_version", None)
    version = 1 if raw is None else as_int(r, "fsdp_config.fsdp_version", raw)
    if version not in (1, 2):
        raise r.fail("fsdp_config.fsdp_version", raw, "must be 1 or 2")
    shard = next((s.value for s in reversed(r.settings) if s.field == "shard"), None)
    if version == 1 and shard == "fsdp":
        key = "fsdp_config.fsdp_version"
        r.set("fsdp_version", 1, key, "1 (accelerate's default)" if raw is None else raw)
    read_fsdp_state_dict_type(r, "fsdp_config.fsdp_state_dict_type", version, shard)


#: accelerate's state-dict types (``accelerate/utils/constants.py`` ``FSDP_STATE_DICT_TYPE``
#: at v1.14.0, beb0672a): ``accelerate config`` writes the name, ``FullyShardedDataParallelPlugin``
#: also takes the enum's number (``StateDictType(int(...))``: 1 FULL, 2 LOCAL, 3 SHARDED).
ACCELERATE_STATE_DICT_TYPES = {"1": "FULL_STATE_DICT", "2": "LOCAL_STATE_DICT"}
ACCELERATE_STATE_DICT_TYPES["3"] = "SHARDED_STATE_DICT"

#: Why an FSDP2 file's ``fsdp_state_dict_type`` changes no GPU figure (accelerate v1.14.0
#: ``utils/fsdp_utils.py`` ``_prepare_sd_options``: FSDP2 saves through
#: ``torch.distributed.checkpoint.state_dict.get_model_state_dict`` with ``cpu_offload`` from the
#: plugin's config, which ``set_state_dict_type`` sets True for both types).
FSDP2_SAVE_NOTE = (
    "read, no GPU phase: accelerate saves an FSDP2 (fsdp_version 2) model with "
    "torch.distributed.checkpoint's get_model_state_dict(cpu_offload=True), each tensor copied "
    "to the CPU in turn; memfit models the checkpoint's GPU copies for FSDP1 only"
)


def read_fsdp_state_dict_type(r: KeyReader, key: str, version: int, shard: Any) -> None:
    """``key`` (accelerate's ``fsdp_config.fsdp_state_dict_type``, HF Trainer's
    ``fsdp_config.state_dict_type``): the checkpoint's state-dict type, carried into the job
    under FSDP1 with ``shard`` fsdp (:mod:`memfit.estimate.fsdp1_save` adds the save phase);
    absent, no phase (whether the script saves during training is not in the file; accelerate's
    and transformers' default type for FSDP1 is FULL_STATE_DICT, one unit at a time). Under
    FSDP2 it is read and said to change nothing; under other strategies (NO_SHARD /
    SHARD_GRAD_OP, read as ddp / zero2) it has no effect here."""
    if not r.has(key):
        return
    raw = r.take(key)
    if is_unset(raw) or shard != "fsdp":
        return
    name = ACCELERATE_STATE_DICT_TYPES.get(str(raw), str(raw).upper())
    if name not in ACCELERATE_STATE_DICT_TYPES.values():
        raise r.fail(key, raw, "must be FULL_STATE_DICT, LOCAL_STATE_DICT or SHARDED_STATE_DICT")
    if version != 1:
        r.warn(key, FSDP2_SAVE_NOTE)
    elif name == "LOCAL_STATE_DICT":
        r.warn(key, "LOCAL_STATE_DICT saves each rank's flat-parameter shard itself: no copy")
    else:
        r.set("fsdp_state_dict_type", name, key, raw)


def read_accelerate(r: KeyReader) -> None:
    kind = str(r.take("distributed_type", "NO")).upper()
    procs = as_int(r, "num_processes", r.take("num_processes", 1))
    r.gpus("num_processes", procs, procs, "accelerate launch --num_processes")
    mp = str(r.take("mixed_precision", "no")).lower()
    if mp in MIXED:
        r.set("precision", MIXED[mp], "mixed_precision", mp)
    elif mp == "fp8":
        r.not_modelled("mixed_precision", "FP8 training (transformer-engine / MS-AMP)")
    if kind == "FSDP":
        strategy = str(r.take("fsdp_config.fsdp_sharding_strategy", "FULL_SHARD")).upper()
        if strategy in ("1", "FULL_SHARD", "HYBRID_SHARD"):
            r.set("shard", "fsdp", "fsdp_config.fsdp_sharding_strategy", strategy)
        elif strategy in ("2", "SHARD_GRAD_OP", "_HYBRID_SHARD_ZERO2"):
            r.set("shard", "zero2", "fsdp_config.fsdp_sharding_strategy", strategy)
        elif strategy in ("3", "NO_SHARD"):
            r.set("shard", "ddp", "fsdp_config.fsdp_sharding_strategy", strategy)
        _fsdp_version(r)
        _fsdp2_layout(r, strategy)
        off = r.take("fsdp_config.fsdp_offload_params", False)
        if as_bool(r, "fsdp_config.fsdp_offload_params", off):
            r.set("offload", "params", "fsdp_config.fsdp_offload_params", off)
        ac = r.take("fsdp_config.fsdp_activation_checkpointing", False)
        if as_bool(r, "fsdp_config.fsdp_activation_checkpointing", ac):
            r.set("checkpointing", "full", "fsdp_config.fsdp_activation_checkpointing", ac)
    elif kind == "DEEPSPEED":
        stage = as_int(
            r, "deepspeed_config.zero_stage", r.take("deepspeed_config.zero_stage", 0), low=0
        )
        _zero_layout(
            r,
            stage,
            (
                "deepspeed_config.zero_stage",
                "deepspeed_config.offload_optimizer_device",
                "deepspeed_config.offload_param_device",
            ),
        )
        v = r.take("deepspeed_config.gradient_accumulation_steps", None)
        if v is not None and not is_auto(v):
            r.set(
                "grad_accum",
                as_int(r, "deepspeed_config.gradient_accumulation_steps", v),
                "deepspeed_config.gradient_accumulation_steps",
                v,
            )
        r.take("deepspeed_config.deepspeed_config_file", None)
    elif kind in ("MULTI_GPU", "NO"):
        pass
    else:
        r.not_modelled("distributed_type", f"{kind} is not modelled (GPU, FSDP, DeepSpeed are)")
    r.no_effect(ACCELERATE_NO_EFFECT)
