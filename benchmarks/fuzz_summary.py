"""Run every generated fuzz case by class and count tried / handled / failed (issue 33's closing
note). Writes benchmarks/results/fuzz_summary.md.

    PYTHONPATH=src python benchmarks/fuzz_summary.py

The cases are tests/fuzz/cases.py's classes (the same ones ``pytest tests/fuzz -m slow`` runs)
plus the typed-option sweep of tests/fuzz/test_fuzz_limits.py run through ``main`` (not only
argparse). As in the fuzz suite (tests/fuzz/conftest.py), every estimate is analytic and the
commands that run real work (``bench``, ``quality``, ``monitor -- CMD``, ``web``) are stubbed
after their own argument checks, and ``MEMFIT_DEBUG=1`` makes an unexpected exception raise so
it is counted as failed rather than as main's one-line last resort.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fuzz import cases as fz  # noqa: E402
from tests.fuzz.test_fuzz_limits import HOSTILE_NUMBERS, TYPED_OPTIONS  # noqa: E402

from memfit.errors import SpecError  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "fuzz_summary.md"
COMMAND = "PYTHONPATH=src python benchmarks/fuzz_summary.py"


def typed_option_cases() -> list[fz.Case]:
    """Every typed option of every subcommand given every hostile number, through main."""
    out = []
    for name, flag in TYPED_OPTIONS:
        for value in HOSTILE_NUMBERS:
            positional = [] if name in ("web", "gpus", "models") else ["x"]
            out.append(
                fz.Case(f"{name} {flag}={value[:12]}", [name, f"{flag}={value}", *positional], {})
            )
    return out


CLASSES: dict[str, Callable[[], list[fz.Case]]] = {
    **fz.CLASSES,
    "argv: every typed option x hostile numbers (inf, nan, 4400 digits...)": typed_option_cases,
}


def _stub(*_args: object, **_kwargs: object) -> object:
    raise SpecError("fuzz: the real run is stubbed")


def _no_real_runs(mp: pytest.MonkeyPatch) -> None:
    """tests/fuzz/conftest.py's policy: analytic engine only, no real runs, bugs raise."""
    policy = importlib.import_module("memfit.estimate.policy")
    mp.setattr(policy, "trace_stack_missing", lambda source: "disabled by the fuzz summary")
    mp.setenv("MEMFIT_DEBUG", "1")
    bench_pkg = importlib.import_module("memfit.bench")
    mp.setattr(bench_pkg, "bench", _stub, raising=False)
    mp.setattr(bench_pkg, "quality", _stub, raising=False)
    mp.setattr(importlib.import_module("memfit.monitor.process"), "monitor_command", _stub)
    mp.setattr(importlib.import_module("memfit.cli.monitor"), "monitor_command", _stub)
    mp.setattr(importlib.import_module("memfit.web.serve"), "serve", _stub)
    mp.setattr(importlib.import_module("memfit.cli.web"), "serve", _stub)


def run_class(make: Callable[[], list[fz.Case]], root: Path) -> dict[str, object]:
    cases = make()
    failed: list[str] = []
    slowest = 0.0
    t0 = time.perf_counter()
    for case in cases:
        outcome = fz.run_case(case, root)
        slowest = max(slowest, outcome.seconds)
        problem = outcome.problem(case, root)
        if problem is not None:
            failed.append(f"{case.name}: {problem.splitlines()[-1][:160]}")
    return {
        "tried": len(cases),
        "handled": len(cases) - len(failed),
        "failed": failed,
        "slowest_s": slowest,
        "total_s": time.perf_counter() - t0,
    }


def render(results: dict[str, dict[str, object]]) -> str:
    lines = [
        "# Fuzz summary (issue 33): generated hostile inputs by class",
        "",
        f"Command: `{COMMAND}` (writes this file). Handled: exit 0/1/2 as the class allows, one "
        "`memfit: error:` line for exit 2 (for an output path: quoting that path), no "
        "traceback, each case under "
        f"{fz.CASE_TIME_LIMIT_S:.0f} s. Cases: tests/fuzz/cases.py (run by "
        "`pytest tests/fuzz -m slow`; every "
        f"{fz.FAST_STRIDE}th by default) and the typed-option sweep of "
        "tests/fuzz/test_fuzz_limits.py. Machine: a shared 2-core CPU box.",
        "",
        "| class | tried | handled | failed | slowest case (s) | class total (s) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    tried = handled = 0
    for name, r in results.items():
        n_failed = len(r["failed"])  # type: ignore[arg-type]
        tried += r["tried"]  # type: ignore[operator]
        handled += r["handled"]  # type: ignore[operator]
        lines.append(
            f"| {name} | {r['tried']} | {r['handled']} | {n_failed} | "
            f"{r['slowest_s']:.2f} | {r['total_s']:.0f} |"
        )
    lines.append(f"| **all** | **{tried}** | **{handled}** | **{tried - handled}** | | |")
    for name, r in results.items():
        if r["failed"]:
            lines += ["", f"## Failed: {name}", ""]
            lines += [f"- {f}" for f in r["failed"][:20]]  # type: ignore[index]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    results = {}
    with pytest.MonkeyPatch.context() as mp, tempfile.TemporaryDirectory() as tmp:
        _no_real_runs(mp)
        root = Path(tmp)
        fz.make_special_files(root)
        for name, make in CLASSES.items():
            print(f"running {name}...", file=sys.stderr, flush=True)
            results[name] = run_class(make, root)
    text = render(results)
    print(text)
    if not args.no_write:
        OUT.write_text(text)
        print(f"wrote {OUT.relative_to(ROOT)}", file=sys.stderr)
    return 0 if all(not r["failed"] for r in results.values()) else 1


if __name__ == "__main__":
    os.environ.setdefault("MEMFIT_DEBUG", "1")
    raise SystemExit(main())
