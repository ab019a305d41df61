"""Build the model a job runs — from a Hugging Face config — with fake parameters and no weights.

The model (and any peft wrappers) is built on the ``meta`` device outside FakeTensorMode, then each
parameter and buffer is replaced by a FakeTensor on the trace device (tracing.md, trap 7: ``.to()``
on fake parameters fails inside peft). Tied parameters stay tied.

Layer counts can be overridden (``layer_counts``) so the engine can trace a few layers and
extrapolate: :func:`layer_plan` says which counts a config has and the period of its layer pattern
(Gemma 2 alternates sliding and full attention: period 2).
"""

from __future__ import annotations

import contextlib
import copy
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from memfit.errors import MissingDependencyError, NotModelledError, SpecError, TraceError
from memfit.estimate import quant
from memfit.estimate.tasks import resolve_task as resolve_task  # callers use build.resolve_task
from memfit.estimate.trace.peft_import import without_bitsandbytes
from memfit.models.config_values import unknown_activations, value_problems, with_float_values
from memfit.models.model_spec import ModelSpec
from memfit.spec import PRECISION_RULES, WorkloadSpec
from memfit.spec.hf_versions import autocasts_adapters
from memfit.spec.rules import LAYER_SAC, layer_sac_checkpointed

#: Parameter dtype per precision as run (``WorkloadSpec.run_precision``), from the one table.
PARAM_DTYPE = {name: getattr(torch, r.params) for name, r in PRECISION_RULES.items()}


def model_dtype(workload: WorkloadSpec) -> torch.dtype:
    """The dtype the model is built in: the precision's parameters, except under an FSDP2
    mixed-precision policy (``WorkloadSpec.fsdp_policy``), whose sharded parameters are the fp32
    originals that ``fully_shard`` casts to ``param_dtype`` at each all-gather."""
    if workload.fsdp_policy is not None:
        return torch.float32
    return PARAM_DTYPE[workload.run_precision]


@dataclass(frozen=True)
class LayerVar:
    """One independently repeated stack: ``path`` to its config dict and the count ``key``.
    ``prefix``: leading layers unlike the rest (DeepSeek's ``first_k_dense_replace`` dense
    layers before the MoE ones), which every resized trace keeps whole."""

    name: str
    path: tuple[str, ...]
    key: str
    count: int
    period: int
    prefix: int = 0


def _hf_config(config: dict[str, Any], trust_remote_code: bool) -> Any:
    """transformers' config of ``config``, its values checked first (models/config_values.py):
    a TraceError (the auto engine then answers with the analytic engine) names each bad value."""
    from transformers import AutoConfig
    from transformers.activations import ACT2FN

    problems = value_problems(config) + unknown_activations(config, frozenset(ACT2FN))
    if problems:
        raise TraceError(
            f"the trace engine cannot build this model from its config.json: {'; '.join(problems)}"
            "; fix config.json, or use --engine analytic"
        )
    # a deep copy: transformers standardizes nested values in place (5.x adds ``rope_theta`` to
    # the ``rope_scaling`` dict it is given), and ``config`` is the caller's (the ModelSource's,
    # hashed into the trace cache's key: a mutated one made a repeated plan's second
    # confirmation a new key, traced again — issue 32)
    d = copy.deepcopy(dict(config))
    model_type = d.pop("model_type", None)
    try:
        try:
            return AutoConfig.for_model(model_type, trust_remote_code=trust_remote_code, **d)
        except _STRICT_ERRORS:  # a float field written as a JSON integer ("rms_norm_eps": 1)
            d = with_float_values(d)
            return AutoConfig.for_model(model_type, trust_remote_code=trust_remote_code, **d)
    except _CONFIG_ERRORS as exc:
        first = str(exc).strip().splitlines()
        raise TraceError(
            f"transformers cannot build a {model_type!r} config: {' '.join(first[:2])}"
        ) from exc


def config_fields(config: dict[str, Any], trust_remote_code: bool = False) -> dict[str, Any]:
    """Every field of transformers' config of ``config``, those its class computes included
    (``layer_types``, Llama 4's ``moe_layers`` ...); TraceError where it cannot be built."""
    return dict(_hf_config(config, trust_remote_code).to_dict())


def _strict_errors() -> tuple[type[Exception], ...]:
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:  # an older huggingface_hub: configs are not strict dataclasses
        return ()
    return (StrictDataclassError,)


