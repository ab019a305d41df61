"""``memfit check FILE...``: estimate the job the user's own config files describe, give the
verdict, and the edit to those files that makes it fit (``--write`` applies it).

Exit codes: 0 fits (or no ``--gpu``), 1 does not fit, 2 bad input.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from memfit.cli import llamacpp as cli_llamacpp
from memfit.cli import sglang as cli_sglang
from memfit.cli import vllm as cli_vllm
from memfit.cli.check_bf16 import bf16_problem, fp16_only, in_front, to_fp16
from memfit.cli.check_fix import CheckFix, KeyChange, checkpointing_fixed, find_fix
from memfit.cli.check_options import CHECK_FAMILIES, with_result_changing
from memfit.cli.from_files import FRAMEWORK_FORMATS
from memfit.errors import SpecError, UnknownModelError
from memfit.estimate import ENGINES, estimate
from memfit.estimate.policy import use_engine
from memfit.estimate.result import MemoryEstimate
from memfit.estimate.trace import frameworks
from memfit.flags import EXIT_BAD_INPUT, integer
from memfit.hardware import get_gpu
from memfit.jobfiles import FORMATS, FileEdit, Job, model_of, read_job, workload_of
from memfit.jobfiles.edit import write_edits
from memfit.jobfiles.files import parse
from memfit.jobfiles.llamacpp_cmd import (
    argv_from_llamacpp_command,
    argv_from_modelfile,
    is_llamacpp_command,
    is_modelfile,
)
from memfit.jobfiles.sglang_cmd import argv_from_sglang_command, is_sglang_command
from memfit.jobfiles.vllm_cmd import (
    argv_from_command,
    argv_from_config,
    is_vllm_command,
    is_vllm_config,
)
from memfit.models import resolve_model
from memfit.progress import report
from memfit.report.check import check_json, render_check
from memfit.spec import WorkloadSpec
from memfit.spec.parallel_rules import is_parallel_job
from memfit.userfiles import read_text
from memfit.userwrites import Written

CHECK_EXAMPLES = """examples:
  memfit check axolotl.yml --gpu RTX-4090
  memfit check sft_config.yaml accelerate.yaml ds_zero2.json --gpu A100-80GB
  memfit check llama3_1_8B_qlora_single_device.yaml batch_size=4 --gpu L4
  memfit check litgpt-qlora.yaml --gpu T4 --write
  memfit check llama3_8b.toml --gpu H100 --gpus 8            # torchtitan: GPUs from the launcher
