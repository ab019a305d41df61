"""Set keys in a YAML file's text line by line, keeping its comments and layout.

The editor handles block mappings — how training configs are written: a key's line is replaced
in place (its comment and ``&anchor`` kept), a missing key is added at the end of its block, keys
go before a document end marker (``...``). It refuses, naming the line, what it cannot edit by
lines: a flow mapping (``train: {…}``) or alias (``train: *base``) on the way to a key, a key
whose value spans several lines (a block, ``|`` / ``>`` text, a multi-line list), an anchored
value that an alias repeats elsewhere (changing it would change the alias too). Whatever the
editor does, :func:`memfit.jobfiles.edit_check.check_edit` then parses the result and refuses an
edit that changes anything else — the net under every construct not listed here.
"""

from __future__ import annotations

import re
from typing import Any

from memfit.errors import SpecError

Keys = list[tuple[str, Any]]
_DOC_END = re.compile(r"^(\.\.\.|---)(\s.*)?$")
_ANCHOR = re.compile(r"^&([^\s\[\]{},]+)\s*")


class EditRefusedError(SpecError):
    """memfit cannot make this edit to the user's file safely; nothing is written."""


def yaml_scalar(value: Any) -> str:
    """``value`` as a YAML 1.1 plain scalar, quoted where ``safe_load`` would read it otherwise."""
    import yaml

    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    text = str(value)
    if isinstance(value, str):
        try:
            same = yaml.safe_load(text) == value
        except yaml.YAMLError:
            same = False
        if not same or ":" in text or "#" in text:
            return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def set_yaml(text: str, keys: Keys, *, source: str = "the file") -> str:
    """Set dotted ``keys`` in YAML ``text`` (see the module docstring)."""
    lines = text.splitlines()
    start = _body_start(lines)
    end = next((i for i in range(start, len(lines)) if _DOC_END.match(lines[i])), len(lines))
    body = lines[start:end]
    for key, value in keys:
        body = _set_line(body, key.split("."), yaml_scalar(value), source=source, offset=start)
    out = lines[:start] + body + lines[end:]
    return "\n".join(out) + ("\n" if text.endswith("\n") or not text else "")


def _body_start(lines: list[str]) -> int:
    """The first line after a leading ``---`` (0 when there is none)."""
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or stripped.startswith("%"):
            continue
        return i + 1 if _DOC_END.match(line) and line.startswith("---") else 0
    return 0


def _key_pattern(indent: int, name: str) -> re.Pattern[str]:
    quoted = rf"(?:{re.escape(name)}|\"{re.escape(name)}\"|'{re.escape(name)}')"
    return re.compile(rf"^{' ' * indent}(?P<key>{quoted})\s*:(?:\s+(?P<rest>.*))?$")


def _split_comment(rest: str) -> tuple[str, str]:
    """``(value, comment)`` of what follows a key's colon (the comment with its ``#``)."""
    m = re.search(r"(?:^|\s)#", rest)
    if m is None or rest.lstrip().startswith(("'", '"')):
        return rest.strip(), ""
    return rest[: m.start()].strip(), rest[m.start() :].strip()


def _block_end(lines: list[str], first: int, end: int, indent: int) -> int:
    """One past the last line of the block of lines after ``first - 1`` indented deeper."""
    i = first
    while i < end and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
        i += 1
    while i > first and not lines[i - 1].strip():
        i -= 1
    return i


def _set_line(
    lines: list[str], path: list[str], value: str, *, source: str, offset: int
) -> list[str]:
    start, end, indent = 0, len(lines), 0
    dotted = ".".join(path)
    for depth, name in enumerate(path):
        pattern = _key_pattern(indent, name)
        found = next((i for i in range(start, end) if pattern.match(lines[i])), None)
        if found is None:
            return _insert(lines, path[depth:], value, start=start, end=end, indent=indent)
        m = pattern.match(lines[found])
        rest, comment = _split_comment((m.group("rest") if m else None) or "")
        where = f"{source} line {found + 1 + offset}"
        child_end = _block_end(lines, found + 1, end, indent)
        if depth == len(path) - 1:
            anchor = _leaf_anchor(lines, rest, child_end > found + 1, where, name, dotted, value)
            new = f"{' ' * indent}{m.group('key') if m else name}: "
            lines = list(lines)
            lines[found] = new + anchor + value + (f"  {comment}" if comment else "")
            return lines
        inline = _ANCHOR.sub("", rest)
        if inline:
            kind = "a flow mapping" if inline.startswith("{") else f"an inline value ({inline!r})"
            if inline.startswith("*"):
                kind = f"an alias ({inline})"
            raise EditRefusedError(
                f"{where}: {name} is written as {kind}; memfit edits only block mappings (one key "
                f"per line): set {dotted}: {value} by hand"
            )
        nxt = next((ln for ln in lines[found + 1 : child_end] if ln.strip()), None)
        indent = (len(nxt) - len(nxt.lstrip())) if nxt else indent + 2
        start, end = found + 1, child_end
    return lines


def _leaf_anchor(
    lines: list[str], rest: str, has_block: bool, where: str, name: str, dotted: str, value: str
) -> str:
    """The ``&anchor`` to keep on a replaced leaf; refusals for values that span lines or that an
    alias repeats."""
    hand = f"set {dotted}: {value} by hand"
    if has_block or rest[:1] in ("|", ">"):
        raise EditRefusedError(
            f"{where}: the value of {name} spans several lines; memfit replaces one line: {hand}"
        )
    if rest[:1] in ("[", "{") and not rest.rstrip().endswith(("]", "}")):
        raise EditRefusedError(
            f"{where}: the value of {name} is a flow collection over several lines: {hand}"
        )
    m = _ANCHOR.match(rest)
    if m is None:
        return ""
    alias = re.compile(rf"\*{re.escape(m.group(1))}(?![^\s\]}},])")
    if any(alias.search(line) for line in lines):
        raise EditRefusedError(
            f"{where}: {name} carries the anchor &{m.group(1)}, which *{m.group(1)} repeats "
            f"elsewhere; changing it would change those too: {hand} (or the alias)"
        )
    return m.group(0).rstrip() + " "


def _insert(
    lines: list[str], path: list[str], value: str, *, start: int, end: int, indent: int
) -> list[str]:
    """Add ``path`` (the missing tail of a dotted key) at the end of the block [start, end)."""
    at = end
    while at > start and not lines[at - 1].strip():
        at -= 1
    new = []
    for j, name in enumerate(path):
        pad = " " * (indent + 2 * j)
        new.append(f"{pad}{name}: {value}" if j == len(path) - 1 else f"{pad}{name}:")
    return lines[:at] + new + lines[at:]