_STRICT_ERRORS: tuple[type[Exception], ...] = _strict_errors()
_CONFIG_ERRORS: tuple[type[Exception], ...] = (ValueError, KeyError, TypeError, *_STRICT_ERRORS)


def layer_plan(config: dict[str, Any], trust_remote_code: bool = False) -> list[LayerVar]:
    """The repeated stacks of a config (decoder layers; encoder + decoder for seq2seq; two towers
    for CLIP), with their counts and layer-pattern period. The counts and the keys holding them
    come from the config's ModelSpec (``spec.keys``); a count only a config class's default
    gives is not resized."""
    spec = ModelSpec.from_config(config)
    if spec.text is not None and spec.vision is not None:
        towers = (("text_config", spec.text), ("vision_config", spec.vision))
        return [
            LayerVar(key, (key,), "num_hidden_layers", _tower_layers(tower), 1)
            for key, tower in towers
        ]
    enc_key = spec.n_layers_key
    if "n_decoder_layers" in spec.keys or (spec.is_encoder_decoder and enc_key == "num_layers"):
        enc = spec.n_layers if enc_key == "num_layers" and spec.n_layers else 6
        dec = spec.n_decoder_layers or enc
        return [
            LayerVar("encoder", (), "num_layers", enc, 1),
            LayerVar("decoder", (), "num_decoder_layers", dec, 1),
        ]
    if enc_key is not None and spec.n_layers is not None:
        hf = _hf_config(config, trust_remote_code)
        period = _period(getattr(hf, "layer_types", None) or [])
        prefix = _dense_prefix(hf, spec.n_layers)
        return [LayerVar("layers", (), enc_key, spec.n_layers, period, prefix)]
    return []


def _dense_prefix(hf: Any, n_layers: int) -> int:
    """Leading layers built unlike the rest: ``first_k_dense_replace`` dense MLPs before the
    routed ones (DeepSeek-V2/V3, GLM-4-MoE), 0 when every layer is alike."""
    k = getattr(hf, "first_k_dense_replace", None)
    if isinstance(k, int) and not isinstance(k, bool) and 0 < k < n_layers:
        return k
    return 0


def _tower_layers(tower: ModelSpec | None) -> int:
    """A tower's layer count as config.json gives it (the tower config classes' default: 12)."""
    if tower is not None and tower.n_layers_key == "num_hidden_layers" and tower.n_layers:
        return tower.n_layers
    return 12


def _period(layer_types: list[str]) -> int:
    n = len(layer_types)
    for p in range(1, n + 1):
        if all(layer_types[i] == layer_types[i % p] for i in range(n)):
            return p
    return max(n, 1)


def with_layer_counts(
    config: dict[str, Any], plan: list[LayerVar], counts: dict[str, int], trust_remote_code: bool
) -> dict[str, Any]:
    """A copy of ``config`` with the stacks resized to ``counts`` (layer_types sliced to match)."""
    d = copy.deepcopy(config)
    for var in plan:
        n = counts[var.name]
        target = d
        for part in var.path:
            target = target[part]
        target[var.key] = n
        if var.name == "decoder":
            target["num_decoder_layers"] = n
    if any(v.period > 1 for v in plan) or "layer_types" in d:
        hf = _hf_config(config, trust_remote_code)
        full = getattr(hf, "layer_types", None)
        # Jamba computes layer_types from its periods (a read-only property), Bamba maps it onto
        # one (attribute_map: layers_block_type, from attn_layer_indices): nothing to slice
        name = (getattr(type(hf), "attribute_map", None) or {}).get("layer_types", "layer_types")
        computed = isinstance(getattr(type(hf), name, None), property)
        if full and not computed:
            d["layer_types"] = list(full[: counts[plan[0].name]])
    return d


def model_class(task: str) -> Any:
    import transformers as tf

    return {
        "causal-lm": tf.AutoModelForCausalLM,
        "seq-cls": tf.AutoModelForSequenceClassification,
        "seq2seq": tf.AutoModelForSeq2SeqLM,
        "image-cls": tf.AutoModelForImageClassification,
        "object-detection": tf.AutoModelForObjectDetection,
        "speech-seq2seq": tf.AutoModelForSpeechSeq2Seq,
        "clip": tf.AutoModel,
    }[task]


