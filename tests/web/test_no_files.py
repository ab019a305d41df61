"""No web request reads a file (issue 33: ``seq-dist=/etc/passwd`` was read and quoted).

The options are read from the CLI's own parser, so a path option added to any API command is
covered here without a change to this file."""

from __future__ import annotations

import argparse
import urllib.parse
from pathlib import Path

import pytest
from tests.web.test_api import get

from memfit.cli import build_parser
from memfit.errors import SpecError
from memfit.web.query import COMMANDS, build_job, options, subparsers

PARSER = build_parser()
#: What the planted file holds: no answer of the server may quote it.
SECRET = "memfit-secret-line-4711"


def _value_may_name_a_file(action: argparse.Action) -> bool:
    """Read independently of memfit.web.query's rule: the metavar or the help says FILE/path."""
    text = f"{action.metavar or ''} {action.help or ''}".lower()
    free = action.nargs != 0 and action.choices is None  # a switch or a choice takes no path
    return free and any(w in text for w in ("file", "path", "folder", "dir "))


PATH_OPTIONS = [
    (command, long[0][2:])
    for command in COMMANDS
    for action in subparsers(PARSER)[command]._actions
    if (long := [s for s in action.option_strings if s.startswith("--")])
    and _value_may_name_a_file(action)
]


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A file that every reader would take: a histogram, a price list, a config, all in one line."""
    path = tmp_path_factory.mktemp("planted") / "secret.csv"
    path.write_text(f"128,{SECRET}\n")
    return path


def test_the_parser_has_path_options_to_check() -> None:
    keys = {key for _, key in PATH_OPTIONS}
    assert {"seq-dist", "from", "prices", "html", "snapshot"} <= keys  # the check sees them


@pytest.mark.parametrize(("command", "key"), PATH_OPTIONS)
def test_every_path_option_is_refused_by_the_query_builder(
    command: str, key: str, planted: Path
) -> None:
    for value in ("/etc/passwd", str(planted), "secret.csv", "~/x.json"):
        with pytest.raises(SpecError, match=r"web server") as info:
            build_job(
                PARSER, command, [("model", "gpt2"), (key, value)], pasted=None, allow_paths=True
            )
        assert SECRET not in str(info.value)


@pytest.mark.parametrize(("command", "key"), PATH_OPTIONS)
def test_every_path_option_is_refused_by_the_api(
    server: str, command: str, key: str, planted: Path
) -> None:
    for value in ("/etc/passwd", str(planted)):
        query = urllib.parse.urlencode({"model": "gpt2", key: value, "engine": "analytic"})
        status, _, body = get(f"{server}/api/{command}?{query}")
        assert status == 400 and "web server" in body["error"]
        assert SECRET not in body["error"] and "root:" not in body["error"]


@pytest.mark.parametrize("command", COMMANDS)
def test_no_free_text_option_takes_a_path(command: str, planted: Path) -> None:
    """Options whose metavar names no file are not readers, and a path-like value is refused."""
    for opt in options(PARSER, command).values():
        if opt.kind not in ("text", "ints"):
            continue  # a number or a choice: argparse refuses a path
        with pytest.raises(SpecError, match=r"web server reads no files"):
            build_job(
                PARSER,
                command,
                [("model", "gpt2"), (opt.key, str(planted))],
                pasted=None,
                allow_paths=True,
            )


def test_seq_dist_passes_only_as_three_numbers() -> None:
    job = build_job(
        PARSER, "estimate", [("model", "gpt2"), ("seq-dist", "300,250.5,1024")], pasted=None,
        allow_paths=True,
    )  # fmt: skip
    assert "--seq-dist=300,250.5,1024" in job.argv
    with pytest.raises(SpecError, match=r"seq-dist \('passwd'\): the web server reads no files"):
        build_job(
            PARSER, "estimate", [("model", "gpt2"), ("seq-dist", "passwd")], pasted=None,
            allow_paths=True,
        )  # fmt: skip


def test_code_running_switches_are_refused() -> None:
    for key in ("allow-code", "trust-remote-code"):
        with pytest.raises(SpecError, match=rf"{key} is not available from the web server"):
            build_job(
                PARSER, "estimate", [("model", "gpt2"), (key, "1")], pasted=None, allow_paths=True
            )
