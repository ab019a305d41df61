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
        ["fit", "llama-3.1-8b", "--engine", "analytic", "--gpu", "L4", "--seq", "2048",
         "--lora-rank", "16", "--solve", "batch"],
        ["vllm", "meta-llama/Llama-3.1-8B", "--gpu", "L4", "--max-model-len", "8192"],
        ["llama-server", "-m", "llama-3.1-8b", "--gpu", "L4", "-c", "8192"],
        ["sglang", "--model-path", "meta-llama/Llama-3.1-8B", "--gpu", "L4"],
        ["--version"],
    ],
    ids=lambda a: " ".join(a[:2]) if a[0] == "estimate" else " ".join(a),
)  # fmt: skip
def test_a_torch_free_command_imports_no_torch(args: list[str], tmp_path: Path) -> None:
    assert _imported(args, tmp_path) == []


#: Run the command line in this process, then print the memfit modules and the slow standard
#: library packages it imported.
MODULES_PROBE = (
    "import sys, json\n"
    "from memfit.cli.entry import main\n"
    "try:\n"
    "    main(sys.argv[1:])\n"
    "except SystemExit:\n"
    "    pass\n"
    "print(json.dumps(sorted(sys.modules)), file=sys.stderr)\n"
)


def _modules(args: list[str], tmp_path: Path) -> set[str]:
    env = {**os.environ, "PYTHONPATH": str(SRC), "MEMFIT_CACHE_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", MODULES_PROBE, *args],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    return set(json.loads(done.stderr.strip().splitlines()[-1]))


@pytest.mark.parametrize("args", [["models"], ["gpus"], ["--version"]], ids=" ".join)
def test_a_listing_loads_no_engine_no_planner_and_no_other_command(
    args: list[str], tmp_path: Path
) -> None:
    """Issue 32: the command line imports only the running command's modules (the lazy table of
    memfit.cli.entry), so a catalog listing loads no engine, no search and no job route."""
    loaded = _modules(args, tmp_path)
    assert "memfit.cli.plan" not in loaded and "memfit.cli.estimate" not in loaded
    for module in ("memfit.estimate.analytic", "memfit.estimate.policy", "memfit.plan.search",
                   "memfit.api", "memfit.jobfiles", "numpy"):  # fmt: skip
        assert module not in loaded


def test_the_analytic_estimate_loads_only_what_it_answers_with(tmp_path: Path) -> None:
    """Issue 32: ``estimate --engine analytic`` (the answer hf-mem's is compared with) loads the
    analytic engine, not the other routes of memfit.api, the job-file readers, the snapshot
    writer, the web server's worker pool, numpy (the derived engine) or urllib (the hub)."""
    loaded = _modules(["estimate", "llama-3.1-8b", "--engine", "analytic", "--mode", "infer"],
                      tmp_path)  # fmt: skip
    assert "memfit.estimate.analytic" in loaded
    for module in ("memfit.api", "memfit.cli.plan", "memfit.cli.check", "memfit.jobfiles",
                   "memfit.snapshot", "memfit.web.workers", "memfit.estimate.derived",
                   "memfit.serving", "numpy", "urllib.request", "multiprocessing"):  # fmt: skip
        assert module not in loaded


@pytest.mark.parametrize(
    "args",
    [
        # does not fit on L4: the nearest change that fits is searched (memfit.plan.nearest),
        # reading the answers caches (memfit.estimate.trace_cache, derived.cache) on the way
        ["estimate", "llama-3.1-8b", "--lora-rank", "16", "--seq", "2048", "--precision",
         "bf16-true", "--gpu", "L4", "--engine", "analytic"],
        ["estimate", "llama-3.1-8b", "--lora-rank", "16", "--seq", "2048", "--precision",
         "bf16-true", "--gpu", "L4"],
        # checkpointed LoRA, answered at its class band's top: no confirming trace (issue 32)
        ["estimate", "mistral-7b-v0.1", "--lora-rank", "16", "--checkpointing", "full",
         "--gpu", "L4"],
        ["fit", "llama-3.1-8b", "--engine", "analytic", "--gpu", "A100-80GB", "--seq", "4096",
         "--lora-rank", "16", "--solve", "batch"],
        ["plan", "llama-3.1-8b", "--engine", "analytic", "--gpu", "L4", "--seq", "4096",
         "--global-batch", "16"],
    ],
    ids=lambda a: " ".join(a[:2]) + (" analytic" if "analytic" in a else " auto"),
)  # fmt: skip
def test_an_analytic_answer_imports_no_numpy(args: list[str], tmp_path: Path) -> None:
    """Issue 32: numpy (~0.24 s) is imported where an answer reads or replays arrays (a derived
    form, its sidecar, a variable-length run), not by every estimating command: the derived
    package, the caches' readers and memfit.api load its evaluators on first use."""
    loaded = _modules(args, tmp_path)
    assert "memfit.estimate.analytic" in loaded
    assert [m for m in ("numpy", *HEAVY) if m in loaded] == []
