"""The solver: exact monotone search, confirmed by the trace engine; seq and batch trade off."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.plan.conftest import closed_form_estimate

import memfit
from memfit.cli import main
from memfit.estimate.result import MemoryEstimate
from memfit.estimate.verdict import EXIT_CODES
from memfit.plan import fit
from memfit.plan.budget import DEFAULT_HEADROOM, Budget, need_bytes
from memfit.plan.budget import verdict as budget_verdict
from memfit.plan.solve import GUIDED_ROUNDS, FitResult, largest, largest_guided
from memfit.report.plan import render_fit
from memfit.spec import WorkloadSpec
from memfit.units import MiB


@settings(max_examples=200, deadline=None)
@given(threshold=st.integers(min_value=0, max_value=5000), cap=st.integers(1, 6000))
def test_largest_finds_the_threshold_of_a_monotone_predicate(threshold: int, cap: int) -> None:
    calls: list[int] = []

    def pred(x: int) -> bool:
        calls.append(x)
        return x <= threshold

    assert largest(pred, cap=cap) == min(threshold, cap)
    assert len(calls) <= 2 * cap.bit_length() + 2


def test_largest_respects_the_step() -> None:
    assert largest(lambda x: x <= 1000, cap=4096, step=64) == 960
    assert largest(lambda x: x <= 10, cap=4096, step=64) == 0


@settings(max_examples=40, deadline=None)
@given(
    seq=st.integers(min_value=16, max_value=2048),
    longer=st.integers(min_value=0, max_value=2048),
    capacity=st.integers(min_value=4 * MiB, max_value=64 * MiB),
)
def test_a_longer_sequence_never_yields_a_larger_max_batch(
    tiny_llama_dir: Path, seq: int, longer: int, capacity: int
) -> None:
    def max_batch(s: int) -> int:
        w = WorkloadSpec(seq_len=s, checkpointing="full")
        r = fit(
            str(tiny_llama_dir),
            w,
            solve="batch",
            gpu_memory_bytes=capacity,
            estimator=closed_form_estimate,
        )
        return r.max_value

    assert max_batch(seq + longer) <= max_batch(seq)


def test_max_batch_is_exact_by_the_trace_engine_and_confirmed(
    tiny_llama_dir: Path, trace_estimator: Callable[[WorkloadSpec], MemoryEstimate]
) -> None:
    """The fast engine over-reports 10 MiB here (pessimistic); the trace engine confirms its answer
    and, fitting the next batch too, searches on up: the answer is the trace engine's own maximum
    (else the largest "only tight" value could be one the precise engine says fits)."""
    w = WorkloadSpec(seq_len=128, precision="amp-bf16")

    def pessimistic(x: WorkloadSpec) -> MemoryEstimate:
        est = trace_estimator(x)
        ranges = {k: (lo, hi + 10 * MiB) for k, (lo, hi) in est.ranges.items()}
        return dataclasses.replace(est, engine="pessimistic", ranges=ranges)

    r = fit(
        str(tiny_llama_dir),
        w,
        solve="batch",
        gpu="L4",
        gpu_memory_bytes=780 * MiB,
        estimator=pessimistic,
        confirm=trace_estimator,
    )
    assert r.max_value > 1 and r.confirmed_by == "trace"
    limit = r.budget.limit_bytes
    assert need_bytes(trace_estimator(dataclasses.replace(w, batch_size=r.max_value))) <= limit
    assert need_bytes(trace_estimator(dataclasses.replace(w, batch_size=r.max_value + 1))) > limit


def test_the_trace_engine_overrules_an_optimistic_fast_engine(
    tiny_llama_dir: Path, trace_estimator: Callable[[WorkloadSpec], MemoryEstimate]
) -> None:
    w = WorkloadSpec(seq_len=128, precision="amp-bf16")

    def optimistic(x: WorkloadSpec) -> MemoryEstimate:
        est = trace_estimator(x)
        ranges = {k: (lo, hi - 20 * MiB) for k, (lo, hi) in est.ranges.items()}
        return dataclasses.replace(est, engine="optimistic", ranges=ranges)

    r = fit(
        str(tiny_llama_dir),
        w,
        solve="batch",
        gpu="L4",
        gpu_memory_bytes=740 * MiB,
        estimator=optimistic,
        confirm=trace_estimator,
    )
    limit = r.budget.limit_bytes
    assert r.max_value >= 1
    assert need_bytes(trace_estimator(dataclasses.replace(w, batch_size=r.max_value))) <= limit
    assert need_bytes(trace_estimator(dataclasses.replace(w, batch_size=r.max_value + 1))) > limit


def test_serving_reports_a_kv_cache_budget_table(tiny_llama_dir: Path) -> None:
    w = WorkloadSpec(mode="infer", seq_len=512, new_tokens=16)
    r = fit(
        str(tiny_llama_dir),
        w,
        solve="concurrency",
        gpu_memory_bytes=64 * MiB,
        estimator=closed_form_estimate,
    )
    assert r.max_value > 0
    contexts = [row["context_tokens"] for row in r.kv_table]
    assert contexts == [1024, 2048]  # capped at the tiny Llama's 2048 positions
    assert r.kv_table[0]["max_concurrency"] >= r.kv_table[1]["max_concurrency"] > 0
    assert r.to_json()["max_concurrency"] == r.max_value


def test_fit_searches_with_the_trace_where_the_analytic_engine_cannot_model_the_model() -> None:
    """A factory model: the analytic engine refuses every point; fit used to answer 0 with
    batch 1 needing 0.6 GiB of a T4 (issue 11). Now the trace engine searches."""
    from memfit.models import resolve_model

    result = fit(
        resolve_model("tests.fixtures.cnn:make_cnn", allow_code=True),
        WorkloadSpec(),
        gpu="T4",
        solve="batch",
    )
    assert result.max_value > 1 and result.search_engine == "trace"
    assert result.estimate is not None and result.estimate.fits


def test_a_pessimistic_fast_engine_never_makes_fit_answer_zero_where_the_precise_one_fits(
    tiny_llama_dir: Path,
) -> None:
    """Issue 11: the fast engine's upper end says even batch 1 overflows, the confirming engine
    says batch 1 fits: fit searches with the confirming engine instead of answering 0."""
    w = WorkloadSpec(seq_len=128, precision="bf16-true")
    precise_need = need_bytes(closed_form_estimate(w))

    def pessimistic(x: WorkloadSpec) -> MemoryEstimate:
        est = closed_form_estimate(x)
        ranges = {k: (lo, hi + 64 * MiB) for k, (lo, hi) in est.ranges.items()}
        return dataclasses.replace(est, engine="pessimistic", ranges=ranges)

    memory = int(precise_need / 0.95) + 2 * MiB  # batch 1 fits by the precise engine only
    r = fit(str(tiny_llama_dir), w, solve="batch", gpu_memory_bytes=memory,
            estimator=pessimistic, confirm=closed_form_estimate)  # fmt: skip
    assert need_bytes(pessimistic(w)) > r.budget.limit_bytes >= precise_need
    assert r.max_value >= 1 and r.confirmed_by == "confirm"  # the injected precise engine
    at = dataclasses.replace(w, batch_size=r.max_value)
    assert need_bytes(closed_form_estimate(at)) <= r.budget.limit_bytes
    assert need_bytes(closed_form_estimate(dataclasses.replace(at, batch_size=r.max_value + 1))) > (
        r.budget.limit_bytes
    )


@settings(max_examples=200, deadline=None)
@given(
    threshold=st.integers(min_value=0, max_value=5000),
    cap=st.integers(1, 6000),
    bias=st.integers(min_value=-300, max_value=300),
    noise=st.integers(min_value=0, max_value=40),
)
def test_a_guided_search_gives_the_exact_searchs_answer_whatever_the_guess(
    threshold: int, cap: int, bias: int, noise: int
) -> None:
    exact: list[int] = []

    def pred(x: int) -> bool:
        exact.append(x)
        return x <= threshold

    def guess(x: int) -> bool:  # off by ``bias``, and not even monotone when ``noise`` > 0
        return x <= threshold + bias + (x * 7919 % (noise + 1))

    assert largest_guided(pred, guess, cap=cap) == largest(lambda x: x <= threshold, cap=cap)
    assert len(exact) <= 2 * (GUIDED_ROUNDS + 1) + 2 * cap.bit_length() + 2


def test_a_right_guess_leaves_the_exact_predicate_three_calls() -> None:
    exact: list[int] = []

    def pred(x: int) -> bool:
        exact.append(x)
        return x <= 777

    assert largest_guided(pred, lambda x: x <= 777, cap=100_000) == 777
    assert exact == [1, 777, 778]  # the smallest value, the answer and the value after it
    assert largest_guided(lambda x: x <= 1000, lambda x: x <= 1000, cap=4096, step=64) == 960
    assert largest_guided(lambda x: x <= 5000, lambda x: True, cap=4096, step=64) == 4096


def _routed(first: Callable[[WorkloadSpec, Callable[[MemoryEstimate], bool]], object]) -> tuple:
    from memfit.plan.engines import CachedEstimator

    calls: list[WorkloadSpec] = []

    def exact(w: WorkloadSpec) -> MemoryEstimate:
        calls.append(w)
        return closed_form_estimate(w)

    engine = CachedEstimator(exact, "derived")
    engine.first = first  # type: ignore[assignment]
    return engine, calls


def test_a_first_answer_that_settles_the_search_is_its_only_estimate(
    tiny_llama_dir: Path,
) -> None:
    def first(w: WorkloadSpec, settles: Callable[[MemoryEstimate], bool]) -> object:
        est = closed_form_estimate(w)
        return est if settles(est) else None

    engine, calls = _routed(first)
    w = WorkloadSpec(seq_len=512)
    got = fit(str(tiny_llama_dir), w, solve="batch", gpu_memory_bytes=MiB, estimator=engine)
    plain = fit(str(tiny_llama_dir), w, solve="batch", gpu_memory_bytes=MiB,
                estimator=closed_form_estimate)  # fmt: skip
    assert calls == [] and got.max_value == plain.max_value == 0
    assert got.n_estimates == plain.n_estimates == 1
    assert got.estimate == plain.estimate
    assert [n for n in got.notes if n not in plain.notes] == [
        "search: batch_size=1 does not fit, estimated from its own traces alone (the derived "
        "engine's bytes at batch_size=1, no whole form built)"
    ]


def test_a_first_answer_that_does_not_settle_leaves_the_search_as_it_was(
    tiny_llama_dir: Path,
) -> None:
    asked: list[int] = []

    def first(w: WorkloadSpec, settles: Callable[[MemoryEstimate], bool]) -> object:
        asked.append(w.batch_size)
        return None if not settles(closed_form_estimate(w)) else closed_form_estimate(w)

    engine, calls = _routed(first)
    w = WorkloadSpec(seq_len=512)
    got = fit(str(tiny_llama_dir), w, solve="batch", gpu_memory_bytes=64 * MiB, estimator=engine)
    plain = fit(str(tiny_llama_dir), w, solve="batch", gpu_memory_bytes=64 * MiB,
                estimator=closed_form_estimate)  # fmt: skip
    assert asked == [1] and calls and got.max_value == plain.max_value > 0
    named = {"search_engine": "derived", "confirmed_by": "derived"}  # the engine's own name
    assert got.to_json() == plain.to_json() | named


# -- the largest value that fits and the largest that is only tight (issue 29 item 5) -----------
def _verdict_at(path: Path, w: WorkloadSpec, batch: int, r: FitResult) -> str:
    est = closed_form_estimate(dataclasses.replace(w, batch_size=batch))
    return budget_verdict(est, r.budget).verdict


@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(min_value=2 * MiB, max_value=96 * MiB))
def test_fit_answers_the_largest_fitting_and_the_largest_tight_value_by_the_one_verdict_rule(
    tiny_llama_dir: Path, capacity: int
) -> None:
    w = WorkloadSpec(seq_len=256)
    r = fit(str(tiny_llama_dir), w, solve="batch", gpu_memory_bytes=capacity,
            estimator=closed_form_estimate)  # fmt: skip
    assert r.max_tight_value is not None and r.max_tight_value >= r.max_value
    if r.max_value:
        assert _verdict_at(tiny_llama_dir, w, r.max_value, r) == "fits"
        assert _verdict_at(tiny_llama_dir, w, r.max_value + 1, r) != "fits"
    if r.max_tight_value:
        assert _verdict_at(tiny_llama_dir, w, r.max_tight_value, r) in ("fits", "tight")
    assert _verdict_at(tiny_llama_dir, w, r.max_tight_value + 1, r) == "does not fit"
    expected = "fits" if r.max_value else "tight" if r.max_tight_value else "does not fit"
    assert r.verdict == expected and r.exit_code == EXIT_CODES[expected]
    assert r.to_json()["verdict"] == expected


def _tight_at_one(tiny_llama_dir: Path) -> tuple[WorkloadSpec, int]:
    """A job and a memory on which batch 1's point fits but its upper end + headroom does not."""
    w = WorkloadSpec(seq_len=256)
    est = closed_form_estimate(w)
    point, need = est.device_used_bytes, need_bytes(est)
    memory = int(need / 0.97)  # 5 % headroom: need + headroom > memory > point
    assert point < memory < need / (1 - DEFAULT_HEADROOM)
    return w, memory


