"""Fixtures of the fuzz suite: hostile files, an analytic-only engine policy, stubbed real runs.

The default run must stay short (~2 min), so every estimate goes to the analytic engine (the
trace stack is reported missing to the engine policy) and the commands that run real work —
``bench`` / ``quality`` train or evaluate a model, ``monitor -- CMD`` starts a process — have
their run replaced by a stub *after* their own argument checks. What the fuzz checks is the
boundary: exit 0/1/2, one line on stderr for 2, never a traceback.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from memfit.errors import SpecError


class Files:
    """Paths of every kind a user could name: regular, empty, binary, JSON of the wrong shape,
    a FIFO, links to /dev/zero and /dev/urandom, a directory, a missing path."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "empty.json").write_text("")
        (root / "list.json").write_text("[1, 2, 3]")
        (root / "nan.json").write_text('{"model_type": "gpt2", "n_embd": NaN}')
        (root / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
        (root / "binary.bin").write_bytes(random.Random(0).randbytes(4096))
        (root / "notes.txt").write_text("hello\n")
        (root / "dir").mkdir()
        os.mkfifo(root / "fifo")
        (root / "zero").symlink_to("/dev/zero")
        (root / "urandom").symlink_to("/dev/urandom")

    def all(self) -> list[str]:
        names = ["empty.json", "list.json", "nan.json", "deep.json", "binary.bin", "notes.txt"]
        names += ["dir", "fifo", "zero", "urandom", "missing.json"]
        return [str(self.root / n) for n in names]


@pytest.fixture(scope="session")
def files(tmp_path_factory: pytest.TempPathFactory) -> Files:
    return Files(tmp_path_factory.mktemp("fuzz-files"))


def _stub(*_args: object, **_kwargs: object) -> object:
    raise SpecError("fuzz: the real run is stubbed")


@pytest.fixture(autouse=True)
def analytic_only_and_no_real_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    from memfit.bench import runner

    # memfit.estimate and memfit.bench are functions: import the packages by name
    bench_pkg = importlib.import_module("memfit.bench")
    policy = importlib.import_module("memfit.estimate.policy")
    process = importlib.import_module("memfit.monitor.process")

    monkeypatch.setattr(policy, "trace_stack_missing", lambda source: "disabled by the fuzz suite")
    # main()'s last resort turns an unexpected exception into one line; here it must raise, so a
    # memfit bug fails the suite with its traceback instead of passing as "exit 2, one line"
    monkeypatch.setenv("MEMFIT_DEBUG", "1")

    def bench_checks_then_stub(model: str = "opt-125m", **kwargs: object) -> object:
        names = kwargs.get("techniques")
        runner._check(
            list(runner.TECHNIQUES) if names is None else list(names),  # type: ignore[call-overload]
            kwargs.get("steps", 3),  # type: ignore[arg-type]
            kwargs.get("batch_size", 1),  # type: ignore[arg-type]
            kwargs.get("seq_len", 128),  # type: ignore[arg-type]
        )
        runner.bench_device(kwargs.get("device"))  # type: ignore[arg-type]
        return _stub()

    monkeypatch.setattr(bench_pkg, "bench", bench_checks_then_stub, raising=False)
    monkeypatch.setattr(bench_pkg, "quality", _stub, raising=False)
    monkeypatch.setattr(process, "monitor_command", _stub)
    monkeypatch.setattr(importlib.import_module("memfit.cli.monitor"), "monitor_command", _stub)
    # `memfit web` serves until Ctrl-C: its own checks run, the server does not
    web_serve = importlib.import_module("memfit.web.serve")
    monkeypatch.setattr(web_serve, "serve", _stub)
    monkeypatch.setattr(importlib.import_module("memfit.cli.web"), "serve", _stub)


def run_log_reader_is_bounded() -> bool:
    """Whether the run-log reader streams through memfit.userfiles (the `monitor` lane's part of
    issue 17); until it does, FIFO / device run logs would hang this process."""
    import inspect

    import memfit.monitor.log as log
    import memfit.monitor.reader as reader

    return any(
        "iter_lines" in inspect.getsource(m) or "userfiles" in inspect.getsource(m)
        for m in (log, reader)
    )
