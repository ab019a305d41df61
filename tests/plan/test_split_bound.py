"""The proven miss of a larger micro-batch split (memfit.plan.split_bound): its premises, that
the bound never exceeds the analytic engine's own answer, and that the search it shortens
recommends the same plan."""

from __future__ import annotations

from dataclasses import replace

import pytest

from memfit.estimate.analytic import api
from memfit.estimate.analytic.reserved import RESERVED_RATIO
from memfit.estimate.analytic.reserved_bands import BANDS
from memfit.estimate.verdict import DOES_NOT_FIT, evictable_bytes, judge
from memfit.hardware import get_gpu
from memfit.models import resolve_model
from memfit.plan import search as search_mod
from memfit.plan import split_bound
from memfit.plan.engines import default_engines
from memfit.plan.nearest import request_of
from memfit.plan.search import plan
from memfit.spec import WorkloadSpec


def split(base: WorkloadSpec, micro_batch: int, accum: int) -> WorkloadSpec:
    """``base`` as the planner splits it (memfit.plan.space.Settings.workload: accumulation
    keeps the gradients through the next micro-batch)."""
    return replace(base, batch_size=micro_batch, grad_accum=accum, zero_grad_set_to_none=accum == 1)


JOBS = [
    ("qwen3-0.6b", WorkloadSpec(mode="train", seq_len=1024, precision="bf16-mixed")),
    ("qwen3-0.6b", WorkloadSpec(mode="train", seq_len=2048, precision="bf16-true")),
    (
        "llama-3.2-1b",
        WorkloadSpec(mode="train", seq_len=1024, precision="bf16-mixed", checkpointing="full"),
    ),
    ("llama-3.2-1b", WorkloadSpec(mode="train", seq_len=1024, lora_rank=16)),
    ("llama-3.2-1b", WorkloadSpec(mode="train", seq_len=2048, loss="fused", lora_rank=16)),
    ("gemma-2-2b", WorkloadSpec(mode="train", seq_len=512, precision="bf16-mixed")),
]
#: (smaller split, larger split) as (micro-batch, accumulation) of one per-rank batch
SPLITS = [((1, 2), (2, 1)), ((1, 4), (2, 2)), ((1, 4), (4, 1)), ((2, 2), (4, 1)), ((1, 8), (8, 1))]


def test_reserved_rule_premise() -> None:
    """Step 3 of the argument: a training step's reserved point is never below its allocated
    bytes (the wide ratio and every job-class band scale by >= 1 and add >= 0)."""
    assert RESERVED_RATIO["train"][0] >= 1
    for name, band in BANDS.items():
        if band is None:
            continue
        assert band["ratio"] >= 1, name
        assert band["fixed_bytes"] >= 0, name


@pytest.mark.parametrize(("model", "base"), JOBS)
def test_bound_below_the_engine(model: str, base: WorkloadSpec) -> None:
    """For every split pair, the bound is at most the larger split's forward peak and peak
    allocated bytes, and its device point (context added, paged states taken off) at most the
    point THE verdict rule judges."""
    source = resolve_model(model)
    gpu = get_gpu("L4")
    for (m, a), (big_m, big_a) in SPLITS:
        small, large = split(base, m, a), split(base, big_m, big_a)
        est_small = api.estimate_analytic(source, small, gpu=gpu)
        est_large = api.estimate_analytic(source, large, gpu=gpu)
        floor = split_bound.larger_split_floor_bytes(small, est_small, large)
        assert floor is not None
        assert floor <= est_large.phases["forward"].peak_allocated_bytes
        assert floor <= est_large.peak_allocated_bytes
        point = floor + est_small.cuda_context_bytes - evictable_bytes(est_small)
        paged = min(evictable_bytes(est_large), est_large.device_used_bytes)
        assert point <= est_large.device_used_bytes - paged
        # at a capacity just below the bound, the engine's own verdict is "does not fit"
        assert split_bound.proven_miss(small, est_small, large, point - 1)
        verdict = judge(
            point_bytes=est_large.device_used_bytes,
            need_bytes=est_large.device_used_bytes,
            capacity_bytes=point - 1,
            headroom_bytes=0,
            evictable_bytes=evictable_bytes(est_large),
        )
        assert verdict.verdict == DOES_NOT_FIT
        assert not split_bound.proven_miss(small, est_small, large, point)


def test_held_gradients_taken_off() -> None:
    """Micro-batch 1 x 2 holds the gradients through the forward; micro-batch 2 x 1 does not:
    the bound drops them (else it could exceed a larger split that needs less)."""
    source = resolve_model("qwen3-0.6b")
    base = JOBS[0][1]
    small, large = split(base, 1, 2), split(base, 2, 1)
    est = api.estimate_analytic(source, small, gpu=get_gpu("L4"))
    grads = est.phases["forward"].components["gradients"]
    assert grads > 0
    floor = split_bound.larger_split_floor_bytes(small, est, large)
    assert floor == est.phases["forward"].peak_allocated_bytes - grads
    both_held = split(base, 2, 2)  # accumulation at both: the gradients stay in the bound
    assert split_bound.larger_split_floor_bytes(small, est, both_held) == (
        est.phases["forward"].peak_allocated_bytes
    )


