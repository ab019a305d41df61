"""The ``memfit`` command line. The only module that parses argv, prints, or exits.

Exit codes: 0 ok, 1 a valid "does not fit", 2 bad input (and any memfit error).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import logging
import os
import sys
import traceback
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from memfit.cli.engine import applied
from memfit.errors import DoesNotFitError, MemfitError
from memfit.flags import EXIT_BAD_INPUT, EXIT_DOES_NOT_FIT, EXIT_OK
from memfit.version import __version__

#: Each command's modules under ``memfit.cli``, in ``memfit --help``'s order: a command line
#: imports only the modules of the command it runs (``memfit models`` does not load the planner,
#: the engines or the web server: issue 32), ``memfit --help`` and a mistyped command all of
#: them. Each module's ``register(sub)`` adds its subcommands and returns their handlers;
#: ``check`` answers a serving file through the ``vllm``, ``sglang`` and ``llama-server``
#: parsers, so it registers them too.
COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "estimate": ("estimate",),
    "models": ("models",),
    "gpus": ("gpus",),
    "layouts": ("layouts",),
    "monitor": ("monitor",),
    "diagnose": ("monitor",),
    "report": ("report",),
    "snapshot": ("report",),
    "plan": ("plan",),
    "fit": ("plan",),
    "upgrade": ("plan",),
    "doctor": ("plan",),
    "bench": ("bench",),
    "quality": ("bench",),
    "vllm": ("vllm",),
    "sglang": ("sglang",),
    "llama-server": ("llamacpp",),
    "llamacpp": ("llamacpp",),
    "check": ("check", "vllm", "sglang", "llamacpp"),
    "web": ("web",),
}
#: The handlers of the commands registered so far, by name (filled by :func:`build_parser`).
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, exit 2 (argparse's own contract)
        self.exit(EXIT_BAD_INPUT, f"memfit: error: {message} (see `{self.prog} --help`)\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``memfit`` parser: with ``command`` (a name of :data:`COMMAND_MODULES`), only that
    command's subcommands (what one command line needs); else every command."""
    p = _Parser(
        prog="memfit",
        description="Predict the GPU memory of training and inference.",
        epilog="examples:\n  memfit estimate llama-3.2-1b --batch 4 --seq 2048 --gpu A100-40GB\n"
        "  memfit models\n  memfit gpus\n  memfit estimate --help",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="store_true", help="print the version and exit")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)
    every = dict.fromkeys(m for ms in COMMAND_MODULES.values() for m in ms)
    for name in COMMAND_MODULES.get(command or "", every):
        module = importlib.import_module(f"memfit.cli.{name}")
        if name == "web":  # the web page runs command lines: it is handed this entry point
            COMMANDS.update(module.register(sub, run=main, parser_factory=build_parser))
        else:
            COMMANDS.update(module.register(sub))
    p.set_defaults(subparsers=sub.choices)  # for --from (cli_from.reparse) and check
    add_allow_code(sub)
    return p


def command_of(argv: Sequence[str]) -> str | None:
    """The command a command line names: its first word that is not an option (``memfit``'s
    own options, ``--version`` and ``--help``, take no value); None when there is none."""
    return next((word for word in argv if not word.startswith("-")), None)


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
    # torch's own UserWarnings while memfit runs a model on fake tensors (a dtype mismatch that
    # "cannot dispatch to fused implementation", a deprecated kernel) are about kernels the
    # trace never executes: the user can do nothing with them (MEMFIT_DEBUG=1 keeps them)
    if os.environ.get(DEBUG_ENV) != "1":
        warnings.filterwarnings("ignore", category=UserWarning, module=r"torch(\.|$)")
    words = sys.argv[1:] if argv is None else list(argv)
    if parser is None and words == ["--version"]:  # no command: no command's module needed
        print(__version__)
        return EXIT_OK
    parser = parser or build_parser(command_of(words))
    args = parser.parse_args(words)
    if args.version:
        print(__version__)
        return EXIT_OK
    if args.command is None:
        parser.print_help()
        return EXIT_BAD_INPUT
    command = args.command
    if _serving_implies_infer(args, words):
        args.mode = "infer"
    reparse = getattr(args, "reparse_from", None)  # a command that takes --from: its job files
    if reparse is not None:
        args = reparse(lambda: build_parser(command), args, words)
    with applied(args):
        code = COMMANDS[args.command](args)
    try:
        sys.stdout.flush()  # `--json > /dev/full`: the write fails here, not at exit
    except OSError:
        _drop_stdout()
        raise
    return code


def _serving_implies_infer(args: argparse.Namespace, words: Sequence[str]) -> bool:
    """``plan / fit / upgrade --runtime vllm|sglang|llama.cpp`` without ``--mode``: every
    ``--runtime`` but ``hf`` (Hugging Face's generate() or a training step) names a server, and a
    server serves, so the job is inference (``--mode train`` given with it stays an error)."""
    if getattr(args, "runtime", "hf") in (None, "hf") or not hasattr(args, "mode"):
        return False
    return not any(w == "--mode" or w.startswith("--mode=") for w in words)


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
