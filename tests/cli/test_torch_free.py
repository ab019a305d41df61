"""The commands that need no trace import no torch (nor transformers, numba, diffusers): a whole
process runs each and reports what it imported (issue 32: importing torch alone is ~2 s)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
HEAVY = ("torch", "transformers", "numba", "diffusers", "peft")
#: Run the command line in this process, then print which heavy modules it imported.
PROBE = (
    "import sys, json\n"
    "from memfit.cli.entry import main\n"
    "try:\n"
    "    main(sys.argv[1:])\n"
    "except SystemExit:\n"
    "    pass\n"
    f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]), file=sys.stderr)\n"
)


def _imported(args: list[str], tmp_path: Path) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(SRC), "MEMFIT_CACHE_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, env=env, timeout=300
    )
    return list(json.loads(done.stderr.strip().splitlines()[-1]))


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["estimate", "--help"],
        ["plan", "--help"],
        ["models"],
        ["gpus"],
        ["estimate", "llama-3.1-8b", "--engine", "analytic", "--gpu", "L4", "--json"],
        # the default engine's validated fast answer (memfit.estimate.fastpath): no trace, no torch
        ["estimate", "llama-3.1-8b", "--lora-rank", "16", "--seq", "2048", "--precision",
         "bf16-true", "--gpu", "L4"],
    ],
    ids=lambda a: " ".join(a[:2]) if a[0] == "estimate" else " ".join(a),
)  # fmt: skip
def test_a_torch_free_command_imports_no_torch(args: list[str], tmp_path: Path) -> None:
    assert _imported(args, tmp_path) == []
