"""The published multi-GPU training points (benchmarks/data/multigpu_published.jsonl): the agreed
schema, and memfit's per-rank answer on the expressible ones against the measurement."""

from __future__ import annotations

import json
import subprocess

import pytest
from benchmarks import multigpu_points
from benchmarks.multigpu_points import FALLBACK, command, load, missing, run, run_cli

from memfit.estimate.fastpath import grid_job
from memfit.estimate.parallel.memory import OP_SAC_SAVES_FLOAT8_SINCE
from memfit.spec import WorkloadSpec

FIELDS = {
    "source", "framework", "version", "model", "gpus", "layout", "precision", "micro_batch",
    "seq", "checkpointing", "measured_gib", "metric",
}  # fmt: skip
LAYOUT = {"dp", "fsdp", "tp", "pp", "cp", "ep"}

#: Points memfit misses by more than the tolerance below, each with the mechanism found
#: (docs/accuracy.md, "Published multi-GPU training points beyond torchtitan"). Strict xfail: a
#: fix that brings one inside the band fails the test until its entry is removed.
DERIVED_RESERVED = (
    "memfit's reserved for these QLoRA jobs is 1.3-1.4x its allocated (the derived engine's "
    "allocator replay), where measured runs show 1.07-1.25; measured at the 24 GB card's "
    "capacity, where the caching allocator frees cached blocks rather than reserve more"
)
KNOWN_MISSES = {
    "aai-7b-qlora-b10": DERIVED_RESERVED + " (its allocated 17.6 GiB: -16 %)",
    "aai-mistral-qlora-offload-b12": DERIVED_RESERVED + " (its allocated: -18 %)",
    "aai-mistral-qlora-offload-s24576": DERIVED_RESERVED + " (its allocated: -18 %)",
    "peft-zero3-lora-70b-8gpu": (
        "~11.6 GiB not found (a bf16 model built under zero.Init: no engine-init phase; its "
        "epoch checkpoint gathers module by module to the CPU). Sized from source, not "
        "modelled (docs/accuracy.md, 'the leads sized from source'): DeepSpeed's prefetch past "
        "the bucket and recomputed modules held to their backward +2.1 GiB together "
        "(benchmarks/zero3_leads.py), NCCL 2.18-2.19 NVLS buffers 1.5 GiB x 2 communicators "
        "(~-10 % in all); the all-gather stream's own allocator pool +0.7 GiB reserved "
        "(benchmarks/zero3_streams.py); left: ring/tree buffers"
    ),
}


def test_every_point_has_the_agreed_fields_and_a_layout_that_spans_its_gpus() -> None:
    for p in load():
        assert set(p) >= FIELDS, p.get("id")
        assert set(p["layout"]) == LAYOUT, p["id"]
        assert p["metric"] in ("allocated", "reserved", "device"), p["id"]
        assert p["source"].startswith("https://"), p["id"]
        n = 1
        for v in p["layout"].values():
            n *= v
        assert n == p["gpus"], p["id"]


def test_a_point_marked_not_expressible_says_why_and_gets_no_error() -> None:
    marked = [p for p in load() if p.get("expressible") is False]
    assert marked
    for p in marked:
        assert p["reason"] in missing(p), p["id"]


def test_every_point_runs_on_the_engine_auto_answers_a_multi_gpu_job_with() -> None:
    """The fast-path grid validates no multi-GPU job, so ``--engine auto`` answers each with the
    trace engine's bytes (the derived form where cached): the points run the derived engine, the
    LoRA ones as the QLoRA ones (before: ``--engine analytic``, which auto never answers with)."""
    by_id = {p["id"]: p for p in load() if "id" in p}
    assert command(by_id["aai-7b-qlora-b4"])[-2:] == ["--engine", "derived"]
    assert command(by_id["aai-7b-lora-b4"])[-2:] == ["--engine", "derived"]
    assert "--offload" in command(by_id["aai-7b-lora-offload-b10"])
    work = WorkloadSpec(gpus=2, shard="fsdp", lora_rank=64, checkpointing="full")
    assert grid_job(work) is None


