"""``--from FILE`` on ``estimate``, ``fit`` and ``plan``: the job the user's own config files
describe (see ``memfit check``) as the command's defaults; flags on the command line override
them. The files are read once, between two parses of the command line.

A torchtune recipe or a LitGPT config is answered as ``memfit check`` answers it (its routing,
:func:`memfit.cli.check.route`): ``estimate`` traces the job through the framework's own code when
the framework is installed; ``fit`` searches with transformers' model and traces its answer once
through the framework; ``plan`` searches with transformers' model and says so (its plans change
settings the framework reads from its own file)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from memfit.errors import SpecError
from memfit.estimate.trace import frameworks
from memfit.flags import flags_for, workload_from_args
from memfit.plan.budget import fits, need_bytes
from memfit.progress import report
from memfit.units import format_bytes

#: File formats whose own code runs the job (memfit answers them through transformers' model
#: when their framework engine does not): their estimates carry the other-framework band.
FRAMEWORK_FORMATS = ("litgpt", "torchtune")
#: Commands that take ``--from``.
FROM_COMMANDS = ("estimate", "fit", "plan")


def add_from(parser: argparse.ArgumentParser) -> None:
    """``--from FILE`` on ``parser``, whose command line the entry point then parses again with
    the file's job (:func:`reparse`, handed over as the parser's ``reparse_from`` default: the
    entry point imports no command's module but the one it runs)."""
    parser.add_argument(
        "--from",
        dest="from_files",
        action="append",
        metavar="FILE",
        default=None,
        help="read the job from your config files (axolotl, TRL / TrainingArguments, "
        "LLaMA-Factory, torchtune, LitGPT, DeepSpeed, accelerate, torchtitan TOML; repeat to "
        "combine); "
        "flags given here override them (see `memfit check`)",
    )
    parser.set_defaults(reparse_from=reparse)


def job_defaults(command: str, paths: Sequence[str]) -> dict[str, Any]:
    """argparse defaults (by dest) of the job the files describe, for ``command``."""
    from memfit.jobfiles import read_job

    return _defaults(command, read_job(list(paths)))


def _defaults(command: str, job: Any) -> dict[str, Any]:
    fields = {name: s.value for name, s in job.fields.items()}
    asked: dict[str, Any] = {}
    if command == "plan":  # the planner splits the global batch itself
        per_step = fields.get("batch_size", 1) * fields.get("grad_accum", 1)
        fields["global_batch"] = per_step * fields.get("gpus", 1)
        # the file's own split and checkpointing: "as asked" is the file's job (not flags:
        # plan searches those; memfit.plan.request.PlanRequest.asked_micro_batch)
        asked = {
            "asked_micro_batch": fields.get("batch_size", 1),
            "asked_checkpointing": fields.get("checkpointing"),
            "asked_global_batch": fields["global_batch"],
        }
        for name in ("batch_size", "grad_accum"):
            fields.pop(name, None)
        if fields.get("lora_rank") is not None:  # plan's --lora-rank takes the ranks to try
            fields["lora_ranks"] = [fields.pop("lora_rank")]
    for key in ("lora_targets", "lora_modules_to_save"):
        if isinstance(fields.get(key), tuple):
            fields[key] = ",".join(fields[key])
    defaults: dict[str, Any] = {}
    for flag in flags_for(command):
        if flag.field in fields and flag.dest not in defaults:
            defaults[flag.dest] = fields[flag.field]
    if "model" in fields:
        defaults["model"] = fields["model"]
    return {**defaults, **asked}


def reparse(
    build_parser: Callable[[], argparse.ArgumentParser],
    args: argparse.Namespace,
    argv: Sequence[str] | None,
) -> argparse.Namespace:
    """Parse again with the ``--from`` job as the subcommand's defaults. ``build_parser``: the
    command line's (:func:`memfit.cli.entry.build_parser`, passed down by the entry point)."""
    command = getattr(args, "command", None)
    paths = getattr(args, "from_files", None)
    if command in FROM_COMMANDS and paths:
        # a fresh parser: the caller's may be reused (memfit web keeps one), and set_defaults
        # would leave this job's values on it for the next command line

        from memfit.jobfiles import read_job  # the job-file readers: for --from only

        given = sys.argv[1:] if argv is None else list(argv)
        gpus = args.gpus if any(a.split("=")[0] == "--gpus" for a in given) else None
        job = read_job(list(paths), gpus=gpus)  # a torchtitan file's -1 degree takes --gpus
        fresh = build_parser()
        fresh.get_default("subparsers")[command].set_defaults(**_defaults(command, job))
        args = fresh.parse_args(argv)
        args.from_route = _route(command, job, args, argv, build_parser)
    elif getattr(args, "engine", None) == "framework":
        raise SpecError(
            "--engine framework traces a torchtune recipe or a LitGPT config: name it with "
            "--from FILE"
        )
    if command in FROM_COMMANDS and getattr(args, "model", None) is None:
        raise SpecError(f"memfit {command} needs MODEL (or --from FILE naming the model)")
    return args


