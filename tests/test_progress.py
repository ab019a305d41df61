"""memfit.progress: one line on a terminal, silence otherwise, messages through a callback."""

from __future__ import annotations

import io
import sys
import time

import pytest

from memfit import progress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_silent_off_a_terminal_and_under_quiet() -> None:
    assert not progress.wanted(quiet=False, json_out=False, stream=io.StringIO())
    assert not progress.wanted(quiet=True, json_out=False, stream=_Tty())
    assert progress.wanted(quiet=False, json_out=False, stream=_Tty())


def test_messages_reach_the_installed_callback_only() -> None:
    seen: list[str] = []
    progress.report("nobody listens")
    with progress.reporting(seen.append):
        progress.report("tracing x")
    progress.report("after")
    assert seen == ["tracing x"]


def test_the_terminal_line_shows_after_the_delay_and_is_cleared() -> None:
    err = _Tty()
    line = progress.TerminalLine(delay_s=0.0, stream=err)
    line("deriving the closed form: trace at batch 2")
    time.sleep(0.05)
    line.close()
    assert "memfit: deriving the closed form: trace at batch 2" in err.getvalue()


def test_nothing_is_drawn_before_the_delay() -> None:
    err = _Tty()
    line = progress.TerminalLine(delay_s=60.0, stream=err)
    line("quick work")
    line.close()
    assert err.getvalue() == ""


def _screen(raw: str) -> list[str]:
    """The lines a terminal shows for ``raw``: ``\\r`` returns to the first column and what
    follows overwrites it (how tqdm's line is drawn and cleared)."""
    lines: list[str] = []
    row: list[str] = []
    col = 0
    for ch in raw:
        if ch == "\n":
            lines.append("".join(row).rstrip())
            row, col = [], 0
        elif ch == "\r":
            col = 0
        else:
            row[col : col + 1] = [ch]
            col += 1
    lines.append("".join(row).rstrip())
    return [line for line in lines if line]


@pytest.mark.parametrize(
    "argv",
    [
        ["fit", "Qwen/Qwen2.5-0.5B", "--gpu", "H100-80GB", "--solve", "batch", "--seq", "512"],
        ["doctor", "Qwen/Qwen2.5-0.5B", "--gpu", "T4", "--seq", "512"],
    ],
)
def test_the_progress_line_is_cleared_before_the_answer(
    argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """stdout and stderr on one terminal, the line drawn from the start: the answer must not
    follow ``memfit: ... [0 s]`` on the same line (issue 29: ``…[13 s]largest batch size``)."""
    from memfit.cli import main

    tty = _Tty()
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    monkeypatch.setattr(progress, "REFRESH_S", 0.005)
    monkeypatch.setattr(sys, "stdout", tty)
    monkeypatch.setattr(sys, "stderr", tty)
    main([*argv, "--engine", "analytic", "--precision", "bf16-mixed"])
    raw = tty.getvalue()
    assert "memfit: " in raw  # the line was drawn (else this test checks nothing)
    shown = _screen(raw)
    assert shown and not any("memfit: " in line for line in shown), shown
