"""The worker pool bounds each job in time and survives a job it had to stop."""

from __future__ import annotations

from pathlib import Path

import pytest

from memfit.cli import build_parser, main
from memfit.web.workers import TimedOut, WorkerPool, run_cli

#: The command line the pool runs: the CLI's, injected (memfit.web imports nothing from it).
CLI = {"run": main, "parser_factory": build_parser}


def test_run_cli_captures_what_the_command_prints() -> None:
    parser = build_parser()
    argv = ["estimate", "gpt2", "--engine=analytic", "--batch=0"]
    code, out, err = run_cli(argv, run=main, parser=parser)
    assert code == 2 and out == ""
    assert err.strip() == "memfit: error: batch_size (0) must be a positive integer"
    code, _, err = run_cli(["estimate", "gpt2", "--no-such-flag"], run=main, parser=parser)
    assert code == 2 and "unrecognized arguments: --no-such-flag" in err


def test_a_job_past_its_time_is_stopped_and_its_worker_replaced() -> None:
    pool = WorkerPool(**CLI, n_workers=1, light_timeout_s=1e-4)
    try:
        argv = ("estimate", "llama-3.1-70b", "--engine=analytic", "--json")
        with pytest.raises(TimedOut, match=r"the job ran past 0.0001 s and was stopped"):
            pool.run(argv, heavy=False)
        pool.light_timeout_s = 60
        assert pool.run(argv, heavy=False).exit_code == 0  # the fresh worker answers
    finally:
        pool.close()


def test_heavy_slots_cannot_exceed_the_workers() -> None:
    with pytest.raises(ValueError, match=r"n_heavy \(3\) must be 1 to n_workers \(2\)"):
        WorkerPool(**CLI, n_workers=2, n_heavy=3)


def start_a_child(argv: list[str], *, parser: object) -> int:
    """A command line that starts a process of its own, as the derived engine's trace worker
    does (issue 33: "daemonic processes are not allowed to have children", HTTP 500)."""
    import multiprocessing

    child = multiprocessing.get_context("spawn").Process(target=int)
    child.start()
    child.join(30)
    print(f"daemon={multiprocessing.current_process().daemon} child_exit={child.exitcode}")
    return 0


def test_a_job_may_start_a_process_of_its_own() -> None:
    pool = WorkerPool(run=start_a_child, parser_factory=build_parser, n_workers=1)
    try:
        outcome = pool.run(("estimate", "gpt2"), heavy=True)
    finally:
        pool.close()
    assert outcome.exit_code == 0, outcome.stderr
    assert outcome.stdout.strip() == "daemon=False child_exit=0"


def test_a_derived_engine_request_forks_its_trace_worker_and_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the API, with a cold cache and the derived engine's worker forced on (inherited
    by the spawned request workers), as `memfit estimate gpt2 --engine derived` runs it."""
    from tests.web.test_api import get

    from memfit.web.serve import running

    monkeypatch.setenv("MEMFIT_TRACE_WORKERS", "2")
    monkeypatch.setenv("MEMFIT_CACHE_DIR", str(tmp_path))
    with running(**CLI, n_workers=1) as base:
        status, headers, body = get(f"{base}/api/estimate?model=gpt2&engine=derived&gpu=T4")
    assert status == 200, body
    assert headers["X-Memfit-Exit"] == "0" and body["engine"] == "derived"


def print_pid(argv: list[str], *, parser: object) -> int:
    """A command line that says which worker ran it (after a moment, so two jobs overlap)."""
    import os
    import time

    time.sleep(0.3)
    print(os.getpid())
    return 0


def test_a_repeated_job_goes_to_the_worker_that_ran_it() -> None:
    """What a worker keeps (a nearest change searched, the analytic engine's blocks) answers
    the same command line again only on that worker."""
    from concurrent.futures import ThreadPoolExecutor

    pool = WorkerPool(run=print_pid, parser_factory=build_parser, n_workers=2)
    try:
        jobs = [("estimate", "gpt2", "--batch=1"), ("estimate", "gpt2", "--batch=2")]
        with ThreadPoolExecutor(2) as ex:  # both at once: one on each worker
            first = list(ex.map(lambda a: pool.run(a, heavy=False).stdout, jobs))
        assert first[0] != first[1]
        for argv in [jobs[1], jobs[0], jobs[1], jobs[0]]:  # one at a time: either is idle
            assert pool.run(argv, heavy=False).stdout == first[jobs.index(argv)], argv
    finally:
        pool.close()
