"""Set keys in a TOML file's text in place (torchtitan's job files): a ``key = value`` line of
the key's ``[section]`` gets the new value with its comment kept, a missing key is added after
the section's last key, a missing section is added at the end. The result is parsed with
``tomllib`` and compared with the old text key by key (:func:`check_toml_edit`): the edit stands
only if the keys it set hold their new values and every other key keeps its own; otherwise
:class:`~memfit.jobfiles.yaml_edit.EditRefusedError` says what to set by hand."""

from __future__ import annotations

import re
from typing import Any

from memfit.errors import SpecError
from memfit.jobfiles.files import parse_toml
from memfit.jobfiles.reader import flatten
from memfit.jobfiles.yaml_edit import EditRefusedError, Keys

_HEADER = re.compile(r"^\s*\[\s*([A-Za-z0-9_.\-]+)\s*\]\s*(#.*)?$")
_ARRAY_HEADER = re.compile(r"^\s*\[\[")
#: ``key = scalar  # comment`` (a scalar: a quoted string without escapes, or a bare token)
_LINE = r"^(\s*{key}\s*=\s*)(\"[^\"\\\n]*\"|'[^'\n]*'|[^\s#\[\{{\"']+)(\s*(#.*)?)$"


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and '"' not in value and "\\" not in value:
        return f'"{value}"'
    raise EditRefusedError(
        f"memfit writes whole numbers, switches and plain strings, not {value!r}"
    )


def _hand(keys: Keys) -> str:
    return ", ".join(f"{k} = {toml_value(v)}" for k, v in keys)


def set_toml(text: str, keys: Keys, *, source: str) -> str:
    """``text`` with each dotted key of ``keys`` set (checked by :func:`check_toml_edit`)."""
    lines = text.splitlines(keepends=True)
    for key, value in keys:
        section, _, name = key.rpartition(".")
        lines = _set_line(lines, section, name, toml_value(value), source=source, keys=keys)
    new = "".join(lines)
    check_toml_edit(text, new, keys, source=source)
    return new


def _sections(lines: list[str]) -> list[tuple[str | None, int, int]]:
    """``(section, first line, end line)`` of each table (``None``: the keys before any)."""
    out: list[tuple[str | None, int, int]] = []
    name: str | None = None
    start = 0
    for i, line in enumerate(lines):
        m = _HEADER.match(line)
        if m or _ARRAY_HEADER.match(line):
            out.append((name, start, i))
            name, start = (m.group(1) if m else "[["), i + 1
    out.append((name, start, len(lines)))
    return out


def _set_line(
    lines: list[str], section: str, name: str, value: str, *, source: str, keys: Keys
) -> list[str]:
    pattern = re.compile(_LINE.format(key=re.escape(name)))
    tables = [t for t in _sections(lines) if t[0] == section]
    if len(tables) > 1:
        raise EditRefusedError(f"{source}: [{section}] appears twice; set by hand: {_hand(keys)}")
    if not tables:
        tail = "" if not lines or lines[-1].endswith("\n") else "\n"
        return [*lines, f"{tail}\n[{section}]\n{name} = {value}\n"]
    _, start, end = tables[0]
    for i in range(start, end):
        m = pattern.match(lines[i].rstrip("\r\n"))
        if m:
            newline = lines[i][len(lines[i].rstrip("\r\n")) :]
            lines[i] = f"{m.group(1)}{value}{m.group(3)}{newline}"
            return lines
    last = start
    for i in range(start, end):
        if lines[i].strip() and not lines[i].lstrip().startswith("#"):
            last = i + 1
    return [*lines[:last], f"{name} = {value}\n", *lines[last:]]


def check_toml_edit(old_text: str, new_text: str, keys: Keys, *, source: str) -> None:
    """Refuse an edit that does anything but set ``keys``."""
    hand = _hand(keys)
    try:
        old = flatten(parse_toml(old_text, source))
        new = flatten(parse_toml(new_text, source))
    except SpecError as exc:
        raise EditRefusedError(f"{exc}; set by hand: {hand}") from None
    want = dict(old)
    for key, value in keys:
        for k in [
            k for k in want if k == key or key.startswith(k + ".") or k.startswith(key + ".")
        ]:
            del want[k]  # the key's old value, or an empty table it now fills
        want[key] = value
    for key in sorted(set(want) | set(new)):
        if key not in new or key not in want or new[key] != want[key]:
            raise EditRefusedError(
                f"memfit's edit of {source} would change {key} in a way it did not mean to; "
                f"set by hand: {hand}"
            )