def test_a_point_the_derived_engine_refuses_is_answered_by_the_analytic_engine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[str] = []

    def fake_run(cmd: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        engine = cmd[cmd.index("--engine") + 1]
        asked.append(engine)
        if engine == "derived":
            return subprocess.CompletedProcess(cmd, 2, "", "memfit: the derived engine refuses")
        return subprocess.CompletedProcess(cmd, 0, json.dumps({"engine": "analytic (x)"}), "")

    monkeypatch.setattr(multigpu_points.subprocess, "run", fake_run)
    out = run_cli(["llama-2-7b", "--gpus", "2", "--engine", "derived"])
    assert asked == ["derived", FALLBACK] and out["engine"].startswith("analytic")


def test_trainy_points_gather_float8_weights_as_their_source_command_sets() -> None:
    """Trainy's command sets ``enable_fsdp_float8_all_gather`` (quoted in the rows' notes); the
    rows said nothing of it before, and memfit gathered bf16 weights for them."""
    by_id = {p["id"]: p for p in load() if "id" in p}
    for pid in ("trainy-h200-4n", "trainy-h200-8n"):
        assert "--float8-all-gather" in command(by_id[pid]), pid
        assert "enable_fsdp_float8_all_gather" in by_id[pid]["notes"], pid


def test_peft_script_points_run_with_their_lora_dropout_and_transformers_release() -> None:
    """Answer.AI's train.py (``lora_dropout=0.1`` default) and peft's examples/sft commands
    (``--lora_dropout 0.1``) run peft's adapter dropout, on a transformers before 4.46 (README /
    requirements at the cited commits), whose Llama forward returns fp32 logits: the points say
    so and their commands pass both, with the peft release (before 0.12: adapters in the base
    dtype) (memfit.spec.hf_versions); before, memfit ran them without dropout, on the installed
    transformers' loss and with fp32 adapters."""
    points = [p for p in load() if p.get("id", "").startswith(("aai-", "peft-"))]
    assert len(points) >= 20
    for p in points:
        if missing(p):
            continue
        argv = command(p)
        assert argv[argv.index("--lora-dropout") + 1] == "0.1", p["id"]
        version = argv[argv.index("--transformers-version") + 1]
        assert version.startswith("4.3"), p["id"]
        peft = argv[argv.index("--peft-version") + 1]
        assert peft in ("0.9", "0.10"), p["id"]  # both before 0.12: bf16 adapters
        assert "lora_dropout 0.1" in p["notes"] and "transformers_version" in p["notes"], p["id"]


def test_compile_points_run_with_compile_unless_their_torchtitan_saves_what_memfit_does_not() -> (
    None
):
    """torch.compile is modelled (``--compile``); a Float8 point under per-op SAC run by a
    torchtitan whose save list has no ``aten._scaled_mm`` (9dec370, e7c0cae: every Float8 linear
    output recomputed) is another job than memfit's (torchtitan since 114151ad4: all saved), so
    it is listed with that reason, not scored; under full checkpointing the list does not
    matter."""
    by_id = {p["id"]: p for p in load() if "id" in p}
    for pid in ("tt-t1-fsdp8-compile", "tt-t3-fsdp128-compile", "tt-t4-70b-2d"):
        assert not missing(by_id[pid]), pid
        assert "--compile" in command(by_id[pid]), pid
    old = ("tt-t1-fsdp8-compile-float8", "tt-t3-fsdp128-compile-float8", "trainy-h200-4n")
    for pid in (*old, "trainy-h200-8n"):
        (reason,) = missing(by_id[pid])
        assert "aten._scaled_mm" in reason and OP_SAC_SAVES_FLOAT8_SINCE in reason, pid
    assert not any("torch.compile" in " ".join(missing(p)) for p in load())


def _cases() -> list[object]:
    out: list[object] = []
    for p in load():
        if missing(p):
            continue
        marks = []
        if command(p)[-1] == "derived":
            marks.append(pytest.mark.slow)  # the derived engine: minutes on a cold cache
        if p["id"] in KNOWN_MISSES:
            marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_MISSES[p["id"]]))
        out.append(pytest.param(p, id=p["id"], marks=marks))
    return out


