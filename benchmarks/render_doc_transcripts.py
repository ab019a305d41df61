"""Re-run the `memfit` command transcripts quoted in docs/planning.md and write their output back.

Each fenced ``text`` block that starts with ``$ memfit …`` is re-run command by command (a trailing
``\\`` continues a command on the next line) with this checkout's CLI; each command's output is
replaced, followed by its exit code and, where the transcript showed one, its wall time. Timings
vary from run to run; the numbers do not.

    .venv/bin/python benchmarks/render_doc_transcripts.py [docs/planning.md ...]
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DOCS = [ROOT / "docs" / "planning.md"]
BLOCK = re.compile(r"```text\n(\$ memfit .*?)```", re.S)


def _commands(block: str) -> list[tuple[list[str], bool]]:
    """The commands of a block: each one's command lines (a trailing backslash continues it) and
    whether the transcript shows its wall time."""
    lines = block.splitlines()
    out: list[tuple[list[str], bool]] = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith("$ memfit"):
            i += 1
            continue
        head = [lines[i]]
        while head[-1].endswith("\\") and i + 1 < len(lines):
            i += 1
            head.append(lines[i])
        j = i + 1
        while j < len(lines) and not lines[j].startswith("$ memfit"):
            j += 1
        timed = any(line.startswith("(wall time") for line in lines[i + 1 : j])
        out.append((head, timed))
        i = j
    return out


def _run(head: list[str], timed: bool) -> str:
    cmd = " ".join(line.rstrip("\\").strip() for line in head)[2:]
    memfit = str(ROOT / ".venv" / "bin" / "memfit")
    env = {**os.environ, "COLUMNS": "100"}
    started = time.perf_counter()
    proc = subprocess.run(
        [memfit, *shlex.split(cmd)[1:]], capture_output=True, text=True, cwd=ROOT, env=env
    )
    wall = time.perf_counter() - started
    text = "\n".join(head) + "\n" + proc.stdout + f"exit {proc.returncode}\n"
    if timed:
        text += f"(wall time {wall:.2f} s)\n"
    return text


def render(path: Path) -> int:
    text = path.read_text(encoding="utf-8")
    n_commands = 0

    def replace(match: re.Match[str]) -> str:
        nonlocal n_commands
        parts = []
        for head, timed in _commands(match.group(1)):
            print(f"{path.name}: {head[0][2:]}", flush=True)
            parts.append(_run(head, timed))
            n_commands += 1
        return "```text\n" + "\n".join(parts) + "```"

    path.write_text(BLOCK.sub(replace, text), encoding="utf-8")
    return n_commands


def main() -> int:
    docs = [Path(a) for a in sys.argv[1:]] or DEFAULT_DOCS
    total = sum(render(p) for p in docs)
    print(f"re-ran {total} transcripts")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
