"""``--sp``: sequence parallelism with tensor parallelism, answered by the per-rank closed form."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from memfit.errors import SpecError
from memfit.estimate.parallel import ENGINE
from memfit.estimate.parallel.memory import layer_activation_bytes, layout_of
from memfit.estimate.parallel.shape import read_shape
from memfit.estimate.sequence_parallel import tp_activation_bytes
from memfit.models import resolve_model
from memfit.spec import WorkloadSpec

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def llama70():
    return read_shape(resolve_model("llama-3.1-70b").spec)


def _lay(shard: str, sp: bool, ckpt: str = "none"):
    w = WorkloadSpec(
        gpus=16, tp=8, shard=shard, seq_len=4096, checkpointing=ckpt, attention="flash",
        sequence_parallel=sp,
    )  # fmt: skip
    return layout_of(w)


@pytest.mark.parametrize("shard", ["fsdp", "zero1"])
def test_under_full_checkpointing_sp_keeps_korthikanti_2sbh_over_t(llama70, shard):
    """Full recomputation keeps each layer's 16-bit input, ``2sbh`` bytes, ``/t`` with sequence
    parallelism (Korthikanti et al. 2022 Table 2; memfit.estimate.sequence_parallel)."""
    for sp in (False, True):
        lay = _lay(shard, sp, "full")
        paper = tp_activation_bytes(
            seq_len=4096, micro_batch=1, hidden=8192, n_heads=64, n_layers=1, vocab=128256,
            tp=8, sequence_parallel=sp, recompute="full",
        )  # fmt: skip
        assert layer_activation_bytes(llama70, lay, moe=False, how="full") == paper.per_layer_bytes


def test_sp_shards_what_tp_replicates_the_way_each_framework_saves_it(llama70):
    """Without checkpointing, SP splits the two norms' inputs (2h per token) over t. Megatron's
    column-parallel linear also saves its input sequence-sharded (it all-gathers again in
    backward): its norm outputs shrink too. torchtitan's DTensor plan saves the all-gathered
    matmul input, full width: only the norm inputs shrink."""
    h, t, tokens, a_b = 8192, 8, 4096, 2
    saved = {
        (shard, sp): layer_activation_bytes(llama70, _lay(shard, sp), moe=False, how="none")
        for shard in ("fsdp", "zero1")
        for sp in (False, True)
    }
    torchtitan = saved[("fsdp", False)] - saved[("fsdp", True)]
    megatron = saved[("zero1", False)] - saved[("zero1", True)]
    assert torchtitan == tokens * a_b * 2 * h * (1 - 1 / t)
    assert megatron == tokens * a_b * 4 * h * (1 - 1 / t)


def test_a_tp_job_with_sp_goes_to_the_closed_form_and_holds_less():
    from memfit import estimate
    from memfit.spec import EstimateOptions

    base = dict(gpus=8, tp=8, batch_size=1, seq_len=8192, checkpointing="full")
    opts = EstimateOptions(engine="analytic")
    with_sp = estimate("llama-3.1-8b", WorkloadSpec(**base, sequence_parallel=True), options=opts)
    assert with_sp.engine == ENGINE
    assert "sequence parallelism" in (with_sp.engine_reason or "")
    layer = with_sp.trace["parallel"]["ranks"][0]["components"]["activations"]
    w = WorkloadSpec(**base, sequence_parallel=True)
    no_sp = dataclasses.replace(layout_of(w), sequence_parallel=False)
    shape = read_shape(resolve_model("llama-3.1-8b").spec)
    full_width = 32 * layer_activation_bytes(shape, no_sp, moe=False, how="full")
    assert layer < full_width


def test_sp_without_tp_is_refused_with_the_fix():
    with pytest.raises(
        SpecError, match=r"sequence_parallel with tp 1: .*set --tp > 1 or drop --sp"
    ):
        WorkloadSpec(sequence_parallel=True)


def test_cli_sp_answers_json_and_tp1_exits_2():
    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "memfit", "estimate", "llama-3.1-8b", *args],
            capture_output=True, text=True, cwd=ROOT, check=False,
            env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
        )  # fmt: skip

    done = cli("--gpus", "8", "--tp", "8", "--sp", "--seq", "8192", "--json")
    assert done.returncode in (0, 1), done.stderr
    out = json.loads(done.stdout)
    assert out["engine"] == ENGINE and out["workload"]["sequence_parallel"] is True
    bad = cli("--sp")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "sequence_parallel with tp 1" in bad.stderr