@pytest.mark.parametrize(
    ("change", "accum"),
    [
        ({"gpus": 2, "shard": "ddp"}, 2),
        ({"shard": "zero2", "offload": "optimizer"}, 2),
        ({"optimizer_in_bwd": True, "precision": "bf16-true"}, 1),  # (accumulation refused)
    ],
)
def test_not_bounded(change: dict[str, object], accum: int) -> None:
    """Jobs whose points a rank view or the optimizer in backward rewrites: no bound."""
    source = resolve_model("qwen3-0.6b")
    base = JOBS[0][1]
    est = api.estimate_analytic(source, split(base, 1, 2), gpu=get_gpu("L4"))
    small, large = split(replace(base, **change), 1, accum), split(replace(base, **change), 2, 1)
    assert split_bound.larger_split_floor_bytes(small, est, large) is None
    assert not split_bound.proven_miss(small, est, large, 1)


def test_not_a_split_of_the_job() -> None:
    source = resolve_model("qwen3-0.6b")
    base = JOBS[0][1]
    small = split(base, 1, 2)
    est = api.estimate_analytic(source, small, gpu=get_gpu("L4"))
    other = split(replace(base, seq_len=2048), 2, 1)
    assert split_bound.larger_split_floor_bytes(small, est, other) is None


def test_not_the_analytic_engine() -> None:
    source = resolve_model("qwen3-0.6b")
    base = JOBS[0][1]
    small, large = split(base, 1, 2), split(base, 2, 1)
    est = api.estimate_analytic(source, small, gpu=get_gpu("L4"))
    assert split_bound.larger_split_floor_bytes(small, replace(est, engine="trace"), large) is None


def test_smaller_split_not_larger() -> None:
    base = JOBS[0][1]
    assert not split_bound.same_stack(split(base, 2, 1), split(base, 1, 2))
    assert not split_bound.same_stack(split(base, 2, 1), split(base, 2, 1))


def test_search_skips_and_recommends_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """The nearest change's search (``analytic_floors``) with the proven misses skipped finds
    the same plan as without, with fewer estimates; a plan whose misses are shown skips none."""
    source = resolve_model("llama-3.1-8b")
    gpu = get_gpu("L4")
    w = WorkloadSpec(mode="train", batch_size=2, seq_len=4096, precision="bf16-mixed")

    def run(*, floors: bool) -> object:
        engines = default_engines(source, gpu)
        engines.search._cache.clear()  # nothing kept from an earlier search
        before = engines.search.n_calls
        found = plan(source, request_of(w), gpu=gpu, analytic_floors=floors, engines=engines)
        return found, engines.search.n_calls - before

    (skipped, n_skipped) = run(floors=True)
    monkeypatch.setattr(search_mod, "proven_miss", lambda *a, **k: False)
    (full, n_full) = run(floors=True)
    assert skipped.recommended is not None
    assert skipped.recommended.settings == full.recommended.settings
    assert skipped.recommended.changes == full.recommended.changes
    assert skipped.tight == full.tight
    assert n_skipped < n_full
    calls = []
    monkeypatch.setattr(search_mod, "proven_miss", lambda *a, **k: calls.append(a) or True)
    shown, _ = run(floors=False)
    assert calls == []  # misses shown: every split estimated
    assert shown.recommended is not None


#: (job, the missed stack's optimizer): the other optimizers the planner tries beside it
TWIN_JOBS = [
    ("qwen3-0.6b", WorkloadSpec(mode="train", seq_len=1024, precision="bf16-mixed")),
    ("llama-3.2-1b", WorkloadSpec(mode="train", seq_len=1024, lora_rank=16)),
    ("llama-3.2-1b", WorkloadSpec(mode="train", seq_len=2048, loss="fused", lora_rank=16)),
    (
        "qwen3-0.6b",
        WorkloadSpec(mode="train", seq_len=1024, lora_rank=16, quant="nf4", prepare_kbit=True),
    ),
    ("gemma-2-2b", WorkloadSpec(mode="train", seq_len=512, precision="16-mixed")),
]
OPTIMIZERS = ("adamw", "adamw-fused", "adamw-8bit", "adafactor", "paged-adamw-8bit")


def test_paged_states_are_states() -> None:
    """Step 6's premise: the evictable (paged) bytes are part of the optimizer states."""
    source = resolve_model("llama-3.2-1b")
    for optimizer in OPTIMIZERS:
        w = WorkloadSpec(mode="train", seq_len=512, optimizer=optimizer)
        est = api.estimate_analytic(source, w, gpu=get_gpu("L4"))
        assert evictable_bytes(est) <= est.phases["forward"].components["optimizer_states"]


