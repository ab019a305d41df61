"""``memfit models``: the bundled model configs and diffusion pipelines (argparse subcommand
for :mod:`memfit.cli`)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from memfit.flags import EXIT_OK
from memfit.models import list_bundled
from memfit.models.pipelines import list_pipelines
from memfit.report.text import render_models


def register(sub: Any) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Add ``models``; return its handler by name."""
    m = sub.add_parser(
        "models",
        help="list the bundled model configs",
        epilog="examples:\n  memfit models\n  memfit models --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    m.add_argument("--json", action="store_true")
    return {"models": cmd_models}


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
