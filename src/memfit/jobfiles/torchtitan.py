"""torchtitan TOML job files (torchtitan <= 0.2: ``torchtitan/models/*/train_configs/*.toml``,
read by ``torchtitan/config/job_config.py`` until the Feb-2026 switch to Python configurations,
pytorch/torchtitan#2386 at 9810191bb; the keys and defaults here are those of 238fa9953, the
commit before it, with the older spellings of the 2024 layout — ``training.batch_size``,
``training.*_degree``, ``[experimental]`` pipeline / context keys, ``[float8]`` — read as
``torchtitan/config_manager.py`` at 9dec370 named them).

How torchtitan runs a job, and so how memfit reads it (238fa9953):

- The GPUs come from the launcher (``NGPU`` / ``torchrun --nproc-per-node``):
  ``data_parallel_replicate_degree x data_parallel_shard_degree x context_parallel_degree x
  tensor_parallel_degree x pipeline_parallel_degree`` must equal them
  (``distributed/parallel_dims.py``), and a shard degree of -1 takes the rest. memfit takes the
  count from ``memfit check --gpus N`` where the degrees leave it open.
- FSDP2 runs where ``dp_shard > 1`` or ``cp > 1`` (``ParallelDims.fsdp_enabled``), with
  ``MixedPrecisionPolicy(param_dtype = training.mixed_precision_param, reduce_dtype =
  training.mixed_precision_reduce)`` over fp32 parameters (``training.dtype = "float32"``):
  memfit's ``--precision bf16-mixed --shard fsdp`` (:data:`memfit.spec.rules.FSDP_MIXED_POLICY`).
  Without FSDP, DDP / one GPU runs the step under autocast (``bf16-mixed``), and TP or PP alone
  runs in fp32 (``distributed/utils.py`` ``maybe_enable_amp``). ``training.dtype = "bfloat16"``
  is pure bf16 (``bf16-true``).
- ``fsdp_reshard_after_forward = "default"`` reshards after forward except under a pipeline
  (``models/llama3/infra/parallelize.py`` ``apply_fsdp``).
- Tensor parallelism always shards the sequence (``apply_tp``: ``SequenceParallel`` norms, no
  switch) with the loss parallel over the vocabulary unless ``disable_loss_parallel``.
- ``local_batch_size`` is per data-parallel rank; ``global_batch_size`` (-1: local x dp) sets
  the accumulation; under a pipeline the local batch is cut into
  ``pipeline_parallel_microbatch_size`` micro-batches (memfit's ``--batch`` and ``--grad-accum``
  of a pipeline: the micro-batch and their count).
- ``activation_checkpoint.mode = "selective"`` with ``selective_ac_option = "op"`` is the per-op
  policy (memfit's ``selective-op``); an integer N checkpoints every N-th block (1: all of them,
  full checkpointing; N >= 2: memfit's ``selective-layer``, not under compile).
- ``enable_async_tensor_parallel`` (with TP): memfit's ``async_tp``; it needs ``compile.enable``
  with ``"model"`` in ``compile.components`` (torchtitan's RuntimeError: exit 2 here).
- Float8: ``model.converters = ["float8"]`` (older: ``float8.enable_float8_linear``) with
  ``quantize.linear.float8.recipe_name`` (None: tensorwise) and
  ``enable_fsdp_float8_all_gather`` (taken only with ``dp_shard > 1``,
  ``components/quantization/float8.py``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from memfit.errors import SpecError
from memfit.jobfiles.names import MIXED, TRUE
from memfit.jobfiles.reader import KeyReader, as_bool, as_int
from memfit.spec.parallel_rules import resolve_schedule

#: torchtitan's ``(model.name, model.flavor)`` → memfit's bundled model
#: (``torchtitan/models/llama3/__init__.py`` ``llama3_args``: the Llama 3.1 shapes).
TORCHTITAN_MODELS = {
    ("llama3", "8B"): "llama-3.1-8b",
    ("llama3", "70B"): "llama-3.1-70b",
}
#: Models torchtitan names that memfit knows but does not bundle.
UNBUNDLED = {("llama3", "405B"): "Llama 3.1 405B (meta-llama/Llama-3.1-405B's config.json)"}
#: Newer key ← the older spellings torchtitan read before (9dec370, Dec 2024).
OLD_KEYS = {
    "training.local_batch_size": ("training.batch_size",),
    "parallelism.data_parallel_replicate_degree": ("training.data_parallel_replicate_degree",),
    "parallelism.data_parallel_shard_degree": ("training.data_parallel_shard_degree",),
    "parallelism.tensor_parallel_degree": ("training.tensor_parallel_degree",),
    "parallelism.disable_loss_parallel": ("training.disable_loss_parallel",),
    "parallelism.enable_async_tensor_parallel": ("experimental.enable_async_tensor_parallel",),
    "parallelism.pipeline_parallel_degree": ("experimental.pipeline_parallel_degree",),
    "parallelism.pipeline_parallel_schedule": ("experimental.pipeline_parallel_schedule",),
    "parallelism.pipeline_parallel_schedule_csv": ("experimental.pipeline_parallel_schedule_csv",),
    "parallelism.context_parallel_degree": ("experimental.context_parallel_degree",),
    "parallelism.context_parallel_rotate_method": ("experimental.context_parallel_rotate_method",),
    "training.enable_cpu_offload": (),
    "compile.enable": ("training.compile",),
    "quantize.linear.float8.enable_fsdp_float8_all_gather": (
        "float8.enable_fsdp_float8_all_gather",
    ),
    "quantize.linear.float8.recipe_name": ("float8.recipe_name",),
    "quantize.linear.float8.filter_fqns": ("float8.filter_fqns",),
}
#: torchtitan's single-stage pipeline schedules (one model chunk per rank), memfit's names.
SINGLE_STAGE = ("gpipe", "1f1b")
#: torchtitan's optimizer names memfit models (``components/optimizer.py``: torch.optim classes).
OPTIMIZERS = {"adamw": "adamw", "adam": "adamw"}
TORCHTITAN_NO_EFFECT = (
    "job",
    "profiling",
    "metrics",
    "checkpoint",
    "lr_scheduler",
    "validation",
    "comm",
    "debug",
    "memory_estimation",
    "model.hf_assets_path",
    "model.tokenizer_path",
    "model.norm_type",
    "model.print_after_conversion",
    "optimizer.lr",
    "optimizer.eps",
    "optimizer.weight_decay",
    "optimizer.beta1",
    "optimizer.beta2",
    "training.dataset",
    "training.dataset_path",
    "training.max_norm",
    "training.steps",
    "training.warmup_steps",
    "training.gc_freq",
    "training.gc_debug",
    "training.seed",
    "training.deterministic",
    "training.dataloader",
    "compile.components",
    "compile.backend",
    "activation_checkpoint.preserve_rng_state",
    "activation_checkpoint.determinism_check",
    "activation_checkpoint.debug",
    "activation_checkpoint.early_stop",
    "activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns",
    "parallelism.context_parallel_load_balancer",
    "parallelism.pipeline_parallel_expert_parallel_overlap",
    "parallelism.pipeline_parallel_split_points",
    "experimental.pipeline_parallel_split_points",
    "experimental.custom_import",
    "experimental.custom_args_module",
    "experimental.enable_compiled_autograd",
    "quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp",
    "float8.precompute_float8_dynamic_scale_for_fsdp",
    "quantize.linear.float8.emulate",
    "quantize.linear.mx",
    "quantize.grouped_mm",
    "fault_tolerance.process_group",
    "fault_tolerance.process_group_timeout_ms",
    "fault_tolerance.replica_id",
    "fault_tolerance.group_size",
    "fault_tolerance.min_replica_size",
    "fault_tolerance.semi_sync_method",
)


def _take(r: KeyReader, key: str, default: Any = None) -> tuple[str, Any]:
    """The value of ``key`` or of an older spelling of it, and the key it came from."""
    for k in (key, *OLD_KEYS.get(key, ())):
        if r.has(k):
            return k, r.take(k)
    return key, default


def is_old_layout(data: dict[str, Any]) -> bool:
    """A 2024-layout file (``training.batch_size``, degrees under ``[training]``)."""
    training = data.get("training")
    return isinstance(training, dict) and (
        "batch_size" in training or "data_parallel_shard_degree" in training
    )


def read_torchtitan(r: KeyReader) -> None:
    r.set("mode", "train", "(a training config)", "train")
    _model(r)
    degrees = _degrees(r)
    fsdp = degrees["dp_shard"] > 1 or degrees["cp"] > 1
    _precision(r, degrees, fsdp)
    _batch(r, degrees)
    key, on = _take(r, "compile.enable", False)
    compiled = as_bool(r, key, on)
    model_compiled = False
    if compiled:
        components = r.flat.get("compile.components", ["model", "loss"])
        model_compiled = isinstance(components, list) and "model" in components
        r.set("compile", model_compiled, key, on)
    _async_tp(r, degrees, model_compiled=model_compiled, compile_key=key)
    _checkpointing(r, compiled=compiled)
    _float8(r, degrees)
    _optimizer(r)
    for key, what in (
        ("parallelism.module_fqns_per_model_part", "a hand-made split of the pipeline stages"),
        ("parallelism.pipeline_parallel_schedule_csv", "a pipeline schedule read from a CSV"),
        ("experimental.pipeline_parallel_schedule_csv", "a pipeline schedule read from a CSV"),
        ("fault_tolerance.enable", "torchft fault tolerance"),
    ):
        r.not_modelled(key, what + ": not modelled")
    r.no_effect(TORCHTITAN_NO_EFFECT)


def _model(r: KeyReader) -> None:
    name = str(r.take("model.name", "llama3"))
    flavor = str(r.take("model.flavor", "debugmodel"))
    assets = r.flat.get("model.hf_assets_path")
    if isinstance(assets, str) and (Path(assets).expanduser() / "config.json").is_file():
        # the checkpoint torchtitan loads holds the model's config.json: read it
        r.take("model.hf_assets_path")
        r.set("model", str(Path(assets).expanduser()), "model.hf_assets_path", assets)
        return
    if (name, flavor) in TORCHTITAN_MODELS:
        r.set("model", TORCHTITAN_MODELS[name, flavor], "model.flavor", f"{name} {flavor}")
        return
    known = ", ".join(f"{n} {f}" for n, f in TORCHTITAN_MODELS)
    what = UNBUNDLED.get((name, flavor))
    why = (
        f"memfit bundles no {what}"
        if what
        else f"memfit knows torchtitan's {known} (and a model.hf_assets_path holding config.json)"
    )
    r.set(
        "_model_refused",
        f"{r.file}: model.name {name!r} flavor {flavor!r}: {why}; pass --model NAME (a bundled "
        "name, a hub id, or a folder holding the model's config.json)",
        "model.flavor",
        f"{name} {flavor}",
    )


def _degree(r: KeyReader, key: str, default: int = 1, *, low: int = 1) -> tuple[str, int]:
    k, v = _take(r, key, default)
    return k, as_int(r, k, v, low=low)


def _degrees(r: KeyReader) -> dict[str, int]:
    """The degrees of the job's mesh, ``gpus`` set (the launcher's count where the shard degree
    takes the rest)."""
    out: dict[str, int] = {}
    keys: dict[str, str] = {}
    for name, key in (
        ("dp_replicate", "parallelism.data_parallel_replicate_degree"),
        ("tp", "parallelism.tensor_parallel_degree"),
        ("pp", "parallelism.pipeline_parallel_degree"),
        ("cp", "parallelism.context_parallel_degree"),
    ):
        keys[name], out[name] = _degree(r, key)
    shard_key, shard = _take(r, "parallelism.data_parallel_shard_degree", -1)
    if shard != -1:
        shard = as_int(r, shard_key, shard)
    fixed = out["dp_replicate"] * out["tp"] * out["pp"] * out["cp"]
    launched = r.launcher_gpus
    if shard == -1:
        if launched is None:
            raise SpecError(
                f"{r.file}: {shard_key} = -1 takes the GPUs the launcher starts (torchtitan's "
                f"NGPU) after the other degrees ({fixed}): pass --gpus N"
            )
        if launched % fixed:
            raise SpecError(
                f"{r.file}: --gpus {launched} is not a multiple of the other degrees "
                f"(replicate x tp x pp x cp = {fixed}), which {shard_key} = -1 needs; change "
                "--gpus or a degree"
            )
        shard = launched // fixed
    elif launched is not None and launched != fixed * shard:
        raise SpecError(
            f"{r.file}: the degrees multiply to {fixed * shard} GPUs but --gpus is {launched} "
            "(torchtitan requires them equal); change --gpus or a degree"
        )
    out["dp_shard"] = shard
    gpus = fixed * shard
    r.set("gpus", gpus, shard_key, shard if launched is None else f"{shard} of --gpus {launched}")
    if out["tp"] > 1:
        r.set("tp", out["tp"], keys["tp"], out["tp"])
        # torchtitan's TP plan always shards the sequence (no switch to turn it off)
        r.set("sequence_parallel", True, keys["tp"], out["tp"])
        key, off = _take(r, "parallelism.disable_loss_parallel", False)
        if as_bool(r, key, off):
            r.warn(key, "a TP loss over the whole vocabulary is not modelled (estimated parallel)")
    else:
        _take(r, "parallelism.disable_loss_parallel")
    if out["cp"] > 1:
        r.set("cp", out["cp"], keys["cp"], out["cp"])
        key, rotate = _take(r, "parallelism.context_parallel_rotate_method", "allgather")
        r.set("cp_rotate", rotate, key, rotate)
    else:
        _take(r, "parallelism.context_parallel_rotate_method")
    for name, key in (
        ("ep", "parallelism.expert_parallel_degree"),
        ("etp", "parallelism.expert_tensor_parallel_degree"),
    ):
        k, v = _degree(r, key)
        if v > 1:
            r.set(name, v, k, v)
    backend = r.take("parallelism.expert_parallel_comm_backend", "standard")
    if backend != "standard":
        r.warn("parallelism.expert_parallel_comm_backend", f"{backend} is not modelled")
    fsdp = shard > 1 or out["cp"] > 1
    if fsdp:
        r.set("shard", "fsdp", shard_key, shard)
        if out["dp_replicate"] > 1:
            r.set("dp_replicate", out["dp_replicate"], keys["dp_replicate"], out["dp_replicate"])
        policy = r.take("parallelism.fsdp_reshard_after_forward", "default")
        table = {"always": True, "never": False, "default": out["pp"] == 1}
        if policy not in table:
            raise r.fail(
                "parallelism.fsdp_reshard_after_forward", policy, "must be default, always or never"
            )
        if not table[policy]:
            r.set("reshard_after_forward", False, "parallelism.fsdp_reshard_after_forward", policy)
        key, off = _take(r, "training.enable_cpu_offload", False)
        if as_bool(r, key, off):
            r.set("offload", "params", key, off)
    else:
        r.set("shard", "ddp" if out["dp_replicate"] > 1 else "none", keys["dp_replicate"], 1)
        r.take("parallelism.fsdp_reshard_after_forward")
        r.take("training.enable_cpu_offload")
    return out


def _async_tp(
    r: KeyReader, degrees: dict[str, int], *, model_compiled: bool, compile_key: str
) -> None:
    """``enable_async_tensor_parallel``: torchtitan turns Inductor's micro-pipelined TP on
    only with tensor parallelism, and refuses it without the model compiled
    (``maybe_enable_async_tp``, ``torchtitan/distributed/tensor_parallel.py`` at 238fa9953;
    the 2024 layout's ``parallelize_llama`` at 9dec370: "Async TP requires
    --training.compile"). ``compile_key``: the key the file spells compile with."""
    key, on = _take(r, "parallelism.enable_async_tensor_parallel", False)
    if not as_bool(r, key, on):
        return
    if degrees["tp"] == 1:
        r.warn(key, "no effect with tensor_parallel_degree 1 (torchtitan applies it with TP only)")
        return
    if not model_compiled:
        if compile_key == "compile.enable":
            said = "Async TP requires 'model' in --compile.components and --compile.enable"
            fix = 'set compile.enable = true with "model" in compile.components'
        else:  # the 2024 layout's [training] compile
            said, fix = "Async TP requires --training.compile", f"set {compile_key} = true"
        rule = f'needs the model compiled: torchtitan raises "{said}"; {fix}, or turn async TP off'
        raise r.fail(key, on, rule)
    r.set("async_tp", True, key, on)


def _precision(r: KeyReader, degrees: dict[str, int], fsdp: bool) -> None:
    dtype = r.take("training.dtype", "float32")
    param = r.take("training.mixed_precision_param", "bfloat16")
    reduce = r.take("training.mixed_precision_reduce", "float32")
    if dtype not in ("float32", "bfloat16"):
        raise r.fail("training.dtype", dtype, "must be float32 or bfloat16")
    if dtype == "bfloat16":  # pure bf16: parameters, gradients and optimizer states
        r.set("precision", TRUE["bf16"], "training.dtype", dtype)
        return
    names = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
    if param not in names:
        raise r.fail("training.mixed_precision_param", param, "must be bfloat16 or float32")
    if param == "float32":
        r.set("precision", TRUE["fp32"], "training.mixed_precision_param", param)
        return
    autocast = degrees["tp"] == 1 and degrees["pp"] == 1  # DDP or one GPU
    if fsdp or autocast:
        r.set("precision", MIXED[names[param]], "training.mixed_precision_param", param)
        if fsdp and reduce != "float32":
            r.warn(
                "training.mixed_precision_reduce",
                f"FSDP2's {reduce} reduce-scatter is estimated as fp32 (the larger)",
            )
    else:
        r.set("precision", TRUE["fp32"], "training.mixed_precision_param", param)
        r.warn(
            "training.mixed_precision_param",
            "torchtitan runs TP / PP without FSDP in fp32 (maybe_enable_amp: mixed precision "
            "needs FSDP, HSDP or CP there): estimated as 32-true",
        )


def _batch(r: KeyReader, degrees: dict[str, int]) -> None:
    key, local = _take(r, "training.local_batch_size", 8)
    local = as_int(r, key, local)
    seq = r.take("training.seq_len", 2048)
    r.set("seq_len", as_int(r, "training.seq_len", seq), "training.seq_len", seq)
    dp = degrees["dp_replicate"] * degrees["dp_shard"]
    glob = r.take("training.global_batch_size", -1)
    accum = 1
    if glob != -1:
        g = as_int(r, "training.global_batch_size", glob)
        if g % (local * dp):
            raise r.fail(
                "training.global_batch_size",
                glob,
                f"must be a multiple of local_batch_size x data-parallel degree ({local} x {dp})",
            )
        accum = g // (local * dp)
    if degrees["pp"] == 1:
        r.set("batch_size", local, key, local)
        if glob != -1:
            r.set("grad_accum", accum, "training.global_batch_size", glob)
        r.take("parallelism.pipeline_parallel_microbatch_size")
        r.take("experimental.pipeline_parallel_microbatches")
        r.take("parallelism.pipeline_parallel_schedule")
        r.take("experimental.pipeline_parallel_schedule")
        r.take("parallelism.pipeline_parallel_layers_per_stage")
        return
    pp = degrees["pp"]
    r.set("pp", pp, "parallelism.pipeline_parallel_degree", pp)
    if r.has("experimental.pipeline_parallel_microbatches"):  # the 2024 layout: a count
        m = as_int(
            r,
            "experimental.pipeline_parallel_microbatches",
            r.take("experimental.pipeline_parallel_microbatches"),
        )
        if local % m:
            raise r.fail(
                "experimental.pipeline_parallel_microbatches", m, f"must divide the batch ({local})"
            )
        micro, mkey = local // m, "experimental.pipeline_parallel_microbatches"
    else:
        mkey = "parallelism.pipeline_parallel_microbatch_size"
        micro = as_int(r, mkey, r.take(mkey, 1))
        if local % micro:
            raise r.fail(mkey, micro, f"must divide training.local_batch_size ({local})")
    # a pipeline step runs local / micro micro-batches; torchtitan's own accumulation repeats
    # whole pipeline steps (the same peak)
    r.set("batch_size", micro, mkey, micro)
    r.set("grad_accum", local // micro, key, local)
    skey, schedule = _take(r, "parallelism.pipeline_parallel_schedule", "1F1B")
    r.set("pp_schedule", schedule, skey, schedule)
    lps = r.take("parallelism.pipeline_parallel_layers_per_stage", None)
    first = as_int(
        r,
        "parallelism.pipeline_parallel_first_stage_less_layers",
        r.take("parallelism.pipeline_parallel_first_stage_less_layers", 1),
        low=0,
    )
    last = as_int(
        r,
        "parallelism.pipeline_parallel_last_stage_less_layers",
        r.take("parallelism.pipeline_parallel_last_stage_less_layers", 1),
        low=0,
    )
    if lps is None and resolve_schedule(schedule) == "interleaved-1f1b":
        # torchtitan's default split: two stages per rank for a multi-stage schedule
        r.set("pp_virtual_stages", 2, skey, schedule)
    if lps is not None:
        # resolved with the model's layer count (job.workload_of): torchtitan's
        # ceil((layers + first + last) / layers_per_stage) stages over the pp ranks
        n = as_int(r, "parallelism.pipeline_parallel_layers_per_stage", lps)
        r.set(
            "_pp_layers_per_stage",
            (n, first + last),
            "parallelism.pipeline_parallel_layers_per_stage",
            lps,
        )


def chunks_per_rank(schedule: str, pp: int, split: tuple[int, int] | None, n_layers: int) -> int:
    """Model chunks each pipeline rank holds, as torchtitan splits the stages
    (``distributed/pipeline_parallel.py`` ``pipeline_llm``): ``ceil((layers + extra) /
    layers_per_stage)`` stages over ``pp`` ranks where ``split = (layers_per_stage, extra)`` is
    given, else one for a single-stage schedule and two for the others."""
    single = schedule in SINGLE_STAGE
    if split is None:
        return 1 if single else 2
    per_stage, extra = split
    stages = math.ceil((n_layers + extra) / per_stage)
    if stages % pp:
        raise SpecError(
            f"pipeline_parallel_layers_per_stage = {per_stage} gives {stages} stages for "
            f"{n_layers} layers (+{extra}), not a multiple of pipeline_parallel_degree ({pp}); "
            "torchtitan refuses it too"
        )
    return stages // pp


def _checkpointing(r: KeyReader, *, compiled: bool) -> None:
    mode = r.take("activation_checkpoint.mode", "selective")
    option = str(r.take("activation_checkpoint.selective_ac_option", "2"))
    key = "activation_checkpoint.mode"
    if mode in ("none", "full"):
        r.set("checkpointing", mode, key, mode)
    elif mode == "selective" and option == "op":
        r.set("checkpointing", "selective-op", "activation_checkpoint.selective_ac_option", option)
    elif mode == "selective" and option.isdigit() and int(option) >= 1:
        if int(option) == 1:  # every block checkpointed: full checkpointing
            r.set("checkpointing", "full", "activation_checkpoint.selective_ac_option", option)
        elif not compiled:
            # torchtitan's per-layer SAC (every N-th block wrapped whole): memfit's
            # selective-layer (the analytic / trace engines and the per-rank closed form)
            key = "activation_checkpoint.selective_ac_option"
            r.set("checkpointing", "selective-layer", key, option)
            r.set("selective_ac_option", int(option), key, option)
        else:
            r.set("checkpointing", "none", "activation_checkpoint.selective_ac_option", option)
            r.warn(
                "activation_checkpoint.selective_ac_option",
                f"checkpointing every {option}th block under torch.compile is not modelled: "
                "estimated without checkpointing (an upper bound)",
            )
    elif mode == "memory_budget":
        budget = r.take("activation_checkpoint.memory_budget", 0.5)
        r.set("checkpointing", "none", key, mode)
        r.warn(key, f"the compiler's memory budget ({budget}) is not modelled: estimated "
               "without checkpointing (an upper bound)")  # fmt: skip
    else:
        raise r.fail(
            key if mode != "selective" else "activation_checkpoint.selective_ac_option",
            mode if mode != "selective" else option,
            "must be none, full, selective (with selective_ac_option op or a whole number) or "
            "memory_budget",
        )
    r.take("activation_checkpoint.memory_budget")


def _float8(r: KeyReader, degrees: dict[str, int]) -> None:
    converters = r.take("model.converters", [])
    if isinstance(converters, str):
        converters = [c.strip() for c in converters.split(",") if c.strip()]
    if not isinstance(converters, list):
        raise r.fail("model.converters", converters, "must be a list of converter names")
    on, on_key = "float8" in converters, "model.converters"
    if r.has("float8.enable_float8_linear"):
        v = r.take("float8.enable_float8_linear")
        if as_bool(r, "float8.enable_float8_linear", v):
            on, on_key = True, "float8.enable_float8_linear"
    for c in converters:
        if c != "float8":
            r.warn("model.converters", f"the {c!r} converter (e.g. MXFP8) is not modelled")
    rkey, recipe = _take(r, "quantize.linear.float8.recipe_name", None)
    gkey, gather = _take(r, "quantize.linear.float8.enable_fsdp_float8_all_gather", False)
    fkey, filt = _take(r, "quantize.linear.float8.filter_fqns", [])
    if not on:
        return
    name = recipe or "tensorwise"
    if name == "rowwise_with_gw_hp":
        r.warn(rkey, "rowwise_with_gw_hp is estimated as rowwise")
        name = "rowwise"
    r.set("float8", name, on_key if recipe is None else rkey, recipe or converters)
    # torchtitan all-gathers in fp8 only with FSDP over dp_shard and tensorwise scaling
    if as_bool(r, gkey, gather) and degrees["dp_shard"] > 1 and name == "tensorwise":
        r.set("float8_all_gather", True, gkey, gather)
    extra = [f for f in (filt if isinstance(filt, list) else str(filt).split(",")) if f != "output"]
    if extra:
        r.warn(fkey, f"linears left in high precision ({', '.join(map(str, extra))}) are "
               "estimated as Float8 (memfit converts every block linear)")  # fmt: skip


def _optimizer(r: KeyReader) -> None:
    name = str(r.take("optimizer.name", "AdamW"))
    opt = OPTIMIZERS.get(name.lower())
    if opt is None:
        r.warn("optimizer.name", f"{name} is not modelled; estimated as AdamW")
        opt = "adamw"
    if r.has("optimizer.implementation"):
        impl = r.take("optimizer.implementation")
        fused = impl == "fused"
        key: str = "optimizer.implementation"
    elif r.has("optimizer.fused"):  # before 2025-04 (c1c2f55): a switch, off by default
        key, impl = "optimizer.fused", r.take("optimizer.fused")
        fused = as_bool(r, key, impl)
    else:  # the default: fused since c1c2f55 (2025-04-18), foreach in the 2024 layout
        key, impl = "optimizer.name", name
        fused = not is_old_layout(dict(r.data))
    r.set("optimizer", "adamw-fused" if fused and opt == "adamw" else opt, key, impl)
    if r.has("optimizer.early_step_in_backward"):
        v = r.take("optimizer.early_step_in_backward")
        if as_bool(r, "optimizer.early_step_in_backward", v):
            r.set("optimizer_in_bwd", True, "optimizer.early_step_in_backward", v)


__all__ = ["TORCHTITAN_MODELS", "chunks_per_rank", "read_torchtitan"]
