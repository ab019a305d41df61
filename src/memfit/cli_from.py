"""``--from FILE`` on ``estimate``, ``fit`` and ``plan``: the job the user's own config files
describe (see ``memfit check``) as the command's defaults; flags on the command line override
them. The files are read once, between two parses of the command line."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

#: Commands that take ``--from``.
FROM_COMMANDS = ("estimate", "fit", "plan")


def add_from(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--from",
        dest="from_files",
        action="append",
        metavar="FILE",
        default=None,
        help="read the job from your config files (axolotl, TRL / TrainingArguments, "
        "LLaMA-Factory, torchtune, LitGPT, DeepSpeed, accelerate; repeat to combine); "
        "flags given here override them (see `memfit check`)",
    )


def job_defaults(command: str, paths: Sequence[str]) -> dict[str, Any]:
    """argparse defaults (by dest) of the job the files describe, for ``command``."""
    from memfit.flags import flags_for
    from memfit.jobfiles import read_job

    job = read_job(list(paths))
    fields = {name: s.value for name, s in job.fields.items()}
    if command == "plan":  # the planner splits the global batch itself
        per_step = fields.get("batch_size", 1) * fields.get("grad_accum", 1)
        fields["global_batch"] = per_step * fields.get("gpus", 1)
        for name in ("batch_size", "grad_accum"):
            fields.pop(name, None)
    if isinstance(fields.get("lora_targets"), tuple):
        fields["lora_targets"] = ",".join(fields["lora_targets"])
    defaults: dict[str, Any] = {}
    for flag in flags_for(command):
        if flag.field in fields and flag.dest not in defaults:
            defaults[flag.dest] = fields[flag.field]
    if "model" in fields:
        defaults["model"] = fields["model"]
    return defaults


def reparse(
    parser: argparse.ArgumentParser,
    subparsers: dict[str, argparse.ArgumentParser],
    args: argparse.Namespace,
    argv: Sequence[str] | None,
) -> argparse.Namespace:
    """Parse again with the ``--from`` job as the subcommand's defaults."""
    command = getattr(args, "command", None)
    paths = getattr(args, "from_files", None)
    if command in FROM_COMMANDS and paths:
        # a fresh parser: the caller's may be reused (memfit web keeps one), and set_defaults
        # would leave this job's values on it for the next command line
        from memfit.cli import build_parser

        fresh = build_parser()
        fresh.get_default("subparsers")[command].set_defaults(**job_defaults(command, paths))
        args = fresh.parse_args(argv)
    if command in FROM_COMMANDS and getattr(args, "model", None) is None:
        from memfit.errors import SpecError

        raise SpecError(f"memfit {command} needs MODEL (or --from FILE naming the model)")
    return args
