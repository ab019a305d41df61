"""YAML read with limits checked before any Python object is built: nesting depth, nodes and
aliases (as expanded: an alias counts every node it stands for).

``yaml.safe_load`` builds no code, but it has no bounds: a 1 KB "billion laughs" file (aliases of
aliases) expands to millions of nodes when memfit walks the result (``check`` went past 6 GB), and
YAML nested ~1,000 deep overflows PyYAML's recursive composer (a RecursionError). Here the
parser's events are scanned first (PyYAML's parser is a loop, not recursion) for depth and size,
the node graph is composed and walked once counting every node an alias expands to, and only
then is the document constructed. Each limit is far past a real job file and is named in the
refusal.
"""

from __future__ import annotations

from typing import Any

from memfit.errors import SpecError

#: Deepest nesting of mappings / sequences (training configs nest about 5 levels).
MAX_YAML_DEPTH = 64
#: Most nodes (scalars, mappings, sequences), counting each alias as the nodes it stands for; a
#: large real config has a few thousand.
MAX_YAML_NODES = 200_000
#: Most ``*alias`` uses in one file (anchors are reused a handful of times in real configs).
MAX_YAML_ALIASES = 10_000


def safe_load(text: str, source: str) -> Any:
    """``yaml.safe_load(text)`` within the limits above; a SpecError naming ``source``, the
    limit and its value when the text is past one, or when it is not valid YAML."""
    import yaml

    try:
        _scan_events(yaml, text, source)
        node = yaml.compose(text, Loader=_fast_loader(yaml))
        if node is None:
            return None
        _count_expanded(yaml, node, source)
        return yaml.SafeLoader("").construct_document(node)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" (line {where.line + 1})" if where is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(f"{source}: not valid YAML{at}: {problem}") from None


def _fast_loader(yaml: Any) -> Any:
    """libyaml's safe loader where PyYAML was built with it (the same YAML 1.1 resolver, ~10x
    faster), else the pure-Python one; either builds nodes, never objects, here."""
    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _scan_events(yaml: Any, text: str, source: str) -> None:
    """Depth, node and alias counts from the parser's events (no tree is built)."""
    depth = nodes = aliases = 0
    for event in yaml.parse(text, Loader=_fast_loader(yaml)):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                raise _past(source, f"nests deeper than {MAX_YAML_DEPTH} levels", "MAX_YAML_DEPTH")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
        elif isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_YAML_ALIASES:
                raise _past(
                    source, f"uses more than {MAX_YAML_ALIASES:,} aliases", "MAX_YAML_ALIASES"
                )
        if isinstance(event, yaml.NodeEvent):
            nodes += 1
            if nodes > MAX_YAML_NODES:
                raise _past(source, f"has more than {MAX_YAML_NODES:,} nodes", "MAX_YAML_NODES")


def _count_expanded(yaml: Any, root: Any, source: str) -> None:
    """Walk the composed graph (an alias is the anchored node itself, so shared subtrees are
    visited once per use): the nodes the constructed data will hold when walked."""
    stack, seen = [root], 0
    while stack:
        node = stack.pop()
        seen += 1
        if seen > MAX_YAML_NODES:
            raise _past(
                source,
                f"expands to more than {MAX_YAML_NODES:,} nodes through its aliases",
                "MAX_YAML_NODES",
            )
        if isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                stack += (key, value)


def _past(source: str, what: str, limit: str) -> SpecError:
    return SpecError(
        f"{source}: the YAML {what} (memfit.jobfiles.yaml_load.{limit}); real job files are "
        "far within it: check the file"
    )
