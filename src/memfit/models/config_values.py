"""The config.json values the trace engine hands to transformers, checked before the trace.

transformers 5 builds configs as strict dataclasses (``huggingface_hub.dataclasses.strict``): a
float field given an int (``"rms_norm_eps": 1``) or a string is refused with a traceback from deep
inside ``AutoConfig``; a string ``rope_theta`` passes the config and fails in the rotary
embedding's ``base ** arange(...)``; an unknown ``hidden_act`` fails as a ``KeyError`` of
``ACT2FN``. Those keys are not ModelSpec fields (the analytic engine does not need them, and can
still answer), so they are checked here, for the trace only:

* :func:`value_problems` lists every value of the wrong kind, naming the key, the value and the
  rule (an int where a float is expected is not a problem: :func:`with_float_values` writes it as
  the float it means, as ``json.dumps(1.0)`` from another writer would have);
* activation names are checked by the trace engine against transformers' ``ACT2FN`` (this module
  stays torch- and transformers-free).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

#: Float-typed fields of transformers config classes that bundled and hub configs set (epsilons,
#: rotary bases and scales, init ranges); the ``rope_parameters`` / ``rope_scaling`` dict's
#: float entries are checked too.
FLOAT_KEYS = (
    "rms_norm_eps",
    "layer_norm_eps",
    "layer_norm_epsilon",
    "norm_eps",
    "rope_theta",
    "rotary_emb_base",
    "initializer_range",
    "initializer_factor",
)
ROPE_DICT_KEYS = ("rope_parameters", "rope_scaling")
ROPE_FLOAT_KEYS = ("rope_theta", "factor", "low_freq_factor", "high_freq_factor")
#: Keys naming an activation function (``ACT2FN`` names) in the transformers families.
ACTIVATION_KEYS = ("hidden_act", "hidden_activation", "activation_function")
#: Sub-configs transformers builds with the same rules.
NESTED = ("text_config", "vision_config")


def _is_real(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def value_problems(config: Mapping[str, Any], *, prefix: str = "") -> list[str]:
    """Every value the trace engine's transformers would refuse or crash on (empty if none)."""
    out: list[str] = []
    for key in FLOAT_KEYS:
        value = config.get(key)
        if value is not None and not _is_real(value):
            out.append(f"{prefix}{key} ({value!r}) must be a number")
        elif value is not None and value < 0:
            out.append(f"{prefix}{key} ({value!r}) must not be negative")
    for key in ROPE_DICT_KEYS:
        rope = config.get(key)
        if rope is None:
            continue
        if not isinstance(rope, Mapping):
            out.append(f"{prefix}{key} ({rope!r}) must be an object")
            continue
        for sub in ROPE_FLOAT_KEYS:
            value = rope.get(sub)
            if value is not None and not _is_real(value):
                out.append(f"{prefix}{key}.{sub} ({value!r}) must be a number")
    for key in ACTIVATION_KEYS:
        value = config.get(key)
        if value is not None and not isinstance(value, str):
            out.append(f"{prefix}{key} ({value!r}) must be an activation name (a string)")
    for key in NESTED:
        if isinstance(config.get(key), Mapping):
            out += value_problems(config[key], prefix=f"{prefix}{key}.")
    return out


def unknown_activations(
    config: Mapping[str, Any], known: frozenset[str], *, prefix: str = ""
) -> list[str]:
    """The activation names in ``config`` that are not in ``known`` (transformers' ``ACT2FN``)."""
    out = [
        f"{prefix}{key} ({config[key]!r}) is not an activation transformers knows "
        f"(e.g. {', '.join(sorted(known)[:8])}...)"
        for key in ACTIVATION_KEYS
        if isinstance(config.get(key), str) and config[key] not in known
    ]
    for key in NESTED:
        if isinstance(config.get(key), Mapping):
            out += unknown_activations(config[key], known, prefix=f"{prefix}{key}.")
    return out


def with_float_values(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``config`` whose float fields given as JSON integers are floats."""
    out = dict(config)
    for key in FLOAT_KEYS:
        if _is_real(out.get(key)):
            out[key] = float(out[key])
    for key in ROPE_DICT_KEYS:
        if isinstance(out.get(key), Mapping):
            rope = dict(out[key])
            for sub in ROPE_FLOAT_KEYS:
                if _is_real(rope.get(sub)):
                    rope[sub] = float(rope[sub])
            out[key] = rope
    for key in NESTED:
        if isinstance(out.get(key), Mapping):
            out[key] = with_float_values(out[key])
    return out