def test_when_nothing_fits_but_the_smallest_value_is_tight_fit_says_so_not_zero(
    tiny_llama_dir: Path,
) -> None:
    w, memory = _tight_at_one(tiny_llama_dir)
    r = fit(str(tiny_llama_dir), w, solve="batch", gpu_memory_bytes=memory,
            estimator=closed_form_estimate)  # fmt: skip
    assert r.max_value == 0 and r.max_tight_value and r.max_tight_value >= 1
    assert r.verdict == "tight" and r.exit_code == 1
    data = r.to_json()
    assert data["max_batch"] == 0 and data["max_batch_tight"] == r.max_tight_value
    assert data["needs"]["fits"] is None
    tight = data["needs"]["tight"]
    assert tight["value"] == r.max_tight_value and tight["verdict"] == "tight"
    assert (
        tight["point_bytes"]
        <= tight["capacity_bytes"]
        < tight["need_bytes"] + tight["headroom_bytes"]
    )
    text = render_fit(r)
    assert ": 0" not in text
    assert text.startswith("no batch size fits") and "only tight" in text
    assert f"largest batch size that is only tight: {r.max_tight_value}" in text


def test_fit_reports_both_needs_of_the_fitting_and_the_tight_answer(tiny_llama_dir: Path) -> None:
    w = WorkloadSpec(seq_len=256)
    r = fit(str(tiny_llama_dir), w, solve="batch", gpu_memory_bytes=64 * MiB,
            estimator=closed_form_estimate)  # fmt: skip
    assert r.max_value > 1 and r.verdict == "fits" and r.exit_code == 0
    needs = r.to_json()["needs"]
    assert needs["fits"]["value"] == r.max_value and needs["fits"]["verdict"] == "fits"
    assert needs["fits"]["point_bytes"] <= needs["fits"]["need_bytes"]
    text = render_fit(r)
    assert f"largest batch size that fits {r.budget.gpu_name}: {r.max_value}" in text
    assert "(estimate " in text and ", upper end " in text
    if r.only_tight:
        assert needs["tight"]["value"] == r.max_tight_value
        assert f"that is only tight: {r.max_tight_value}" in text
    else:
        assert needs["tight"] is None and "is even tight" in text


