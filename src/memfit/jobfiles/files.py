"""Read a user's job files, name each one's format, and combine them into one job.

Formats (``FORMATS``): Hugging Face ``TrainingArguments`` / TRL configs (``hf``), axolotl,
LLaMA-Factory, torchtune, LitGPT, DeepSpeed, accelerate, torchtitan's TOML job files. Files are
read through the bounded reader (:mod:`memfit.userfiles`), JSON strictly, YAML with
``yaml.safe_load`` (no tags, no code) and TOML (a ``.toml`` file) with the standard library's
``tomllib``.

Combining: a field set explicitly by two files must agree (as Hugging Face's Trainer refuses a
DeepSpeed config whose micro-batch differs from its own); a file's *default* (a key it leaves
out, shown as ``(default)``) yields to any file that sets the field.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

try:
    import tomllib
except ImportError:  # Python 3.10: the same parser as the tomli package, when installed
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ImportError:
        tomllib = None  # type: ignore[assignment]

from memfit.errors import SpecError
from memfit.jobfiles import yaml_load
from memfit.jobfiles.axolotl import read_axolotl
from memfit.jobfiles.distributed import read_accelerate, read_deepspeed
from memfit.jobfiles.hf import LOAD_DTYPE_KEYS, read_hf, read_llamafactory
from memfit.jobfiles.litgpt import read_litgpt
from memfit.jobfiles.reader import KeyReader, Setting, Warning_
from memfit.jobfiles.torchtitan import read_torchtitan
from memfit.jobfiles.torchtune import apply_overrides, read_torchtune
from memfit.spec.rules import DEEPSPEED_SHARDS
from memfit.userfiles import CONFIG_MAX_BYTES, parse_json, read_text

FORMATS: dict[str, Callable[[KeyReader], None]] = {
    "hf": read_hf,
    "axolotl": read_axolotl,
    "llamafactory": read_llamafactory,
    "torchtune": read_torchtune,
    "litgpt": read_litgpt,
    "deepspeed": read_deepspeed,
    "accelerate": read_accelerate,
    "torchtitan": read_torchtitan,
}
FORMAT_NAMES = {
    "hf": "Hugging Face TrainingArguments / TRL config",
    "axolotl": "axolotl YAML",
    "llamafactory": "LLaMA-Factory YAML",
    "torchtune": "torchtune recipe",
    "litgpt": "LitGPT fine-tune YAML",
    "deepspeed": "DeepSpeed JSON",
    "accelerate": "accelerate config",
    "torchtitan": "torchtitan TOML job file",
}
#: Defaults of each format for a key it leaves out (the framework's own default).
FORMAT_DEFAULTS: dict[str, dict[str, Any]] = {
    # transformers 5.x TrainingArguments: per_device_train_batch_size=8, optim=adamw_torch_fused
    "hf": {"batch_size": 8, "optimizer": "adamw-fused", "checkpointing": "none"},
    # LLaMA-Factory enables gradient checkpointing unless disable_gradient_checkpointing is set
    "llamafactory": {"batch_size": 8, "optimizer": "adamw-fused", "checkpointing": "full"},
    "axolotl": {"optimizer": "adamw", "checkpointing": "none", "batch_size": 1},
    "torchtune": {"optimizer": "adamw", "checkpointing": "none"},
    "litgpt": {"optimizer": "adamw", "checkpointing": "none"},
}


@dataclass
class JobFile:
    """One parsed file: its path, format, content and what was read from it."""

    path: str
    format: str
    data: dict[str, Any]
    text: str
    reader: KeyReader
    #: ``tune run``-style ``key=value`` overrides applied over the text (the first file's)
    overrides: tuple[str, ...] = ()
    #: the launcher's GPU count given with the file (``memfit check --gpus``)
    gpus: int | None = None

    @property
    def is_yaml(self) -> bool:
        return not self.text.lstrip().startswith("{")


def parse(path: str | Path) -> tuple[str, dict[str, Any]]:
    """The text and the mapping of a JSON or YAML file."""
    text = read_text(path, what="job file", max_bytes=CONFIG_MAX_BYTES)
    return text, parse_text(text, path)


def parse_text(text: str, path: str | Path) -> dict[str, Any]:
    """The mapping a JSON, YAML or TOML (``*.toml``) job file's ``text`` holds (``path`` names
    it in errors)."""
    if str(path).lower().endswith(".toml"):
        return parse_toml(text, path)
    if text.lstrip().startswith("{"):
        data = parse_json(text, what="job file", source=str(path))
    else:
        data = yaml_load.safe_load(text, str(path))  # bounded: depth, nodes, aliases
    if not isinstance(data, dict):
        raise SpecError(
            f"{path}: expected a mapping of keys (a training / launcher config), got "
            f"{type(data).__name__}"
        )
    return data


def parse_toml(text: str, path: str | Path) -> dict[str, Any]:
    """The mapping a TOML job file holds (torchtitan's), errors as one line naming the file."""
    if tomllib is None:
        raise SpecError(f"{path}: reading TOML needs Python 3.11 or later (or: pip install tomli)")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: not valid TOML ({exc}); fix the file") from None
    except RecursionError:
        raise SpecError(f"{path}: nested too deeply to be a real job file") from None


def detect(data: Mapping[str, Any], path: str) -> str:
    """The format of a parsed file, from the keys each format is known by."""
    keys = set(data)
    model = data.get("model")
    if isinstance(model, dict) and "_component_" in model:
        return "torchtune"
    if (
        isinstance(model, dict)
        and {"name", "flavor"} & set(model)
        and any(isinstance(data.get(k), dict) for k in ("training", "parallelism", "experimental"))
    ):
        return "torchtitan"
    if keys & {"zero_optimization", "train_micro_batch_size_per_gpu"} or (
        isinstance(data.get("bf16"), dict) or isinstance(data.get("fp16"), dict)
    ):
        return "deepspeed"
    if keys & {"distributed_type", "compute_environment"}:
        return "accelerate"
    if "checkpoint_dir" in keys and (isinstance(data.get("train"), dict) or "lora_r" in keys):
        return "litgpt"
    if keys & {"base_model", "micro_batch_size", "sequence_len", "adapter"}:
        return "axolotl"
    if keys & {"finetuning_type", "cutoff_len", "quantization_bit"}:
        return "llamafactory"
    if keys & {"per_device_train_batch_size", "output_dir", "model_name_or_path", "optim"}:
        return "hf"
    raise SpecError(
        f"{path}: not a format memfit reads (keys: {', '.join(sorted(keys)[:8])}); memfit check "
        f"reads {', '.join(FORMAT_NAMES.values())}; name it with --format "
        f"({'|'.join(FORMATS)})"
    )


def read_file(
    path: str | Path,
    *,
    fmt: str | None = None,
    overrides: Sequence[str] = (),
    gpus: int | None = None,
) -> JobFile:
    text = read_text(path, what="job file", max_bytes=CONFIG_MAX_BYTES)
    return read_text_as(text, path, fmt=fmt, overrides=overrides, gpus=gpus)


def read_text_as(
    text: str,
    path: str | Path,
    *,
    fmt: str | None = None,
    overrides: Sequence[str] = (),
    gpus: int | None = None,
) -> JobFile:
    """The job file ``path`` would be if it held ``text``."""
    data = parse_text(text, path)
    if overrides:
        data = apply_overrides(data, list(overrides))
    kind = fmt or detect(data, str(path))
    if kind not in FORMATS:
        raise SpecError(f"--format ({kind!r}) must be one of {', '.join(FORMATS)}")
    reader = KeyReader(file=Path(path).name, data=data, launcher_gpus=gpus)
    FORMATS[kind](reader)
    return JobFile(
        path=str(path),
        format=kind,
        data=data,
        text=text,
        reader=reader,
        overrides=tuple(overrides),
        gpus=gpus,
    )


@dataclass
class Job:
    """The job several files describe together."""

    files: list[JobFile]
    fields: dict[str, Setting] = field(default_factory=dict)

    @property
    def warnings(self) -> list[Warning_]:
        return [w for f in self.files for w in f.reader.warnings]

    def unknown(self) -> list[tuple[str, str]]:
        return [(f.reader.file, k) for f in self.files for k in f.reader.unknown()]

    def no_effect(self) -> list[tuple[str, str]]:
        return [(f.reader.file, k) for f in self.files for k in f.reader.no_effect_keys]

    def value(self, name: str, default: Any = None) -> Any:
        s = self.fields.get(name)
        return default if s is None else s.value


def _is_default(s: Setting) -> bool:
    return s.key.startswith("(") or (isinstance(s.raw, str) and s.raw.endswith("(default)"))


def _half_load(a: Setting, b: Setting) -> Setting | None:
    """The ``*-true`` precision of a half-dtype model load when the other setting is the same
    width's ``*-mixed`` autocast (None: another disagreement)."""
    if a.field != "precision" or b.field != "precision":
        return None
    for true, mixed in ((a, b), (b, a)):
        if (
            (true.key in LOAD_DTYPE_KEYS or true.load_dtype)
            and str(true.value).endswith("-true")
            and str(mixed.value).endswith("-mixed")
            and str(true.value).rsplit("-", 1)[0] == str(mixed.value).rsplit("-", 1)[0]
        ):
            return true
    return None


def combine(files: list[JobFile]) -> Job:
    job = Job(files=files)
    for f in files:
        for fname, value in FORMAT_DEFAULTS.get(f.format, {}).items():
            job.fields.setdefault(
                fname, Setting(field=fname, value=value, key="(default)", file=f.reader.file)
            )
    for f in files:
        for s in f.reader.settings:
            old = job.fields.get(s.field)
            if old is None or _is_default(old):
                job.fields[s.field] = s
            elif _is_default(s) or old.value == s.value:
                continue
            elif (load := _half_load(old, s)) is not None:
                # one file's autocast switch (accelerate mixed_precision: bf16) over the model
                # another file loads in that half dtype (TRL dtype: bfloat16): autocast over
                # half weights is pure half-precision training, one precision (read_hf's rule
                # within one file)
                job.fields[s.field] = load
            else:
                raise SpecError(
                    f"the files disagree on {s.field}: {old.key}: {old.raw!r} in {old.file} but "
                    f'{s.key}: {s.raw!r} in {s.file}; make them agree (or set one to "auto")'
                )
    # A Trainer config's `deepspeed: path` names a DeepSpeed file: it must be among the files.
    _deepspeed_over_load_dtype(job)
    return job


def _deepspeed_over_load_dtype(job: Job) -> None:
    """A model a file loads in 16 bits (a ``load_dtype`` reading, LLaMA-Factory's) trained under
    DeepSpeed ZeRO runs as DeepSpeed's bf16 / fp16 optimizer does: the 16-bit model with fp32
    masters of the trainable parameters, memfit's ``*-mixed`` under ZeRO
    (``spec.rules.run_precision``; ``*-true`` there is refused as pure 16-bit states)."""
    prec, shard = job.fields.get("precision"), job.fields.get("shard")
    if prec is None or shard is None or not prec.load_dtype:
        return
    if shard.value in DEEPSPEED_SHARDS and prec.value in ("bf16-true", "16-true"):
        job.fields["precision"] = replace(
            prec,
            value=str(prec.value).replace("-true", "-mixed"),
            raw=f"{prec.raw}, under DeepSpeed {shard.value}",
        )


def read_job(
    paths: Sequence[str | Path],
    *,
    fmt: str | None = None,
    overrides: Sequence[str] = (),
    gpus: int | None = None,
) -> Job:
    """Read and combine ``paths`` (``overrides``: ``tune run``-style ``key=value``, applied to
    the first file; ``gpus``: the launcher's GPU count, for a file that leaves it to the
    launcher)."""
    if not paths:
        raise SpecError("name at least one job file (e.g. memfit check axolotl.yml)")
    files = [
        read_file(p, fmt=fmt if i == 0 else None, overrides=overrides if i == 0 else (), gpus=gpus)
        for i, p in enumerate(paths)
    ]
    files += _referenced_deepspeed(files)
    return combine(files)


def reread(job: Job, texts: Mapping[str, str]) -> Job:
    """``job`` as its files would read with ``texts`` (path → new text) in place of theirs:
    each file re-read in its own format, with its overrides, and combined again (the check of
    an edit before it is written: the edited files must read as the job the fix promised)."""
    files = [
        read_text_as(
            texts.get(f.path, f.text), f.path, fmt=f.format, overrides=f.overrides, gpus=f.gpus
        )
        for f in job.files
    ]
    for f in files:  # a referenced DeepSpeed file is among the files already
        if isinstance(f.data.get("deepspeed"), str) and f.data["deepspeed"]:
            f.reader.take("deepspeed")
    return combine(files)


def _referenced_deepspeed(files: list[JobFile]) -> list[JobFile]:
    """DeepSpeed files a training config names (``deepspeed: ds.json``) and that exist beside
    it, unless given already."""
    given = {Path(f.path).resolve() for f in files}
    extra: list[JobFile] = []
    for f in files:
        ref = f.data.get("deepspeed")
        if not isinstance(ref, str) or not ref:
            continue
        f.reader.take("deepspeed")
        for base in (Path(f.path).parent, Path.cwd()):
            candidate = (base / ref).expanduser()
            if candidate.is_file():
                if candidate.resolve() not in given:
                    extra.append(read_file(candidate, fmt="deepspeed"))
                    given.add(candidate.resolve())
                break
        else:
            f.reader.warnings.append(
                Warning_(
                    key="deepspeed",
                    file=f.reader.file,
                    message=f"names DeepSpeed config {ref!r}, which is not there: pass it too "
                    "(memfit check train.yml ds.json)",
                )
            )
    return extra
