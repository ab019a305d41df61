"""``memfit plan`` and ``memfit fit`` on the command line: JSON shapes, units, exit codes.

The engines are replaced by the closed-form stand-in (monkeypatched default) so that these tests
check the CLI's plumbing quickly; the planner's agreement with the trace engine is tested in
test_search.py and test_solve.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.plan.conftest import closed_form_estimate

from memfit import cli
from memfit.plan import engines


@pytest.fixture(autouse=True)
def _closed_form_engines(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake(source: Any, gpu: Any) -> engines.EnginePair:
        return engines.EnginePair(
            search=engines.CachedEstimator(closed_form_estimate, "closed-form"), confirm=None
        )

    monkeypatch.setattr(engines, "default_engines", fake)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv))
    return code, capsys.readouterr().out


def test_plan_json_has_the_recommended_settings_and_exports(
    tiny_llama_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _run(
        capsys, "plan", str(tiny_llama_dir), "--gpu", "A100-80GB", "--gpu-memory", "12MiB",
        "--seq", "512", "--global-batch", "8", "--json",
    )  # fmt: skip
    data = json.loads(out)
    assert code == 0 and data["fits"] is True
    rec = data["recommended"]
    assert (
        rec["need_bytes"] <= data["budget"]["limit_bytes"] == 12 * 2**20 - round(12 * 2**20 * 0.05)
    )
    export = data["settings_export"]
    assert (
        export["memfit"].startswith(f"memfit estimate {tiny_llama_dir.name}")
        or "--batch" in export["memfit"]
    )
    assert "TrainingArguments(per_device_train_batch_size=" in export["training_arguments"]
    assert data["search"]["n_candidates"] > data["search"]["n_estimated"] > 0


def test_plan_exits_1_with_the_closest_attempt_when_nothing_fits(
    tiny_llama_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _run(capsys, "plan", str(tiny_llama_dir), "--gpu", "L4", "--gpu-memory", "1MiB")
    assert code == 1
    assert "NOTHING FITS. closest attempt:" in out and "over by" in out


def test_plan_multi_gpu_exports_a_deepspeed_or_fsdp_config(
    tiny_llama_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _run(
        capsys, "plan", str(tiny_llama_dir), "--gpu", "H100-80GB", "--gpus", "4",
        "--gpu-memory", "4MiB", "--global-batch", "16", "--keep-full-finetune", "--json",
    )  # fmt: skip
    data = json.loads(out)
    assert code == 0
    shard = data["recommended"]["settings"]["shard"]
    assert shard in ("zero2", "zero3", "fsdp")  # 4 MiB is too small to replicate the model
    export = data["settings_export"]
    key = "accelerate_fsdp" if shard == "fsdp" else "deepspeed"
    assert key in export


@pytest.mark.parametrize(("size", "expected"), [("24GB", 24 * 10**9), ("24GiB", 24 * 2**30)])
def test_fit_reads_gpu_memory_in_decimal_and_binary_units(
    tiny_llama_dir: Path, capsys: pytest.CaptureFixture[str], size: str, expected: int
) -> None:
    code, out = _run(
        capsys, "fit", str(tiny_llama_dir), "--gpu-memory", size, "--solve", "batch", "--json"
    )
    data = json.loads(out)
    assert code == 0 and data["capacity_bytes"] == expected
    assert data["headroom_bytes"] == round(expected * 0.05)
    assert data["solve"] == "batch" and data["max_batch"] > 0
    assert data["estimate"]["workload"]["batch_size"] == data["max_batch"]


def test_fit_headroom_zero_means_the_limit_itself(
    tiny_llama_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out = _run(
        capsys, "fit", str(tiny_llama_dir), "--gpu-memory", "8MiB", "--solve", "seq",
        "--headroom", "0", "--json",
    )  # fmt: skip
    data = json.loads(out)
    assert data["headroom_bytes"] == 0 and data["max_seq"] % 64 == 0


def test_fit_rejects_bad_input_with_exit_2(
    tiny_llama_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["fit", str(tiny_llama_dir), "--solve", "batch"]) == 2
    assert "--gpu NAME or --gpu-memory" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli.main(["fit", str(tiny_llama_dir), "--gpu-memory", "24 bananas", "--solve", "batch"])
    assert exc.value.code == 2
    code = cli.main(["fit", str(tiny_llama_dir), "--gpu-memory", "8MiB", "--solve", "concurrency"])
    assert code == 2 and "--mode infer" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "mode"), [((), "auto"), (("--confirm",), "shown"), (("--confirm", "none"), "none")]
)
def test_plan_confirms_automatically_unless_asked(
    tiny_llama_dir: Path, capsys: pytest.CaptureFixture[str], flags: tuple[str, ...], mode: str
) -> None:
    """Issue 32: the default is ``auto``; ``--confirm`` alone confirms every plan shown; the
    JSON says whether the recommended plan's bytes were confirmed."""
    code, out = _run(
        capsys, "plan", str(tiny_llama_dir), "--gpu", "A100-80GB", "--gpu-memory", "12MiB",
        "--seq", "512", "--global-batch", "8", "--json", *flags,
    )  # fmt: skip
    data = json.loads(out)
    assert code == 0 and data["request"]["confirm"] == mode
    # the stand-in search engine has no confirming engine: its answer is its own
    assert data["confirmed"] is False and "no precise engine" in data["confirmed_why"]
