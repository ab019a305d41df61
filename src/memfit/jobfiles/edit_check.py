"""The check after every edit to a user's file: the new text is parsed with the loader memfit
reads with (``yaml.safe_load`` / strict JSON) and compared, key by key, with the old one. The
edit stands only if (a) it parses, (b) every key it did not mean to change keeps its value, and
(c) the keys it set hold their new values; otherwise :class:`EditRefusedError` says which key
went wrong, and nothing is written. This makes the line editor safe for constructs it does not
know (merge keys, tags, odd quoting, a YAML feature added later)."""

from __future__ import annotations

import json
from typing import Any

from memfit.jobfiles.yaml_edit import EditRefusedError, Keys, yaml_scalar

#: Leaves compared at most: an alias-heavy file expands when flattened (a YAML "billion laughs"
#: is a few hundred bytes); past this the edit is refused rather than checked for minutes.
MAX_LEAVES = 200_000
_EMPTY = object()


def check_edit(old_text: str, new_text: str, keys: Keys, *, is_yaml: bool, source: str) -> None:
    """Refuse (:class:`EditRefusedError`) an edit of ``old_text`` into ``new_text`` that does
    anything but set ``keys`` (dotted names)."""
    hand = ", ".join(f"{k}: {yaml_scalar(v)}" for k, v in keys)
    old = _load(old_text, is_yaml=is_yaml, source=source, hand=hand, what="the file")
    new = _load(new_text, is_yaml=is_yaml, source=source, hand=hand, what="the edited file")
    if is_yaml:
        added = _duplicate_keys(new_text) - _duplicate_keys(old_text)
        if added:
            raise EditRefusedError(
                f"memfit's edit of {source} would set {sorted(added)[0]} twice (the key is "
                f"written in a way memfit did not find); set by hand: {hand}"
            )
    want = _flatten(old, source=source, hand=hand)
    for key, value in keys:
        path = tuple(key.split("."))
        for k in [k for k in want if k[: len(path)] == path or path[: len(k)] == k]:
            del want[k]  # the key's old value, or a scalar it replaces on the way
        want[path] = value
    got = _flatten(new, source=source, hand=hand)
    for k in sorted(set(want) | set(got), key=str):
        before, after = want.get(k, _EMPTY), got.get(k, _EMPTY)
        if before != after or type(before) is not type(after):
            raise EditRefusedError(
                f"memfit's edit of {source} would leave {'.'.join(k)} = {_show(after)} instead "
                f"of {_show(before)} (a YAML construct memfit does not edit by lines: an "
                f"anchor, alias, merge key or tag?); nothing was written: set by hand: {hand}"
            )


def _show(value: Any) -> str:
    return "(absent)" if value is _EMPTY else repr(value)


def _load(text: str, *, is_yaml: bool, source: str, hand: str, what: str) -> Any:
    if not is_yaml:
        try:
            return json.loads(text)
        except ValueError as exc:
            raise EditRefusedError(
                f"{what} {source} is not valid JSON ({exc}): set by hand: {hand}"
            ) from None
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise EditRefusedError(
            f"memfit's edit of {source} would not parse{at} "
            f"({getattr(exc, 'problem', None) or exc}); nothing was written: set by hand: {hand}"
        ) from None


def _flatten(data: Any, *, source: str, hand: str) -> dict[tuple[str, ...], Any]:
    """Every leaf of ``data`` by its path (list items by index; empty containers are leaves)."""
    out: dict[tuple[str, ...], Any] = {}
    stack: list[tuple[tuple[str, ...], Any]] = [((), data)]
    while stack:
        path, node = stack.pop()
        items = (
            list(node.items())
            if isinstance(node, dict)
            else list(enumerate(node))
            if isinstance(node, list)
            else None
        )
        if not items:
            out[path] = node
        else:
            stack.extend((path + (str(k),), v) for k, v in items)
        if len(out) + len(stack) > MAX_LEAVES:
            raise EditRefusedError(
                f"{source} expands to over {MAX_LEAVES:,} values (aliases?): memfit does not "
                f"check an edit that large; set by hand: {hand}"
            )
    return out


def _duplicate_keys(text: str) -> set[str]:
    """Keys written twice in one mapping (PyYAML keeps the last silently), as dotted paths."""
    import yaml

    dups: set[str] = set()
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return dups
    stack: list[tuple[str, Any]] = [("", root)]
    seen_nodes: set[int] = set()
    while stack:
        prefix, node = stack.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            names: set[str] = set()
            for k, v in node.value:
                name = str(getattr(k, "value", ""))
                if name in names and name != "<<":
                    dups.add(prefix + name)
                names.add(name)
                stack.append((prefix + name + ".", v))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((prefix, v) for v in node.value)
    return dups
