"""GGUF models for llama.cpp (torch-free): a ``.gguf`` file's header, or a bundled config plus a
file type, as one :class:`GgufModel` (hyper-parameters and every tensor's type, shape, bytes).

A GGUF file is a header (magic ``GGUF``, version, tensor count, metadata key/values, then per
tensor: name, dims, ggml type, offset) followed by the tensor data (format:
ggml-org/ggml docs/gguf.md). memfit reads the header only, through the one bounded reader
(:func:`memfit.userfiles.read_head`), and decodes its values with the ``gguf`` package's own
tables (``GGUFValueType``, ``GGMLQuantizationType``, ``GGML_QUANT_SIZES``; the ``llamacpp``
extra). ``gguf.GGUFReader`` is not used: it memory-maps the whole file and slices every tensor's
data, so it needs the weights present (memfit's test headers ship without them) and reads past
the bounded reader. A split model (``*-00001-of-00003.gguf``) is read part by part.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path
from types import ModuleType
from typing import Any

from memfit.errors import MemfitError, MissingDependencyError, ModelConfigError, NotModelledError
from memfit.models.ggml_types import (
    GGML_BLOCKS,
    file_type,
    llama_tensor_shapes,
    row_bytes,
    tensor_type,
)
from memfit.models.source import resolve_model
from memfit.spec.llamacpp import FILE_TYPES as FILE_TYPE_NAMES
from memfit.userfiles import HeadReader, read_head

#: Header caps: a Gemma-3 header (262k-token vocabulary with scores) is ~6 MB.
GGUF_HEADER_MAX_BYTES = 256 * 1024 * 1024
MAX_TENSORS = 1_000_000
MAX_KV = 100_000
MAX_STRING_BYTES = 64 * 1024 * 1024
#: Arrays longer than this are skipped, their length kept (vocabularies, merges).
KEEP_ARRAY_MAX = 4096
#: Layers in which llama.cpp uses sliding-window attention, by architecture: ``set_swa_pattern(n)``
#: in src/llama-model.cpp (layer ``il`` is SWA when ``il % n < n - 1``).
SWA_PATTERNS = {"gemma2": 2, "gemma3": 6, "gpt-oss": 2, "cohere2": 4, "gemma3n": 5}
#: Architectures whose state is not (only) an attention KV cache: not modelled.
RECURRENT_ARCHS = ("mamba", "mamba2", "rwkv6", "rwkv7", "jamba", "falcon-h1", "qwen3next", "lfm2")

_SPLIT = re.compile(r"^(?P<stem>.*)-(?P<i>\d{5})-of-(?P<n>\d{5})\.gguf$")


def gguf_module() -> ModuleType:
    """The ``gguf`` package, or a MissingDependencyError naming the extra."""
    try:
        import gguf
    except ImportError:
        raise MissingDependencyError(
            "reading a .gguf file needs the gguf package: pip install 'memfit[llamacpp]' (a "
            "bundled model with a file type, e.g. llama-3.1-8b:Q4_K_M, needs nothing)"
        ) from None
    return gguf


@dataclass(frozen=True)
class GgufTensor:
    name: str
    ggml_type: str  # "Q4_K", "F32" ...
    shape: tuple[int, ...]  # ggml order: ne0 (the row) first
    n_bytes: int
    layer: int | None  # blk.N, or None

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True, kw_only=True)
class GgufModel:
    """What llama.cpp sizes: hyper-parameters (llama.cpp's hparams names) and the tensors."""

    name: str
    arch: str
    file_type: str | None
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: tuple[int, ...]  # per layer
    n_embd_head_k: int
    n_embd_head_v: int
    n_ff: int  # the widest FFN activation per token (a MoE: expert width x experts used)
    n_vocab: int
    n_ctx_train: int
    n_swa: int
    swa_layers: tuple[bool, ...]
    n_expert: int
    tensors: tuple[GgufTensor, ...]
    source: str  # "GGUF header <path>" or "bundled config + llama-quantize mix"
    metadata: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @property
    def total_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors)

    @cached_property
    def _layer_totals(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for t in self.tensors:
            if t.layer is not None:
                out[t.layer] = out.get(t.layer, 0) + t.n_bytes
        return out

    def layer_bytes(self, il: int) -> int:
        return self._layer_totals.get(il, 0)

    def tensor_bytes(self, name: str) -> int:
        return sum(t.n_bytes for t in self.tensors if t.name == name)

    def n_embd_k_gqa(self, il: int) -> int:
        return self.n_embd_head_k * self.n_head_kv[il]

    def n_embd_v_gqa(self, il: int) -> int:
        return self.n_embd_head_v * self.n_head_kv[il]

    @property
    def has_output(self) -> bool:
        """An ``output.weight`` of its own (False: tied to ``token_embd``)."""
        return any(t.name == "output.weight" for t in self.tensors)


# -- reading a header ----------------------------------------------------------------------------
def _unpack(r: HeadReader, fmt: str) -> Any:
    return struct.unpack("<" + fmt, r.read(struct.calcsize(fmt)))[0]


def _string(r: HeadReader, path: str) -> bytes:
    n = _unpack(r, "Q")
    if n > MAX_STRING_BYTES:
        raise ModelConfigError(f"GGUF file {path!r} has a {n:,}-byte string: is it a GGUF file?")
    return r.read(n)


#: gguf.GGUFValueType name -> struct format of the scalar types.
_SCALAR_FORMATS = {"UINT8": "B", "INT8": "b", "UINT16": "H", "INT16": "h", "UINT32": "I",
                   "INT32": "i", "FLOAT32": "f", "BOOL": "?", "UINT64": "Q", "INT64": "q",
                   "FLOAT64": "d"}  # fmt: skip


@cache
def _types(gg: ModuleType) -> tuple[dict[int, str], int, int]:
    """(scalar type code -> struct format, STRING code, ARRAY code) from gguf's GGUFValueType."""
    vt = gg.GGUFValueType
    scalars = {int(vt[name]): fmt for name, fmt in _SCALAR_FORMATS.items()}
    return scalars, int(vt.STRING), int(vt.ARRAY)


def _value(r: HeadReader, vtype: int, gg: ModuleType, path: str) -> Any:
    """One metadata value; an array longer than :data:`KEEP_ARRAY_MAX` is skipped (its length
    kept), a string array one length at a time, a scalar array in one read."""
    scalars, string_t, array_t = _types(gg)
    if vtype not in scalars and vtype not in (string_t, array_t):
        raise ModelConfigError(f"GGUF file {path!r} has a value of unknown type {vtype}")
    if vtype in scalars:
        return _unpack(r, scalars[vtype])
    if vtype == string_t:
        return _string(r, path).decode("utf-8", "replace")
    itype, n = _unpack(r, "I"), _unpack(r, "Q")
    if n > 1 << 32:
        raise ModelConfigError(f"GGUF file {path!r} has a {n:,}-element array")
    if n <= KEEP_ARRAY_MAX:
        return [_value(r, itype, gg, path) for _ in range(n)]
    if itype in scalars:  # a vocabulary's scores or types: skip in one read
        r.read(n * struct.calcsize("<" + scalars[itype]))
    elif itype == string_t:
        length = struct.Struct("<Q")
        for _ in range(n):
            (size,) = length.unpack(r.read(8))
            if size > MAX_STRING_BYTES:
                raise ModelConfigError(f"GGUF file {path!r} has a {size:,}-byte string")
            r.read(size)
    else:
        for _ in range(n):
            _value(r, itype, gg, path)
    return ("<array>", n)


def read_gguf_header(path: str | Path) -> tuple[dict[str, Any], list[GgufTensor]]:
    """The metadata and tensor table of one GGUF file (no tensor data is read)."""
    gg = gguf_module()
    p = str(path)
    with read_head(path, what="GGUF file", max_bytes=GGUF_HEADER_MAX_BYTES) as r:
        if _unpack(r, "I") != gg.GGUF_MAGIC:
            raise ModelConfigError(f"{p!r} is not a GGUF file (no GGUF magic at its start)")
        version = _unpack(r, "I")
        if version not in gg.READER_SUPPORTED_VERSIONS:
            raise ModelConfigError(f"GGUF file {p!r} is version {version}; memfit reads 2 and 3")
        n_tensors, n_kv = _unpack(r, "Q"), _unpack(r, "Q")
        if n_tensors > MAX_TENSORS or n_kv > MAX_KV:
            raise ModelConfigError(
                f"GGUF file {p!r} claims {n_tensors:,} tensors and {n_kv:,} keys: corrupt?"
            )
        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            key = _string(r, p).decode("utf-8", "replace")
            meta[key] = _value(r, _unpack(r, "I"), gg, p)
        tensors = [_tensor_info(r, gg, p) for _ in range(n_tensors)]
    return meta, tensors


def _tensor_info(r: HeadReader, gg: ModuleType, path: str) -> GgufTensor:
    name = _string(r, path).decode("utf-8", "replace")
    n_dims = _unpack(r, "I")
    if not 1 <= n_dims <= 4:
        raise ModelConfigError(f"GGUF file {path!r}: tensor {name} has {n_dims} dimensions")
    shape = tuple(int(_unpack(r, "Q")) for _ in range(n_dims))
    raw = _unpack(r, "I")
    _unpack(r, "Q")  # the data offset: not needed
    try:
        qtype = gg.GGMLQuantizationType(raw)
        block, size = gg.GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
        raise ModelConfigError(
            f"GGUF file {path!r}: tensor {name} has ggml type {raw}, unknown to gguf "
            f"{getattr(gg, '__version__', '')}: upgrade the gguf package"
        ) from None
    n = 1
    for dim in shape:
        n *= dim
    if shape[0] % block:
        raise ModelConfigError(f"GGUF file {path!r}: tensor {name} rows do not fill blocks")
    m = re.match(r"blk\.(\d+)\.", name)
    return GgufTensor(name, qtype.name, shape, n // block * size, int(m.group(1)) if m else None)


def _parts(path: Path) -> list[Path]:
    m = _SPLIT.match(path.name)
    if m is None or int(m.group("n")) == 1:
        return [path]
    n = int(m.group("n"))
    return [path.with_name(f"{m.group('stem')}-{i:05d}-of-{n:05d}.gguf") for i in range(1, n + 1)]


def load_gguf(path: str | Path) -> GgufModel:
    """A :class:`GgufModel` from a .gguf file (every part of a split model)."""
    p = Path(path)
    meta: dict[str, Any] = {}
    tensors: list[GgufTensor] = []
    for part in _parts(p):
        part_meta, part_tensors = read_gguf_header(part)
        meta = meta or part_meta
        tensors += part_tensors
    return _from_metadata(meta, tensors, name=p.name, source=f"GGUF header {p}")


def _per_layer(value: Any, n_layer: int, default: int) -> tuple[int, ...]:
    if isinstance(value, list):
        return tuple(int(v) for v in value[:n_layer])
    return (int(value if value is not None else default),) * n_layer


def _from_metadata(meta: Mapping[str, Any], tensors: list[GgufTensor], *, name: str,
                   source: str) -> GgufModel:  # fmt: skip
    arch = str(meta.get("general.architecture", ""))
    if not arch:
        raise ModelConfigError(f"{name}: GGUF metadata lacks general.architecture")
    if arch in RECURRENT_ARCHS or any(k.startswith(f"{arch}.ssm.") for k in meta):
        raise ModelConfigError(
            f"{name}: architecture {arch!r} keeps a recurrent state, which memfit does not model "
            "for llama.cpp yet (attention-only models are)"
        )
    a = meta.get
    try:
        n_layer = int(meta[f"{arch}.block_count"])
        n_embd = int(meta[f"{arch}.embedding_length"])
        heads = a(f"{arch}.attention.head_count")
    except (KeyError, TypeError, ValueError):
        raise ModelConfigError(
            f"{name}: GGUF metadata lacks {arch}.block_count / embedding_length"
        ) from None
    n_head = max(_per_layer(heads, n_layer, 1)) or 1
    n_head_kv = _per_layer(a(f"{arch}.attention.head_count_kv"), n_layer, n_head)
    head_k = int(a(f"{arch}.attention.key_length") or n_embd // n_head)
    head_v = int(a(f"{arch}.attention.value_length") or head_k)
    ff = a(f"{arch}.feed_forward_length") or 0
    n_ff = max(_per_layer(ff, n_layer, 0)) if ff else 0
    used = int(a(f"{arch}.expert_used_count") or 0)
    n_ff = max(n_ff, int(a(f"{arch}.expert_feed_forward_length") or 0) * used)
    embd = next((t for t in tensors if t.name == "token_embd.weight"), None)
    n_vocab = int(a(f"{arch}.vocab_size") or (embd.shape[1] if embd else 0))
    pattern = SWA_PATTERNS.get(arch, 0)
    n_swa = int(a(f"{arch}.attention.sliding_window") or 0)
    swa = tuple(bool(n_swa and pattern and il % pattern < pattern - 1) for il in range(n_layer))
    return GgufModel(
        name=name, arch=arch, file_type=_ftype_name(a("general.file_type")),
        n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv,
        n_embd_head_k=head_k, n_embd_head_v=head_v, n_ff=int(n_ff), n_vocab=n_vocab,
        n_ctx_train=int(a(f"{arch}.context_length") or 4096), n_swa=n_swa, swa_layers=swa,
        n_expert=int(a(f"{arch}.expert_count") or 0), tensors=tuple(tensors), source=source,
        metadata={k: v for k, v in meta.items() if not isinstance(v, tuple)},
    )  # fmt: skip


def _ftype_name(value: Any) -> str | None:
    """general.file_type's llama_ftype as its name (``Q4_K_M``), via gguf's LlamaFileType."""
    if value is None:
        return None
    try:
        return str(gguf_module().LlamaFileType(int(value)).name).removeprefix("MOSTLY_")
    except (ValueError, MissingDependencyError):
        return None


# -- a bundled config + a file type ------------------------------------------------------------
#: ModelSpec.model_type -> the llama.cpp architecture its conversion writes.
ARCH_OF = {
    "llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
    "qwen3_moe": "qwen3moe", "qwen2_moe": "qwen2moe", "mixtral": "llama", "gemma": "gemma",
    "gemma2": "gemma2", "gemma3": "gemma3", "gemma3_text": "gemma3", "phi3": "phi3",
    "olmo2": "olmo2",
}  # fmt: skip


def gguf_from_spec(spec: Any, name: str, ftype: str) -> GgufModel:
    """The GGUF ``llama-quantize --ftype`` would write for a config (:mod:`.ggml_types`)."""
    ftype = file_type(ftype)
    model_type = str(spec.model_type or "")
    if spec.text is not None:
        spec = spec.text
        model_type = str(spec.model_type or model_type)
    arch = ARCH_OF.get(model_type)
    if arch is None or not spec.hidden_size or not spec.n_layers or not spec.vocab_size:
        raise NotModelledError(
            f"{name}: a {model_type or 'model'} config has no llama.cpp tensor table in memfit "
            f"(it builds {', '.join(sorted(set(ARCH_OF)))}); pass the model's .gguf file instead",
            engine="llama.cpp",
        )
    n_layer, tied = spec.n_layers, bool(spec.tie_word_embeddings)
    tensors = []
    for t in llama_tensor_shapes(spec):
        kind = tensor_type(ftype, t.name, t.shape, layer=t.layer, n_layers=n_layer, tied=tied)
        n = 1
        for d in t.shape:
            n *= d
        tensors.append(GgufTensor(t.name, kind, t.shape, row_bytes(kind, n), t.layer))
    n_head = spec.n_heads
    hd = spec.head_dim or spec.hidden_size // n_head
    pattern = SWA_PATTERNS.get(arch, 0)
    n_swa = int(spec.sliding_window or 0) if pattern else 0
    if spec.layer_types:
        swa = tuple(t == "sliding_attention" for t in spec.layer_types[:n_layer])
    else:
        swa = tuple(bool(n_swa and il % pattern < pattern - 1) for il in range(n_layer))
    return GgufModel(
        name=f"{name}:{ftype}", arch=arch, file_type=ftype, n_layer=n_layer,
        n_embd=spec.hidden_size, n_head=n_head,
        n_head_kv=(spec.n_kv_heads or n_head,) * n_layer, n_embd_head_k=hd, n_embd_head_v=hd,
        n_ff=max(spec.intermediate_size or 0,
                 (spec.expert_intermediate_size or 0) * (spec.n_experts_per_token or 0)),
        n_vocab=spec.vocab_size, n_ctx_train=spec.max_positions or 4096,
        n_swa=n_swa if any(swa) else 0, swa_layers=swa, n_expert=spec.n_experts or 0,
        tensors=tuple(tensors),
        source=f"bundled config {name} + llama-quantize {ftype} mix (src/llama-quant.cpp)",
    )  # fmt: skip


__all__ = [
    "GGML_BLOCKS",
    "GgufModel",
    "GgufTensor",
    "gguf_from_spec",
    "gguf_module",
    "load_gguf",
    "read_gguf_header",
    "resolve_gguf",
    "split_file_type",
]


DEFAULT_FILE_TYPE = "Q4_K_M"  # Ollama's default tags and most GGUF repos' recommended file


def split_file_type(model: str) -> tuple[str, str | None]:
    """``llama-3.1-8b:Q4_K_M`` -> (``llama-3.1-8b``, ``Q4_K_M``), as ``llama-server -hf
    repo:quant`` spells it; a name without a known file type suffix is returned whole."""
    name, sep, tail = model.rpartition(":")
    if sep and name and tail.upper() in FILE_TYPE_NAMES:
        return name, tail.upper()
    return model, None


def resolve_gguf(model: str | Path, file_type_name: str | None = None) -> GgufModel:
    """MODEL as llama.cpp would load it: a ``.gguf`` path (its header), or a bundled name / config
    path / cached hub id, with ``:FILE_TYPE`` or ``file_type_name`` (default Q4_K_M)."""
    text = str(model)
    p = Path(text)
    if text.lower().endswith(".gguf") or p.is_file() and _has_magic(p):
        if file_type_name is not None:
            raise ModelConfigError(
                f"a file type ({file_type_name}) applies to a bundled config, not to {p.name}: "
                "the GGUF header has its own tensor types"
            )
        return load_gguf(p)
    name, suffix = split_file_type(text)
    if file_type_name is not None and suffix is not None and file_type_name.upper() != suffix:
        raise ModelConfigError(
            f"MODEL {text!r} names file type {suffix} and the job {file_type_name}: give one"
        )
    spec = resolve_model(name).spec
    if spec is None:
        raise ModelConfigError(f"{name!r} is a factory, not a config: pass its .gguf file")
    return gguf_from_spec(spec, name, file_type_name or suffix or DEFAULT_FILE_TYPE)


def _has_magic(path: Path) -> bool:
    with read_head(path, what="model file", max_bytes=4) as r:
        try:
            return r.read(4) == b"GGUF"
        except MemfitError:
            return False
