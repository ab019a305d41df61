"""The edit to the user's own file that makes a job fit: memfit settings → each format's keys,
applied to the file's text (comments and layout kept: a YAML key's line is replaced in place, a
missing key is added under its block; JSON is re-serialised in its own indentation), shown as a
unified diff and written by ``--write``."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memfit.jobfiles.files import JobFile
from memfit.jobfiles.names import HF_OPTIM_OF

Keys = list[tuple[str, Any]]


def _hf(field: str, value: Any, f: JobFile) -> Keys | None:
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
    }
    return table[field](value) if field in table else None


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
    table: dict[str, Callable[[Any], Keys]] = {
        "batch_size": lambda v: [("train.micro_batch_size", v)],
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
    if field in ("batch_size", "grad_accum"):
        key = (
            "train_micro_batch_size_per_gpu"
            if field == "batch_size"
            else "gradient_accumulation_steps"
        )
        current = f.data.get(key, "auto")
        return [] if current == "auto" else [(key, value)]
    return table[field](value) if field in table else None


WRITERS: dict[str, Callable[[str, Any, JobFile], Keys | None]] = {
    "hf": _hf,
    "llamafactory": _llamafactory,
    "axolotl": _axolotl,
    "torchtune": _torchtune,
    "litgpt": _litgpt,
    "deepspeed": _deepspeed,
    "accelerate": lambda field, value, f: None,
}


@dataclass(frozen=True, kw_only=True)
class FileEdit:
    path: str
    old_text: str
    new_text: str
    keys: tuple[tuple[str, Any], ...]

    def diff(self) -> str:
        return "".join(
            difflib.unified_diff(
                self.old_text.splitlines(keepends=True),
                self.new_text.splitlines(keepends=True),
                fromfile=f"a/{self.path}",
                tofile=f"b/{self.path}",
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
        keys = keys_by_file[f.path]
        if keys:
            new = set_json(f.text, keys) if not f.is_yaml else set_yaml(f.text, keys)
            edits.append(FileEdit(path=f.path, old_text=f.text, new_text=new, keys=tuple(keys)))
    return edits, unexpressed


def set_json(text: str, keys: Keys) -> str:
    data = json.loads(text)
    for key, value in keys:
        node = data
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    match = re.search(r"\n(\s+)\"", text)
    indent = len(match.group(1)) if match else 2
    return json.dumps(data, indent=indent) + ("\n" if text.endswith("\n") else "")


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return str(value)


def set_yaml(text: str, keys: Keys) -> str:
    """Set dotted ``keys`` in YAML ``text`` line by line (block mappings, as these configs are
    written); a key that is absent is added at the end of its parent block."""
    lines = text.splitlines()
    for key, value in keys:
        lines = _set_yaml_line(lines, key.split("."), _yaml_scalar(value))
    return "\n".join(lines) + ("\n" if text.endswith("\n") or not text else "")


def _set_yaml_line(lines: list[str], path: list[str], value: str) -> list[str]:
    start, end, indent = 0, len(lines), 0
    for depth, name in enumerate(path):
        pattern = re.compile(rf"^{' ' * indent}{re.escape(name)}\s*:(.*)$")
        found = None
        for i in range(start, end):
            if pattern.match(lines[i]):
                found = i
                break
        last = depth == len(path) - 1
        if found is None:
            insert_at = end
            while insert_at > start and not lines[insert_at - 1].strip():
                insert_at -= 1
            new = [f"{' ' * indent}{name}: {value}"] if last else [f"{' ' * indent}{name}:"]
            if not last:
                rest = path[depth + 1 :]
                for j, child in enumerate(rest):
                    pad = " " * (indent + 2 * (j + 1))
                    new.append(f"{pad}{child}: {value}" if j == len(rest) - 1 else f"{pad}{child}:")
            return lines[:insert_at] + new + lines[insert_at:]
        if last:
            m = pattern.match(lines[found])
            assert m is not None
            comment = ""
            if "#" in m.group(1):
                comment = "  #" + m.group(1).split("#", 1)[1]
            lines = list(lines)
            lines[found] = f"{' ' * indent}{name}: {value}{comment}"
            return lines
        # descend: the block is the following lines indented deeper
        child_start = found + 1
        child_end = child_start
        while child_end < end and (
            not lines[child_end].strip()
            or len(lines[child_end]) - len(lines[child_end].lstrip()) > indent
        ):
            child_end += 1
        nxt = next((ln for ln in lines[child_start:child_end] if ln.strip()), None)
        indent = (len(nxt) - len(nxt.lstrip())) if nxt else indent + 2
        start, end = child_start, child_end
    return lines
