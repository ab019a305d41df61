"""Exact parameter counts and dtypes from ``*.safetensors`` headers, without reading any weights.

A safetensors file starts with an 8-byte little-endian ``N``, then ``N`` bytes of JSON describing
every tensor (``dtype``, ``shape``, ``data_offsets`` into the data block that follows), then the
data (format spec: https://github.com/huggingface/safetensors#format). Only the first ``8 + N``
bytes are read here, so a 140 GB checkpoint costs a few kilobytes of I/O.

``n_params`` counts the elements the files store. Tied weights are stored once, so a tied LM head is
not counted twice; packed quantized weights (e.g. GPTQ ``I32``) count packed elements, not the
logical parameters they encode.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from memfit.errors import ModelConfigError
from memfit.units import MB
from memfit.userfiles import UserFileError, open_regular, read_text

#: Bytes of the little-endian u64 that opens every safetensors file.
HEADER_LENGTH_BYTES = 8
#: Largest JSON header accepted. The safetensors reader itself refuses headers over 100 MB
#: (``MAX_HEADER_SIZE`` in safetensors/src/tensor.rs); a bigger value means garbage, not a model.
MAX_HEADER_BYTES = 100 * MB
#: The one header key that is not a tensor.
METADATA_KEY = "__metadata__"
INDEX_FILENAME = "model.safetensors.index.json"


@dataclass(frozen=True, kw_only=True)
class SafetensorsInfo:
    """What the headers of a checkpoint's safetensors files say, summed over the files."""

    n_params: int
    total_bytes: int  # bytes of tensor data (sum of data_offsets spans)
    dtype_counts: dict[str, int]  # safetensors dtype ("BF16", "F32", ...) -> number of elements
    files: tuple[str, ...]


def _bad(path: Path, what: str) -> ModelConfigError:
    return ModelConfigError(
        f"{path}: not a readable safetensors file ({what}); re-download it or pass another file"
    )


def read_safetensors_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON header of one safetensors file, validated against the file's size.

    Reads only the 8-byte length and the header. Raises ModelConfigError naming the file when it
    is too short, declares a header over 100 MB, holds invalid JSON, or is truncated (its tensors
    claim more data than the file contains).
    """
    p = Path(path)
    try:
        file_bytes, header_bytes, raw = _read_prefix(p)
    except OSError as e:
        raise _bad(p, f"{type(e).__name__}: {e.strerror or e}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _bad(p, f"header is not UTF-8 JSON: {e}") from None
    except RecursionError:
        raise _bad(p, "header JSON is nested too deeply") from None
    if not isinstance(header, dict):
        raise _bad(p, f"header is a JSON {type(header).__name__}, not an object")
    data_bytes = file_bytes - HEADER_LENGTH_BYTES - header_bytes
    end = max((_tensor_span(p, k, v)[1] for k, v in header.items() if k != METADATA_KEY), default=0)
    if end > data_bytes:
        raise _bad(
            p,
            f"tensors need {end} bytes of data but the file holds {data_bytes}: it is truncated",
        )
    return header


def _read_prefix(p: Path) -> tuple[int, int, bytes]:
    """(file size, declared header length, header bytes), checking the length before reading.
    The file is opened by :func:`memfit.userfiles.open_regular` (a FIFO or device is refused)
    and its size taken from the open file."""
    try:
        with open_regular(p, what="safetensors file") as f:
            return _read_open_prefix(p, f)
    except UserFileError as e:
        raise ModelConfigError(str(e)) from None


def _read_open_prefix(p: Path, f: IO[bytes]) -> tuple[int, int, bytes]:
    file_bytes = os.fstat(f.fileno()).st_size
    prefix = f.read(HEADER_LENGTH_BYTES)
    if len(prefix) < HEADER_LENGTH_BYTES:
        raise _bad(p, f"{file_bytes} bytes, shorter than the 8-byte header length")
    (header_bytes,) = struct.unpack("<Q", prefix)  # unsigned: never negative
    if header_bytes > MAX_HEADER_BYTES:
        raise _bad(p, f"header length {header_bytes} exceeds the 100 MB limit")
    if header_bytes > file_bytes - HEADER_LENGTH_BYTES:
        raise _bad(
            p,
            f"header length {header_bytes} but only {file_bytes - HEADER_LENGTH_BYTES} "
            "bytes follow: the file is truncated",
        )
    raw = f.read(header_bytes)
    if len(raw) < header_bytes:
        raise _bad(p, f"the header ends early ({len(raw)} of {header_bytes} bytes)")
    return file_bytes, header_bytes, raw


def _tensor_span(path: Path, name: str, entry: Any) -> tuple[int, int]:
    ok = (
        isinstance(entry, dict)
        and isinstance(entry.get("dtype"), str)
        and isinstance(entry.get("shape"), list)
        and all(isinstance(d, int) and d >= 0 for d in entry["shape"])
        and isinstance(entry.get("data_offsets"), list)
        and len(entry["data_offsets"]) == 2
        and all(isinstance(o, int) for o in entry["data_offsets"])
        and 0 <= entry["data_offsets"][0] <= entry["data_offsets"][1]
    )
    if not ok:
        raise _bad(path, f"tensor {name!r} lacks a valid dtype, shape or data_offsets")
    start, end = entry["data_offsets"]
    return start, end


def summarize_safetensors(paths: Sequence[str | os.PathLike[str]]) -> SafetensorsInfo:
    """Sum the headers of ``paths``: exact element counts per dtype and bytes of tensor data."""
    n_params = 0
    total_bytes = 0
    dtype_counts: dict[str, int] = {}
    for path in paths:
        header = read_safetensors_header(path)
        for name, entry in header.items():
            if name == METADATA_KEY:
                continue
            n = math.prod(entry["shape"])
            n_params += n
            dtype_counts[entry["dtype"]] = dtype_counts.get(entry["dtype"], 0) + n
            start, end = entry["data_offsets"]
            total_bytes += end - start
    return SafetensorsInfo(
        n_params=n_params,
        total_bytes=total_bytes,
        dtype_counts=dtype_counts,
        files=tuple(str(p) for p in paths),
    )


def find_safetensors(directory: Path) -> list[Path]:
    """The checkpoint files in ``directory``: the shards its index names, else every *.safetensors.

    Raises ModelConfigError when the index is unreadable or names shards that are missing.
    """
    index_path = directory / INDEX_FILENAME
    if not index_path.is_file():
        return sorted(directory.glob("*.safetensors"))
    try:
        index = json.loads(read_text(index_path, what="safetensors index"))
        shards = sorted(set(index["weight_map"].values()))
    except UserFileError as e:
        raise ModelConfigError(str(e)) from None
    except (RecursionError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise ModelConfigError(
            f"{index_path}: not a readable safetensors index ({type(e).__name__}: {e}); "
            "re-download it or delete it so the *.safetensors files are read directly"
        ) from None
    outside = [s for s in shards if Path(s).name != s or s in ("", ".", "..")]
    if outside:
        raise ModelConfigError(
            f"{index_path} names shard(s) outside its folder ({', '.join(map(repr, outside))}); "
            "a shard is a file name in the same folder: fix or delete the index"
        )
    files = [directory / shard for shard in shards]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise ModelConfigError(
            f"{index_path} names {len(missing)} shard(s) that are not in {directory}: "
            f"{', '.join(missing)}; download every shard, or remove the index to size the "
            "files that are there"
        )
    return files
