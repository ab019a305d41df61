"""A ``llama-server`` command line or an Ollama ``Modelfile``, turned into ``memfit llama-server``
arguments: ``memfit check`` hands either to the llama.cpp model (memfit.serving.llamacpp)
instead of reading it as a training config.

* **llama-server** (``llama-server``, ``./build/bin/llama-server``, ``llama-cli``; ``\\``
  continuations allowed): its own flags, which ``memfit llama-server`` spells the same way.
* **Ollama Modelfile** (``FROM`` + ``PARAMETER`` lines, https://docs.ollama.com/modelfile):
  ``FROM`` a ``.gguf`` path (relative to the Modelfile, as ``ollama create`` reads it) or a model
  memfit bundles (``NAME[:FILE_TYPE]``, e.g. ``llama-3.1-8b:Q4_K_M``; Ollama's library tags such
  as ``llama3.1:8b`` are named in :data:`OLLAMA_TAGS`, at Ollama's default Q4_K_M).
  Ollama runs llama.cpp with ``n_ctx = num_ctx x OLLAMA_NUM_PARALLEL``, ``n_batch = num_batch x
  parallel``, ``n_ubatch = num_batch`` (ollama ``llama/llama.go``: ``NewContextParams``) and
  ``num_gpu`` layers offloaded (default: as many as fit). Without ``num_ctx`` the context is
  Ollama's default by GPU memory: 4k under 24 GiB, 32k up to 48 GiB, 256k above
  (ollama ``docs/context-length.mdx`` at 948f693), or ``OLLAMA_CONTEXT_LENGTH``. The server's
  environment (``OLLAMA_NUM_PARALLEL``, default 1; ``OLLAMA_CONTEXT_LENGTH``;
  ``OLLAMA_KV_CACHE_TYPE``, default f16; ``OLLAMA_FLASH_ATTENTION``) is read from the
  environment memfit runs in, and the answer says which values it used.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from memfit.errors import SpecError
from memfit.jobfiles.vllm_cmd import MAX_COMMAND_CHARS, command_words
from memfit.units import GiB

__all__ = [
    "OLLAMA_TAGS",
    "argv_from_llamacpp_command",
    "argv_from_modelfile",
    "is_llamacpp_command",
    "is_modelfile",
    "ollama_default_ctx",
]

#: The llama.cpp programs whose command line memfit reads (the basename of the first word).
BINARIES = ("llama-server", "llama-cli")

#: Ollama library tags -> the bundled config memfit sizes them from (Ollama's default tags are
#: Q4_K_M GGUFs of these checkpoints; https://ollama.com/library).
OLLAMA_TAGS: dict[str, str] = {
    "llama3.1:8b": "llama-3.1-8b",
    "llama3.1:70b": "llama-3.1-70b",
    "llama3.2:1b": "llama-3.2-1b",
    "llama3.2:3b": "llama-3.2-3b",
    "llama3.3:70b": "llama-3.3-70b",
    "qwen2.5:0.5b": "qwen2.5-0.5b",
    "qwen2.5:1.5b": "qwen2.5-1.5b",
    "qwen2.5:7b": "qwen2.5-7b",
    "qwen2.5:72b": "qwen2.5-72b",
    "qwen3:0.6b": "qwen3-0.6b",
    "qwen3:1.7b": "qwen3-1.7b",
    "qwen3:4b": "qwen3-4b",
    "qwen3:8b": "qwen3-8b",
    "qwen3:14b": "qwen3-14b",
    "qwen3:32b": "qwen3-32b",
    "qwen3:30b": "qwen3-30b-a3b",
    "gemma2:2b": "gemma-2-2b",
    "gemma2:9b": "gemma-2-9b",
    "gemma3:1b": "gemma-3-1b",
    "gemma3:4b": "gemma-3-4b",
    "gemma3:12b": "gemma-3-12b",
    "gemma3:27b": "gemma-3-27b",
    "mistral-nemo:12b": "mistral-nemo-12b",
    "mistral-small3.1:24b": "mistral-small-3.1-24b",
    "phi4:14b": "phi-4",
    "mixtral:8x7b": "mixtral-8x7b",
    "tinyllama:1.1b": "tinyllama-1.1b",
}
#: What each family's ``:latest`` tag is (https://ollama.com/library).
OLLAMA_TAGS.update({
    "llama3.1:latest": "llama-3.1-8b", "llama3.2:latest": "llama-3.2-3b",
    "llama3.3:latest": "llama-3.3-70b", "qwen2.5:latest": "qwen2.5-7b",
    "qwen3:latest": "qwen3-8b", "gemma2:latest": "gemma-2-9b", "gemma3:latest": "gemma-3-4b",
    "mistral-nemo:latest": "mistral-nemo-12b", "mistral-small3.1:latest": "mistral-small-3.1-24b",
    "phi4:latest": "phi-4", "mixtral:latest": "mixtral-8x7b", "tinyllama:latest": "tinyllama-1.1b",
})  # fmt: skip
#: Ollama's default context by the GPU's memory (docs/context-length.mdx at 948f693).
OLLAMA_CTX_BY_VRAM = ((24 * GiB, 4096), (48 * GiB, 32768))
OLLAMA_CTX_LARGE = 262144
#: Ollama's num_batch default (``api.DefaultOptions``: NumBatch 512).
OLLAMA_NUM_BATCH = 512


def _lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def _first_word(text: str) -> str:
    lines = _lines(text)
    if not lines:
        return ""
    words = lines[0].replace("'", " ").replace('"', " ").split()
    return words[0] if words else ""


def is_llamacpp_command(text: str) -> bool:
    """Whether ``text``'s first command line runs ``llama-server`` (or ``llama-cli``)."""
    return Path(_first_word(text)).name in BINARIES


