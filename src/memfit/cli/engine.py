"""The flags every estimating command shares: ``--engine``, ``--quiet``, ``--no-cache``, and how
they apply.

``--engine auto|analytic|derived|trace`` (the rule: :mod:`memfit.estimate.policy`),
``--quiet`` (no progress line; :mod:`memfit.progress`), ``--confirm`` (the trace confirms every
fast answer) and ``--no-cache`` (neither read nor
write the disk caches of derived forms and trace answers: :mod:`memfit.estimate.derived.cache`)
are added to ``estimate``, ``plan``, ``fit``, ``upgrade`` and ``doctor``; :func:`applied` runs a
command under them, with ``--allow-code`` and the rest of its :class:`EstimateOptions`.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator

from memfit import progress
from memfit.estimate.options import using_options
from memfit.spec.options import ENGINES, EstimateOptions

ENGINE_HELP = (
    "auto (default): the fastest engine that models the job, said in the output — analytic "
    "(hand-written closed forms) where the model type has one, else derived (the trace's bytes "
    "from 3-4 traces per technique stack, cached), else trace; one `estimate` is analytic where "
    "the fast-path grid validates it (docs/engines.md), else traced unless a derived form is "
    "cached. analytic | derived | trace: that engine alone"
)


#: What ``--engine framework`` adds where a command takes ``--from`` (memfit.cli.from_files).
FRAMEWORK_HELP = (
    ". framework: the torchtune / LitGPT file given with --from, traced through that "
    "framework's own code (the default for such a file when the framework is installed)"
)


def add_engine_flags(
    parser: argparse.ArgumentParser, *, framework: bool = False, confirm: bool = True
) -> None:
    """Add ``--engine``, ``--quiet``, ``--confirm`` and ``--no-cache`` to ``parser``
    (``framework``: ``--engine framework`` too, for the commands that take ``--from``;
    ``confirm`` False: a command with a ``--confirm`` of its own, ``plan``'s)."""
    choices = (*ENGINES, "framework") if framework else ENGINES
    helptext = ENGINE_HELP + (FRAMEWORK_HELP if framework else "")
    parser.add_argument("--engine", choices=choices, default="auto", help=helptext)
    parser.add_argument(
        "--quiet",
        "-q",
        action="store_true",
        help="no progress line on stderr (shown only on a terminal, for work over 2 s)",
    )
    if confirm:
        parser.add_argument(
            "--confirm",
            action="store_true",
            help="the trace engine confirms every fast (analytic) answer of --engine auto; "
            "without it, only where the answer's validated error band could change the verdict",
        )
    parser.add_argument(
        "--no-cache",
        dest="no_cache",
        action="store_true",
        help="neither read nor write the disk caches (derived forms, trace answers, variable-"
        "length runs, the nearest change that fits; kept under $MEMFIT_CACHE_DIR, else "
        "~/.cache/memfit: delete it to clear them): every answer is traced, derived or "
        "searched again",
    )


def options_from(args: argparse.Namespace) -> EstimateOptions:
    """The :class:`EstimateOptions` a command's flags say: ``--engine``, ``--no-cache``,
    ``--allow-code``, ``--trust-remote-code``, ``--extrapolate`` (a command without one: the
    default)."""
    return EstimateOptions(
        engine=getattr(args, "engine", "auto"),
        use_cache=not getattr(args, "no_cache", False),
        allow_code=bool(getattr(args, "allow_code", False)),
        trust_remote_code=bool(getattr(args, "trust_remote_code", False)),
        extrapolate=getattr(args, "extrapolate", None),
        confirm=getattr(args, "confirm", False) is True,  # plan's --confirm is a mode
    )


@contextlib.contextmanager
def applied(args: argparse.Namespace) -> Iterator[None]:
    """Run a command under its options (:func:`options_from`, applied by
    :func:`~memfit.estimate.options.using_options`) and its progress display."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(using_options(options_from(args)))
        if hasattr(args, "quiet"):
            json_out = bool(getattr(args, "json", False))
            stack.enter_context(progress.terminal(quiet=args.quiet, json_out=json_out))
        yield
