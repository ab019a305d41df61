"""``timm/NAME`` and ``torchvision/NAME``: image models built by those libraries, by name.

memfit builds them with the library's own constructor and no weights (``timm.create_model(NAME,
pretrained=False)``, ``torchvision.models.get_model(NAME, weights=None)``) on the meta device and
traces them like a factory model (:mod:`memfit.estimate.trace.factory`). The libraries are
optional: without them the MODEL string is a clear one-line error (exit 2), never a hub lookup
(``timm/...`` is also an organisation on the hub, whose repositories are timm checkpoints, not
transformers configs). Torch-free: only ``importlib.util.find_spec`` looks for the package.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from memfit.errors import MissingDependencyError

#: prefix → (the package it needs, the pip command that installs it).
ZOO_PREFIXES: dict[str, tuple[str, str]] = {
    "timm": ("timm", "pip install timm torchvision"),
    "torchvision": ("torchvision", "pip install torchvision"),
}


def zoo_source(text: str) -> Any:
    """The ModelSource of ``timm/NAME`` / ``torchvision/NAME``; MissingDependencyError (exit 2)
    when the library is not installed."""
    from memfit.models.source import ModelSource

    prefix, _, name = text.partition("/")
    package, pip = ZOO_PREFIXES[prefix]
    if not name:
        raise MissingDependencyError(f"{text!r} names no model; pass {prefix}/MODEL_NAME")
    if importlib.util.find_spec(package) is None:
        raise MissingDependencyError(
            f"{package} is not installed: {pip} (memfit builds {text!r} with {package}'s own "
            "constructor, without weights)"
        )
    return ModelSource.of_factory(text)
