"""A web request's parameters as the ``memfit`` command line they stand for.

The API (``GET /api/estimate?model=gpt2&batch=4&seq=1024``) answers exactly what
``memfit estimate gpt2 --batch 4 --seq 1024 --json`` prints because it *is* that command: this
module turns the query into argv, checked against the CLI's own parser (so every flag the one
flags table adds is accepted, spelled as the CLI spells it), and :mod:`memfit.web.workers` runs
the command line on it. The parser is the caller's (``memfit web`` passes the CLI's): this
package imports nothing from :mod:`memfit.cli`. What a web caller may not ask for is refused
here, with the CLI's kind of one-line message: running repository code
(``--trust-remote-code``, ``--allow-code``), importing a factory (``package.module:function``),
reading or writing files, and, when the server listens beyond this machine, local paths.

**No request reads or writes a file** (issue 33): an option whose value may name a file is known
by its metavar in the CLI's parser (``FILE``, ``PATH``, ``DIR``: :func:`takes_path`), so a path
option added to the CLI is refused here without a change to this module. Such an option is not
offered at all, unless it also has an inline form (:data:`INLINE_FORMS`: ``--seq-dist``'s
``MEAN,STD,MAX``), and then only that form passes. Every other free-text value that looks like a
path (a ``/`` or ``\\``, a leading ``~``) is refused too: no option a web caller may pass takes one.
"""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from memfit.errors import SpecError
from memfit.models.bundled import find_bundled
from memfit.models.ggml_types import FILE_TYPES
from memfit.userfiles import parse_json
from memfit.web.scratch import PastedConfigs

#: The commands the API serves (``/api/<command>``).
COMMANDS = ("estimate", "plan", "fit", "upgrade")
#: Options a web request may not pass: they run code, read or write files, or are the API's own.
REFUSED = frozenset(
    {
        "--trust-remote-code",
        "--json",
        "--html",
        "--snapshot",
        "--log",
        "--help",
        "--output",
        "--from",
        "--prices",
        "--write",
        "--allow-code",
    }
)
#: Metavars that say an option's value may name a file (``--from FILE``, ``--seq-dist
#: MEAN,STD,MAX|FILE``): such an option is refused from the web unless it has an inline form.
PATH_METAVAR = re.compile(r"\b(FILE|PATH|DIR|FOLDER)\b")
_NUMBER = r"\s*[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?\s*"
#: Options that take a file *or* an inline value: from the web only the inline value passes
#: (option -> (the value's whole pattern, how the message spells it)).
INLINE_FORMS: dict[str, tuple[re.Pattern[str], str]] = {
    "--seq-dist": (
        re.compile(rf"{_NUMBER},{_NUMBER},{_NUMBER}"),
        "MEAN,STD,MAX (e.g. 300,250,1024)",
    ),
}
#: The commands that search the memory techniques themselves (``memfit plan``, ``upgrade``):
#: they take the job's shape and recipe, not its techniques.
PLANNERS = ("plan", "upgrade")
#: What a planner takes for a job field of the form it has no flag for (none today: ``memfit
#: plan`` takes the job's ``--quant`` and ``--lora-targets`` itself). Every such field that is
#: set is named in :attr:`Job.not_taken` and the answer's ``X-Memfit-Not-Taken`` header (a
#: planner searches checkpointing, offload, sharding ... itself and starts from the job without
#: them), so the page says which fields the plan does not take instead of dropping them unsaid.
PLANNER_EQUIVALENTS: dict[tuple[str, str], Callable[[str], list[str]]] = {}
#: Query keys that are not options: the model, a pasted config.json, the page's own state.
MODEL_KEY, CONFIG_KEY = "model", "config"
PAGE_KEYS = frozenset({"view"})
#: A pasted config.json is at most this long (a real one is 1-4 KiB; the URL carries it).
CONFIG_MAX_CHARS = 12_000
SWITCH_ON, SWITCH_OFF = ("", "1", "true", "on", "yes"), ("0", "false", "off", "no")


@dataclass(frozen=True, kw_only=True)
class Option:
    """One option of a subcommand, as the page's form needs it."""

    name: str  # "--lora-rank"
    kind: str  # "switch" | "int" | "number" | "choice" | "text" | "ints"
    choices: tuple[str, ...] | None
    default: Any
    help: str | None

    @property
    def key(self) -> str:
        """The query key: the option without its dashes (``lora-rank``)."""
        return self.name[2:]


