"""The edit to the user's own file that makes a job fit: memfit settings → each format's keys,
applied to the file's text (comments and layout kept: a YAML key's line is replaced in place, a
missing key is added under its block — :mod:`memfit.jobfiles.yaml_edit`; JSON is re-serialised in
its own indentation), checked by parsing the result (:mod:`memfit.jobfiles.edit_check`), shown as
a unified diff and written by ``--write`` through :mod:`memfit.userwrites` (atomic, all files or
none, the originals kept as ``NAME.memfit-orig``). An edit memfit cannot make safely is refused
with the reason: shown instead of its diff, and ``--write`` then writes nothing (exit 2)."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memfit.jobfiles.edit_check import check_edit
from memfit.jobfiles.files import JobFile
from memfit.jobfiles.hf import LOAD_DTYPE_KEYS
from memfit.jobfiles.names import HF_OPTIM_OF
from memfit.jobfiles.toml_edit import set_toml
from memfit.jobfiles.torchtitan import is_old_layout
from memfit.jobfiles.yaml_edit import EditRefusedError, Keys, set_yaml
from memfit.userwrites import write_files

if TYPE_CHECKING:
    from memfit.userwrites import Written

__all__ = ["EditRefusedError", "FileEdit", "plan_edits", "set_json", "set_yaml", "write_edits"]


def _hf(field: str, value: Any, f: JobFile) -> Keys | None:
    flat = f.reader.flat
    ckpt_key = (
        "activation_checkpointing"
        if "activation_checkpointing" in f.data
        else "gradient_checkpointing"
    )
    table: dict[str, Callable[[Any], Keys]] = {
        "batch_size": lambda v: [("per_device_train_batch_size", v)],
        "grad_accum": lambda v: [("gradient_accumulation_steps", v)],
        "checkpointing": lambda v: [(ckpt_key, v != "none")],
        "optimizer": lambda v: [("optim", HF_OPTIM_OF[v])] if v in HF_OPTIM_OF else [],
        "quant": lambda v: (
            [("load_in_4bit", True), ("use_bnb_nested_quant", v == "nf4-dq")]
            if v in ("nf4", "nf4-dq")
            else [("load_in_8bit", True)]
            if v == "int8"
            else []
        ),
        "lora_rank": lambda v: [("use_peft", True), ("lora_r", v)] if v else [],
        "attention": lambda v: [("attn_implementation", {"flash": "flash_attention_2"}.get(v, v))],
        "precision": lambda v: _load_dtype(v, f),
        "amp": lambda v: _amp(v, f),
        # TrainingArguments' fsdp_config.state_dict_type, where the file sets it (else the
        # accelerate config's key is written)
        "fsdp_state_dict_type": lambda v: (
            [("fsdp_config.state_dict_type", v)] if "fsdp_config.state_dict_type" in flat else []
        ),
    }
    return table[field](value) if field in table else None


def _amp(value: str, f: JobFile) -> Keys:
    """The Trainer's autocast switch as ``fp16`` (``memfit check`` on a GPU without bf16:
    ``memfit.cli.check_bf16``): ``bf16: false``, ``fp16: true``, and a load dtype key that says
    bfloat16 as float16 (a bf16 base under fp16 autocast would run bf16 matmuls), or as float32
    for ``fp16-fp32-weights`` (a full fine-tune: fp16 trainable weights under the Trainer's
    GradScaler stop at "Attempting to unscale FP16 gradients", torch ``amp/grad_scaler.py``)."""
    if value not in ("fp16", "fp16-fp32-weights") or f.reader.flat.get("bf16") is not True:
        return []
    keys: Keys = [("bf16", False), ("fp16", True)]
    load = "float16" if value == "fp16" else "float32"
    for key in (*LOAD_DTYPE_KEYS, "bfloat16"):
        old = f.reader.flat.get(key)
        if old in ("bfloat16", "bf16"):
            keys.append((key, load))
        elif key == "bfloat16" and old is True:  # axolotl's bfloat16: true
            keys += [("bfloat16", False), ("float16", True)]
    return keys


def _load_dtype(precision: str, f: JobFile) -> Keys:
    """An adapter job's frozen base loaded in 16 bits (``bf16-true`` / ``16-true``): the load
    dtype key the file has (``model_init_kwargs.dtype`` …), else TRL ``ModelConfig``'s
    ``dtype``, which ``trl sft --config`` reads from the same file. Other precision changes
    are not the file's to make here (check_fix offers only this one)."""
    name = {"bf16-true": "bfloat16", "16-true": "float16"}.get(precision)
    if name is None:
        return []
    key = next((k for k in LOAD_DTYPE_KEYS if k in f.reader.flat), "dtype")
    return [(key, name)]


