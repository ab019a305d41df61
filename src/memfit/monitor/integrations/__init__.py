"""Framework callbacks that run a :class:`memfit.Monitor` for you.

- ``MemfitTrainerCallback``: a transformers ``TrainerCallback`` (``Trainer(callbacks=[...])``).
- ``MemfitLightningCallback``: a PyTorch Lightning ``Callback`` (``Trainer(callbacks=[...])``).
- ``MemfitPreflight`` / ``MemfitLightningPreflight``: the pre-flight estimate before the first
  step (transformers ``TrainerCallback`` / Lightning ``Callback``).

Each is imported on first access, so this package needs neither framework installed.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_WHERE = {
    "MemfitTrainerCallback": "memfit.monitor.integrations.transformers_callback",
    "MemfitLightningCallback": "memfit.monitor.integrations.lightning_callback",
    "MemfitPreflight": "memfit.monitor.integrations.preflight",
    "MemfitLightningPreflight": "memfit.monitor.integrations.lightning",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_WHERE[name]), name)
