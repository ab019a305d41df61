"""benchmarks/answers_identical.py: the before/after check of every ``--json`` answer (issue 32)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "answers_identical.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("answers_identical", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write(path: Path, answers: list[dict[str, object]]) -> Path:
    rows = [{"argv": ["estimate", str(i)], "exit": 1, "answer": a} for i, a in enumerate(answers)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_scrub_drops_timings_at_any_depth() -> None:
    s = _script()
    value = {"a": 1, "trace": {"analytic": {"wall_s": 0.1, "task": "x"}}, "l": [{"elapsed_s": 2}]}
    assert s.scrub(value, s.TIMING_KEYS) == {
        "a": 1,
        "trace": {"analytic": {"task": "x"}},
        "l": [{}],
    }


def test_compare_finds_a_changed_answer(tmp_path: Path) -> None:
    s = _script()
    a = _write(tmp_path / "a.jsonl", [{"fits": False, "n": 1}, {"nearest_fit": {"change": "x"}}])
    b = _write(tmp_path / "b.jsonl", [{"fits": False, "n": 1}, {"nearest_fit": {"change": "y"}}])
    assert s.compare(a, a, frozenset()) == 0
    assert s.compare(a, b, frozenset()) == 1
    c = _write(tmp_path / "c.jsonl", [{"fits": False, "n": 2}, {"nearest_fit": {"change": "x"}}])
    assert s.compare(a, c, frozenset()) == 1
    assert s.compare(a, c, frozenset({"n"})) == 0  # --ignore n