def test_fit_without_the_tight_search_leaves_it_unanswered(tiny_llama_dir: Path) -> None:
    r = fit(str(tiny_llama_dir), WorkloadSpec(seq_len=256), solve="batch",
            gpu_memory_bytes=64 * MiB, estimator=closed_form_estimate, tight=False)  # fmt: skip
    assert r.max_tight_value is None and r.to_json()["max_batch_tight"] is None
    assert r.verdict == "fits"


def test_the_fit_command_exits_by_the_verdict_of_what_it_reports(
    tiny_llama_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["fit", str(tiny_llama_dir), "--seq", "256", "--solve", "batch", "--engine",
            "analytic", "--json"]  # fmt: skip
    code = main([*argv, "--gpu-memory", str(1 << 40)])
    assert code == 0 and json.loads(capsys.readouterr().out)["verdict"] == "fits"
    one = memfit_estimate(tiny_llama_dir)
    tight_memory = int(need_bytes(one) / 0.97)
    code = main([*argv, "--gpu-memory", str(tight_memory)])
    data = json.loads(capsys.readouterr().out)
    assert (data["max_batch"], data["verdict"], code) == (0, "tight", 1)
    assert data["max_batch_tight"] >= 1
    code = main([*argv, "--gpu-memory", str(one.device_used_bytes // 2)])
    data = json.loads(capsys.readouterr().out)
    assert (data["max_batch"], data["max_batch_tight"], data["verdict"], code) == (
        0, 0, "does not fit", 1,
    )  # fmt: skip


def memfit_estimate(path: Path) -> MemoryEstimate:
    return memfit.estimate(str(path), WorkloadSpec(seq_len=256), engine="analytic")


def _largest_fitting(
    estimator: Callable[[WorkloadSpec], MemoryEstimate], w: WorkloadSpec, budget: Budget
) -> int:
    return largest(
        lambda b: budget_verdict(estimator(dataclasses.replace(w, batch_size=b)), budget).fits,
        cap=memfit.spec.MAX_BATCH_SIZE,
    )


def _widened(extra: Callable[[MemoryEstimate], int]) -> Callable[[WorkloadSpec], MemoryEstimate]:
    """The closed form with a wider device range (a fast engine's): its upper end ``extra``
    over the closed form's."""

    def estimator(x: WorkloadSpec) -> MemoryEstimate:
        est = closed_form_estimate(x)
        ranges = {"device_used_bytes": (est.device_used_bytes, need_bytes(est) + extra(est))}
        return dataclasses.replace(est, engine="pessimistic", ranges=ranges)

    return estimator


def test_the_kv_table_is_the_fast_engines_answer_scaled_to_the_confirmed_one(
    tiny_llama_dir: Path,
) -> None:
    """The KV-cache table of ``--solve concurrency`` was the fast engine's alone, judged on its
    own wider range (gpt2 on a T4: 127 requests at 1024 tokens where the trace fits 154). Now,
    where the answer is confirmed, the fast engine judges each row on the capacity scaled by its
    need over the confirming engine's at the answer: a fast engine whose range is a constant
    25 % wider then gives the confirming engine's own answers."""
    w = WorkloadSpec(mode="infer", seq_len=512, new_tokens=16)
    wide = _widened(lambda est: need_bytes(est) // 4)
    r = fit(str(tiny_llama_dir), w, solve="concurrency", gpu_memory_bytes=96 * MiB,
            estimator=wide, confirm=closed_form_estimate)  # fmt: skip
    assert r.confirmed_by == "confirm"
    assert [row["context_tokens"] for row in r.kv_table] == [1024, 2048]
    for row in r.kv_table:
        at = dataclasses.replace(w, seq_len=row["context_tokens"] - w.new_tokens)
        precise = _largest_fitting(closed_form_estimate, at, r.budget)
        assert row["max_concurrency"] == precise > _largest_fitting(wide, at, r.budget)
    assert any("answers on the capacity x 1.25" in n for n in r.notes)


def test_confirm_certifies_each_row_of_the_kv_table_with_the_confirming_engine(
    tiny_llama_dir: Path,
) -> None:
    """Under ``--confirm`` each row is the confirming engine's largest batch, asked first at
    the scaled fast answer and the batch after it, whatever the fast engine's range (here 8 MiB
    wider at every batch, so the scale at the answer does not hold at other contexts)."""
    from memfit.estimate.policy import use_confirm

    w = WorkloadSpec(mode="infer", seq_len=512, new_tokens=16)
    wide = _widened(lambda est: 8 * MiB)
    with use_confirm():
        r = fit(str(tiny_llama_dir), w, solve="concurrency", gpu_memory_bytes=96 * MiB,
                estimator=wide, confirm=closed_form_estimate)  # fmt: skip
    assert r.confirmed_by == "confirm"
    for row in r.kv_table:
        at = dataclasses.replace(w, seq_len=row["context_tokens"] - w.new_tokens)
        assert row["max_concurrency"] == _largest_fitting(closed_form_estimate, at, r.budget)
    assert any("each row certified by the confirm engine" in n for n in r.notes)
