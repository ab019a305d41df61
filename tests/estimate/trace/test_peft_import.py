"""The trace imports peft and wraps its plain layers without bitsandbytes, and wraps them as peft
does with it; afterwards bitsandbytes imports and peft sees it as before."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

pytest.importorskip("peft")
if __import__("importlib.util").util.find_spec("bitsandbytes") is None:
    pytest.skip("bitsandbytes is not installed", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[3]

_SCRIPT = textwrap.dedent(
    """
    import sys, torch
    from memfit.estimate.trace import build
    from memfit.spec import WorkloadSpec

    def wrapped():
        with torch.device("meta"):
            model = torch.nn.Sequential(
                torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4)
            )
        w = WorkloadSpec(
            mode="train", batch_size=1, seq_len=8, lora_rank=4, lora_targets=("0", "2")
        )
        out = build.apply_lora_(model, w)
        return [(n, f"{type(m).__module__}.{type(m).__qualname__}")
                for n, m in out.named_modules()]

    held = wrapped()
    print("during", "bitsandbytes" in sys.modules)
    import peft.import_utils as iu, peft.helpers as helpers
    print("after", iu.is_bnb_available(), helpers.bnb is not None)
    import bitsandbytes
    print("imports", hasattr(bitsandbytes.nn, "Linear4bit"), iu.is_bnb_4bit_available())
    print("same", held == wrapped())
    print("helper", helpers.bnb.functional is bitsandbytes.functional)
    """
)


def _run(script: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
        check=True,
        timeout=300,
    )
    return [line for line in out.stdout.splitlines() if line.split(" ")[0] in _KEYS]


_KEYS = ("during", "after", "imports", "same", "helper")


@pytest.mark.slow
def test_the_trace_wraps_without_importing_bitsandbytes_and_leaves_it_importable() -> None:
    assert _run(_SCRIPT) == [
        "during False",  # neither peft's import nor its dispatch imported it
        "after True True",  # peft's answers are read again; its helpers' name stands in
        "imports True True",
        "same True",  # with bitsandbytes imported, peft wraps the same modules
        "helper True",
    ]


def test_nothing_is_held_where_bitsandbytes_is_imported_already(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from memfit.estimate.trace.peft_import import without_bitsandbytes

    imported = types.ModuleType("bitsandbytes")  # as the rest of this process may have it
    monkeypatch.setitem(sys.modules, "bitsandbytes", imported)
    with without_bitsandbytes():
        assert sys.modules["bitsandbytes"] is imported
    assert sys.modules["bitsandbytes"] is imported


def test_inside_bitsandbytes_does_not_import_and_afterwards_it_may(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from memfit.estimate.trace.peft_import import without_bitsandbytes

    monkeypatch.delitem(sys.modules, "bitsandbytes", raising=False)
    with without_bitsandbytes(), pytest.raises(ImportError):
        import bitsandbytes  # noqa: F401
    assert "bitsandbytes" not in sys.modules