@cache
def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The CLI's subcommand parsers by name (argparse parsers are reusable)."""
    for action in parser._actions:  # argparse keeps subparsers as an action
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise RuntimeError("memfit's parser has no subcommands")  # pragma: no cover


def takes_path(action: argparse.Action) -> bool:
    """Whether ``action``'s value may name a file, by its metavar (``FILE``, ``A|FILE``)."""
    metavar = action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar or ())
    return bool(PATH_METAVAR.search(metavar))


def refused_from_the_web(action: argparse.Action) -> bool:
    """An option a web request may not pass (:data:`REFUSED`, or a path with no inline form)."""
    long = [s for s in action.option_strings if s.startswith("--")]
    if not long:
        return False
    return long[0] in REFUSED or (takes_path(action) and long[0] not in INLINE_FORMS)


def _kind(action: argparse.Action) -> str:
    if action.nargs == 0:
        return "switch"
    if isinstance(action, argparse._AppendAction):
        return "ints"
    if action.choices is not None:
        return "choice"
    if action.type is float:
        return "number"
    name = getattr(action.type, "__name__", "")
    return "int" if name in ("integer", "positive_int", "int") else "text"


@cache
def options(parser: argparse.ArgumentParser, command: str) -> dict[str, Option]:
    """``command``'s options a web request may pass, by query key (``parser``: the CLI's)."""
    out: dict[str, Option] = {}
    for action in subparsers(parser)[command]._actions:
        long = [s for s in action.option_strings if s.startswith("--")]
        if not long or refused_from_the_web(action):
            continue
        choices = tuple(str(c) for c in action.choices) if action.choices else None
        default = None if action.default is argparse.SUPPRESS else action.default
        opt = Option(
            name=long[0], kind=_kind(action), choices=choices, default=default, help=action.help
        )
        out[opt.key] = opt
    return out


@dataclass(frozen=True, kw_only=True)
class Job:
    """A checked request: the argv of ``memfit COMMAND ... --json`` and what it costs."""

    command: str
    argv: tuple[str, ...]  # without the program name, with --json
    heavy: bool  # runs the trace engine or a planner search (seconds), not only closed forms
    #: job fields of the query a planner takes no flag for (``checkpointing=full``), in order
    not_taken: tuple[str, ...] = ()
    #: a pasted config.json (checked): on disk at ``argv[1]`` only while the job runs
    #: (:meth:`memfit.web.scratch.PastedConfigs.holding`)
    config: str | None = None

    def command_line(self, *, json: bool = False) -> str:
        """The equivalent shell command (``memfit estimate gpt2 --batch 4``)."""
        words: list[str] = []
        for w in self.argv:
            if w == "--json" and not json:
                continue
            words += w.split("=", 1) if w.startswith("--") else [w]
        return shlex.join(["memfit", *words])


def build_job(
    parser: argparse.ArgumentParser,
    command: str,
    params: Iterable[tuple[str, str]],
    *,
    pasted: PastedConfigs | None,
    allow_paths: bool,
) -> Job:
    """The job of one request, checked against ``parser`` (the CLI's). ``params``: the query's
    (key, value) pairs, repeats kept.
    ``pasted``: where a pasted config.json is written while its job runs (None refuses pasted
    configs); nothing is written here. Raises SpecError (a 400) naming the key, the value and
    the rule."""
    if command not in COMMANDS:
        raise SpecError(f"unknown API command {command!r}: use one of {', '.join(COMMANDS)}")
    allowed = options(parser, command)
    pairs = list(params)
    words: list[str] = []
    chosen: list[str] = []
    job_fields = options(parser, "estimate") if command in PLANNERS else {}
    model = config = None
    for key, value in pairs:
        if key == MODEL_KEY:
            model = value.strip()
        elif key == CONFIG_KEY:
            config = value
        elif key in PAGE_KEYS:
            continue
        elif key in allowed:
            words += _option_words(allowed[key], value)
        elif key in job_fields:  # a job field the planner takes no flag for: carried or named
            equivalent = PLANNER_EQUIVALENTS.get((command, key))
            words += [w for w in (equivalent(value) if equivalent else []) if w not in words]
            if value not in ("", "none", str(job_fields[key].default)):
                chosen.append(f"{key}={value}")
        elif _is_refused(parser, command, key):
            raise SpecError(
                f"{key} is not available from the web server: it runs code or reads or writes "
                "files (run `memfit` itself)"
            )
        else:
            raise SpecError(
                f"memfit {command} takes no option {key!r} (see `memfit {command} --help`)"
            )
    if config is not None and config.strip():
        config = _check_config(config, pasted)
        model = str(pasted.folder_for(config))  # type: ignore[union-attr]  # checked above
    elif not model:
        raise SpecError("model is required: a bundled name, a hub id or a pasted config.json")
    else:
        _check_model(model, allow_paths=allow_paths)
    argv = (command, model, *words, "--json")
    return Job(
        command=command,
        argv=argv,
        heavy=_is_heavy(command, words),
        not_taken=tuple(chosen),
        config=config if config is not None and config.strip() else None,
    )


