"""Multi-GPU, ZeRO, offload and tensor-parallel jobs: the derived form records rank 0's
rewritten timeline (memfit.estimate.trace.rank_replay) and gives the trace engine's own answer
at batch sizes it never traced — peak allocated and reserved bytes, host memory, every phase's
breakdown and the top modules, byte for byte."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

pytest.importorskip("transformers")

from tests.conftest import TINY_LLAMA

from memfit.estimate import derived
from memfit.estimate.derived import cache, estimate_derived
from memfit.estimate.policy import run_engine
from memfit.hardware import get_gpu
from memfit.models import resolve_model
from memfit.spec import WorkloadSpec

#: Two layers wide enough (512) that ZeRO-3 partitions and gathers the projections (DeepSpeed
#: keeps parameters under 1e5 elements whole on every rank).
WIDE = {**TINY_LLAMA, "hidden_size": 512, "intermediate_size": 1024, "num_attention_heads": 8,
        "num_hidden_layers": 2}  # fmt: skip
#: Batch sizes no form traces (full traces: 1-4).
UNTRACED = (5, 7)
#: The jobs, by name: (gpus, tp, shard, offload).
JOBS = {
    "ddp-2": dict(gpus=2, shard="ddp"),
    "zero1": dict(shard="zero1"),
    "zero2": dict(shard="zero2"),
    "zero3": dict(shard="zero3"),
    "zero1-2": dict(gpus=2, shard="zero1"),
    "zero2-2": dict(gpus=2, shard="zero2"),
    "zero3-2": dict(gpus=2, shard="zero3"),
    "zero2-offload-optimizer": dict(shard="zero2", offload="optimizer"),
    "zero3-offload-optimizer": dict(shard="zero3", offload="optimizer"),
    "zero3-offload-params": dict(shard="zero3", offload="params"),
    "zero3-offload-params-2": dict(gpus=2, shard="zero3", offload="params"),
    "fsdp-2": dict(gpus=2, shard="fsdp"),
    "fsdp-offload-params-2": dict(gpus=2, shard="fsdp", offload="params"),
    "tp-2": dict(gpus=2, tp=2),
}
#: Run by default (the planner's recommendation for an 8B model on an L4, DDP, TP); the rest
#: are marked slow (about 5 s each on two cores).
FAST = ("zero3-offload-params", "ddp-2", "tp-2")


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp("wide")
    (folder / "config.json").write_text(json.dumps(WIDE))
    return resolve_model(str(folder))


def train_job(b: int, **kw: Any) -> WorkloadSpec:
    return WorkloadSpec(mode="train", batch_size=b, seq_len=64, precision="bf16-mixed", **kw)


def _answer(est: Any) -> dict[str, Any]:
    """Everything an estimate says but which engine said it and how long it took."""
    out = est.to_json()
    for key in ("engine", "engine_reason", "trace"):
        out.pop(key, None)
    # what a rank form says of itself: staging replayed as traced (test below)
    out["notes"] = [n for n in out.get("notes", []) if "staging blocks are replayed" not in n]
    return out


def assert_same_answers(source: Any, w: WorkloadSpec) -> None:
    gpu = get_gpu("L4")
    for b in UNTRACED:
        job = dataclasses.replace(w, batch_size=b)
        mine = estimate_derived(source, job, gpu=gpu)
        trace = run_engine("trace", source, job, gpu)
        assert mine.engine == "derived"
        assert any("staging blocks are replayed as traced" in n for n in mine.notes)
        assert mine.peak_allocated_bytes == trace.peak_allocated_bytes
        assert mine.peak_reserved_bytes == trace.peak_reserved_bytes
        assert mine.host_memory_bytes == trace.host_memory_bytes
        assert mine.components == trace.components
        got, want = _answer(mine), _answer(trace)
        assert got == want, {k: (got.get(k), want.get(k)) for k in want if got.get(k) != want[k]}


@pytest.mark.parametrize(
    "name",
    [n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in JOBS],
)
def test_a_rank_form_gives_the_trace_engines_answer_at_untraced_batch_sizes(
    wide: Any, name: str
) -> None:
    assert_same_answers(wide, train_job(1, **JOBS[name]))


def test_zero3_offload_gathers_partitions_and_moves_states_to_the_host(wide: Any) -> None:
    """The compared answers are not the single-GPU job's: rank 0 holds gathered parameters and
    the ZeRO bucket on the device and its optimizer states in host RAM."""
    w = train_job(5, shard="zero3", offload="params")
    est = estimate_derived(wide, w, gpu=get_gpu("L4"))
    plain = estimate_derived(wide, train_job(5), gpu=get_gpu("L4"))
    assert est.host_memory_bytes > 0 == plain.host_memory_bytes
    assert est.components["optimizer_states"] == 0 < plain.components["optimizer_states"]
    form = derived._FORMS[cache.variant_key(WIDE, w)]
    (run,) = form["runs"]
    assert any(m.endswith("(gathered)") for m in run["mods"])
    assert "(ZeRO gradient bucket)" in run["mods"]
    assert run["fixed"], "the rewrite's own births are marked"


def test_zero_traces_one_step_for_both_adam_names_and_shares_their_form(wide: Any) -> None:
    """DeepSpeed steps its own Adam for ``adamw`` and ``adamw-fused`` (sharding.DEEPSPEED_ADAM):
    the trace engine traces torch's ``adamw`` step for both, so their answers are the same, and
    a plan's two stacks share one derived form; without ZeRO the two steps stay distinct."""
    gpu = get_gpu("L4")
    zero = {"shard": "zero2", "offload": "optimizer"}
    fused = train_job(5, optimizer="adamw-fused", **zero)
    plain = train_job(5, optimizer="adamw", **zero)
    assert cache.variant_key(WIDE, fused) == cache.variant_key(WIDE, plain)
    one = train_job(5, optimizer="adamw-fused")
    assert cache.variant_key(WIDE, one) != cache.variant_key(WIDE, train_job(5, optimizer="adamw"))
    a, b = (run_engine("trace", wide, w, gpu) for w in (fused, plain))
    assert a.workload["optimizer"] == "adamw-fused"  # the job as asked is what the answer names
    assert (a.peak_allocated_bytes, a.host_memory_bytes) == (
        b.peak_allocated_bytes,
        b.host_memory_bytes,
    )
    assert a.trace["n_ops"] == b.trace["n_ops"]  # the same traced step
