"""The analytic engine says when the installed libraries differ from the ones it was written for."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.conftest import TINY_LLAMA

from memfit.estimate.analytic import estimate_analytic, versions
from memfit.spec import WorkloadSpec

WORKLOAD = WorkloadSpec(batch_size=1, seq_len=16, precision="bf16-true")


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str | None]]:
    """The versions ``version_notes`` reads, set by the test (the notes' cache cleared around)."""
    fake: dict[str, str | None] = dict(versions.WRITTEN_AGAINST)
    monkeypatch.setattr(versions, "installed_version", lambda pkg: fake.get(pkg))
    versions.version_notes.cache_clear()
    yield fake
    versions.version_notes.cache_clear()


def test_an_installed_transformers_of_another_minor_version_is_named_in_a_note(
    installed: dict[str, str | None],
) -> None:
    installed["transformers"] = "5.30.1"
    notes = estimate_analytic(TINY_LLAMA, WORKLOAD).notes
    (note,) = [n for n in notes if "differs from" in n]
    assert "installed transformers 5.30.1 differs from 5.23" in note
    assert "--engine derived or --engine trace follow the installed version" in note


def test_a_patch_release_or_a_local_build_of_the_same_minor_adds_no_note(
    installed: dict[str, str | None],
) -> None:
    installed["transformers"] = "5.23.4"
    installed["torch"] = "2.13.1+cu128"
    assert not [n for n in estimate_analytic(TINY_LLAMA, WORKLOAD).notes if "differs from" in n]


def test_libraries_that_are_not_installed_add_no_note(installed: dict[str, str | None]) -> None:
    installed["transformers"] = None
    installed["torch"] = None
    assert versions.version_notes() == ()


def test_the_installed_versions_are_read_without_importing_them() -> None:
    assert versions.installed_version("memfit-no-such-package") is None
    assert versions.installed_version("pytest") == pytest.__version__
