"""Byte units, bytes per dtype, and parsing/formatting of human sizes.

Memory inside memfit is always an ``int`` of bytes. Human units appear only in ``report/`` and the
CLI. ``GB`` means 10**9 bytes and ``GiB`` 2**30 bytes; a bare ``G`` is read as GiB (how GPU memory
is usually meant).
"""

from __future__ import annotations

import re

KiB = 1024
MiB = 1024**2
GiB = 1024**3
KB = 1000
MB = 1000**2
GB = 1000**3

#: Storage size of one element per dtype name (torch / safetensors / HF ``torch_dtype`` spellings).
DTYPE_BYTES: dict[str, float] = {
    "float64": 8,
    "F64": 8,
    "float32": 4,
    "F32": 4,
    "float16": 2,
    "F16": 2,
    "bfloat16": 2,
    "BF16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "int64": 8,
    "I64": 8,
    "int32": 4,
    "I32": 4,
    "int16": 2,
    "I16": 2,
    "int8": 1,
    "I8": 1,
    "uint8": 1,
    "U8": 1,
    "bool": 1,
    "BOOL": 1,
}

_UNITS = {
    "": 1,
    "b": 1,
    "k": KiB,
    "kb": KB,
    "kib": KiB,
    "m": MiB,
    "mb": MB,
    "mib": MiB,
    "g": GiB,
    "gb": GB,
    "gib": GiB,
    "t": 1024**4,
    "tb": 1000**4,
    "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str) -> int:
    """Parse ``"80GB"``, ``"79.6 GiB"``, ``"512MiB"`` or ``"1024"`` into bytes.

    Raises ValueError (the CLI turns it into a SpecError) with the accepted units.
    """
    m = _SIZE_RE.match(str(text))
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(
            f"cannot read memory size {text!r}: write a number with a unit such as 80GB, 79.6GiB, "
            "512MiB (GB = 10^9 bytes, GiB = 2^30 bytes)"
        )
    return int(round(float(m.group(1)) * _UNITS[unit]))


def format_bytes(n_bytes: int | float | None, *, binary: bool = True) -> str:
    """``format_bytes(3 * GiB) == "3.00 GiB"``; ``None`` (unknown) prints as ``"n/a"``."""
    if n_bytes is None:
        return "n/a"
    sign = "-" if n_bytes < 0 else ""
    value = abs(float(n_bytes))
    steps = (
        [("TiB", 1024**4), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)]
        if binary
        else [("TB", 1000**4), ("GB", GB), ("MB", MB), ("kB", KB)]
    )
    for name, size in steps:
        if value >= size:
            return f"{sign}{value / size:.2f} {name}"
    return f"{sign}{int(value)} B"