def _llamafactory(field: str, value: Any, f: JobFile) -> Keys | None:
    table: dict[str, Callable[[Any], Keys]] = {
        "quant": lambda v: (
            [("quantization_bit", 4)]
            if v in ("nf4", "nf4-dq")
            else [("quantization_bit", 8)]
            if v == "int8"
            else []
        ),
        "lora_rank": lambda v: [("finetuning_type", "lora"), ("lora_rank", v)] if v else [],
        "attention": lambda v: [("flash_attn", {"flash": "fa2"}.get(v, v))],
        # LLaMA-Factory has no load-dtype key (TRL's dtype would be refused as unknown):
        # pure_bf16 keeps every weight and state in bf16, memfit's bf16-true
        "precision": lambda v: [("pure_bf16", True)] if v == "bf16-true" else [],
    }
    if field in table:
        return table[field](value)
    return _hf(field, value, f)


def _axolotl(field: str, value: Any, f: JobFile) -> Keys | None:
    table: dict[str, Callable[[Any], Keys]] = {
        "batch_size": lambda v: [("micro_batch_size", v)],
        "grad_accum": lambda v: [("gradient_accumulation_steps", v)],
        "checkpointing": lambda v: [("gradient_checkpointing", v != "none")],
        "optimizer": lambda v: [("optimizer", HF_OPTIM_OF[v])] if v in HF_OPTIM_OF else [],
        "quant": lambda v: (
            [("adapter", "qlora"), ("load_in_4bit", True)]
            if v in ("nf4", "nf4-dq")
            else [("load_in_8bit", True)]
            if v == "int8"
            else []
        ),
        "lora_rank": lambda v: (
            [
                ("adapter", f.data.get("adapter") or "lora"),
                ("lora_r", v),
                ("lora_target_linear", True),
            ]
            if v
            else []
        ),
        "attention": lambda v: [("flash_attention", True)] if v == "flash" else [],
        "amp": lambda v: _amp(v, f),
    }
    return table[field](value) if field in table else None


def _torchtune(field: str, value: Any, f: JobFile) -> Keys | None:
    table: dict[str, Callable[[Any], Keys]] = {
        "batch_size": lambda v: [("batch_size", v)],
        "grad_accum": lambda v: [("gradient_accumulation_steps", v)],
        "checkpointing": lambda v: [("enable_activation_checkpointing", v != "none")],
        "optimizer": lambda v: {
            "adamw-8bit": [("optimizer._component_", "bitsandbytes.optim.AdamW8bit")],
            "paged-adamw-8bit": [("optimizer._component_", "bitsandbytes.optim.PagedAdamW8bit")],
        }.get(v, []),
    }
    return table[field](value) if field in table else None


def _litgpt(field: str, value: Any, f: JobFile) -> Keys | None:
    glob = f.reader.flat.get("train.global_batch_size")
    table: dict[str, Callable[[Any], Keys]] = {
        "batch_size": lambda v: [("train.micro_batch_size", v)],
        # LitGPT accumulates global_batch_size / (micro_batch_size x devices) micro-batches: a
        # fix holds the global batch, so the new micro-batch says the accumulation (the key is
        # named at its own value, which is no edit)
        "grad_accum": lambda v: [("train.global_batch_size", glob)] if glob is not None else [],
        "quant": lambda v: [("quantize", "bnb." + v)] if v in ("nf4", "nf4-dq", "int8") else [],
        "lora_rank": lambda v: [("lora_r", v)] if v else [],
    }
    return table[field](value) if field in table else None


