"""``fit`` of a diffusion pipeline call (memfit.plan.diffusion_fit): the most images per prompt
or the largest square picture that fits, every value estimated and judged by THE verdict rule."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("diffusers")

from tests.estimate.diffusion.test_pipeline import job  # noqa: E402
from tests.plan.test_diffusion_infer import mid_flux  # noqa: E402

import memfit  # noqa: E402
from memfit.cli import main  # noqa: E402
from memfit.errors import SpecError  # noqa: E402
from memfit.estimate.verdict import judge_point  # noqa: E402

GIB = 2**30


@pytest.fixture(scope="module")
def flux_mid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return mid_flux(tmp_path_factory.mktemp("fit-mid-flux"))


@pytest.mark.parametrize(("solve", "step"), [("batch", 1), ("resolution", 64)])
def test_the_answer_fits_and_the_next_value_up_does_not(
    flux_mid: Path, solve: str, step: int
) -> None:
    result = memfit.fit(str(flux_mid), job(), solve=solve, gpu_memory_bytes=GIB, headroom=0.05)
    assert result.fits and result.value is not None and result.value > step
    b = result.budget
    by_value = {v: (need, fits) for v, need, fits in result.probes}
    need, fits = by_value[result.value]
    assert fits and judge_point(need, b.capacity_bytes, b.headroom_bytes).fits
    assert by_value[result.value + step][1] is False
    shape = result.estimate.job
    assert (shape.batch if solve == "batch" else shape.height) == result.value


def test_a_budget_under_the_smallest_call_has_no_answer(flux_mid: Path) -> None:
    result = memfit.fit(str(flux_mid), job(), solve="batch", gpu_memory_bytes=GIB // 4)
    assert not result.fits and result.value is None and len(result.probes) == 1


def test_a_solve_a_pipeline_call_has_not_is_refused(flux_mid: Path) -> None:
    with pytest.raises(SpecError, match=r"--solve seq for a diffusion pipeline call: use batch"):
        memfit.fit(str(flux_mid), job(), solve="seq", gpu_memory_bytes=GIB)


def test_memfit_fit_mode_infer_prints_the_answer_and_exits_by_it(
    flux_mid: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["fit", str(flux_mid), "--mode", "infer", "--height", "64", "--width", "64",
            "--solve", "batch"]  # fmt: skip
    assert main([*argv, "--gpu-memory", "1GiB"]) == 0
    assert capsys.readouterr().out.startswith("largest images per prompt that fits")
    assert main([*argv, "--gpu-memory", "256MiB"]) == 1
    assert "does NOT fit" in capsys.readouterr().out
    assert main([*argv]) == 2
    assert "fit of a diffusion pipeline needs --gpu NAME" in capsys.readouterr().err
