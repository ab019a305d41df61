"""The ``memfit`` command line. The only module that parses argv, prints, or exits.

Exit codes: 0 ok, 1 a valid "does not fit", 2 bad input (and any memfit error).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import logging
import os
import sys
import traceback
import warnings
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from memfit import progress
from memfit.api import estimate
from memfit.cli import bench as cli_bench
from memfit.cli import check as cli_check
from memfit.cli import diffusion as cli_diffusion
from memfit.cli import from_files as cli_from
from memfit.cli import gpus as cli_gpus
from memfit.cli import layouts as cli_layouts
from memfit.cli import llamacpp as cli_llamacpp
from memfit.cli import monitor as cli_monitor
from memfit.cli import plan as cli_plan
from memfit.cli import report as cli_report
from memfit.cli import seqdist as cli_seqdist
from memfit.cli import sglang as cli_sglang
from memfit.cli import vllm as cli_vllm
from memfit.cli import web as cli_web
from memfit.cli.engine import add_engine_flags, applied, options_from
from memfit.errors import DoesNotFitError, MemfitError
from memfit.flags import (
    EXIT_BAD_INPUT,
    EXIT_DOES_NOT_FIT,
    EXIT_OK,
    add_flags,
    non_negative_int,
    workload_from_args,
)
from memfit.models import list_bundled
from memfit.models.pipelines import list_pipelines
from memfit.plan.nearest import NearestFit, nearest_fit
from memfit.report.text import render_estimate, render_models
from memfit.version import __version__

ESTIMATE_EXAMPLES = """examples:
  memfit estimate llama-3.2-1b --batch 4 --seq 2048 --gpu A100-40GB
  memfit estimate mistral-7b-v0.1 --lora-rank 16 --checkpointing full --gpu L4
  memfit estimate llama-3.1-8b --mode infer --seq 4096 --new-tokens 256 --gpu L40S --json
  memfit estimate ./my-model/config.json --precision amp-bf16 --optimizer adamw-fused
  memfit estimate mypkg.models:make_unet --allow-code --batch 8 --precision fp16
  memfit estimate vit-base-patch16-224 --image-size 384 --batch 64 --checkpointing full
  memfit estimate whisper-large-v3 --mode infer --audio-seconds 600 --new-tokens 224
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, exit 2 (argparse's own contract)
        self.exit(EXIT_BAD_INPUT, f"memfit: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="memfit",
        description="Predict the GPU memory of training and inference.",
        epilog="examples:\n  memfit estimate llama-3.2-1b --batch 4 --seq 2048 --gpu A100-40GB\n"
        "  memfit models\n  memfit gpus\n  memfit estimate --help",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="store_true", help="print the version and exit")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)
    e = sub.add_parser(
        "estimate",
        help="peak memory of a training step or an inference run, by component",
        description="Trace MODEL's step on fake tensors (no GPU, no weights) and report peak "
        "allocated / reserved / device memory by component and phase.",
        epilog=ESTIMATE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    e.add_argument(
        "model",
        nargs="?",
        help="bundled name (see `memfit models`), path to config.json or a "
        "model dir, Hugging Face hub id",
    )
    add_flags(e, "estimate")
    cli_seqdist.add_flags(e)
    cli_from.add_from(e)
    e.add_argument("--gpu", default=None, help="GPU name for a fits verdict (see `memfit gpus`)")
    add_engine_flags(e, framework=True)
    e.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow configs that need the repo's own Python code (runs that code)",
    )
    x = e.add_mutually_exclusive_group()
    x.add_argument(
        "--no-extrapolate",
        dest="extrapolate",
        action="store_const",
        const=False,
        help="trace every layer (default up to 48 layers; slower, exact reserved)",
    )
    x.add_argument(
        "--extrapolate",
        dest="extrapolate",
        action="store_const",
        const=True,
        help="trace a few layers and extrapolate (default beyond 48 layers; fast)",
    )
    e.add_argument(
        "--top", type=non_negative_int, default=5, help="modules to list at the peak (default 5)"
    )
    e.add_argument("--json", action="store_true", help="print one JSON object")
    cli_web.add_share_flags(e, snapshot=True)  # --html, --snapshot
    m = sub.add_parser(
        "models",
        help="list the bundled model configs",
        epilog="examples:\n  memfit models\n  memfit models --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    m.add_argument("--json", action="store_true")
    COMMANDS.update(cli_gpus.register(sub))  # gpus
    COMMANDS.update(cli_layouts.register(sub))  # layouts (pp / cp layouts of N GPUs)
    COMMANDS.update(cli_monitor.register(sub))  # monitor, diagnose
    COMMANDS.update(cli_report.register(sub))  # report, snapshot
    COMMANDS.update(cli_plan.register(sub))  # plan, fit, upgrade, doctor
    COMMANDS.update(cli_bench.register(sub))  # bench, quality
    COMMANDS.update(cli_vllm.register(sub))  # vllm
    COMMANDS.update(cli_sglang.register(sub))  # sglang
    COMMANDS.update(cli_llamacpp.register(sub))  # llama-server (alias llamacpp)
    COMMANDS.update(cli_check.register(sub))  # check
    p.set_defaults(subparsers=sub.choices)  # for --from (cli_from.reparse)
    COMMANDS.update(cli_web.register(sub, run=main, parser_factory=build_parser))  # web
    add_allow_code(sub)
    return p


#: The commands whose MODEL may be a ``package.module:function`` factory, with --allow-code.
FACTORY_COMMANDS = ("estimate", "plan", "fit", "upgrade", "doctor")
ALLOW_CODE_HELP = (
    "let MODEL be package.module:function: memfit imports that module and calls the function "
    "to build the model, which runs its code (off by default: a MODEL string never runs code)"
)


def add_allow_code(sub: Any) -> None:
    """``--allow-code`` on every command of :data:`FACTORY_COMMANDS`, and its MODEL help says so
    (one place, so no command can take a factory without the opt-in being documented)."""
    for name in FACTORY_COMMANDS:
        parser = sub.choices.get(name)
        if parser is None:
            continue
        parser.add_argument("--allow-code", action="store_true", help=ALLOW_CODE_HELP)
        for action in parser._actions:  # argparse keeps no public list of the positionals
            if action.dest == "model" and "--allow-code" not in (action.help or ""):
                action.help = f"{action.help}; package.module:function with --allow-code"


def cmd_estimate(args: argparse.Namespace) -> int:
    if cli_diffusion.is_pipeline(args.model):
        return cli_diffusion.cmd_estimate_pipeline(args)
    cli_diffusion.refuse_pipeline_flags(args)
    if args.seq_dist is not None:
        return cli_seqdist.cmd(args, workload_from_args(args))
    with cli_web.history(args) as traces:  # --snapshot: the trace's allocation history
        est = cli_from.framework_estimate(args, workload_from_args(args)) or estimate(
            args.model, workload_from_args(args), gpu=args.gpu, options=options_from(args)
        )
        est = cli_from.with_framework_band(args, est)
    cli_web.write_estimate_outputs(args, est, traces)
    answer = cli_from.answer(args, est.engine)  # a torchtune / LitGPT --from file: who answered
    nearest = _nearest(args, est)
    if args.json:
        extra = {} if nearest is None else {"nearest_fit": nearest.to_json()}
        print(json.dumps({**est.to_json(), **answer, **extra}, indent=2))
    else:
        tail = "" if nearest is None else "\n" + nearest.text()
        print(render_estimate(est, top=args.top) + cli_from.answer_lines(answer) + tail)
    return EXIT_DOES_NOT_FIT if est.fits is not None and not est.fits.fits else EXIT_OK


def _nearest(args: argparse.Namespace, est: Any) -> NearestFit | None:
    """For a text job that does not fit: the nearest change that does (memfit.plan.nearest),
    searched with the fast engine; None when it fits, or for a --from framework answer."""
    if est.fits is None or est.fits.verdict != "does not fit" or cli_from.answer(args, est.engine):
        return None
    settled = dataclasses.replace(workload_from_args(args), precision=est.workload["precision"])
    progress.report("looking for the nearest change that fits")
    return nearest_fit(args.model, settled, args.gpu, model_name=str(args.model))


def _print_records(records: list[Any]) -> None:
    """The JSON form of catalog rows (frozen dataclasses), all fields."""
    print(json.dumps([asdict(r) for r in records], indent=2))


def cmd_models(args: argparse.Namespace) -> int:
    rows = list_bundled()
    if args.json:
        _print_records(rows)
        return EXIT_OK
    print(render_models(rows, list_pipelines()))
    return EXIT_OK


COMMANDS = {"estimate": cmd_estimate, "models": cmd_models}


#: Libraries whose import-time warnings are noise for a CLI user: bitsandbytes and torchao on CPU
#: look for optional accelerated kernels memfit never runs; torch's pytree logs deprecations of
#: registrations those libraries make; transformers and peft log notes about the model building
#: memfit does (use_cache off under checkpointing), which are not the user's concern.
QUIET_LOGGERS = ("bitsandbytes", "torchao", "torch.utils._pytree", "transformers", "peft")


#: Exit status after Ctrl-C: 128 + SIGINT, as shells report an interrupted command.
EXIT_INTERRUPTED = 130
#: Set to 1 to let an unexpected exception raise with its traceback (memfit's bug reports).
DEBUG_ENV = "MEMFIT_DEBUG"
#: The extra (pyproject.toml ``[project.optional-dependencies]``) that installs each optional
#: top-level package, for a ModuleNotFoundError that reaches :func:`main`.
EXTRA_OF_MODULE = {
    "torch": "trace",
    "transformers": "trace",
    "safetensors": "trace",
    "peft": "lora",
    "huggingface_hub": "hub",
    "matplotlib": "report",
    "pynvml": "monitor",
    "psutil": "monitor",
    "starlette": "web",
    "uvicorn": "web",
    "diffusers": "diffusion",
    "prodigyopt": "diffusion",
    "numba": "fast",
}


def main(
    argv: Sequence[str] | None = None, *, parser: argparse.ArgumentParser | None = None
) -> int:
    """Run one command line. ``parser``: a :func:`build_parser` made earlier, for a caller that
    runs many (``memfit web``'s workers; building one takes tens of milliseconds).

    Every failure ends in one ``memfit: error:`` line on stderr and exit 2 (a valid "does not
    fit" is exit 1, Ctrl-C exit 130 with nothing printed); an exception memfit did not expect
    says it is memfit's bug in one line, with the traceback under ``MEMFIT_DEBUG=1``."""
    _encoding_safe(sys.stdout, sys.stderr)
    try:
        return _run(argv, parser)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `memfit gpus | head`: the reader left; not an error
        _drop_stdout()
        sys.stderr.close()
        return EXIT_OK
    except MemfitError as exc:
        _error(str(exc))
        return EXIT_DOES_NOT_FIT if isinstance(exc, DoesNotFitError) else EXIT_BAD_INPUT
    except ModuleNotFoundError as exc:
        if os.environ.get(DEBUG_ENV) == "1":
            raise
        _error(_missing_module(exc))
        return EXIT_BAD_INPUT
    except OSError as exc:  # a path the OS refused: too long, unreadable, a full disk…
        _error(_os_error(exc))
        return EXIT_BAD_INPUT
    except RecursionError:
        _error("the input nests too deeply to read (a file or value nested hundreds of levels)")
        return EXIT_BAD_INPUT
    except ValueError as exc:  # a value from the input no reader refused by name (a 5,000-digit
        if os.environ.get(DEBUG_ENV) == "1":  # integer in a JSON file: json's own limit)
            raise
        _error(
            f"{_cut(str(exc))} (a value memfit could not read; if the input is valid, this is a "
            f"bug in memfit: {DEBUG_ENV}=1 shows where)"
        )
        return EXIT_BAD_INPUT
    except Exception as exc:  # noqa: BLE001 - the last resort: one line, never a traceback
        if os.environ.get(DEBUG_ENV) == "1":
            raise
        where = traceback.extract_tb(exc.__traceback__)[-1]
        _error(
            f"internal error: {type(exc).__name__}: {_cut(str(exc))} "
            f"(at {os.path.basename(where.filename)}:{where.lineno}); this is a bug in memfit: "
            f"please report it with the command line (run it with {DEBUG_ENV}=1 for the traceback)",
        )
        return EXIT_BAD_INPUT


def _run(argv: Sequence[str] | None, parser: argparse.ArgumentParser | None) -> int:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # read when transformers configures
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    # Deprecations inside transformers / peft (e.g. peft reading is_gradient_checkpointing) are
    # for those libraries' own callers, not for a CLI user.
    warnings.filterwarnings("ignore", category=FutureWarning)
    parser = parser or build_parser()
    args = parser.parse_args(argv)
    if args.version:
        print(__version__)
        return EXIT_OK
    if args.command is None:
        parser.print_help()
        return EXIT_BAD_INPUT
    args = cli_from.reparse(build_parser, args, argv)
    with applied(args):
        code = COMMANDS[args.command](args)
    try:
        sys.stdout.flush()  # `--json > /dev/full`: the write fails here, not at exit
    except OSError:
        _drop_stdout()
        raise
    return code


def _error(message: str) -> None:
    print(f"memfit: error: {message}", file=sys.stderr)


def _cut(text: str, limit: int = 300) -> str:
    """``text`` on one line and at most ``limit`` characters."""
    line = " ".join(text.split())
    return line if len(line) <= limit else f"{line[:limit]}… ({len(line):,} characters)"


def _os_error(exc: OSError) -> str:
    """One line for an OSError: what the OS said, the path, what to do."""
    what = exc.strerror or type(exc).__name__
    path = "" if exc.filename is None else f": {_cut(str(exc.filename), 80)}"
    return f"{what}{path} (errno {exc.errno}); check the path, its permissions and free space"


def _missing_module(exc: ModuleNotFoundError) -> str:
    """The extra that installs the missing package (pyproject's optional dependencies)."""
    top = (exc.name or "").split(".")[0]
    extra = EXTRA_OF_MODULE.get(top)
    if extra is None:
        return f"this needs the Python package {top!r}, which is not installed: pip install {top}"
    return f"this needs {top}, which is not installed: pip install 'memfit[{extra}]'"


def _encoding_safe(*streams: Any) -> None:
    """Print what the terminal's encoding can hold and a ``?`` for the rest (``LANG=C``,
    ``PYTHONIOENCODING=ascii``: the tables' ``×`` and ``—`` failed with UnicodeEncodeError)."""
    for stream in streams:
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            with contextlib.suppress(ValueError, OSError):  # detached or closed: leave it
                stream.reconfigure(errors="replace")


def _drop_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's flush at exit does not fail again."""
    with contextlib.suppress(OSError, ValueError, AttributeError, io.UnsupportedOperation):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


if __name__ == "__main__":
    raise SystemExit(main())
