"""`memfit estimate|fit|plan <pipeline> --mode train`: diffusion training from the command line."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("diffusers")
pytest.importorskip("peft")

from memfit.cli import main  # noqa: E402
from memfit.plan.budget import Budget  # noqa: E402
from memfit.plan.diffusion_train import fit_training, verdict  # noqa: E402


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> str:
    from tests.estimate.diffusion.test_pipeline import tiny_flux

    return str(tiny_flux(tmp_path_factory.mktemp("cli-flux-train")))


TINY = ("--resolution", "64", "--max-sequence-length", "16", "--precision", "bf16-mixed")


def test_estimate_train_prints_the_peak_by_phase_and_component(
    capsys: pytest.CaptureFixture[str], tree: str
) -> None:
    code, out, _ = run(capsys, "estimate", tree, "--mode", "train", "--lora-rank", "4", *TINY,
                       "--json")  # fmt: skip
    assert code == 0
    data = json.loads(out)
    assert data["script"].endswith("train_dreambooth_lora_flux.py")
    assert data["peak_allocated_bytes"] == max(p["peak_bytes"] for p in data["phases"])
    assert data["peak_reserved_bytes"] >= data["peak_allocated_bytes"]
    assert {c["name"] for c in data["components"]} == {
        "transformer", "vae", "text_encoder", "text_encoder_2"}  # fmt: skip
    code, text, _ = run(capsys, "estimate", tree, "--mode", "train", "--lora-rank", "4", *TINY)
    assert code == 0 and "peak on the GPU" in text and "backward" in text


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--mode", "train", "--height", "512"), "is a diffusion inference flag"),
        (("--mode", "infer", "--resolution", "512"), "is a diffusion training flag"),
        (("--mode", "train", "--checkpointing", "selective"), "--gradient_checkpointing only"),
        (("--mode", "train", "--optimizer", "lion"), "use adamw, adamw-8bit, prodigy"),
        (("--mode", "train", "--precision", "bf16-true"), "--mixed_precision"),
        (("--mode", "train", "--shard", "fsdp"), "drop the flag"),
        (("--mode", "train", "--cache-latents"), "only the LoRA scripts"),
    ],
)
def test_a_training_job_memfit_cannot_answer_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], tree: str, extra: tuple[str, ...], message: str
) -> None:
    code, out, err = run(capsys, "estimate", tree, *extra)
    assert code == 2
    assert message in err and "Traceback" not in err and out == ""


def test_a_training_flag_on_a_text_model_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "estimate", "gpt2", "--optimizer", "prodigy")
    assert code == 2 and "prodigy" in err and "Traceback" not in err
    code, _, err = run(capsys, "estimate", "gpt2", "--resolution", "512")
    assert code == 2 and "applies to diffusion pipelines only" in err
    code, _, err = run(capsys, "fit", "gpt2", "--gpu", "L4", "--solve", "resolution")
    assert code == 2 and "for diffusion pipelines" in err


class _Affine:
    """A stand-in trace whose memory is affine in the batch (what the solver relies on)."""

    def __init__(self, base: int, per: int) -> None:
        self.base, self.per, self.calls = base, per, 0

    def __call__(self, job: Any) -> Any:
        self.calls += 1
        n = self.base + self.per * job.batch
        return _Traced(peak_bytes=n, peak_reserved_bytes=n)


@dataclass(frozen=True, kw_only=True)
class _Traced:
    """What fit_training reads of a traced run (and the verdict it attaches)."""

    peak_bytes: int
    peak_reserved_bytes: int
    gpu: str | None = None
    arch: str | None = None
    fits: Any = None


def test_fit_solves_the_largest_batch_that_fits_and_confirms_the_next_one_does_not() -> None:
    from memfit.spec.diffusion import DiffusionTrainJob

    budget = Budget.of(None, memory_bytes=40 * 2**30, headroom=0.05)
    trace = _Affine(20 * 2**30, 700 * 2**20)
    result = fit_training(trace, DiffusionTrainJob(precision="bf16-mixed"), solve="batch",
                          budget=budget, arch=None)  # fmt: skip
    assert result.value is not None
    best = trace(DiffusionTrainJob(batch=result.value, precision="bf16-mixed"))
    over = trace(DiffusionTrainJob(batch=result.value + 1, precision="bf16-mixed"))
    assert verdict(best, budget, None).fits and not verdict(over, budget, None).fits
    assert trace.calls <= 8  # two probes for the line, the rest confirm around the guess


def test_fit_and_plan_run_on_a_pipeline(capsys: pytest.CaptureFixture[str], tree: str) -> None:
    code, out, _ = run(capsys, "fit", tree, "--mode", "train", "--lora-rank", "4", *TINY,
                       "--gpu-memory", "80GB", "--solve", "resolution", "--json")  # fmt: skip
    assert code == 0
    data = json.loads(out)
    probes = {p["value"]: p["fits"] for p in data["probes"]}
    best = data["max_value"]
    assert probes[best] and (best + 64 not in probes or not probes[best + 64])
    code, out, _ = run(capsys, "plan", tree, "--mode", "train", "--lora-rank", "4", *TINY,
                       "--gpu-memory", "80GB", "--json")  # fmt: skip
    assert code == 0
    plans = json.loads(out)["plans"]
    assert plans and plans[0]["fits"] and "--lora-rank 4" in plans[0]["flags"]


@pytest.mark.parametrize(
    "extra",
    [("--global-batch", "32"), ("--recommend-gpu",), ("--goal", "memory"), ("--allow", "lora")],
)
def test_a_text_model_plan_flag_on_a_pipeline_plan_is_refused_not_ignored(
    capsys: pytest.CaptureFixture[str], tree: str, extra: tuple[str, ...]
) -> None:
    code, out, err = run(capsys, "plan", tree, "--mode", "train", "--gpu", "T4", *extra)
    assert code == 2
    assert extra[0] in err and "not used by a diffusion training plan" in err
    assert "Traceback" not in err and out == ""