def preload(config: dict[str, Any], workload: WorkloadSpec) -> None:
    """Import what the first trace of ``workload`` on ``config`` would import (peft and the
    bitsandbytes it brings for LoRA, the model's transformers module): a worker forked after
    this has them (:mod:`memfit.estimate.derived.workers`). Changes nothing else; any failure is
    left for the trace itself to report."""
    import importlib

    try:
        if workload.is_train and workload.lora_rank:
            with without_bitsandbytes():  # as the trace imports it (apply_lora_)
                importlib.import_module("peft")
        hf = _hf_config(config, False)
        mapping = getattr(model_class(resolve_task(config, workload.task)), "_model_mapping", {})
        mapping.get(type(hf))  # the lazy mapping imports the model's module
    except Exception:  # noqa: BLE001, S110 - a warm-up only: the trace reports real failures
        pass


#: The tasks :func:`model_class` builds (said where a model needs another one).
TASK_NAMES = (
    "causal-lm", "seq-cls", "seq2seq", "image-cls", "object-detection", "speech-seq2seq", "clip",
)  # fmt: skip


def _cannot_build(task: str, exc: BaseException) -> str:
    first = (str(exc).splitlines() or [""])[0][:300]
    return f"transformers cannot build this model for task {task!r}: {type(exc).__name__}: {first}"


def _eager_or_error(cls: Any, hf: Any, task: str, kwargs: dict[str, Any]) -> torch.nn.Module:
    """The model with eager attention; TraceError (never a traceback) where that fails too, e.g.
    an architecture the task's auto class does not map (issue 11: found by the coverage grid)."""
    try:
        return cls.from_config(hf, attn_implementation="eager", **kwargs)
    except (ValueError, AssertionError, TypeError) as exc:
        archs = ", ".join(getattr(hf, "architectures", None) or [])
        if "Unrecognized configuration class" in str(exc) and archs:
            raise TraceError(  # e.g. Wav2Vec2ForCTC: no task of memfit's builds it
                f"the trace engine does not model {archs} ({hf.model_type}): it builds models "
                f"for the tasks {', '.join(TASK_NAMES)}, and transformers cannot build this "
                f"config as the {task!r} model memfit took it for (not modelled yet)"
            ) from exc
        raise TraceError(_cannot_build(task, exc)) from exc


def build_hf_model(
    config: dict[str, Any],
    workload: WorkloadSpec,
    task: str,
    *,
    trust_remote_code: bool = False,
    device: str = "meta",
) -> torch.nn.Module:
    """Build the model (on ``meta`` unless a validation run asks for real ``cpu`` weights) with the
    workload's dtype, attention and techniques."""
    hf = _hf_config(config, trust_remote_code)
    if task == "seq-cls":
        hf.num_labels = 2
        if getattr(hf, "pad_token_id", None) is None:
            hf.pad_token_id = 0
    impl = "eager" if workload.attention == "eager" else "sdpa"
    cls = model_class(task)
    kwargs: dict[str, Any] = {"dtype": model_dtype(workload)}
    if trust_remote_code:
        kwargs["trust_remote_code"] = True
    with torch.device(device):
        try:
            model = cls.from_config(hf, attn_implementation=impl, **kwargs)
        except ValueError as exc:
            if impl != "sdpa":
                raise TraceError(
                    f"transformers cannot build this model for task {task!r}: {exc}"
                ) from exc
            # The architecture has no SDPA path: transformers runs it with eager attention.
            model = _eager_or_error(cls, hf, task, kwargs)
        except (AssertionError, TypeError) as exc:  # a config transformers' modules reject
            raise TraceError(_cannot_build(task, exc)) from exc
    keep_in_fp32_(model, kwargs["dtype"])
    if workload.is_train:
        model.train()
        _apply_training_techniques(model, workload)
    else:
        model.eval()
    return model


