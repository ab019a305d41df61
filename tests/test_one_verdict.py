"""One job, one verdict: the same job gets the same verdict and the same "needs" figure from every
surface that takes it (issue 28, "one answer shape and one verdict").

Surfaces, per kind of job:

* a text training step (Qwen2.5-0.5B, full fine-tune, analytic engine) on three GPUs whose
  verdicts differ (``does not fit`` / ``tight`` / ``fits``): ``estimate``, ``plan`` (its
  ``as_asked``), ``upgrade`` (``as_asked``), ``doctor`` (``verdict``), ``check`` of a TRL config
  file, the Python API (``memfit.estimate``, ``memfit.plan``, ``memfit.doctor``,
  ``memfit.upgrade_verdict``) and the web API (``/api/estimate``, ``/api/plan``,
  ``/api/upgrade`` and the ``/api/gpu-table`` row the page's table shows); ``fit --solve batch``
  answers another question (the largest batch), so it must agree instead: the job's batch is at
  most ``max_batch`` exactly when the verdict is ``fits``.
* the figures printed in words (issue 29): Llama-3.1-8B at seq 4096 (full fine-tuning and LoRA
  r16) on a T4 (no bf16) and an RTX-4090: every "needs" of ``doctor``'s text and of
  ``upgrade``'s text is the verdict's ``need_bytes``, and the page's banner (``/api/estimate``)
  and its table row (``/api/gpu-table``) carry the same verdict and ``need_bytes``.
* a diffusion pipeline call (a tiny FLUX tree) on cards sized around its need: ``estimate``, the
  Python API (``estimate_pipeline``) and the web API (``/api/estimate``). ``plan``, ``fit``,
  ``upgrade``, ``doctor`` and ``check`` take no pipeline inference job today (``fit`` and ``plan``
  of a pipeline size its training, below).
* a diffusion training run (the same tree, ``--mode train``): ``estimate``, ``plan`` (the
  cheapest combination is the job as asked), ``fit --solve batch`` (its probe at the job's
  batch), the Python API (``estimate_training_fast``); ``upgrade``, ``doctor``, ``check`` and
  the web API do not take it.
* a ``vllm serve`` job (Llama-3.1-8B, ``--max-model-len 65536``) on two GPUs (fails / starts):
  its question is "does it start", not a fit verdict, and its "needs" figures are vLLM's
  budget, weights and KV cache: ``memfit vllm``, ``check`` of the serve command line, the Python
  API (``simulate_startup``) and ``fit --runtime vllm --solve max-model-len`` (CLI and web API:
  the job starts exactly when its length is at most the answer). ``estimate``, ``upgrade``,
  ``doctor`` take no vLLM job; ``plan --runtime vllm`` searches configurations (TP, quantization)
  rather than judging the one asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import json
import re
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

import memfit
from memfit.cli import main
from memfit.estimate.verdict import EXIT_CODES, headroom_bytes
from memfit.units import format_bytes

#: a synthetic card whose capacity is its memory_bytes (observed reservation 0)
CARD = "test card: capacity = memory_bytes"

TEXT_MODEL = "Qwen/Qwen2.5-0.5B"
TEXT_JOB = {"mode": "train", "batch": "4", "seq": "1024", "engine": "analytic"}
TRL_CONFIG = """\
model_name_or_path: Qwen/Qwen2.5-0.5B
output_dir: out
per_device_train_batch_size: 4
max_length: 1024
bf16: true
optim: adamw_torch
"""
#: GPUs on which the text job's verdicts differ (its point ~24.5 GB, its upper end ~31.8 GB).
TEXT_GPUS = {"L4": "does not fit", "RTX-4090": "tight", "A100-40GB": "fits"}


def cli(*argv: str) -> tuple[int, dict[str, Any]]:
    """``memfit ARGV --json``: its exit code and its JSON."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main([*argv, "--json"])
    return code, json.loads(out.getvalue())


def flags(job: dict[str, str]) -> list[str]:
    return [w for k, v in job.items() for w in (f"--{k}", v)]


class _InProcessPool:
    """The web app's worker pool, run in this process (the CLI the workers run, no processes)."""

    def run(self, argv: tuple[str, ...], *, heavy: bool) -> Any:
        from memfit.cli import build_parser, main
        from memfit.web.workers import Outcome, run_cli

        code, out, err = run_cli(list(argv), run=main, parser=build_parser())
        return Outcome(exit_code=code, stdout=out, stderr=err, wall_s=0.0)