"""


def register(sub: Any) -> dict[str, Callable[[argparse.Namespace], int]]:
    c = sub.add_parser(
        "check",
        help="estimate the job your own training config files describe, and the edit that fits",
        description="Read training / launcher configs (Hugging Face TrainingArguments, TRL, "
        "axolotl, LLaMA-Factory, torchtune, LitGPT, DeepSpeed, accelerate, torchtitan TOML; "
        "several combine), "
        "estimate the job, give the verdict on --gpu and, when it does not fit, the edit to your "
        "files that makes it fit, keeping their LoRA / quantization / precision (a unified diff, "
        "checked on the edited files; --write applies it). Every key memfit does not "
        "use is listed; keys that change memory but are not modelled are warnings.",
        epilog=CHECK_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="job files (JSON / YAML), and torchtune-style key=value overrides",
    )
    c.add_argument("--gpu", default=None, help="GPU name for the verdict and the fix")
    c.add_argument("--model", default=None, help="the model, when the files name none")
    c.add_argument(
        "--seq", type=integer, default=None, help="sequence length, when the files give none"
    )
    c.add_argument(
        "--gpus",
        type=integer,
        default=None,
        help="GPUs the launcher starts (torchrun --nproc-per-node x nodes; torchtitan's NGPU): "
        "a torchtitan file's data_parallel_shard_degree = -1 takes the rest of them",
    )
    c.add_argument(
        "--accelerate-version",
        default=None,
        help="the accelerate release that runs the files (default: the installed one's rules); "
        "before 0.31 an FSDP1 SHARDED_STATE_DICT checkpoint keeps every rank's copies on the GPU",
    )
    c.add_argument("--format", choices=tuple(FORMATS), default=None, help="the first file's format")
    c.add_argument(
        "--engine",
        choices=(*ENGINES, "framework"),
        dest="check_engine",
        default=None,
        help="estimate engine. Default: for a torchtune recipe or a LitGPT config, the "
        "framework's own model and step when the framework is installed (framework: require "
        "it), else analytic (milliseconds; trace: transformers' model run on fake tensors)",
    )
    c.add_argument(
        "--quiet",
        "-q",
        action="store_true",
        help="no progress line on stderr (shown only on a terminal, for work over 2 s)",
    )
    c.add_argument(
        "--write",
        action="store_true",
        help="apply the fix to the files (one whose edited files the estimate says fit; the "
        "originals kept as NAME.memfit-orig), then check the written files: exit by their verdict",
    )
    c.add_argument(
        "--allow",
        action="append",
        choices=CHECK_FAMILIES,
        default=[],
        help="let the fix change the result in this family, as `memfit plan --allow` does "
        "(quant: a LoRA job's base loaded in 4 bits, QLoRA, in the files' own keys: "
        "LLaMA-Factory quantization_bit, axolotl adapter: qlora + load_in_4bit, TRL "
        "load_in_4bit, LitGPT quantize); without it such a fix is only named",
    )
    c.add_argument("--json", action="store_true", help="print one JSON object")
    return {"check": cmd_check}


def cmd_check(args: argparse.Namespace) -> int:
    paths = [
        f for f in args.files if "=" not in f or f.endswith((".yml", ".yaml", ".json", ".toml"))
    ]
    overrides = [f for f in args.files if f not in paths]
    served_by_llamacpp = _llamacpp_argv(paths, args.gpu)
    if served_by_llamacpp is not None:  # llama-server / Ollama: `memfit llama-server` answers
        argv, notes = served_by_llamacpp
        gpu = ["--gpu", args.gpu] if args.gpu else []
        as_json = ["--json"] if args.json else []
        server = _vllm_args(args.subparsers["llama-server"], [*argv, *gpu, *as_json])
        server.extra_notes = notes
        return cli_llamacpp.cmd_llamacpp(server)
    launched = _sglang_argv(paths)
    if launched is not None:  # an SGLang server: `memfit sglang`'s door answers, on its flags
        gpu = ["--gpu", args.gpu] if args.gpu else []
        as_json = ["--json"] if args.json else []
        sglang = args.subparsers["sglang"]
        return cli_sglang.cmd_sglang(_vllm_args(sglang, [*launched, *gpu, *as_json]))
    served = _vllm_argv(paths)
    if served is not None:  # a serving job: `memfit vllm`'s door answers, on the file's flags
        gpu = ["--gpu", args.gpu] if args.gpu else []
        as_json = ["--json"] if args.json else []
        return cli_vllm.cmd_vllm(_vllm_args(args.subparsers["vllm"], [*served, *gpu, *as_json]))
    job = read_job(paths, fmt=args.format, overrides=overrides, gpus=args.gpus)
    model = model_of(job, args.model)
    framework, answered_by, note = route(job, args.check_engine)
    try:
        source = resolve_model(model)
    except UnknownModelError:
        if framework is None:
            raise
        source = None  # the framework knows its model; only the fix needs transformers' config
    n_layers = source.spec.n_layers if source is not None and source.spec is not None else None

    def estimate_job(j: Job, w: WorkloadSpec | None = None) -> tuple[WorkloadSpec, MemoryEstimate]:
        """The route every estimate of this command takes: the job's, the edited files'."""
        if w is None:
            w = workload_of(
                j,
                overrides={
                    "seq_len": args.seq,
                    "gpus": args.gpus,
                    "accelerate_version": args.accelerate_version,
                },
                n_layers=n_layers,
            )
        if framework is not None:
            data = next(f.data for f in j.files if f.format == framework)
            report(f"tracing {model} through {framework}'s own code")
            return w, frameworks.estimate_with_framework(framework, data, w, gpu=args.gpu)
        est = estimate(source, w, gpu=args.gpu, engine=args.check_engine or "analytic")
        if any(f.format in FRAMEWORK_FORMATS for f in j.files):  # the framework's code runs it
            est = est.with_band("other-framework")
        return w, est

    workload, est = estimate_job(job)
    if framework is None and is_parallel_job(workload):  # whichever engine was named
        answered_by = "the per-rank closed form (memfit.estimate.parallel), the files' settings"
    # a bf16 file on a GPU without bf16 does not run as written: estimated, and fixed, as the
    # fp16 files the fix writes (memfit.cli.check_bf16)
    not_runnable = bf16_problem(job, workload, get_gpu(args.gpu) if args.gpu else None)
    fixed_job = job
    fp16_edits: list[FileEdit] = []
    fp16_keys: list[KeyChange] = []
    as_written = workload.precision
    if not_runnable is not None:
        fixed_job, fp16_edits, fp16_keys = to_fp16(job, workload)
        workload, est = estimate_job(fixed_job)
    answer = {"answered_by": answered_by, "note": note, "not_runnable": not_runnable}
    fits = None if est.fits is None else est.fits.fits
    fix: CheckFix | None = None
    if fits is False:
        planner = args.check_engine if args.check_engine in ENGINES else "analytic"
        with use_engine(planner):  # the fix is planned with transformers' model
            fix = (
                find_fix(fixed_job, source, workload, args.gpu, estimate_job)
                if source is not None
                else CheckFix(message=_no_plan(model))
            )
            fix = with_result_changing(
                fix,
                fixed_job,
                source,
                workload,
                est.n_params,
                args.gpu,
                estimate_job,
                allow=frozenset(args.allow),
                keep_checkpointing=checkpointing_fixed(fixed_job),
            )
        if fp16_edits:
            fix = in_front(fix, fp16_edits, fp16_keys, as_written)
    elif fp16_edits:
        fix = fp16_only(fp16_edits, fp16_keys, workload, est, as_written)
    after: tuple[list[Written], MemoryEstimate] | None = None
    if args.write and fix is not None and fix.found:  # atomic, all files or none, originals kept
        written = write_edits(fix.edits)
        again = read_job(paths, fmt=args.format, overrides=overrides, gpus=args.gpus)
        after = (written, estimate_job(again)[1])
    if args.json:
        out = check_json(job, model, workload, est, fix, args.write, answer, after)
        print(json.dumps(out, indent=2))
    else:
        print(render_check(job, model, est, fix, args.write, answer, after))
    if after is None and not_runnable is not None:
        return 1  # the files as written do not run on this GPU
    final = est if after is None else after[1]
    return 1 if final.fits is not None and not final.fits.fits else 0


def _no_plan(model: str) -> str:
    return (
        f"no fix: the planner needs a Hugging Face config for {model}, and memfit has "
        "none (pass --model with a hub id or a folder holding its config.json)"
    )


def route(
    job: Job, engine: str | None, *, default: str = "analytic"
) -> tuple[str | None, str, str | None]:
    """Which code path answers: ``(framework or None, what answered, a note or None)``.
    ``engine``: the one asked for (None: none); ``default``: the engine that answers otherwise.

    A torchtune recipe or LitGPT config goes through that framework's own model and step when
    it is installed and no other engine is asked for; ``--engine framework`` requires it (exit 2
    with the extra to install); otherwise transformers' model answers with the framework's
    settings, and says so."""
    framework = next((f.format for f in job.files if f.format in frameworks.EXTRAS), None)
    if framework is None:
        if engine == "framework":
            raise SpecError(
                "--engine framework needs a torchtune recipe or a LitGPT config among the files"
            )
        if job.value("kernels") == "unsloth":
            return None, "transformers' model with Unsloth's kernels (analytic engine)", None
        return None, f"transformers' model ({engine or default} engine)", None
    if engine == "framework":
        frameworks.require(framework)
        return framework, frameworks.ANSWERED_BY[framework], None
    if engine is not None:
        return None, settings_answer(engine, asked=True), None
    reason = frameworks.missing(framework)
    if reason is None:
        return framework, frameworks.ANSWERED_BY[framework], None
    return None, settings_answer(default), reason


def settings_answer(engine: str, *, asked: bool = False) -> str:
    """What answers a framework's file when transformers' model does."""
    how = f"{engine} engine, as asked" if asked else f"{engine} engine"
    return f"transformers' model, the framework's settings ({how})"


def _vllm_argv(paths: list[str]) -> list[str] | None:
    """``memfit vllm`` arguments when the one file is a ``vllm serve`` line or config."""
    if len(paths) != 1:
        return None
    text = read_text(paths[0], what="job file")
    if is_vllm_command(text):
        return argv_from_command(text)
    try:
        _, data = parse(paths[0])
    except Exception:  # noqa: BLE001 - read_job reports the file's problem
        return None
    return argv_from_config(data) if is_vllm_config(data) else None


def _llamacpp_argv(paths: list[str], gpu: str | None) -> tuple[list[str], list[str]] | None:
    """``memfit llama-server`` arguments (and notes) when the one file is a ``llama-server``
    command line or an Ollama Modelfile."""
    if len(paths) != 1:
        return None
    text = read_text(paths[0], what="job file")
    if is_llamacpp_command(text):
        return argv_from_llamacpp_command(text), []
    if not is_modelfile(text):
        return None
    if gpu is None:
        raise SpecError(
            f"{paths[0]} is an Ollama Modelfile: pass --gpu NAME (Ollama's default context "
            "depends on the GPU's memory)"
        )
    return argv_from_modelfile(text, path=paths[0], capacity_bytes=get_gpu(gpu).capacity_bytes)


def _sglang_argv(paths: list[str]) -> list[str] | None:
    """``memfit sglang`` arguments when the one file is an SGLang launch_server line."""
    if len(paths) != 1:
        return None
    text = read_text(paths[0], what="job file")
    return argv_from_sglang_command(text) if is_sglang_command(text) else None


def _vllm_args(vllm: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``argv`` as ``memfit vllm ARGV`` reads it. A flag vllm does not take is refused as the
    whole command line refuses it: argparse leaves unknown arguments to the top parser, whose
    message points at ``memfit --help``."""
    args, unknown = vllm.parse_known_args(argv)
    if unknown:
        top = vllm.prog.split()[0]
        vllm.exit(
            EXIT_BAD_INPUT,
            f"{top}: error: unrecognized arguments: {' '.join(unknown)} (see `{top} --help`)\n",
        )
    return args