def keep_in_fp32_(model: torch.nn.Module, dtype: Any) -> None:
    """What ``from_pretrained`` does and ``from_config`` does not: parameters matching the
    model's ``_keep_in_fp32_modules`` (in fp16) or ``_keep_in_fp32_modules_strict`` (in fp16 and
    bf16) are loaded in fp32 (transformers' ``_get_dtype_plan``; T5 keeps ``wo`` in fp32 under
    fp16). The patterns are searched in each parameter's name, as the loader does."""
    plan_of = getattr(model, "_get_dtype_plan", None)
    if not callable(plan_of) or isinstance(dtype, str):
        return
    plan: dict[str, Any] = plan_of(dtype) or {}
    if not plan:
        return
    patterns = [(re.compile(glob.replace("*", ".*")), target) for glob, target in plan.items()]
    for name, param in model.named_parameters():
        for pattern, target in patterns:
            if pattern.search(name):
                param.data = param.data.to(target)
                break


def _apply_training_techniques(model: torch.nn.Module, workload: WorkloadSpec) -> None:
    if workload.freeze_layers:
        freeze_first_layers_(model, workload.freeze_layers)
    if workload.checkpointing != "none":
        if not getattr(model, "supports_gradient_checkpointing", False):
            raise SpecError(
                f"checkpointing ({workload.checkpointing!r}) is not supported by "
                f"{type(model).__name__}; use --checkpointing none"
            )
        kwargs: dict[str, Any] = {"use_reentrant": False}
        if workload.checkpointing in ("selective", "selective-op"):
            kwargs["context_fn"] = SAC_CONTEXTS[workload.checkpointing]
        enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5.2x
        if enable is not None:
            enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)  # type: ignore[operator]
        if workload.checkpointing == LAYER_SAC:
            keep_every_nth_checkpointed_(model, workload.selective_ac_option)


def keep_every_nth_checkpointed_(model: torch.nn.Module, every: int) -> None:
    """torchtitan's per-layer SAC on a transformers model whose blocks checkpointing turned on:
    only the blocks ``rules.layer_sac_checkpointed`` picks stay checkpointed (each block a
    ``GradientCheckpointingLayer`` whose ``gradient_checkpointing`` flag
    ``activation_checkpointing_enable`` set, transformers ``modeling_layers.py``)."""
    layers = decoder_layers(model)
    flags = [getattr(layer, "gradient_checkpointing", None) for layer in layers or ()]
    if not layers or any(f is not True for f in flags):
        raise NotModelledError(
            f"checkpointing 'selective-layer': {type(model).__name__}'s repeated blocks are not "
            "checkpointed one by one (no per-block gradient_checkpointing switch); use "
            "--checkpointing full",
            engine="trace",
        )
    for layer, wrapped in zip(layers, layer_sac_checkpointed(len(layers), every), strict=True):
        layer.gradient_checkpointing = wrapped  # type: ignore[assignment]


def apply_lora_(
    model: torch.nn.Module, workload: WorkloadSpec, device: str = "meta"
) -> torch.nn.Module:
    """Wrap with peft LoRA adapters (frozen base, trainable adapters; peft keeps them in fp32).
    On the meta device (the trace's plain layers) peft is imported and wraps without importing
    bitsandbytes (:mod:`memfit.estimate.trace.peft_import`)."""
    held = without_bitsandbytes() if str(device) == "meta" else contextlib.nullcontext()
    with held:
        return _apply_lora(model, workload, device)


def _apply_lora(model: torch.nn.Module, workload: WorkloadSpec, device: str) -> torch.nn.Module:
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:
        raise MissingDependencyError(
            "--lora-rank needs peft: pip install 'memfit[lora]' (or pip install peft)"
        ) from exc
    targets = workload.lora_targets
    target_modules: Any = "all-linear" if targets == "all-linear" else list(targets)
    rank = workload.lora_rank or 8
    to_save = list(workload.lora_modules_to_save) or None
    candidates = _module_leaf_names(model) if to_save else []
    cfg = LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        lora_dropout=workload.lora_dropout,  # peft: nn.Identity at 0, nn.Dropout above
        target_modules=target_modules,
        modules_to_save=to_save,
    )
    with torch.device(device):
        try:
            wrapped = get_peft_model(model, cfg)
        except ValueError as exc:
            raise SpecError(
                f"lora_targets ({targets!r}) do not match this model: {exc}; its linear modules "
                f"are {', '.join(linear_module_names(model))} (or name roles: q,k,v,o,gate,up,"
                "down, attention, mlp, all-linear)"
            ) from exc
    if not autocasts_adapters(workload.peft_version) and _float_storage(workload):
        _adapters_to_base_dtype_(wrapped)
    missing = _unsaved_modules(wrapped, workload.lora_modules_to_save)
    if missing:
        raise SpecError(
            f"lora_modules_to_save ({', '.join(missing)}) match no module of this model; its "
            f"top-level modules are {', '.join(candidates)}"
        )
    unwrappable = _non_tensor_linears(wrapped)
    if unwrappable:
        name, cls = unwrappable[0]
        raise SpecError(
            f"lora_targets ({targets!r}) wrap {name!r} ({cls}, an nn.Linear whose forward does "
            "not return a tensor, e.g. a MoE router returning scores and logits): peft's LoRA "
            "layer fails on it at the first forward; name the targets instead, e.g. "
            "--lora-targets attention,mlp"
        )
    return wrapped


