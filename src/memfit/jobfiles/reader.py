"""What every format reader shares: the parsed file, the keys it used, the job fields it set.

A reader walks one parsed file (a mapping) with a :class:`KeyReader`: ``take`` marks a key used and
returns its value, ``set`` records a job field with the key it came from, ``no_effect`` marks keys
memfit knows and that do not change memory, ``not_modelled`` records a key that changes memory but
that memfit does not model (a warning). Every key left over is *unknown*: listed, never dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from memfit.errors import SpecError

MISSING: Any = object()


@dataclass(frozen=True, kw_only=True)
class Setting:
    """One job field set by one key of one file (``value`` in memfit's terms)."""

    field: str
    value: Any
    key: str
    file: str
    raw: Any = None
    #: a ``precision`` that is the dtype the file loads the model in (TRL ``dtype``,
    #: LLaMA-Factory's compute dtype): another file's same-width autocast switch over it is one
    #: reading, not a disagreement (files.combine)
    load_dtype: bool = False

    def describe(self) -> str:
        return f"{self.field}={self.value!r} ({self.key}: {self.raw!r} in {self.file})"


@dataclass(frozen=True, kw_only=True)
class Warning_:
    key: str
    file: str
    message: str

    def describe(self) -> str:
        return f"{self.key} ({self.file}): {self.message}"


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys (lists and scalars are leaves)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


@dataclass
class KeyReader:
    """One file being read: its flattened keys and what the reader made of them."""

    file: str
    data: Mapping[str, Any]
    settings: list[Setting] = field(default_factory=list)
    warnings: list[Warning_] = field(default_factory=list)
    no_effect_keys: list[str] = field(default_factory=list)
    used: set[str] = field(default_factory=set)
    #: the GPUs the launcher starts (``memfit check --gpus N``), for a format whose file leaves
    #: them to it (torchtitan's ``data_parallel_shard_degree = -1``); None: not given
    launcher_gpus: int | None = None

    def __post_init__(self) -> None:
        self.flat = flatten(self.data)

    def has(self, key: str) -> bool:
        return key in self.flat or any(k.startswith(key + ".") for k in self.flat)

    def take(self, key: str, default: Any = MISSING) -> Any:
        """The value at dotted ``key`` (a sub-mapping for a prefix), marking it used."""
        if key in self.flat:
            self.used.add(key)
            return self.flat[key]
        sub = {k[len(key) + 1 :]: v for k, v in self.flat.items() if k.startswith(key + ".")}
        if sub:
            self.used.update(f"{key}.{k}" for k in sub)
            return _unflatten(sub)
        return default

    def set(
        self, field_: str, value: Any, key: str, raw: Any = MISSING, *, load_dtype: bool = False
    ) -> None:
        self.settings.append(
            Setting(
                field=field_,
                value=value,
                key=key,
                file=self.file,
                raw=value if raw is MISSING else raw,
                load_dtype=load_dtype,
            )
        )

    def gpus(self, key: str, count: int, raw: Any, launcher: str) -> int:
        """The job's GPU count: the file's ``key`` (``count``), unless the launcher's count
        (``memfit check --gpus N``) differs, which wins as the launcher's flag does
        (``launcher``, e.g. ``accelerate launch --num_processes``) and is said. Returns it."""
        launched = self.launcher_gpus
        if launched is None or launched == count:
            self.set("gpus", count, key, raw)
            return count
        self.set("gpus", launched, key, f"{raw}, launched on --gpus {launched}")
        self.warn(
            key,
            f"{key} is {raw} but --gpus {launched} was given: estimated on {launched} GPUs, "
            f"as {launcher} {launched} would run it",
        )
        return launched

    def int_key(self, key: str, field_: str, *, low: int = 1) -> None:
        """``field_`` from the whole number at ``key``, when the file has it."""
        if self.has(key):
            value = self.take(key)
            self.set(field_, as_int(self, key, value, low=low), key, value)

    def warn(self, key: str, message: str) -> None:
        self.warnings.append(Warning_(key=key, file=self.file, message=message))

    def class_optimizer(self, key: str, class_path: str, table: Mapping[str, str | None]) -> str:
        """memfit's optimizer for a class path (torchtune ``_component_``, LitGPT
        ``class_path``); one not modelled is a warning and estimated as AdamW."""
        name = table.get(class_path)
        if name is None:
            self.warn(key, f"{class_path} is not modelled; estimated as AdamW")
            return "adamw"
        return name

    def no_effect(self, keys: Iterable[str]) -> None:
        """Known keys that do not change memory (listed as such, not as unknown)."""
        for key in dict.fromkeys(keys):
            for k in list(self.flat):
                if (k == key or k.startswith(key + ".")) and k not in self.used:
                    self.used.add(k)
                    self.no_effect_keys.append(k)

    def not_modelled(self, key: str, message: str) -> None:
        """A key that changes memory and is not modelled: a warning when it is set; a value
        that means "off" (:func:`is_unset`: false, null, empty) is read silently."""
        if key in self.flat or self.has(key):
            value = self.take(key)
            if not is_unset(value):
                self.warnings.append(Warning_(key=key, file=self.file, message=message))

    def drop_setting(self, field_: str) -> None:
        """Forget what this file said of ``field_`` so far (a later key of the same file
        refines it, e.g. a load dtype next to the ``bf16`` flag)."""
        self.settings = [s for s in self.settings if s.field != field_]

    def unknown(self) -> list[str]:
        return [k for k in self.flat if k not in self.used]

    def fail(self, key: str, value: Any, rule: str) -> SpecError:
        return SpecError(f"{self.file}: {key} ({value!r}) {rule}")


def _unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in flat.items():
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def as_bool(r: KeyReader, key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
        return value.lower() in ("true", "yes", "1")
    if value in (0, 1):
        return bool(value)
    raise r.fail(key, value, "must be true or false")


def as_int(r: KeyReader, key: str, value: Any, *, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise r.fail(key, value, f"must be a whole number of {low} or more")
    try:
        number = int(value)
    except ValueError:
        raise r.fail(key, value, f"must be a whole number of {low} or more") from None
    if number < low:
        raise r.fail(key, value, f"must be a whole number of {low} or more")
    return number


def is_unset(value: Any) -> bool:
    """A value the frameworks read as "not set / off": YAML ``false`` or an empty key (``null``),
    an empty string or mapping or list, or the strings ``false`` / ``no`` / ``none``. (axolotl's
    ``DictDefault`` returns None for an empty key and tests every switch for truth;
    TrainingArguments' ``fsdp: ""`` and ``packing: false`` are their defaults.)"""
    if value is None or value is False:
        return True
    if isinstance(value, str):
        return value.strip().lower() in ("", "false", "no", "none", "null")
    return isinstance(value, (dict, list, tuple)) and not value


def is_auto(value: Any) -> bool:
    """DeepSpeed's and accelerate's ``"auto"``: the other config decides."""
    return isinstance(value, str) and value.strip().lower() == "auto"