#: Workload fields a framework engine takes from the command line; it reads every other one (the
#: model, adapters, quantization, precision, checkpointing) from its own file.
FRAMEWORK_WORKLOAD = frozenset({"batch_size", "seq_len", "grad_accum", "optimizer"})


@dataclass(frozen=True, kw_only=True)
class FromRoute:
    """How a command with ``--from`` a torchtune / LitGPT file answers. ``framework``: the
    framework engine that answers (None: transformers' model); ``asked``: the ``--engine`` given
    (None: the default); ``note``: why the framework does not answer, or None."""

    job: Any
    file_framework: str
    framework: str | None
    asked: str | None
    note: str | None

    def __post_init__(self) -> None:
        if self.framework not in (None, self.file_framework):
            raise SpecError(
                f"framework ({self.framework!r}) must be None or the file's "
                f"({self.file_framework!r})"
            )

    @property
    def data(self) -> dict[str, Any]:
        """The framework's file, parsed (overrides applied)."""
        return next(f.data for f in self.job.files if f.format == self.file_framework)

    def answered_by(self, engine: str) -> str:
        """What answered, ``engine`` being the one transformers' model ran on (when it did)."""
        from memfit.cli.check import settings_answer  # the check door: for --from only

        if self.framework is not None:
            return frameworks.ANSWERED_BY[self.framework]
        return settings_answer(self.asked or engine, asked=self.asked is not None)


def _route(
    command: str,
    job: Any,
    args: argparse.Namespace,
    argv: Any,
    build_parser: Callable[[], argparse.ArgumentParser],
) -> FromRoute | None:
    from memfit.cli.check import route

    file_framework = next((f.format for f in job.files if f.format in frameworks.EXTRAS), None)
    if file_framework is None:
        if args.engine == "framework":
            route(job, "framework")  # the one message: needs a torchtune recipe or LitGPT config
        return None
    asked = None if args.engine in ("auto", "framework") else args.engine
    framework, _, note = route(job, "framework" if args.engine == "framework" else asked)
    # plan traces no candidate through the framework: its flags are the search's, not a conflict
    traced = framework is not None and command != "plan"
    overridden = _overridden(command, argv, build_parser) if traced else ()
    if overridden:
        flags = ", ".join(overridden)
        if args.engine == "framework":
            raise SpecError(
                f"--engine framework traces the {file_framework} file as it is, and {flags} "
                f"{'sets' if len(overridden) == 1 else 'set'} what {file_framework} reads from "
                "it: edit the file instead (or drop --engine framework)"
            )
        framework = None
        note = (
            f"{flags} override{'s' if len(overridden) == 1 else ''} the {file_framework} file, "
            f"and {file_framework}'s own code reads that from the file: transformers' model "
            "answered (edit the file to trace it through the framework)"
        )
    if args.engine == "framework":
        args.engine = "auto"  # transformers' model (searches, the fix) runs on the default rule
    return FromRoute(
        job=job, file_framework=file_framework, framework=framework, asked=asked, note=note
    )


def _overridden(
    command: str, argv: Any, build_parser: Callable[[], argparse.ArgumentParser]
) -> tuple[str, ...]:
    """The flags on the command line that set what a framework engine reads from its file.

    A third parse, only for a torchtune / LitGPT file that its framework would trace (not
    ``plan``): every workload flag's default is a sentinel, so a flag typed with the default's
    value still counts as given. The first parse cannot tell (its defaults are argparse's), and
    the second cannot either (its defaults are the file's values, which a flag may repeat)."""
    unset = object()
    flags = [f for f in flags_for(command) if f.target == "workload"]
    fresh = build_parser()
    fresh.get_default("subparsers")[command].set_defaults(
        model=unset, **{f.dest: unset for f in flags}
    )
    given = fresh.parse_args(argv)
    names = ["MODEL"] if given.model is not unset else []
    names += [
        f.name
        for f in flags
        if getattr(given, f.dest) is not unset and f.field not in FRAMEWORK_WORKLOAD
    ]
    return tuple(dict.fromkeys(names))


