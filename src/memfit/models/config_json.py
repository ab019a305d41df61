"""Reading and checking a Hugging Face ``config.json`` before anything is built from it.

Three kinds of problem are caught here, each as a ModelConfigError that names the file:

* the file is not JSON (truncated download, HTML error page saved as config.json): the message
  gives the JSON error's line, column and character offset;
* the JSON is not a model config: not an object, no ``model_type``, or structural fields that no
  model could have (``hidden_size`` 0, heads that do not divide the width). All problems are
  reported together;
* the architecture's code is not in transformers but in the repository (``auto_map`` with a
  ``model_type`` transformers does not know): that code would run on this machine, so memfit asks
  for ``--trust-remote-code`` instead of assuming it.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeGuard

from memfit.errors import ModelConfigError
from memfit.units import MiB
from memfit.userfiles import UserFileError, read_text

#: A real config.json is a few kB (the largest bundled one, CLIP's, is 6 kB). Anything over this is
#: a weights file or archive passed by mistake; it is refused before being read into memory.
MAX_CONFIG_BYTES = 16 * MiB

#: Fields that must be positive integers when present: the standard names and the GPT-2/BLOOM and
#: T5 spellings of the same quantities. (The ModelSpec reader checks every spelling of its key
#: table as it reads it; this list stays as it is, since widening it would refuse configs that
#: resolve today, such as per-layer ``num_kv_heads`` lists of repository-code models.)
POSITIVE_INT_FIELDS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
    "intermediate_size",
    "head_dim",
    "n_embd",
    "n_layer",
    "n_head",
    "d_model",
    "num_layers",
    "num_heads",
)
#: (heads field, width field) pairs whose heads must divide the width unless ``head_dim`` is given.
HEADS_DIVIDE_WIDTH = (("num_attention_heads", "hidden_size"), ("n_head", "n_embd"))
#: Sub-configs of multi-part models (CLIP, LLaVA, ...) that are checked with the same rules.
NESTED_CONFIGS = ("text_config", "vision_config")

NEXT_STEP = "re-download it or pass another file"


def read_config_file(path: Path) -> dict[str, Any]:
    """Parse ``path`` as a config.json object (not yet checked; see :func:`check_config`). The
    file is read by :func:`memfit.userfiles.read_text`: a regular file of at most
    ``MAX_CONFIG_BYTES`` (a FIFO, ``/dev/zero`` or a directory is refused, never read)."""
    try:
        text = read_text(path, what="config", max_bytes=MAX_CONFIG_BYTES)
    except UserFileError as e:
        raise ModelConfigError(str(e)) from None
    return parse_config_text(text, where=str(path))


def parse_config_text(text: str, *, where: str) -> dict[str, Any]:
    """Parse config.json text; ``where`` (a path or hub id) starts every error message."""
    if not text.strip():
        raise ModelConfigError(f"{where}: the file is empty; {NEXT_STEP}")
    try:
        config = json.loads(text)
    except RecursionError:
        raise ModelConfigError(
            f"{where}: the JSON is nested too deeply to be a config.json; {NEXT_STEP}"
        ) from None
    except json.JSONDecodeError as e:
        hint = "the file ends early (truncated?)" if e.pos >= len(text.rstrip()) else e.msg
        raise ModelConfigError(
            f"{where}: invalid JSON at line {e.lineno}, column {e.colno} (char {e.pos}): "
            f"{hint}; {NEXT_STEP}"
        ) from None
    except ValueError as e:  # e.g. an integer of more than 4,300 digits (int's own limit)
        raise ModelConfigError(
            f"{where}: a value no config holds: {str(e)[:80]}; {NEXT_STEP}"
        ) from None
    if not isinstance(config, dict):
        raise ModelConfigError(
            f"{where}: the JSON is a {type(config).__name__}, but a config.json is an object "
            f"({{...}}); {NEXT_STEP}"
        )
    return config


#: Families whose ``num_heads`` is a list with one count per stage (SwinConfig).
PER_STAGE_TYPES = ("swin", "swinv2")


def config_problems(config: dict[str, Any], *, prefix: str = "") -> list[str]:
    """Every structural problem of ``config`` (empty when it looks like a real model config)."""
    problems: list[str] = []
    model_type = config.get("model_type")
    if not prefix and model_type is None:
        problems.append("no model_type (every transformers config.json names its architecture)")
    elif model_type is not None and (not isinstance(model_type, str) or not model_type):
        problems.append(f"{prefix}model_type ({model_type!r}) must be a non-empty string")
    architectures = config.get("architectures")
    if architectures is not None and not (
        isinstance(architectures, list) and all(isinstance(a, str) for a in architectures)
    ):
        problems.append(f"{prefix}architectures ({architectures!r}) must be a list of class names")
    for field in POSITIVE_INT_FIELDS:
        value = config.get(field)
        if model_type in PER_STAGE_TYPES and isinstance(value, list) and all(map(_positive, value)):
            continue  # Swin's num_heads: one count per stage
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            problems.append(f"{prefix}{field} ({value!r}) must be a positive integer")
    for heads_key, width_key in HEADS_DIVIDE_WIDTH:
        heads, width = config.get(heads_key), config.get(width_key)
        if (
            _positive(heads)
            and _positive(width)
            and config.get("head_dim") is None
            and width % heads
        ):
            problems.append(
                f"{prefix}{heads_key} ({heads}) must divide {width_key} ({width}) "
                "unless head_dim is given"
            )
    heads, kv = config.get("num_attention_heads"), config.get("num_key_value_heads")
    if _positive(heads) and _positive(kv) and heads % kv:
        problems.append(
            f"{prefix}num_key_value_heads ({kv}) must divide num_attention_heads ({heads})"
        )
    for key in NESTED_CONFIGS:
        if isinstance(config.get(key), dict):
            problems += config_problems(config[key], prefix=f"{prefix}{key}.")
    return problems


def _positive(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def check_config(config: dict[str, Any], *, where: str, trust_remote_code: bool) -> None:
    """Raise one ModelConfigError listing every problem, or the remote-code refusal."""
    problems = config_problems(config)
    if len(problems) == 1:
        raise ModelConfigError(f"{where}: {problems[0]}; fix the file or pass another one")
    if problems:
        raise ModelConfigError(
            f"{where}: {len(problems)} problems: {'; '.join(problems)}; "
            "fix the file or pass another one"
        )
    if not trust_remote_code and needs_remote_code(config):
        auto_map = config.get("auto_map")
        entries = auto_map.values() if isinstance(auto_map, dict) else ()
        code = ", ".join(sorted({str(v) for v in entries})) or "auto_map"
        raise ModelConfigError(
            f"{where}: model_type {config['model_type']!r} is not built into transformers; its "
            f"code comes from the model repository ({code}). Pass --trust-remote-code "
            "(trust_remote_code=True) only if you trust that repository, since its Python code "
            "will run on this machine"
        )


def needs_remote_code(config: dict[str, Any]) -> bool:
    """True when the config relies on repository code transformers does not ship.

    Only decidable with transformers installed; without it the answer is False and the question
    is left to whatever later builds the model.
    """
    if "auto_map" not in config:
        return False
    known = builtin_model_types()
    return known is not None and config.get("model_type") not in known


#: ``("llama", "LlamaConfig")`` tuples and ``"llama": "LlamaConfig"`` pairs in transformers' source.
_MAPPING_ENTRIES = (
    re.compile(r'\(\s*"([\w.-]+)",\s*"\w+Config"\s*\)'),
    re.compile(r'"([\w.-]+)":\s*"\w+Config"'),
)


@lru_cache(maxsize=1)
def builtin_model_types() -> frozenset[str] | None:
    """The ``model_type`` values installed transformers builds itself; None without transformers.

    Importing ``transformers.models.auto`` imports torch (about 1.5 s), which the analytic path
    must not pay just to read a config. Unless transformers is already loaded, the mapping is read
    from its source files instead (found with ``importlib.util.find_spec``, which imports
    nothing): the ``CONFIG_MAPPING_NAMES`` entries, or, for a version that lays the mapping out
    differently, the names of the ``transformers/models/<type>/`` packages.
    """
    loaded = sys.modules.get("transformers.models.auto.configuration_auto")
    if loaded is not None:
        return frozenset(loaded.CONFIG_MAPPING_NAMES)
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return None
    models = Path(next(iter(spec.submodule_search_locations))) / "models"
    types: set[str] = set()
    for name in ("auto_mappings.py", "configuration_auto.py"):
        source = models / "auto" / name
        if source.is_file():
            text = source.read_text(encoding="utf-8")
            types.update(t for pattern in _MAPPING_ENTRIES for t in pattern.findall(text))
    if not types:
        types = {p.name for p in models.iterdir() if (p / "__init__.py").is_file()}
    return frozenset(types)
