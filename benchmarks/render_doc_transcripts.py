"""Re-run the `memfit` command transcripts quoted in docs/planning.md and write their output back.

Each fenced ``text`` block that starts with ``$ memfit …`` (a trailing ``\\`` continues the command
on the next line) is re-run with this checkout's CLI and its output replaced, so the document
shows what the code prints today. Timings in the output vary from run to run; the numbers do not.

    .venv/bin/python benchmarks/render_doc_transcripts.py [docs/planning.md ...]
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DOCS = [ROOT / "docs" / "planning.md"]
BLOCK = re.compile(r"```text\n(\$ memfit .*?)```", re.S)


def _command(block: str) -> tuple[str, int]:
    """The command of a block (continuation lines joined) and the number of lines it spans."""
    lines = block.splitlines()
    n = 1
    while lines[n - 1].endswith("\\"):
        n += 1
    cmd = " ".join(line.rstrip("\\").strip() for line in lines[:n])
    return cmd[2:], n


def _run(cmd: str) -> str:
    memfit = str(ROOT / ".venv" / "bin" / "memfit")
    args = shlex.split(cmd)
    env = {**os.environ, "COLUMNS": "100"}
    proc = subprocess.run(
        [memfit, *args[1:]], capture_output=True, text=True, cwd=ROOT, env=env, check=False
    )
    return proc.stdout


def render(path: Path) -> int:
    text = path.read_text(encoding="utf-8")
    n_blocks = 0

    def replace(match: re.Match[str]) -> str:
        nonlocal n_blocks
        block = match.group(1)
        cmd, n = _command(block)
        head = "\n".join(block.splitlines()[:n])
        print(f"{path.name}: {cmd}", flush=True)
        n_blocks += 1
        return f"```text\n{head}\n{_run(cmd)}```"

    path.write_text(BLOCK.sub(replace, text), encoding="utf-8")
    return n_blocks


def main() -> int:
    docs = [Path(a) for a in sys.argv[1:]] or DEFAULT_DOCS
    total = sum(render(p) for p in docs)
    print(f"re-ran {total} transcripts")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
