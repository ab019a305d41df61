"""A ``python -m sglang.launch_server`` (or ``sglang serve``) command line, ``\\`` continuations
allowed, turned into ``memfit sglang`` arguments: ``memfit check`` hands it to the SGLang
serving model (memfit.serving.sglang) instead of reading it as a training config."""

from __future__ import annotations

from memfit.errors import SpecError
from memfit.jobfiles.vllm_cmd import command_words

__all__ = ["argv_from_sglang_command", "is_sglang_command"]

#: The words that start an SGLang server command line.
LAUNCHERS = (
    ("python", "-m", "sglang.launch_server"),
    ("python3", "-m", "sglang.launch_server"),
    ("sglang", "serve"),
)


def _head_words(text: str) -> list[str]:
    """The first words of ``text``'s first command line (a few lines at most: a large YAML or
    JSON file is not split as a shell line)."""
    head: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            head.append(stripped.removesuffix("\\")[:200])
        if len(head) == 3:
            break
    return " ".join(head).replace("'", " ").replace('"', " ").split()[:3]


def _launcher(words: list[str]) -> tuple[str, ...] | None:
    return next((w for w in LAUNCHERS if tuple(words[: len(w)]) == w), None)


def is_sglang_command(text: str) -> bool:
    """Whether ``text``'s first command line starts an SGLang server."""
    return _launcher(_head_words(text)) is not None


def argv_from_sglang_command(text: str) -> list[str]:
    """``python -m sglang.launch_server --model-path M --flag …`` → ``[--model-path, M, …]``."""
    words = command_words(text, "SGLang")
    launcher = _launcher(words)
    if launcher is None:
        raise SpecError("expected `python -m sglang.launch_server --model-path MODEL [flags]`")
    rest = words[len(launcher) :]
    if launcher == ("sglang", "serve") and rest and not rest[0].startswith("-"):
        return rest  # `sglang serve MODEL …`: the positional MODEL
    return rest