@pytest.mark.parametrize("point", _cases())
def test_expressible_points_are_not_under_predicted(point: dict) -> None:
    """Tolerance: never more than 10 % under (issue 30's rule), at most 10 % over — torchtitan's
    per-op SAC runs as memfit's ``selective-op``, the same policy (before it, as ``selective``,
    its points were +18 % / +28 %: docs/accuracy.md, torchtitan's checkpointing)."""
    row = run(point)
    assert -0.10 <= row["error"] <= 0.10, row


def test_peft_fsdp_qlora_rows_run_as_fsdp1_with_their_epoch_checkpoint() -> None:
    """peft's FSDP-QLoRA rows (accelerate 0.28: FSDP1, fsdp_state_dict_type SHARDED_STATE_DICT,
    a checkpoint at the epoch end) run with the checkpoint phase (memfit.estimate.fsdp1_save);
    before it they were -37.8 % / -18.8 % (docs/accuracy.md, helper peft70b)."""
    by_id = {p["id"]: p for p in load() if "id" in p}
    for pid in ("peft-fsdp-qlora-70b-offload", "peft-fsdp-qlora-70b"):
        argv = command(by_id[pid])
        assert argv[argv.index("--fsdp-version") + 1] == "1", pid
        assert argv[argv.index("--grad-accum") + 1] == "2", pid
        assert argv[argv.index("--fsdp-state-dict-type") + 1] == "SHARDED_STATE_DICT", pid
        # the page's accelerate (>= 0.28.0, 2024-03): the copies on the GPU (hf_versions)
        assert argv[argv.index("--accelerate-version") + 1] == "0.28.0", pid


def test_the_zero3_leads_benchmark_patches_the_replay_only_inside_its_block() -> None:
    """benchmarks/zero3_leads.py sizes unmodelled DeepSpeed rules by patching rank 0's ZeRO
    rewrite; the estimate outside its block must stay memfit's own."""
    from benchmarks import zero3_leads

    from memfit.estimate.trace import rank_replay

    before = (rank_replay._Zero._prefetch, rank_replay._Zero.on_mark)
    with zero3_leads._patched(prefetch=True, hold=True):
        assert rank_replay._Zero._prefetch is zero3_leads._prefetch_past_bucket
        assert rank_replay._Zero.on_mark is not before[1]
    assert (rank_replay._Zero._prefetch, rank_replay._Zero.on_mark) == before


def test_a_freed_gathered_weight_serves_the_rest_in_one_pool_but_not_in_two() -> None:
    """benchmarks/zero3_streams.py: DeepSpeed allocates gathered parameters on its all-gather
    stream, whose caching-allocator pool never serves the compute stream. 100 MiB gathered and
    freed, then 100 MiB of activations: one pool reuses the segment (100 MiB reserved), two
    pools reserve 200 MiB."""
    from benchmarks import zero3_streams

    mib = 2**20
    events = [("a", 1, 100 * mib), ("f", 1, 0), ("a", 2, 100 * mib), ("f", 2, 0)]
    owner = {1: ("parameters", "layers.0.mlp.up_proj (gathered)"), 2: ("activations", "x")}
    gathered, rest = zero3_streams.split_events(events, owner)
    assert [e[1] for e in gathered] == [1, 1] and [e[1] for e in rest] == [2, 2]
    p = zero3_streams.pools(events, owner)
    assert p["reserved_one_pool"] == 100 * mib
    assert p["reserved_two_pools"] == 200 * mib


def test_the_zero3_streams_benchmark_restores_the_rewrite_after_its_block() -> None:
    from benchmarks import zero3_streams

    from memfit.estimate.trace import rank_replay

    before = rank_replay._Zero.run
    kept: list = []
    with zero3_streams._kept(kept):
        assert rank_replay._Zero.run is not before
    assert rank_replay._Zero.run is before