@pytest.fixture(scope="module")
def web() -> Any:
    """``get(path, **query)`` -> (status, exit header, JSON) of the web app, over ASGI."""
    pytest.importorskip("starlette")
    from memfit.cli import build_parser, main
    from memfit.web.app import create_app

    app = create_app(pool=_InProcessPool(), run=main, parser_factory=build_parser)

    async def call(path: str, query: str) -> tuple[int, dict[str, str], bytes]:
        sent: list[dict[str, Any]] = []
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
            "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
            "query_string": query.encode(), "headers": [(b"host", b"127.0.0.1")],
            "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 5000),
        }  # fmt: skip

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await app(scope, receive, send)
        start = next(m for m in sent if m["type"] == "http.response.start")
        headers = {k.decode().lower(): v.decode() for k, v in start["headers"]}
        body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        return start["status"], headers, body

    def get(path: str, **query: str) -> tuple[int, str | None, Any]:
        status, headers, body = asyncio.run(call(path, urllib.parse.urlencode(query)))
        return status, headers.get("x-memfit-exit"), json.loads(body)

    return get


# -- a text step ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("gpu", "expected"), sorted(TEXT_GPUS.items()))
def test_a_text_step_gets_one_verdict_and_one_need_everywhere(
    gpu: str, expected: str, tmp_path: Path, web: Any
) -> None:
    argv = [TEXT_MODEL, *flags(TEXT_JOB), "--gpu", gpu]
    answers: dict[str, tuple[str, int]] = {}
    exits: dict[str, int] = {}

    def pair(v: dict[str, Any]) -> tuple[str, int]:
        return v["verdict"], v["need_bytes"]

    exits["estimate"], est = cli("estimate", *argv)
    answers["estimate"] = pair(est["fits"])
    _, plan = cli("plan", *argv, "--confirm", "none")
    answers["plan"] = pair(plan["as_asked"])
    _, upgrade = cli("upgrade", *argv)
    answers["upgrade"] = pair(upgrade["as_asked"])
    exits["doctor"], doctor = cli("doctor", *argv)
    answers["doctor"] = pair(doctor["verdict"])
    config = tmp_path / "trl.yaml"
    config.write_text(TRL_CONFIG)
    exits["check"], check = cli("check", str(config), "--gpu", gpu)
    assert check["estimate"]["workload"] == est["workload"]  # the same job
    answers["check"] = pair(check["estimate"]["fits"])
    assert check["fits"] is (expected == "fits")

    workload = memfit.WorkloadSpec(mode="train", batch_size=4, seq_len=1024)
    api = memfit.estimate(TEXT_MODEL, workload, gpu=gpu, engine="analytic")
    assert api.verdict is not None
    answers["python estimate"] = (api.verdict.verdict, api.verdict.need_bytes)
    from memfit.estimate.policy import use_engine

    with use_engine("analytic"):  # the CLI's --engine analytic
        doctor_api = memfit.doctor(TEXT_MODEL, workload, gpu=gpu)
        plan_api = memfit.plan(TEXT_MODEL, gpu=gpu, mode="train", batch_size=4, seq_len=1024)
    answers["python doctor"] = pair(doctor_api.to_json()["verdict"])
    answers["python plan"] = pair(plan_api.to_json()["as_asked"])

    for command in ("estimate", "plan", "upgrade"):
        extra = {"confirm": "none"} if command == "plan" else {}
        status, code, body = web(f"/api/{command}", model=TEXT_MODEL, gpu=gpu, **TEXT_JOB, **extra)
        assert status == 200, body
        answers[f"web {command}"] = pair(
            body["fits"] if command == "estimate" else body["as_asked"]
        )
        if command == "estimate":
            exits["web estimate"] = int(code or -1)
    _, _, rows = web(
        "/api/gpu-table",
        device_used_bytes=str(est["device_used_bytes"]),
        device_used_bytes_high=str(est["device_used_bytes_high"]),
    )
    row = next(r for r in rows if r["gpu"] == gpu)
    answers["web gpu table"] = pair(row)  # the page's table: the banner's verdict, not another
    assert row["fits"] is (expected == "fits")

    assert set(answers.values()) == {(expected, est["fits"]["need_bytes"])}, answers
    assert set(exits.values()) == {EXIT_CODES[expected]}, exits
    _, fit = cli("fit", *argv, "--solve", "batch")
    assert (int(TEXT_JOB["batch"]) <= fit["max_batch"]) is (expected == "fits")


