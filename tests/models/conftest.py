"""Guard for the whole tests/models tree: nothing may reach the network.

Both network paths of :mod:`memfit.models.hub` (huggingface_hub and urllib) are replaced by a
function that fails the test; tests that simulate a download patch them again on top.
"""

from __future__ import annotations

import urllib.request

import pytest


def _refuse(*args: object, **kwargs: object) -> None:
    raise AssertionError(f"tests/models must not touch the network (called with {args!r})")


@pytest.fixture(autouse=True)
def _no_network(monkeypatch):
    monkeypatch.setattr(urllib.request, "urlopen", _refuse)
    try:
        import huggingface_hub
    except ImportError:
        return
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", _refuse)
