"""Text of the checklists (memfit.report.checklist): one renderer for upgrade's and doctor's."""

from __future__ import annotations

from memfit.plan.doctor_findings import Finding
from memfit.plan.upgrade_items import CheckItem
from memfit.report.checklist import STATUS_MARK, render_checks


def test_each_result_shows_its_mark_title_status_and_evidence() -> None:
    item = CheckItem(id="kv_cache_concurrency", status="not_applicable", evidence="training job")
    assert render_checks([item]) == [
        "[-] concurrent requests x context exhaust the KV cache: not applicable",
        "    training job",
    ]


def test_the_next_step_is_shown_unless_the_check_is_clear() -> None:
    found = [
        Finding(id="gpu_by_vram", status=status, evidence="e", next_step=f"do {status}")
        for status in ("yes", "no", "unknown")
    ]
    assert render_checks(found) == [
        "[x] GPU chosen by VRAM alone: yes", "    e", "    next: do yes",
        "[ ] GPU chosen by VRAM alone: no", "    e",
        "[?] GPU chosen by VRAM alone: unknown", "    e", "    next: do unknown",
    ]  # fmt: skip


def test_every_status_of_both_vocabularies_has_a_mark() -> None:
    assert set(STATUS_MARK) == set(CheckItem.STATUSES) | set(Finding.STATUSES)