def _deepspeed(field: str, value: Any, f: JobFile) -> Keys | None:
    table: dict[str, Callable[[Any], Keys]] = {
        "shard": lambda v: (
            [("zero_optimization.stage", int(v[-1]))] if v.startswith("zero") else []
        ),
        "offload": lambda v: (
            [("zero_optimization.offload_optimizer.device", "cpu")]
            + ([("zero_optimization.offload_param.device", "cpu")] if v == "params" else [])
            if v != "none"
            else []
        ),
    }
    if field == "amp":  # bf16 named on a GPU without it: DeepSpeed's fp16 with loss scaling
        on = f.reader.flat.get("bf16.enabled") is True
        return [("bf16.enabled", False), ("fp16.enabled", True)] if on else []
    if field in ("batch_size", "grad_accum"):
        key = (
            "train_micro_batch_size_per_gpu"
            if field == "batch_size"
            else "gradient_accumulation_steps"
        )
        current = f.data.get(key, "auto")
        return [] if current == "auto" else [(key, value)]
    return table[field](value) if field in table else None


def _torchtitan(field: str, value: Any, f: JobFile) -> Keys | None:
    """torchtitan's keys: the local batch (under no pipeline: a pipeline's micro-batches are
    cut from it, which this edit does not say), the accumulation through
    ``training.global_batch_size`` (held: a fix keeps the samples per step, so the new local
    batch sets the accumulation; written where the file leaves it at -1, which would otherwise
    mean no accumulation), activation checkpointing (torchtitan has no ``selective`` of memfit's:
    its selective is per-op or per-block)."""
    flat = f.reader.flat
    if any(s.field == "pp" for s in f.reader.settings):
        return [] if field in ("batch_size", "grad_accum") else _torchtitan_ac(field, value)
    if field == "batch_size":
        key = (
            "training.batch_size" if "training.batch_size" in flat else "training.local_batch_size"
        )
        return [(key, value)]
    if field == "grad_accum":
        if is_old_layout(f.data):  # no accumulation before 2025-06 (8570415c3)
            return []
        glob = flat.get("training.global_batch_size", -1)
        if glob == -1:
            values = {s.field: s.value for s in f.reader.settings}
            dp = values["gpus"] // (values.get("tp", 1) * values.get("cp", 1))
            glob = values["batch_size"] * dp
        return [("training.global_batch_size", glob)]
    return _torchtitan_ac(field, value)


def _torchtitan_ac(field: str, value: Any) -> Keys | None:
    if field != "checkpointing":
        return None
    return {
        "none": [("activation_checkpoint.mode", "none")],
        "full": [("activation_checkpoint.mode", "full")],
        "selective-op": [
            ("activation_checkpoint.mode", "selective"),
            ("activation_checkpoint.selective_ac_option", "op"),
        ],
    }.get(value, [])


def _accelerate(field: str, value: Any, f: JobFile) -> Keys | None:
    """accelerate's config: only the FSDP checkpoint's state-dict type is written here (the
    batch and the techniques live in the training config)."""
    if field == "fsdp_state_dict_type" and str(f.reader.flat.get("distributed_type")) == "FSDP":
        return [("fsdp_config.fsdp_state_dict_type", value)]
    if field == "amp" and f.reader.flat.get("mixed_precision") == "bf16":
        return [("mixed_precision", "fp16")]  # the launcher's autocast, as the Trainer's (_amp)
    return None


WRITERS: dict[str, Callable[[str, Any, JobFile], Keys | None]] = {
    "hf": _hf,
    "llamafactory": _llamafactory,
    "axolotl": _axolotl,
    "torchtune": _torchtune,
    "litgpt": _litgpt,
    "deepspeed": _deepspeed,
    "accelerate": lambda field, value, f: _accelerate(field, value, f),
    "torchtitan": _torchtitan,
}


