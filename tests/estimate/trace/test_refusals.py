"""The trace engine's refusals are known from the workload alone: the engine policy raises them
before torch is imported or a model built (issue 32: a plan whose recommended job has a fused
loss paid a torch import and a model build for the refusal)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from memfit.errors import NotModelledError
from memfit.estimate.trace.refusals import refusal
from memfit.spec import WorkloadSpec

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("fields", "refused"),
    [
        ({"loss": "fused"}, True),
        ({"loss": "chunked"}, True),
        ({"checkpointing": "offload"}, True),
        ({"checkpointing": "full"}, False),
        ({}, False),
    ],
)
def test_the_trace_refuses_a_fused_or_chunked_loss_and_host_checkpoints(
    fields: dict, refused: bool
) -> None:
    found = refusal(WorkloadSpec(mode="train", lora_rank=16, **fields))
    assert (found is not None) == refused
    if found is not None:
        assert isinstance(found, NotModelledError)
        assert "modelled by the analytic engine (--engine analytic)" in str(found)


def test_the_policy_refuses_before_importing_torch() -> None:
    code = (
        "import sys\n"
        "from memfit.errors import NotModelledError\n"
        "from memfit.estimate.policy import run_engine\n"
        "from memfit.models import resolve_model\n"
        "from memfit.spec import WorkloadSpec\n"
        "w = WorkloadSpec(mode='train', lora_rank=16, loss='fused')\n"
        "try:\n"
        "    run_engine('trace', resolve_model('qwen2.5-7b'), w, None)\n"
        "except NotModelledError as exc:\n"
        "    print('refused:', exc)\n"
        "print('torch imported:', 'torch' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert "refused: loss 'fused' / checkpointing 'none'" in out
    assert "torch imported: False" in out
