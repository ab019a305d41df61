"""A grown rank form whose traces ran partly in a forked worker leaves every traced step in this
process's step memo (memfit.estimate.trace.step_memo): the next rank variant of the stack runs
no fake step, sends nothing to the worker, and is the form a build without the memo gives."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

pytest.importorskip("transformers")

from tests.estimate.derived.test_rank import train_job
from tests.estimate.derived.test_rank_grown import DEEP

from memfit.estimate.derived import cache, workers
from memfit.estimate.derived.record import record
from memfit.estimate.trace import step_memo

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the worker is a fork (Linux only)"
)


@pytest.mark.slow
def test_a_workers_traces_serve_the_next_rank_variant_here(
    monkeypatch: pytest.MonkeyPatch, fake_steps: list[int]
) -> None:
    monkeypatch.setenv(workers.ENV, "2")  # a worker wherever fork and two cores exist
    if not workers.wanted():
        pytest.skip("no second core for the trace worker")
    calls = fake_steps
    sent: list[Any] = []
    by_worker: list[Any] = []
    real_run = workers.Pool.run

    def run(self: workers.Pool, keys: Any) -> dict[Any, Any]:
        keys = list(keys)
        sent.extend(k for k, _c in keys)
        out = real_run(self, keys)
        by_worker.extend(self.by_worker)
        return out

    monkeypatch.setattr(workers.Pool, "run", run)
    first = train_job(1, checkpointing="none", shard="zero2", offload="optimizer")
    second = train_job(1, checkpointing="none", shard="zero3", offload="params")
    form, _ = record(DEEP, first, name="deep")
    assert "growth" in form and by_worker, "the first variant was grown, partly in the worker"
    sent.clear()
    here = calls[0]
    mine, _ = record(DEEP, second, name="deep")
    assert calls[0] == here, "the second variant ran a fake step"
    assert sent == [], "the second variant sent traces to the worker"
    step_memo.clear()
    with cache.disabled():
        plain, _ = record(DEEP, second, name="deep")
    for f in (mine, plain):
        f["trace"].pop("wall_s")
    assert json.dumps(mine, sort_keys=True) == json.dumps(plain, sort_keys=True)
