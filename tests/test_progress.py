"""memfit.progress: one line on a terminal, silence otherwise, messages through a callback."""

from __future__ import annotations

import io
import time

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
