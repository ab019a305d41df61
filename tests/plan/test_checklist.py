"""The checklist shape shared by ``upgrade`` and ``doctor`` (memfit.plan.checklist)."""

from __future__ import annotations

import json
from typing import Any, ClassVar

import pytest
from tests.plan.conftest import closed_form_estimate

from memfit.errors import SpecError
from memfit.hardware import get_gpu, list_gpus
from memfit.plan.checklist import (
    Checklist,
    CheckResult,
    check,
    has_rates,
    rated_gpus,
    step_cost,
    trainable_share,
)
from memfit.plan.cost import ModelFacts, Rates, infer_cost, train_step_cost
from memfit.plan.doctor import DoctorChecks
from memfit.plan.doctor_findings import MISTAKES, Finding
from memfit.plan.space import Settings
from memfit.plan.upgrade_checks import UpgradeChecks
from memfit.plan.upgrade_items import ITEMS, CheckItem
from memfit.spec import WorkloadSpec


class Toy(CheckResult):
    TITLES: ClassVar[dict[str, str]] = {"first": "the first check", "second": "the second check"}
    STATUSES: ClassVar[tuple[str, ...]] = ("bad", "fine")
    FLAGGED: ClassVar[str] = "bad"
    CLEAR: ClassVar[str] = "fine"


class ToyJob(Checklist[Toy]):
    result_type = Toy

    def __init__(self, second_id: str = "second") -> None:
        self.calls: list[str] = []
        self.second_id = second_id

    @check
    def first(self) -> Toy:
        self.calls.append("first")
        return Toy(id="first", status="bad", evidence="one", numbers={"n": 1})

    @check
    def second(self) -> Toy:
        self.calls.append("second")
        return Toy(id=self.second_id, status="fine", evidence="two")


# -- declaring and running a job --------------------------------------------------------------
def test_a_check_declared_once_runs_for_the_job_in_the_vocabularys_order() -> None:
    job = ToyJob()
    results = job.run()
    assert [r.id for r in results] == ["first", "second"] == job.calls
    assert ToyJob.checks() == ("first", "second")
    assert [r.flagged for r in results] == [True, False]
    assert [r.clear for r in results] == [False, True]
    assert results[0].title == "the first check"


def test_a_vocabulary_id_without_its_check_fails_when_the_job_is_defined() -> None:
    with pytest.raises(TypeError, match=r"declares the checks \['first'\] but Toy.TITLES lists"):

        class Missing(Checklist[Toy]):
            result_type = Toy

            @check
            def first(self) -> Toy:
                return Toy(id="first", status="bad", evidence="")


def test_checks_declared_out_of_the_vocabularys_order_fail_when_the_job_is_defined() -> None:
    with pytest.raises(TypeError, match=r"\['second', 'first'\] .* in that order"):

        class Swapped(Checklist[Toy]):
            result_type = Toy

            @check
            def second(self) -> Toy:
                return Toy(id="second", status="bad", evidence="")

            @check
            def first(self) -> Toy:
                return Toy(id="first", status="bad", evidence="")


def test_an_overridden_check_keeps_its_place() -> None:
    class Stricter(ToyJob):
        @check
        def first(self) -> Toy:
            return Toy(id="first", status="fine", evidence="overridden")

    results = Stricter().run()
    assert [(r.id, r.evidence) for r in results] == [("first", "overridden"), ("second", "two")]


def test_a_check_that_answers_for_another_id_is_refused() -> None:
    with pytest.raises(TypeError, match=r"check second of ToyJob returned .* with id 'second'"):
        ToyJob(second_id="first").run()


def test_upgrade_and_doctor_declare_one_check_per_item_of_their_vocabulary() -> None:
    assert UpgradeChecks.checks() == tuple(ITEMS)
    assert UpgradeChecks.result_type is CheckItem
    assert DoctorChecks.checks() == tuple(MISTAKES)
    assert DoctorChecks.result_type is Finding