def _is_refused(parser: argparse.ArgumentParser, command: str, key: str) -> bool:
    if f"--{key}" in REFUSED:
        return True
    return any(
        f"--{key}" in action.option_strings and refused_from_the_web(action)
        for action in subparsers(parser)[command]._actions
    )


def _check_no_path(opt: Option, value: str) -> None:
    """A value of an option that may take a file passes only in its inline form; any other free
    text that looks like a path is refused (no option a web caller may pass reads one)."""
    inline = INLINE_FORMS.get(opt.name)
    if inline is not None:
        pattern, form = inline
        if not pattern.fullmatch(value):
            raise SpecError(
                f"{opt.key} ({value[:80]!r}): the web server reads no files; give {form}"
            )
        return
    if opt.kind in ("text", "ints") and ("/" in value or "\\" in value or value.startswith("~")):
        raise SpecError(
            f"{opt.key} ({value[:80]!r}) looks like a path; the web server reads no files"
        )


def _option_words(opt: Option, value: str) -> list[str]:
    if opt.kind == "switch":
        text = value.strip().lower()
        if text in SWITCH_ON:
            return [opt.name]
        if text in SWITCH_OFF:
            return []
        raise SpecError(f"{opt.key} is a switch: pass 1 or 0, got {value!r}")
    if value == "":
        return []  # an empty form field: the option's default
    _check_no_path(opt, value)
    return [f"{opt.name}={value}"]  # one word, so "-1" stays the option's value


def _check_model(model: str, *, allow_paths: bool) -> None:
    if model.startswith("-"):
        raise SpecError(f"model ({model!r}) must not start with '-'")
    name, _, file_type = model.rpartition(":")
    if ":" in model and not (find_bundled(name) is not None and file_type.upper() in FILE_TYPES):
        raise SpecError(
            f"model ({model!r}) looks like package.module:function; the web server never imports "
            "code: pass a bundled name (llama.cpp: NAME:Q4_K_M), a hub id or paste the config.json"
        )
    looks_local = "\\" in model or model.startswith((".", "/", "~")) or model.count("/") > 1
    if not allow_paths and find_bundled(model) is None and (looks_local or Path(model).exists()):
        raise SpecError(
            f"model ({model!r}) is a local path; this server listens beyond localhost and reads "
            "no local files: paste the config.json instead"
        )


def _check_config(text: str, pasted: PastedConfigs | None) -> str:
    """A pasted config.json, checked: strict JSON, an object, bounded (not written here)."""
    if pasted is None:
        raise SpecError("this server takes no pasted config.json")
    if len(text) > CONFIG_MAX_CHARS:
        raise SpecError(
            f"config ({len(text)} characters) is longer than {CONFIG_MAX_CHARS}: paste the "
            "model's config.json only (no weights index, no tokenizer)"
        )
    data = parse_json(text, what="the pasted config", source="config")
    if not isinstance(data, dict):
        raise SpecError(f"config must be a JSON object, got {type(data).__name__}")
    return text


def _is_heavy(command: str, words: list[str]) -> bool:
    """Only an analytic estimate is light: every other job may trace (seconds to minutes)."""
    return not (command == "estimate" and "--engine=analytic" in words)