# -- the printed "needs" figures: doctor, upgrade, the page's banner and table (issue 29) --------
#: issue 29's job: Llama-3.1-8B, a full fine-tuning step at seq 4096 (the shape upgrade takes),
#: and with LoRA r16 (doctor); on a T4 (no bf16) and an RTX-4090. The precision is explicit.
LLAMA_JOB = {"mode": "train", "batch": "1", "seq": "4096", "engine": "analytic"}
NEEDS = re.compile(r"\bneeds (\d[\d.,]* [KMGT]?i?B)")


def cli_text(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(list(argv))
    return out.getvalue()


@pytest.mark.parametrize("gpu", ["T4", "RTX-4090"])
@pytest.mark.parametrize("lora", [(), ("--lora-rank", "16")])
def test_doctor_upgrade_and_the_page_print_the_verdicts_needs_figure(
    gpu: str, lora: tuple[str, ...], web: Any
) -> None:
    argv = ["llama-3.1-8b", *flags(LLAMA_JOB), "--gpu", gpu]
    job = [*argv, "--precision", "bf16-mixed", *lora]
    _, est = cli("estimate", *job)
    want = (est["fits"]["verdict"], est["fits"]["need_bytes"])
    need = format_bytes(want[1])

    _, doctor = cli("doctor", *job)
    assert (doctor["verdict"]["verdict"], doctor["verdict"]["need_bytes"]) == want
    assert set(NEEDS.findall(cli_text("doctor", *job))) == {need}  # every line, one figure

    # upgrade takes the job's shape and recipe (its LoRA too, as plan spells it): its as-asked
    # is this job at the precision memfit defaults to on the GPU (16-mixed on a T4, no bf16: its
    # GradScaler's blocks make it a few KB more than bf16-mixed, fp16grid)
    _, asked = cli("estimate", *argv, *lora)
    want_asked = (asked["fits"]["verdict"], asked["fits"]["need_bytes"])
    _, upgrade = cli("upgrade", *argv, *lora, "--no-recommend")
    assert (upgrade["as_asked"]["verdict"], upgrade["as_asked"]["need_bytes"]) == want_asked
    assert upgrade["request"]["lora_asked"] is bool(lora)
    text = cli_text("upgrade", *argv, *lora, "--no-recommend")
    assert text.splitlines()[1].startswith("as asked: ")
    # plans are named by their settings
    assert set(NEEDS.findall(text)) == {format_bytes(want_asked[1])}, text

    query = {**LLAMA_JOB, "precision": "bf16-mixed", **dict(zip(lora[::2], lora[1::2]))}
    query = {k.removeprefix("--"): v for k, v in query.items()}
    status, _, body = web("/api/estimate", model="llama-3.1-8b", gpu=gpu, **query)
    assert status == 200, body
    banner = body["fits"]  # the page's banner words this (app.js verdictText: need_bytes)
    _, _, rows = web(
        "/api/gpu-table",
        device_used_bytes=str(body["device_used_bytes"]),
        device_used_bytes_high=str(body["device_used_bytes_high"]),
    )
    row = next(r for r in rows if r["gpu"] == gpu)  # the table under the banner
    assert (banner["verdict"], banner["need_bytes"]) == (row["verdict"], row["need_bytes"]) == want


# -- a diffusion pipeline and its training ---------------------------------------------------------
@pytest.fixture(scope="module")
def flux(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("diffusers")
    from tests.estimate.diffusion.test_pipeline import tiny_flux

    return tiny_flux(tmp_path_factory.mktemp("one-verdict-flux"))


def _card_around(need: int, verdict: str) -> Any:
    """A T4 whose capacity puts ``need`` in ``verdict``'s band (no driver reservation)."""
    from memfit.hardware import catalog

    t4 = dataclasses.replace(catalog.get_gpu("T4"), driver_reserved_bytes=0, capacity_source=CARD)
    memory = {
        "fits": need * 2,
        "tight": need + headroom_bytes(need) // 2,
        "does not fit": need - 1,
    }[verdict]
    return dataclasses.replace(t4, memory_bytes=memory)


@pytest.mark.parametrize("expected", ["fits", "tight", "does not fit"])
def test_a_diffusion_pipeline_gets_one_verdict_and_one_need_everywhere(
    expected: str, flux: Path, web: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memfit.estimate.diffusion.pipelines import estimate_pipeline
    from memfit.hardware import catalog
    from memfit.spec.diffusion import DiffusionJob

    job = DiffusionJob(height=64, width=64, precision="bf16")
    need = estimate_pipeline(flux, job, name="tiny", gpu=catalog.get_gpu("T4")).device_used_bytes
    card = _card_around(need, expected)
    monkeypatch.setitem(catalog._INDEX, catalog._normalize("T4"), card)  # every door's get_gpu

    api = estimate_pipeline(flux, job, name="tiny", gpu=card)
    assert api.verdict is not None
    query = {"mode": "infer", "height": "64", "width": "64", "precision": "bf16", "gpu": "T4"}
    code, est = cli("estimate", str(flux), *flags(query))
    status, web_code, body = web("/api/estimate", model=str(flux), **query)
    assert status == 200, body
    answers = {
        "python": (api.verdict.verdict, api.verdict.need_bytes),
        "estimate": (est["fits"]["verdict"], est["fits"]["need_bytes"]),
        "web estimate": (body["fits"]["verdict"], body["fits"]["need_bytes"]),
    }
    assert set(answers.values()) == {(expected, need)}, answers
    assert code == int(web_code or -1) == EXIT_CODES[expected]
    assert est["fits"]["fits"] is (expected == "fits")


@pytest.mark.parametrize("expected", ["fits", "tight", "does not fit"])
def test_a_diffusion_training_run_gets_one_verdict_and_one_need_everywhere(
    expected: str, flux: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("peft")
    from memfit.estimate.diffusion.train_fast import estimate_training_fast
    from memfit.hardware import catalog
    from memfit.spec.diffusion import DiffusionTrainJob

    job = DiffusionTrainJob(resolution=64, max_sequence_length=16, lora_rank=4)
    t4 = catalog.get_gpu("T4")
    need = estimate_training_fast(flux, job, name="tiny", gpu=t4).device_used_bytes
    card = _card_around(need, expected)
    monkeypatch.setitem(catalog._INDEX, catalog._normalize("T4"), card)  # every door's get_gpu

    api = estimate_training_fast(flux, job, name="tiny", gpu=card)
    assert api.verdict is not None
    argv = [str(flux), "--mode", "train", "--resolution", "64", "--max-sequence-length", "16",
            "--lora-rank", "4", "--gpu", "T4"]  # fmt: skip
    code, est = cli("estimate", *argv)
    _, plan = cli("plan", *argv)
    first = plan["plans"][0]  # the cheapest combination: the job as asked
    assert first["flags"] == job.flags()
    _, fit = cli("fit", *argv, "--solve", "batch")
    probe = next(p for p in fit["probes"] if p["value"] == job.batch)
    answers = {
        "python": (api.verdict.verdict, api.verdict.need_bytes),
        "estimate": (est["fits"]["verdict"], est["fits"]["need_bytes"]),
    }
    assert set(answers.values()) == {(expected, need)}, answers
    assert code == EXIT_CODES[expected]
    assert (first["need_bytes"], first["fits"]) == (need, expected == "fits")
    assert (probe["need_bytes"], probe["fits"]) == (need, expected == "fits")


# -- a vllm serve job ----------------------------------------------------------------------------
VLLM_GPUS = {"L4": False, "L40S": True}
VLLM_LEN = 65536
VLLM_KEYS = ("starts", "requested_bytes", "weights_bytes", "kv_cache_bytes", "error")


@pytest.mark.parametrize(("gpu", "starts"), sorted(VLLM_GPUS.items()))
def test_a_vllm_job_gets_one_answer_everywhere(
    gpu: str, starts: bool, tmp_path: Path, web: Any
) -> None:
    from memfit.hardware import get_gpu
    from memfit.models import resolve_model
    from memfit.serving import simulate_startup
    from memfit.spec.serving import VllmConfig

    code, served = cli("vllm", "llama-3.1-8b", "--max-model-len", str(VLLM_LEN), "--gpu", gpu)
    line = tmp_path / "serve.sh"
    line.write_text(f"vllm serve llama-3.1-8b \\\n  --max-model-len {VLLM_LEN}\n")
    check_code, checked = cli("check", str(line), "--gpu", gpu)
    spec = resolve_model("llama-3.1-8b").spec
    assert spec is not None
    api = simulate_startup(spec, get_gpu(gpu), VllmConfig(max_model_len=VLLM_LEN)).to_json()
    answers = {
        "vllm": {k: served[k] for k in VLLM_KEYS},
        "check": {k: checked[k] for k in VLLM_KEYS},
        "python": {k: api[k] for k in VLLM_KEYS},
    }
    assert all(a == answers["vllm"] for a in answers.values()), answers
    assert served["starts"] is starts and code == check_code == (0 if starts else 1)

    fit_argv = ["llama-3.1-8b", "--runtime", "vllm", "--solve", "max-model-len", "--gpu", gpu]
    _, fit = cli("fit", *fit_argv)
    status, _, body = web("/api/fit", model="llama-3.1-8b", runtime="vllm",
                          solve="max-model-len", gpu=gpu)  # fmt: skip
    assert status == 200, body
    assert body["max_value"] == fit["max_value"]
    assert (fit["max_value"] >= VLLM_LEN) is starts


# -- an SGLang server ---------------------------------------------------------------------------
SGLANG_GPUS = {"T4": False, "L4": True}
SGLANG_KEYS = ("starts", "weights_bytes", "max_total_num_tokens", "kv_cache_bytes", "error")


@pytest.mark.parametrize(("gpu", "starts"), sorted(SGLANG_GPUS.items()))
def test_an_sglang_job_gets_one_answer_everywhere(gpu: str, starts: bool, tmp_path: Path) -> None:
    """``memfit sglang``, ``check`` of the launch_server line, memfit.estimate and the engine
    give the same start-up (SGLang answers "does it start", not a fit verdict: the exit code
    follows ``starts``)."""
    import memfit
    from memfit.hardware import get_gpu
    from memfit.models import resolve_model
    from memfit.serving.sglang import simulate_sglang
    from memfit.spec import SglangConfig

    code, served = cli("sglang", "llama-3.1-8b", "--gpu", gpu)
    line = tmp_path / "serve.sh"
    line.write_text("python -m sglang.launch_server \\\n  --model-path llama-3.1-8b\n")
    check_code, checked = cli("check", str(line), "--gpu", gpu)
    spec = resolve_model("llama-3.1-8b").spec
    assert spec is not None
    engine = simulate_sglang(spec, get_gpu(gpu), SglangConfig()).to_json()
    python = memfit.estimate("llama-3.1-8b", SglangConfig(), gpu=gpu).to_json()
    answers = [{k: a[k] for k in SGLANG_KEYS} for a in (served, checked, engine, python)]
    assert all(a == answers[0] for a in answers), answers
    assert served["starts"] is starts and code == check_code == (0 if starts else 1)


# -- a llama-server job ----------------------------------------------------------------------------
LLAMACPP_GPUS = {"RTX-3060": "does not fit", "RTX-4090": "fits"}


@pytest.mark.parametrize(("gpu", "expected"), sorted(LLAMACPP_GPUS.items()))
def test_a_llamacpp_job_gets_one_answer_everywhere(gpu: str, expected: str) -> None:
    """Qwen3-14B Q8_0 with -c 16384: the CLI (`memfit llama-server`) and the Python API give the
    same verdict and "needs" bytes, and `fit` (largest -ngl) agrees with the verdict: all layers
    only where the whole job fits. The web page serves no llama-server command yet (issue 31
    part 4: --runtime llama.cpp)."""
    import memfit
    from memfit.spec import LlamaCppJob

    job = LlamaCppJob(ctx_size=16384)
    code, served = cli("llama-server", "qwen3-14b:Q8_0", "-c", "16384", "--gpu", gpu)
    api = memfit.estimate("qwen3-14b:Q8_0", job, gpu=gpu)
    assert api.verdict is not None
    answers = {
        "llama-server": (served["verdict"]["verdict"], served["verdict"]["need_bytes"]),
        "python": (api.verdict.verdict, api.verdict.need_bytes),
    }
    assert set(answers.values()) == {(expected, answers["python"][1])}, answers
    assert code == EXIT_CODES[expected]
    ngl, best = memfit.fit("qwen3-14b:Q8_0", job, gpu=gpu, solve="n-gpu-layers")
    assert (ngl == api.n_layer + 1) is (expected == "fits")
    assert best.verdict is not None and best.verdict.fits
