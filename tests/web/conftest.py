"""A calculator server shared by the web tests (worker processes start once per module)."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    from memfit.cli import build_parser, main
    from memfit.web.serve import running

    with running(run=main, parser_factory=build_parser, n_workers=2, heavy_timeout_s=120) as base:
        yield base


def cli_json(*argv: str) -> tuple[int, dict[str, Any]]:
    """What ``memfit ARGV --json`` prints, parsed, and its exit code (run in this process)."""
    from memfit.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main([*argv, "--json"])
    return code, json.loads(out.getvalue())


def cli_error(*argv: str) -> str:
    """The one-line message ``memfit ARGV`` prints for a bad input."""
    from memfit.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(list(argv))
    assert code == 2
    return err.getvalue().strip()


#: The planner's clock readings (``search``): how long this run took, not a prediction.
CLOCK_KEYS = ("elapsed_s", "search_s", "confirm_s")
#: where an answer came from rather than what it is: the trace cache marks a stored answer
#: ``cached`` (memfit.estimate.trace_cache), so two runs differ in it by which ran first
PROVENANCE_KEYS = ("cached",)


def without_timings(value: Any) -> Any:
    """``value`` less its wall-clock readings (``*wall_s``, the planner's ``elapsed_s`` ...) and
    the trace cache's ``cached`` mark: the parts of an answer that differ between two runs of the
    same command."""
    if isinstance(value, dict):
        return {
            k: without_timings(v)
            for k, v in value.items()
            if not (k.endswith("wall_s") or k in CLOCK_KEYS or k in PROVENANCE_KEYS)
        }
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value
