"""The torch-free layers stay torch-free: ruff's banned-api rule (pyproject.toml) refuses torch and
its stack outside the torch layers, and the monitor may import them only lazily."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAZY_TORCH = "def f():\n    import torch\n\n    return torch\n"
EAGER_TORCH = "import torch\n\n\ndef f():\n    return torch\n"


def _ruff() -> str:
    found = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(found).exists():
        pytest.skip("ruff is not installed")
    return found


def _codes(source: str, as_file: str) -> set[str]:
    run = subprocess.run(
        [_ruff(), "check", "--no-cache", "--output-format", "concise", "--stdin-filename", as_file],
        input=source,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    return {code for code in ("TID251", "TID253") if code in run.stdout}


@pytest.mark.parametrize(
    "as_file",
    [
        "src/memfit/plan/search.py",
        "src/memfit/estimate/analytic/engine.py",
        "src/memfit/models/source.py",
        "src/memfit/cli/entry.py",
        "src/memfit/spec.py",
        "src/memfit/report/text.py",
        "src/memfit/estimate/__init__.py",
    ],
)
def test_torch_is_refused_in_the_torch_free_layers_even_lazily(as_file: str) -> None:
    assert "TID251" in _codes(LAZY_TORCH, as_file)


@pytest.mark.parametrize(
    "as_file",
    ["src/memfit/estimate/trace/engine.py", "src/memfit/apply/lora.py", "src/memfit/bench/gate.py"],
)
def test_the_torch_layers_may_import_torch(as_file: str) -> None:
    assert _codes(EAGER_TORCH, as_file) == set()


def test_the_monitor_imports_torch_only_inside_functions() -> None:
    assert _codes(LAZY_TORCH, "src/memfit/monitor/runtime.py") == set()
    assert "TID253" in _codes(EAGER_TORCH, "src/memfit/monitor/runtime.py")


def _private_imports(root: Path) -> list[str]:
    """``from memfit.x import _name`` anywhere under ``root``: a module reaching into another's
    private names (the coupling that made the import graph circular before issue 18)."""
    import ast

    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("memfit"):
                found += [
                    f"{path.relative_to(root)}: {node.module}.{a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
    return found


def test_no_module_imports_another_modules_private_names(tmp_path: Path) -> None:
    assert _private_imports(ROOT / "src" / "memfit") == []
    (tmp_path / "a.py").write_text("from memfit.estimate.trace.engine import _hidden\n")
    assert _private_imports(tmp_path) == ["a.py: memfit.estimate.trace.engine._hidden"]
