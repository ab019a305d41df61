"""Stack frames of a snapshot: which frame is the user's, and what to call its place in the code.

Frames come innermost first (``frames[0]`` is where the allocation was requested), as in
``torch.cuda._memory_viz``, which reverses them to draw flame graphs root first.
"""

from __future__ import annotations

import re
from typing import Any

#: Frames that are the framework, not the user's code: torch's own Python files, C/C++ frames
#: (``stacks="all"``), and the interpreter. A torch snapshot taken with ``stacks="python"`` has
#: only Python frames.
_INTERNAL_FILE = re.compile(
    r"(^|[/\\])torch[/\\]|\.(c|cc|cpp|cxx|h|hpp|cu|cuh)$|\.so(\.\d+)*$|^\?\?$|^<frozen |"
    r"(^|[/\\])(threading|runpy|contextlib|functools)\.py$"
)
NO_STACK = "(no Python stack recorded)"
ONLY_INTERNAL = "(torch internals only)"


def is_user_frame(frame: dict[str, Any]) -> bool:
    return not _INTERNAL_FILE.search(str(frame.get("filename", "")))


def user_frames(frames: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return [f for f in frames or () if isinstance(f, dict) and is_user_frame(f)]


def location(frames: list[dict[str, Any]] | None) -> str:
    """``file.py:LINE name`` of the innermost user frame (a short path: see :func:`short_path`)."""
    if not frames:
        return NO_STACK
    for f in frames:
        if isinstance(f, dict) and is_user_frame(f):
            return _fmt(f)
    return ONLY_INTERNAL


def module(frames: list[dict[str, Any]] | None) -> str:
    """The Python module of the innermost user frame (``transformers.models.llama.modeling``)."""
    if not frames:
        return NO_STACK
    for f in frames:
        if isinstance(f, dict) and is_user_frame(f):
            path = short_path(str(f.get("filename", "?")))
            return re.sub(r"\.py$", "", path).replace("/", ".").replace("\\", ".")
    return ONLY_INTERNAL


def short_path(filename: str) -> str:
    """The path below ``site-packages`` / ``dist-packages`` of installed code, else the name."""
    m = re.search(r"[/\\](?:site|dist)-packages[/\\](.+)$", filename)
    if m:
        return m.group(1)
    return re.split(r"[/\\]", filename)[-1]


def format_frames(frames: list[dict[str, Any]] | None, limit: int = 6) -> list[str]:
    """Up to ``limit`` user frames, innermost first, as ``path:line name``."""
    return [_fmt(f) for f in user_frames(frames)[:limit]]


def _fmt(f: dict[str, Any]) -> str:
    return f"{short_path(str(f.get('filename', '?')))}:{f.get('line', '?')} {f.get('name', '?')}"
