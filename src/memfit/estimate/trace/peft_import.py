"""peft on the meta device without importing bitsandbytes: the trace's LoRA wrapping.

peft 0.21 imports bitsandbytes when peft itself is imported (``peft/helpers.py``: ``try: import
bitsandbytes``) and again each time ``get_peft_model`` dispatches a layer
(``peft/tuners/lora/model.py``: ``if is_bnb_4bit_available(): from .bnb import ...``), only to
ask whether the layer is a bitsandbytes one. bitsandbytes 0.50 in turn imports torch's compiler
stack (``torch._inductor.compile_fx``, ``torch._functorch.aot_autograd``, networkx): measured
with ``python -X importtime``, ~3 s of a cold process on this 2-core machine, the largest part
of peft's import.

The trace never gives peft a bitsandbytes layer: it wraps the model's plain ``nn.Linear`` layers
on the meta device, and replaces the base layers by its own stand-ins after the wrapping
(:func:`memfit.estimate.trace.quantized.quantize_`). For such layers every bitsandbytes
dispatcher declines (``isinstance(target, bnb.nn.Linear4bit)`` is false) and peft's default
``Linear`` wraps them, whether bitsandbytes is installed or not; so while the trace imports peft
and wraps, :func:`without_bitsandbytes` makes ``import bitsandbytes`` fail as if it were not
installed. Afterwards everything is as it was: the entry is removed, peft's and transformers'
cached availability answers are cleared, and where peft was first imported inside
(``peft.helpers.bnb`` left ``None``) that name gets a stand-in that imports bitsandbytes on first
use. A real model (:mod:`memfit.apply.lora`) is wrapped outside it, with bitsandbytes.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
from collections.abc import Iterator
from typing import Any

#: The module whose import is held off, and the cached availability answers that read it.
HELD = "bitsandbytes"
_CACHED = (
    ("peft.import_utils", "is_bnb_available"),
    ("peft.import_utils", "is_bnb_4bit_available"),
    ("transformers.utils.import_utils", "is_bitsandbytes_available"),
)


class BitsandbytesOnDemand:
    """Stands for the bitsandbytes module where peft was imported without it: the first
    attribute asked for imports it (as ``import bitsandbytes`` would have) and answers."""

    def __getattr__(self, name: str) -> Any:
        return getattr(importlib.import_module(HELD), name)


@contextlib.contextmanager
def without_bitsandbytes() -> Iterator[None]:
    """Inside: ``import bitsandbytes`` raises ImportError and peft sees no bitsandbytes (see the
    module docstring). Nothing changes where it is imported already or not installed."""
    if HELD in sys.modules or importlib.util.find_spec(HELD) is None:
        yield
        return
    sys.modules[HELD] = None  # type: ignore[assignment]  # the import system's "not importable"
    _clear_cached()
    try:
        yield
    finally:
        if HELD in sys.modules and sys.modules[HELD] is None:
            del sys.modules[HELD]
        _clear_cached()
        helpers = sys.modules.get("peft.helpers")
        if helpers is not None and getattr(helpers, "bnb", False) is None:
            helpers.bnb = BitsandbytesOnDemand()  # type: ignore[attr-defined]


def _clear_cached() -> None:
    for module_name, name in _CACHED:
        fn = getattr(sys.modules.get(module_name), name, None)
        clear = getattr(fn, "cache_clear", None)
        if clear is not None:
            clear()


__all__ = ["HELD", "BitsandbytesOnDemand", "without_bitsandbytes"]
