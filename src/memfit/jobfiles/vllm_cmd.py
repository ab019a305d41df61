"""A ``vllm serve`` command line (a shell line, ``\\`` continuations allowed) or a ``vllm serve
--config`` YAML, turned into ``memfit vllm`` arguments: ``memfit check`` hands serving jobs to the
serving model (memfit.serving) instead of reading them as training configs."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from memfit.errors import SpecError

#: Keys that mark a YAML as a ``vllm serve --config`` file (its keys are the flags' long names).
VLLM_KEYS = frozenset(
    {
        "gpu_memory_utilization",
        "gpu-memory-utilization",
        "max_model_len",
        "max-model-len",
        "max_num_seqs",
        "max-num-seqs",
        "tensor_parallel_size",
        "tensor-parallel-size",
        "kv_cache_dtype",
        "kv-cache-dtype",
        "max_num_batched_tokens",
        "max-num-batched-tokens",
        "enforce_eager",
        "enforce-eager",
        "max_cudagraph_capture_size",
        "max-cudagraph-capture-size",
    }
)


#: The longest ``vllm serve`` command text memfit splits: Linux's limit on one argument
#: (MAX_ARG_STRLEN, 32 pages = 128 KiB; man 2 execve). shlex's splitting is quadratic in a
#: token's length (2 MB took 56 s), so longer text is refused before it is split.
MAX_COMMAND_CHARS = 128 * 1024


def is_vllm_command(text: str) -> bool:
    """Whether ``text``'s first command line starts ``vllm serve`` (read from its first words
    only: a YAML or JSON file of any size is not split as a shell line)."""
    head: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            head.append(stripped.removesuffix("\\")[:200])
        if len(head) == 2:  # "vllm \" / "serve MODEL": the two words span two lines at most
            break
    return " ".join(head).replace("'", " ").replace('"', " ").split()[:2] == ["vllm", "serve"]


def is_vllm_config(data: Mapping[str, Any]) -> bool:
    return bool(VLLM_KEYS & set(data))


def command_words(text: str, what: str = "vllm serve") -> list[str]:
    """The words of the one shell command in ``text`` (``\\`` continuations joined, ``#``
    lines dropped), refused over :data:`MAX_COMMAND_CHARS` and when it cannot be split (an
    unclosed quote). ``what``: the command's name in the messages. Every server command line
    memfit reads (vLLM, SGLang, llama.cpp) is split here."""
    if len(text) > MAX_COMMAND_CHARS:
        raise SpecError(
            f"the {what} command is {len(text):,} characters; memfit splits at most "
            f"{MAX_COMMAND_CHARS:,} (memfit.jobfiles.vllm_cmd.MAX_COMMAND_CHARS, Linux's limit "
            "on one argument)"
        )
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    joined = " ".join(ln.rstrip().removesuffix("\\") for ln in lines)
    try:
        return shlex.split(joined)
    except ValueError as exc:
        raise SpecError(f"the {what} command line cannot be split: {exc}") from None


def argv_from_command(text: str) -> list[str]:
    """``vllm serve MODEL --flag …`` → ``[MODEL, --flag, …]`` (one command per file)."""
    words = command_words(text)
    if words[:2] != ["vllm", "serve"] or len(words) < 3:
        raise SpecError("expected `vllm serve MODEL [flags]`")
    return words[2:]


def argv_from_config(data: Mapping[str, Any]) -> list[str]:
    """A ``vllm serve --config`` mapping as flags (``model`` is the positional)."""
    model = data.get("model")
    if not isinstance(model, str):
        raise SpecError("the vllm config names no model (model: org/name)")
    argv = [model]
    for key, value in data.items():
        if key == "model":
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value in (False, None):
            continue
        else:
            argv += [flag, str(value)]
    return argv