@pytest.mark.parametrize(("model", "base"), TWIN_JOBS)
def test_other_optimizer_bound_below_the_engine(model: str, base: WorkloadSpec) -> None:
    """For every pair of optimizers and every split of the other one at the same or a larger
    micro-batch, the bound is at most that stack's forward peak less its own states, its device
    point (context added) at most the point THE verdict rule judges, and the engine's own
    verdict is "does not fit" at a capacity just below it."""
    source = resolve_model(model)
    gpu = get_gpu("L4")
    for mine in OPTIMIZERS[:3]:
        for (m, a), (big_m, big_a) in [((1, 2), (1, 2)), ((2, 1), (2, 1)), *SPLITS[:3]]:
            small = split(replace(base, optimizer=mine), m, a)
            est_small = api.estimate_analytic(source, small, gpu=gpu)
            for other in OPTIMIZERS:
                large = split(replace(base, optimizer=other), big_m, big_a)
                floor = split_bound.other_optimizer_floor_bytes(small, est_small, large)
                if other == mine:
                    assert floor is None  # the same stack: larger_split_floor_bytes' case
                    continue
                assert floor is not None
                est_large = api.estimate_analytic(source, large, gpu=gpu)
                forward = est_large.phases["forward"]
                assert (
                    floor <= forward.peak_allocated_bytes - forward.components["optimizer_states"]
                )
                point = floor + est_small.cuda_context_bytes
                paged = min(evictable_bytes(est_large), est_large.device_used_bytes)
                assert point <= est_large.device_used_bytes - paged
                assert split_bound.proven_miss_of_other_optimizer(
                    small, est_small, large, point - 1
                )
                assert not split_bound.proven_miss_of_other_optimizer(
                    small, est_small, large, point
                )
                verdict = judge(
                    point_bytes=est_large.device_used_bytes,
                    need_bytes=est_large.device_used_bytes,
                    capacity_bytes=point - 1,
                    headroom_bytes=0,
                    evictable_bytes=evictable_bytes(est_large),
                )
                assert verdict.verdict == DOES_NOT_FIT


def test_other_optimizer_not_claimed() -> None:
    """No bound for a smaller micro-batch, another change beside the optimizer, the optimizer
    in backward, a rank view, or another engine's estimate."""
    source = resolve_model("qwen3-0.6b")
    base = replace(JOBS[0][1], optimizer="adamw")
    small = split(base, 2, 1)
    est = api.estimate_analytic(source, small, gpu=get_gpu("L4"))
    eight = replace(base, optimizer="adamw-8bit")
    assert split_bound.other_optimizer_floor_bytes(small, est, split(eight, 2, 1)) is not None
    assert split_bound.other_optimizer_floor_bytes(small, est, split(eight, 1, 2)) is None
    longer = split(replace(eight, seq_len=2048), 2, 1)
    assert split_bound.other_optimizer_floor_bytes(small, est, longer) is None
    in_bwd = split(replace(eight, optimizer_in_bwd=True, precision="bf16-true"), 2, 1)
    assert split_bound.other_optimizer_floor_bytes(small, est, in_bwd) is None
    sharded = split(replace(eight, shard="zero2", offload="optimizer"), 2, 1)
    assert split_bound.other_optimizer_floor_bytes(small, est, sharded) is None
    trace = replace(est, engine="trace")
    assert split_bound.other_optimizer_floor_bytes(small, trace, split(eight, 2, 1)) is None


@pytest.mark.parametrize(
    ("model", "gpu_name", "w"),
    [
        (
            "gemma-3-27b",
            "RTX-4090",
            WorkloadSpec(mode="train", batch_size=1, seq_len=2048, lora_rank=16),
        ),
        (
            "qwen3-8b",
            "T4",
            WorkloadSpec(
                mode="train",
                batch_size=4,
                seq_len=2048,
                lora_rank=16,
                quant="nf4",
                prepare_kbit=True,
                lora_dropout=0.1,
            ),
        ),
    ],
)
def test_search_skips_twins_and_recommends_the_same(
    monkeypatch: pytest.MonkeyPatch, model: str, gpu_name: str, w: WorkloadSpec
) -> None:
    """The nearest change's search with the other-optimizer misses skipped finds the same plan
    (and tight plan) as without, with fewer estimates; a plan whose misses are shown skips none."""
    source = resolve_model(model)
    gpu = get_gpu(gpu_name)

    def run(*, floors: bool) -> tuple[object, int]:
        engines = default_engines(source, gpu)
        engines.search._cache.clear()
        before = engines.search.n_calls
        found = plan(source, request_of(w), gpu=gpu, analytic_floors=floors, engines=engines)
        return found, engines.search.n_calls - before

    skipped, n_skipped = run(floors=True)
    monkeypatch.setattr(search_mod, "proven_miss_of_other_optimizer", lambda *a, **k: False)
    full, n_full = run(floors=True)
    assert skipped.recommended is not None and full.recommended is not None
    assert skipped.recommended.settings == full.recommended.settings
    assert skipped.recommended.changes == full.recommended.changes
    assert (skipped.tight is None) == (full.tight is None)
    if skipped.tight is not None and full.tight is not None:  # (estimates carry their wall time)
        assert skipped.tight.settings == full.tight.settings
        assert skipped.tight.need_bytes == full.tight.need_bytes
    assert n_skipped < n_full
    calls: list[object] = []
    monkeypatch.setattr(
        search_mod, "proven_miss_of_other_optimizer", lambda *a, **k: calls.append(a) or True
    )
    run(floors=False)
    assert calls == []