# -- the result record -----------------------------------------------------------------------
def test_a_result_outside_its_vocabulary_is_refused_with_every_problem() -> None:
    with pytest.raises(
        SpecError,
        match=r"2 problems: id \('third'\) must be one of first, second; "
        r"status \('maybe'\) must be one of bad, fine",
    ):
        Toy(id="third", status="maybe", evidence="")


def test_a_next_step_is_given_exactly_where_the_vocabulary_has_one() -> None:
    with pytest.raises(SpecError, match=r"next_step \(None\) must be given: every Finding has one"):
        Finding(id="gpu_by_vram", status="yes", evidence="")
    with pytest.raises(SpecError, match=r"next_step \('run it'\) must be None: CheckItem has none"):
        CheckItem(id="bandwidth", status="triggered", evidence="", next_step="run it")


def test_upgrade_items_keep_their_json_keys_and_order() -> None:
    item = CheckItem(id="bandwidth", status="triggered", evidence="slow", numbers={"x": 1})
    assert json.dumps(item.to_json()) == (
        '{"id": "bandwidth", "title": "memory bandwidth too low for interactive decode", '
        '"status": "triggered", "evidence": "slow", "numbers": {"x": 1}}'
    )
    assert item.triggered and item.flagged


def test_doctor_findings_keep_their_json_keys_and_order() -> None:
    f = Finding(id="gpu_by_vram", status="unknown", evidence="e", next_step="n", numbers={})
    assert json.dumps(f.to_json()) == (
        '{"mistake": "gpu_by_vram", "title": "GPU chosen by VRAM alone", "applies": "unknown", '
        '"evidence": "e", "next_step": "n", "numbers": {}}'
    )
    assert (f.mistake, f.applies) == ("gpu_by_vram", "unknown")


def test_a_results_numbers_are_copied_into_its_json() -> None:
    numbers: dict[str, Any] = {"n": 1}
    item = CheckItem(id="bandwidth", status="unknown", evidence="", numbers=numbers)
    item.to_json()["numbers"]["n"] = 2
    assert item.numbers == {"n": 1}


# -- the helpers both checklists use ---------------------------------------------------------
def test_rated_gpus_splits_the_catalog_and_names_the_unrated_ones(monkeypatch) -> None:
    import dataclasses

    import memfit.hardware as hardware

    gpus = list_gpus()
    unrated_row = dataclasses.replace(gpus[0], name="NO-RATES", memory_bandwidth_gbps=None)
    monkeypatch.setattr(hardware, "list_gpus", lambda: [*gpus, unrated_row])
    rated, note = rated_gpus("ranked")
    assert [g.name for g in rated] == [g.name for g in gpus if has_rates(g)]
    assert note == (
        "not ranked (no published compute rate or memory bandwidth in the catalog): NO-RATES"
    )
    monkeypatch.setattr(hardware, "list_gpus", lambda: gpus)
    assert rated_gpus("ranked")[1] is None  # every catalog GPU has rates today


def test_step_cost_is_the_cost_model_of_the_jobs_mode() -> None:
    facts = ModelFacts(
        n_params=1_000_000, n_layers=3, d_model=128, vocab_size=1000,
        kv_bytes_per_token_per_byte=2 * 3 * 128, tied_embeddings=True,
    )  # fmt: skip
    rates, s = Rates.of(get_gpu("L4")), Settings(precision="bf16", micro_batch=2)
    infer = step_cost(s, facts, rates, mode="infer", seq_len=256, new_tokens=32)
    assert infer == infer_cost(s, facts, rates, seq_len=256, new_tokens=32)
    train = step_cost(
        s, facts, rates, mode="train", seq_len=256, new_tokens=0, trainable_fraction=0.5
    )
    assert train == train_step_cost(s, facts, rates, seq_len=256, trainable_fraction=0.5)
    assert train != step_cost(s, facts, rates, mode="train", seq_len=256, new_tokens=0)


def test_trainable_share_is_one_without_an_estimate() -> None:
    assert trainable_share(None) == 1.0
    est = closed_form_estimate(WorkloadSpec(lora_rank=16))
    assert trainable_share(est) == est.n_trainable_params / est.n_params < 1.0
