"""Traces of one form build run two at a time (a forked worker) give what this process gives,
and a worker that fails, hangs or is switched off leaves the job to this process."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import pytest

from memfit.estimate.derived import workers

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the worker is a fork (Linux only)"
)


def _square(key: int) -> tuple[int, int]:
    return key * key, os.getpid()


def test_a_pool_answers_every_key_and_the_worker_takes_some() -> None:
    with workers.Pool(_square, enabled=True) as pool:
        got = pool.run([(k, float(k)) for k in range(1, 7)])
        again = pool.run([(10, 1.0), (11, 2.0)])  # the same worker answers a second round
    assert {k: v[0] for k, v in got.items()} == {k: k * k for k in range(1, 7)}
    assert {k: v[0] for k, v in again.items()} == {10: 100, 11: 121}
    assert pool.by_worker, "the worker traced nothing"
    assert all(got[k][1] != os.getpid() for k in pool.by_worker if k in got)
    here = [k for k in got if k not in pool.by_worker]
    assert here and all(got[k][1] == os.getpid() for k in here)


def test_the_costliest_key_goes_to_the_worker_first() -> None:
    with workers.Pool(_square, enabled=True) as pool:
        pool.run([(1, 1.0), (2, 5.0), (3, 2.0)])
    assert pool.by_worker[0] == 2


def _fails_in_the_worker(key: int) -> tuple[int, int]:
    if key == 2 and os.getpid() != _PARENT[0]:
        raise RuntimeError("worker-only failure")
    return key * 10, os.getpid()


_PARENT = [os.getpid()]


def test_a_job_that_raises_in_the_worker_is_run_again_here() -> None:
    _PARENT[0] = os.getpid()
    with workers.Pool(_fails_in_the_worker, enabled=True) as pool:
        got = pool.run([(1, 1.0), (2, 9.0)])
    assert got[2] == (20, os.getpid())
    assert got[1][0] == 10


def _raises(key: int) -> int:
    raise ValueError(f"bad key {key}")


def test_an_error_is_raised_here_as_a_serial_run_raises_it() -> None:
    with workers.Pool(_raises, enabled=True) as pool, pytest.raises(ValueError, match="bad key"):
        pool.run([(1, 1.0), (2, 2.0)])


def _dies_in_the_worker(key: int) -> tuple[int, int]:
    if os.getpid() != _PARENT[0]:
        os._exit(3)
    return key, os.getpid()


def test_a_worker_that_dies_leaves_its_job_here_and_is_not_used_again() -> None:
    _PARENT[0] = os.getpid()
    with workers.Pool(_dies_in_the_worker, enabled=True) as pool:
        got = pool.run([(1, 1.0), (2, 2.0), (3, 3.0)])
        assert not pool.enabled
    assert {k: v for k, v in got.items()} == {k: (k, os.getpid()) for k in (1, 2, 3)}
    assert pool.by_worker == []


def _hangs_in_the_worker(key: int) -> tuple[int, int]:
    if os.getpid() != _PARENT[0]:
        time.sleep(60)
    return key, os.getpid()


def test_a_worker_that_hangs_past_the_limit_is_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    _PARENT[0] = os.getpid()
    monkeypatch.setattr(workers, "HANG_SLACK_S", 0.5)
    started = time.perf_counter()
    with workers.Pool(_hangs_in_the_worker, enabled=True) as pool:
        got = pool.run([(1, 1.0), (2, 2.0)])
    assert got == {1: (1, os.getpid()), 2: (2, os.getpid())}
    assert time.perf_counter() - started < 30


def test_one_setting_switches_the_worker_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(workers.ENV, "1")
    assert not workers.wanted()
    with workers.Pool(_square) as pool:
        got = pool.run([(1, 1.0), (2, 2.0)])
    assert {k: v[1] for k, v in got.items()} == {1: os.getpid(), 2: os.getpid()}


def test_the_worker_waits_for_a_free_core_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(workers.ENV, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1})
    monkeypatch.setattr(os, "getloadavg", lambda: (1.7, 1.0, 1.0))
    monkeypatch.setattr(workers, "idle_cores", lambda _window_s: 0.9)  # a neighbour runs
    monkeypatch.setattr(workers, "_IDLE_SEEN", [])
    assert not workers.wanted()
    monkeypatch.setattr(os, "getloadavg", lambda: (0.4, 1.0, 1.0))
    assert workers.wanted()
    monkeypatch.setattr(os, "getloadavg", lambda: (3.0, 1.0, 1.0))
    monkeypatch.setenv(workers.ENV, "2")
    assert workers.wanted()


def test_a_lagging_load_average_is_checked_against_the_cores_idle_now(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The 1-minute average still counts a command that has just ended: where it says no core
    is free, the cores idle over a short window decide."""
    monkeypatch.delenv(workers.ENV, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1})
    monkeypatch.setattr(os, "getloadavg", lambda: (1.05, 0.8, 0.4))
    windows: list[float] = []

    def idle(window_s: float) -> float | None:
        windows.append(window_s)
        return answer[0]

    monkeypatch.setattr(workers, "idle_cores", idle)
    monkeypatch.setattr(workers, "_IDLE_SEEN", [])
    answer: list[float | None] = [1.95]
    assert workers.wanted()
    answer[0] = 1.0  # one core busy besides this process ...
    assert workers.wanted() and len(windows) == 1  # ... unseen: a look answers for a while
    monkeypatch.setattr(workers, "IDLE_ANSWER_S", 0.0)
    assert not workers.wanted()
    answer[0] = None  # /proc/stat unreadable: the load average's answer stands
    assert not workers.wanted()
    assert windows == [workers.IDLE_WINDOW_S] * 3
    monkeypatch.setattr(os, "getloadavg", lambda: (0.3, 0.8, 0.4))
    assert workers.wanted() and len(windows) == 3  # the average said yes: no wait


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads Linux's /proc/stat")
def test_idle_cores_counts_a_busy_neighbour() -> None:
    """A process spinning on one core for the whole window leaves at most the others idle."""
    import multiprocessing

    n_cpus = os.cpu_count() or 1
    ctx = multiprocessing.get_context("fork")
    stop = ctx.Event()
    spinner = ctx.Process(target=_spin, args=(stop,))
    spinner.start()
    try:
        time.sleep(0.2)
        idle = workers.idle_cores(0.5)
    finally:
        stop.set()
        spinner.join(10)
    assert idle is not None
    assert 0.0 <= idle <= n_cpus - 0.7


def _spin(stop: Any) -> None:
    while not stop.is_set():
        pass
