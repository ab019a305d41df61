"""The nearest change that fits answers what it answered before the search was made cheaper
(issue 32): tests/plan/data/nearest_answers.json holds the answers of main's code at commit
0e889ab for jobs of every kind the search covers (full fine-tunes, LoRA, QLoRA, inference, a
data-parallel job, a --compile job it answers with the command only, jobs nothing fits on the
GPU asked), recorded by ``benchmarks/nearest_speed.py --record``. Every job is searched anew
(nothing kept from an earlier job), then once more in the same process after the other jobs
(what a ``memfit web`` worker keeps between jobs must not change an answer). Each answer's
``tight`` (a memory-only change the fast engine leaves tight, issue 29) was added by the lead on
2026-12-07 from the answers of that day's search, whose other fields equalled the recorded ones;
on 2026-12-08 the lead set ``tight`` anew the same way (a tight plan the trace engine cannot run
says a run decides it; a result-changing tight plan is named where it would be preferred).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from memfit.estimate import trace_cache
from memfit.plan import nearest as nearest_mod
from memfit.plan.nearest import nearest_fit
from memfit.spec import WorkloadSpec

RECORDED: list[dict[str, Any]] = json.loads(
    (Path(__file__).parent / "data" / "nearest_answers.json").read_text()
)
IDS = [f"{r['model']}-{r['gpu']}-{i}" for i, r in enumerate(RECORDED)]


def _search(row: dict[str, Any]) -> dict[str, Any] | None:
    w = WorkloadSpec(**{"mode": "train", **row["workload"]})
    found = nearest_fit(row["model"], w, row["gpu"], model_name=row["model"])
    return None if found is None else found.to_json()


@pytest.mark.parametrize("row", RECORDED, ids=IDS)
def test_nearest_change_is_the_recorded_one(row: dict[str, Any]) -> None:
    nearest_mod._ANSWERS.clear()
    assert _search(row) == row["nearest_fit"]


def test_nearest_changes_searched_in_one_process_are_the_recorded_ones() -> None:
    """All jobs in a row, in reverse, with nothing cleared: memos shared between jobs (block
    profiles, candidate spaces, simulations) hand no job another's answer."""
    nearest_mod._ANSWERS.clear()
    for row in reversed(RECORDED):
        assert _search(row) == row["nearest_fit"], row["model"]


def test_recorded_jobs_cover_the_kinds_of_job() -> None:
    kinds = {"lora" if "lora_rank" in r["workload"] else "full" for r in RECORDED}
    modes = {r["workload"].get("mode", "train") for r in RECORDED}
    assert kinds == {"lora", "full"} and modes == {"train", "infer"}
    assert any(r["workload"].get("quant") == "nf4" for r in RECORDED)  # QLoRA
    assert sum(r["nearest_fit"]["change"] is not None for r in RECORDED) >= 10


REAL_CACHEABLE = trace_cache.cacheable  # tests/conftest.py turns the trace cache off per test


def test_a_repeated_job_reads_its_nearest_change_from_disk(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Kept with the trace engine's answers (one key rule): a new process (nothing kept in
    memory) answers a repeated job without searching; another job, or --no-cache, searches."""
    monkeypatch.setattr(trace_cache, "cacheable", REAL_CACHEABLE)
    monkeypatch.setenv("MEMFIT_CACHE_DIR", str(tmp_path))
    row = RECORDED[2]
    nearest_mod._ANSWERS.clear()
    assert _search(row) == row["nearest_fit"]
    assert list(tmp_path.rglob("*.json"))  # kept on disk

    def searched(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("searched again")

    monkeypatch.setattr(nearest_mod, "plan", searched)
    nearest_mod._ANSWERS.clear()
    assert _search(row) == row["nearest_fit"]  # read back, command included
    other = {**row, "gpu": "A100-80GB"}
    nearest_mod._ANSWERS.clear()
    with pytest.raises(AssertionError, match="searched again"):
        _search(other)
    monkeypatch.setenv("MEMFIT_NO_CACHE", "1")
    nearest_mod._ANSWERS.clear()
    with pytest.raises(AssertionError, match="searched again"):
        _search(row)