def _float_storage(workload: WorkloadSpec) -> bool:
    """Whether the base weights the adapters wrap are stored in a float dtype: unquantized, or
    bitsandbytes 4-bit packed in a bf16 ``quant_storage`` (FSDP-QLoRA under fsdp / zero3)."""
    return workload.quant == "none" or quant.packs_as_parameter(workload.quant, workload.shard)


def _adapters_to_base_dtype_(model: torch.nn.Module) -> None:
    """peft before 0.12 (:mod:`memfit.spec.hf_versions`): ``update_layer`` moved each new
    adapter to its base weight's dtype when that is a float (``self.to(weight.device,
    dtype=weight.dtype)``); the installed peft keeps them fp32 (``autocast_adapter_dtype``, and
    on the meta device it moves nothing). Cast them as the old release did."""
    names = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector")
    for module in model.modules():
        base_of = getattr(module, "get_base_layer", None)
        if base_of is None or not hasattr(module, "lora_A"):
            continue
        weight = getattr(base_of(), "weight", None)
        if not isinstance(weight, torch.Tensor) or not weight.dtype.is_floating_point:
            continue
        for name in names:
            adapters = getattr(module, name, None)
            if isinstance(adapters, torch.nn.Module):
                adapters.to(dtype=weight.dtype)


def _unsaved_modules(model: torch.nn.Module, names: tuple[str, ...]) -> list[str]:
    """The ``modules_to_save`` names peft wrapped no module for (it skips them silently)."""
    wrapped = {
        name.rsplit(".", 1)[-1]
        for name, m in model.named_modules()
        if type(m).__name__ == "ModulesToSaveWrapper"
    }
    return [n for n in names if n.rsplit(".", 1)[-1] not in wrapped]


def _module_leaf_names(model: torch.nn.Module) -> list[str]:
    """Leaf names of the model's non-repeated modules (candidates for ``modules_to_save``)."""
    names = {
        n.rsplit(".", 1)[-1]
        for n, m in model.named_modules()
        if n
        and not any(p.isdigit() for p in n.split("."))
        and not isinstance(m, torch.nn.ModuleList)
    }
    return sorted(names)


def _non_tensor_linears(model: torch.nn.Module) -> list[tuple[str, str]]:
    """The LoRA-wrapped modules whose base layer (a subclass of nn.Linear with its own forward)
    returns something other than a tensor: peft's ``lora.Linear.forward`` reads
    ``result.dtype`` and fails (transformers' Llama4Router, PhimoeTopKRouter). Found by running
    each such base layer of transformers' on one row (on the meta device while building: no
    memory); a quantized base layer (bitsandbytes' int8 keeps state across calls) is not run."""
    out = []
    for name, m in model.named_modules():
        base = getattr(m, "base_layer", None)
        if not isinstance(base, torch.nn.Linear) or type(base).forward is torch.nn.Linear.forward:
            continue
        w = base.weight
        if not type(base).__module__.startswith("transformers.") or not w.is_floating_point():
            continue  # quantized layers (bitsandbytes, torchao ...) return tensors: never run
        with torch.no_grad():
            result = base(torch.zeros(1, base.in_features, device=w.device, dtype=w.dtype))
        if not isinstance(result, torch.Tensor):
            out.append((name.removeprefix("base_model.model."), type(base).__name__))
    return out


def linear_module_names(model: torch.nn.Module) -> list[str]:
    """The leaf names of the model's linear modules (what peft's ``target_modules`` matches)."""
    from transformers.pytorch_utils import Conv1D

    kinds = (torch.nn.Linear, Conv1D)
    names = (n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, kinds))
    return sorted(set(names))


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList | None:
    """The longest ModuleList of the model: its repeated blocks."""
    best: torch.nn.ModuleList | None = None
    for m in model.modules():
        if isinstance(m, torch.nn.ModuleList) and (best is None or len(m) > len(best)):
            best = m
    return best