def argv_from_llamacpp_command(text: str) -> list[str]:
    """``llama-server -m M.gguf -c 8192 …`` -> ``[-m, M.gguf, -c, 8192, …]``."""
    words = command_words(text, "llama-server")
    if not words or Path(words[0]).name not in BINARIES:
        raise SpecError("expected `llama-server -m MODEL.gguf [flags]`")
    return words[1:]


def is_modelfile(text: str) -> bool:
    """Whether ``text`` is an Ollama Modelfile: its first instruction is ``FROM``."""
    lines = _lines(text)
    return bool(lines) and lines[0].split(maxsplit=1)[0].upper() == "FROM"


def ollama_default_ctx(capacity_bytes: int) -> int:
    """Ollama's context when neither the Modelfile nor OLLAMA_CONTEXT_LENGTH sets it."""
    return next((ctx for limit, ctx in OLLAMA_CTX_BY_VRAM if capacity_bytes < limit),
                OLLAMA_CTX_LARGE)  # fmt: skip


def argv_from_modelfile(
    text: str,
    *,
    path: str,
    capacity_bytes: int,
    env: Mapping[str, str] | None = None,
) -> tuple[list[str], list[str]]:
    """``memfit llama-server`` arguments for the Modelfile at ``path`` and the notes that say
    what memfit took from Ollama's defaults and environment."""
    _check_size(text, "Modelfile")
    env = os.environ if env is None else env
    source: str | None = None
    params: dict[str, str] = {}
    for line in _lines(text):
        head, _, rest = line.strip().partition(" ")
        word = head.upper()
        if word == "FROM":
            source = rest.strip()
        elif word == "PARAMETER":
            key, _, value = rest.strip().partition(" ")
            params[key.lower()] = value.strip()
    if not source:
        raise SpecError(f"{path}: the Modelfile has no FROM line; add `FROM model.gguf`")
    model, notes = _ollama_model(source, path)
    parallel = max(1, _int(env.get("OLLAMA_NUM_PARALLEL", "1"), "OLLAMA_NUM_PARALLEL"))
    if "num_ctx" in params:
        ctx = _int(params["num_ctx"], "PARAMETER num_ctx")
    elif env.get("OLLAMA_CONTEXT_LENGTH"):
        ctx = _int(env["OLLAMA_CONTEXT_LENGTH"], "OLLAMA_CONTEXT_LENGTH")
        notes.append(f"num_ctx {ctx} from OLLAMA_CONTEXT_LENGTH")
    else:
        ctx = ollama_default_ctx(capacity_bytes)
        notes.append(
            f"num_ctx {ctx}: Ollama's default for a GPU of this memory (4k under 24 GiB, 32k "
            "up to 48 GiB, 256k above); PARAMETER num_ctx sets it"
        )
    batch = _int(params.get("num_batch", str(OLLAMA_NUM_BATCH)), "PARAMETER num_batch")
    argv = [model, "-c", str(ctx * parallel), "-np", str(parallel)]
    argv += ["-b", str(batch * parallel), "-ub", str(batch)]
    if "num_gpu" in params:
        argv += ["-ngl", str(_int(params["num_gpu"], "PARAMETER num_gpu"))]
    kv = env.get("OLLAMA_KV_CACHE_TYPE")
    if kv:
        argv += ["-ctk", kv, "-ctv", kv]
    fa = env.get("OLLAMA_FLASH_ATTENTION")
    if fa is not None and fa.strip():
        argv += ["-fa", "on" if fa.strip().lower() in ("1", "true", "on") else "off"]
    notes.append(
        f"Ollama runs llama.cpp with n_ctx = num_ctx x OLLAMA_NUM_PARALLEL ({ctx} x {parallel}), "
        f"n_ubatch = num_batch ({batch}); OLLAMA_KV_CACHE_TYPE {kv or 'f16 (default)'}"
    )
    return argv, notes


def _ollama_model(source: str, path: str) -> tuple[str, list[str]]:
    """FROM's model: a .gguf beside the Modelfile, a bundled NAME[:TYPE], or an Ollama tag."""
    if source.lower().endswith(".gguf") or "/" in source or source.startswith("."):
        gguf = Path(source).expanduser()
        if not gguf.is_absolute():
            gguf = Path(path).resolve().parent / gguf
        return str(gguf), []
    tag = source.lower()
    if ":" not in tag:
        tag += ":latest"
    name = OLLAMA_TAGS.get(tag)
    if name is not None:
        note = f"FROM {source}: Ollama's {tag} tag, sized as {name} at Ollama's default Q4_K_M"
        return f"{name}:Q4_K_M", [note]
    return source, []  # a bundled NAME[:FILE_TYPE]; memfit llama-server says if it is not one


def _int(text: str, what: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise SpecError(f"{what} ({text!r}) must be a whole number") from None
    if value < 0:
        raise SpecError(f"{what} ({value}) must be 0 or more")
    return value


def _check_size(text: str, what: str) -> None:
    if len(text) > MAX_COMMAND_CHARS:
        raise SpecError(
            f"the {what} is {len(text):,} characters; memfit reads at most "
            f"{MAX_COMMAND_CHARS:,} (memfit.jobfiles.vllm_cmd.MAX_COMMAND_CHARS)"
        )