def route_of(args: argparse.Namespace) -> FromRoute | None:
    return getattr(args, "from_route", None)


def framework_estimate(args: argparse.Namespace, workload: Any) -> Any:
    """The framework engine's estimate of ``workload`` (the job of args' ``--from`` file), or
    None where transformers' model answers."""
    r = route_of(args)
    if r is None or r.framework is None:
        return None

    report(f"tracing {args.model} through {r.framework}'s own code")
    return frameworks.estimate_with_framework(r.framework, r.data, workload, gpu=args.gpu)


def with_framework_band(args: argparse.Namespace, est: Any) -> Any:
    """``est`` with the other-framework band where a LitGPT / torchtune ``--from`` file was
    answered through transformers' model (the job runs the framework's code, not that model's:
    memfit.estimate.uncertainty)."""
    r = route_of(args)
    if r is None or r.framework is not None or r.file_framework not in FRAMEWORK_FORMATS:
        return est
    return est.with_band("other-framework")


def answer(args: argparse.Namespace, engine: str) -> dict[str, Any]:
    """``answered_by`` and ``note`` (as ``memfit check`` gives them) for a framework's file;
    nothing otherwise. ``engine``: the engine transformers' model ran on."""
    r = route_of(args)
    if r is None:
        return {}
    return {"answered_by": r.answered_by(engine), "note": r.note}


def answer_lines(info: dict[str, Any]) -> str:
    if not info:
        return ""
    out = f"\nanswered by: {info['answered_by']}"
    return out + (f"\nnote: {info['note']}" if info.get("note") else "")


def confirm_fit(args: argparse.Namespace, result: Any) -> tuple[dict[str, Any], str, bool]:
    """For ``fit --from`` a framework's file: the search ran on transformers' model; trace its
    answer once through the framework. ``(JSON keys, text lines, whether it still fits)``."""
    from memfit.cli.check import settings_answer

    r = route_of(args)
    if r is None:
        return {}, "", True

    searched = result.search_engine
    info: dict[str, Any] = {"framework_estimate": None}
    if r.framework is None:
        info.update(answered_by=f"searched with {r.answered_by(searched)}", note=r.note)
        return info, answer_lines(info), True
    info["answered_by"] = f"searched with {settings_answer(searched)}"
    if result.estimate is None or not result.fits:
        info["note"] = f"nothing fits, so nothing was traced through {r.framework}'s own code"
        return info, answer_lines(info), True
    field = {"batch": "batch_size", "seq": "seq_len"}[result.solve]  # training: no concurrency
    workload = dataclasses.replace(workload_from_args(args), **{field: result.max_value})
    est = framework_estimate(args, workload)
    ok = fits(est, result.budget)
    value = f"{result.solve} {result.max_value}"
    who = frameworks.ANSWERED_BY[r.framework]
    info["answered_by"] += f"; {who} answered the estimate of {value}"
    info["framework_estimate"] = {**est.to_json(), "fits": ok}
    verdict = "fits" if ok else f"does NOT fit {result.budget.gpu_name}: lower {result.solve}"
    info["note"] = (
        f"searched with transformers' model; the framework's own code "
        f"({who}) answered the estimate of the recommended {value}: device "
        f"{format_bytes(est.device_used_bytes)} (upper end {format_bytes(need_bytes(est))}) — "
        f"{verdict}"
    )
    return info, answer_lines(info), ok


def plan_answer(args: argparse.Namespace, engine: str) -> dict[str, Any]:
    """For ``plan --from`` a framework's file: the search runs on transformers' model, and its
    plans are not traced through the framework (they change settings it reads from its file)."""
    from memfit.cli.check import settings_answer

    r = route_of(args)
    if r is None:
        return {}

    if r.framework is None:
        return {"answered_by": f"searched with {r.answered_by(engine)}", "note": r.note}
    return {
        "answered_by": f"searched with {settings_answer(engine)}",
        "note": f"searched with transformers' model; the plans were not traced through "
        f"{r.framework}'s own code (they change settings {r.framework} reads from its file): "
        f"apply the recommended one to the file and run `memfit check FILE` to trace it",
    }
