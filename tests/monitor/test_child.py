"""`memfit monitor -- CMD` never leaves the command as an orphan, and a run log survives a kill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memfit.cli import main

ROOT = Path(__file__).resolve().parents[2]
CHILD = "import sys, time; time.sleep(float(sys.argv[1])); open(sys.argv[2], 'w').write('done')"


def _memfit(*args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.Popen(
        [sys.executable, "-m", "memfit", *args], env=env, stderr=subprocess.PIPE
    )


def _file_size_limit(n_bytes: int) -> None:
    """In the memfit process: writes past ``n_bytes`` fail (EFBIG) instead of killing it."""
    import resource

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (n_bytes, n_bytes))


def test_a_log_that_fails_mid_run_keeps_the_command_running_to_its_end(tmp_path: Path) -> None:
    """The log opens, then its writes fail (a file-size limit: EFBIG, as a full disk would):
    the command runs to its end and exits 0, and memfit says so once. (A device such as
    /dev/full is refused before the command starts: issue 33, special output paths.)"""
    marker = tmp_path / "marker"
    log = tmp_path / "run.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    run = subprocess.Popen(
        [sys.executable, "-m", "memfit", "monitor", "--log", str(log), "--interval", "0.05",
         "--", sys.executable, "-c", CHILD, "0.3", str(marker)],
        env=env, stderr=subprocess.PIPE, preexec_fn=lambda: _file_size_limit(600),
    )  # fmt: skip
    _, err = run.communicate(timeout=60)
    assert run.returncode == 0 and marker.read_text() == "done", err.decode()[-800:]
    assert err.decode().count(f"cannot write the run log '{log}'") == 1, err.decode()[-800:]


def test_a_log_that_cannot_be_opened_starts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "marker"
    log = tmp_path / "missing" / "run.jsonl"
    code = main(["monitor", "--log", str(log), "--", sys.executable, "-c", CHILD, "0", str(marker)])
    assert code == 2 and not marker.exists()
    assert "the command was not started" in capsys.readouterr().err


def test_sigterm_to_memfit_is_forwarded_and_the_command_is_waited_for(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    run = _memfit("monitor", "--log", str(log), "--interval", "0.05", "--",
                  sys.executable, "-c", "import time; time.sleep(60)")  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (log.exists() and log.read_text().count("\n") >= 2):
        time.sleep(0.05)
    child_pid = json.loads(log.read_text().splitlines()[0])["pid"]
    run.send_signal(signal.SIGTERM)
    run.communicate(timeout=30)
    assert run.returncode == 128 + signal.SIGTERM  # the command's own exit, by the signal
    with pytest.raises(ProcessLookupError):
        os.kill(child_pid, 0)  # gone, and reaped: not an orphan
    end = json.loads(log.read_text().splitlines()[-1])
    assert end["type"] == "end" and end["summary"]["outcome"] == "interrupted"


def test_a_run_log_killed_mid_run_keeps_every_record_written(tmp_path: Path) -> None:
    """Each record is one write(): SIGKILL after a step loses nothing before it."""
    log = tmp_path / "run.jsonl"
    script = (
        "import sys, time, memfit\n"
        "from tests.monitor.conftest import FakeCuda\n"
        f"mon = memfit.Monitor({str(log)!r}, device=FakeCuda(), verbose=False).__enter__()\n"
        "for i in range(1000):\n"
        "    mon.step(); print(i, flush=True); time.sleep(0.01)\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    for _ in range(5):
        done = int(proc.stdout.readline())
    proc.kill()
    proc.wait(timeout=30)
    from memfit.monitor import read_log

    run = read_log(log)
    assert run.n_steps >= done + 1 and run.end is None