@dataclass(frozen=True, kw_only=True)
class FileEdit:
    path: str
    old_text: str
    new_text: str
    keys: tuple[tuple[str, Any], ...]
    #: why memfit cannot make this edit safely (None: it can); the file is then left as it is
    refused: str | None = None

    def diff(self) -> str:
        if self.refused is not None:
            return f"memfit cannot edit {self.path}: {self.refused}\n"
        return "".join(
            difflib.unified_diff(
                self.old_text.splitlines(keepends=True),
                self.new_text.splitlines(keepends=True),
                fromfile="a/" + self.path.lstrip("/"),
                tofile="b/" + self.path.lstrip("/"),
            )
        )


def plan_edits(
    files: list[JobFile], changes: dict[str, Any], set_by: dict[str, str]
) -> tuple[list[FileEdit], list[str]]:
    """Edits applying ``changes`` (memfit field → value) to ``files``: each field goes to the
    file that set it (``set_by``: field → file name), else to the first file whose format can
    say it. Returns the edits and the changes no file can express."""
    keys_by_file: dict[str, Keys] = {f.path: [] for f in files}
    unexpressed: list[str] = []
    for field, value in changes.items():
        order = sorted(files, key=lambda f: f.reader.file != set_by.get(field))
        for f in order:
            keys = WRITERS[f.format](field, value, f)
            if keys:
                keys_by_file[f.path] += keys
                break
        else:
            unexpressed.append(f"{field}={value}")
    edits = []
    for f in files:
        keys = [(k, v) for k, v in keys_by_file[f.path] if not _holds(f, k, v)]
        if keys:
            edits.append(_edit(f, keys))
    return edits, unexpressed


def _holds(f: JobFile, key: str, value: Any) -> bool:
    """Whether ``f`` has ``key`` at ``value`` already (a key set to what it holds is no edit:
    selective checkpointing is written as ``gradient_checkpointing: true``, which a file may
    have)."""
    old = f.reader.flat.get(key, _ABSENT)
    return old == value and type(old) is type(value)


_ABSENT = object()


def _edit(f: JobFile, keys: Keys) -> FileEdit:
    """The edit of one file, or its refusal (the edit is checked by parsing its result)."""
    try:
        if f.format == "torchtitan":  # TOML: set and checked with tomllib
            new = set_toml(f.text, keys, source=f.path)
        else:
            new = set_yaml(f.text, keys, source=f.path) if f.is_yaml else set_json(f.text, keys)
            check_edit(f.text, new, keys, is_yaml=f.is_yaml, source=f.path)
    except EditRefusedError as exc:
        return FileEdit(
            path=f.path, old_text=f.text, new_text=f.text, keys=tuple(keys), refused=str(exc)
        )
    return FileEdit(path=f.path, old_text=f.text, new_text=new, keys=tuple(keys))


def write_edits(edits: list[FileEdit]) -> list[Written]:
    """Write ``edits`` all or nothing (:func:`memfit.userwrites.write_files`, originals kept as
    ``NAME.memfit-orig``); a refused edit refuses the whole write. Returns what was written."""

    refused = [e for e in edits if e.refused is not None]
    if refused:
        raise EditRefusedError(
            "; ".join(f"{e.path}: {e.refused}" for e in refused) + " (no file was written)"
        )
    return write_files(
        [(e.path, e.new_text) for e in edits],
        what="job file",
        backup=True,
        expected=[e.old_text for e in edits],
    )


def set_json(text: str, keys: Keys) -> str:
    """Set dotted ``keys`` in JSON ``text``, re-serialised in its own indentation."""
    data = json.loads(text)
    for key, value in keys:
        node = data
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise EditRefusedError(
                    f"{key}: {p} is {node!r}, not an object; set {key}: {json.dumps(value)} by hand"
                )
        node[leaf] = value
    match = re.search(r"\n(\s+)\"", text)
    indent = len(match.group(1)) if match else 2
    return json.dumps(data, indent=indent) + ("\n" if text.endswith("\n") else "")