def freeze_first_layers_(model: torch.nn.Module, n_layers: int) -> None:
    """Freeze the input embeddings and the first ``n_layers`` repeated blocks."""
    layers = decoder_layers(model)
    if layers is None or n_layers > len(layers):
        n = 0 if layers is None else len(layers)
        raise SpecError(f"freeze_layers ({n_layers}) exceeds the model's {n} layers")
    get_emb = getattr(model, "get_input_embeddings", None)
    try:
        emb = get_emb() if callable(get_emb) else None
    except NotImplementedError as exc:  # e.g. CLIPModel: two towers, no one input embedding
        raise SpecError(
            f"freeze_layers ({n_layers}): {type(model).__name__} has no single input embedding "
            "to freeze with its first layers; use LoRA (--lora-rank) or drop --freeze"
        ) from exc
    for module in ([emb] if emb is not None else []) + list(layers[:n_layers]):
        for p in module.parameters():
            p.requires_grad_(False)


#: Selective activation checkpointing: ops whose outputs are saved (expensive to recompute); all
#: other ops inside a checkpointed block are recomputed. This is the op-level SAC policy of
#: torchtitan (matmuls and attention kernels saved) — Korthikanti et al. 2022 §4.2 recompute the
#: cheap attention-core elementwise work instead of storing it.
SAC_SAVE_OPS = (
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
)


def _sac_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    from torch.utils.checkpoint import CheckpointPolicy

    name = getattr(op, "__name__", str(op)).split(".")[0]
    if name in SAC_SAVE_OPS:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def selective_checkpoint_context() -> Any:
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(_sac_policy)


def _alternate_mm_policy() -> Callable[..., Any]:
    """torchtitan's per-op SAC (``selective_ac_option = "op"``): :data:`SAC_SAVE_OPS` saved but
    every second ``aten.mm`` of the checkpointed block, counted afresh each time the block's
    checkpoint starts (its forward, its recomputation) — ``_custom_policy`` in torchtitan
    ``torchtitan/parallelisms/parallelize_llama.py`` at 9dec370. (torchtitan's own list is
    narrower: ``bmm`` / ``addmm`` are not on it at 9dec370; a Llama block has neither.)"""
    from torch.utils.checkpoint import CheckpointPolicy

    count = {"forward": 0, "recompute": 0}

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        name = getattr(op, "__name__", str(op)).split(".")[0]
        if name == "mm":
            key = "recompute" if ctx.is_recompute else "forward"
            count[key] += 1
            if count[key] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        if name in SAC_SAVE_OPS:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def alternate_mm_checkpoint_context() -> Any:
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(_alternate_mm_policy())


#: The ``context_fn`` of each selective ``--checkpointing``.
SAC_CONTEXTS: dict[str, Callable[[], Any]] = {
    "selective": selective_checkpoint_context,
    "selective-op": alternate_mm_checkpoint_context,
}


def meta_to_fake_(model: torch.nn.Module, fake_mode: Any, device: str = "cpu") -> torch.nn.Module:
    """Replace every meta parameter/buffer by an uninitialised FakeTensor on ``device``."""
    memo: dict[int, torch.Tensor] = {}

    def convert(t: torch.Tensor, is_param: bool) -> torch.Tensor:
        if id(t) in memo:
            return memo[id(t)]
        if t.device.type != "meta":
            new = fake_mode.from_tensor(t)
        else:
            with fake_mode:
                new = torch.empty_strided(
                    tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=device
                )
        if is_param:
            new = torch.nn.Parameter(new, requires_grad=t.requires_grad)
        memo[id(t)] = new
        return new

    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                module._parameters[name] = convert(p, True)  # type: ignore[assignment]
        for name, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[name] = convert(b, False)
    return model


_LAYER_INDEX = re.compile(r"\.(\d+)(?=\.|$)")


def generic_module_name(name: str) -> str:
    """``model.layers.3.mlp`` → ``model.layers.*.mlp`` (so layer traces can be extrapolated)."""
    return _LAYER_INDEX.sub(".*", name)
