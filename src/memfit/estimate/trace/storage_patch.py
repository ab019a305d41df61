"""The one patch of ``torch.UntypedStorage.resize_``, shared and reference-counted.

FSDP frees unsharded parameters with ``UntypedStorage.resize_(0)``, which no dispatch mode sees, so
memfit's storage trackers need a hook there. Each tracker used to save the method and put it back
on exit, which leaves the class patched when two trackers close out of order (A saves the
original, B saves A's wrapper, A restores the original, B restores A's wrapper) or live in two
threads. Here one wrapper is installed when the first tracker subscribes and the original is put
back when the last one leaves, in whatever order, from whatever thread. The wrapper calls the
original first (the user's resize happens, and its errors propagate unchanged), then tells every
subscriber; a subscriber's failure is swallowed: a memory counter must never break the resize.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Protocol


class ResizeListener(Protocol):
    def on_storage_resize(self, storage: Any, size: int) -> None: ...


_lock = threading.Lock()
_listeners: list[ResizeListener] = []
_original: Any = None
_wrapper: Any = None


def subscribe(listener: ResizeListener) -> None:
    """Start telling ``listener`` about resizes (installs the wrapper for the first one)."""
    global _original, _wrapper
    import torch

    with _lock:
        if any(x is listener for x in _listeners):
            return
        if not _listeners:
            _original = torch.UntypedStorage.resize_
            original = _original

            def resize_(storage: Any, size: int) -> Any:
                result = original(storage, size)
                for each in tuple(_listeners):
                    # a counter must never break the user's op
                    with contextlib.suppress(Exception):
                        each.on_storage_resize(storage, size)
                return result

            _wrapper = resize_
            torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign,assignment]
        _listeners.append(listener)


def unsubscribe(listener: ResizeListener) -> None:
    """Stop telling ``listener``; the last one to leave puts the original method back (unless
    someone patched over memfit's wrapper since: theirs is left in place, and memfit's wrapper,
    with no listener left, only calls through)."""
    global _original, _wrapper
    import torch

    with _lock:
        for i, x in enumerate(_listeners):
            if x is listener:
                del _listeners[i]
                break
        if not _listeners and _original is not None:
            if torch.UntypedStorage.resize_ is _wrapper:
                torch.UntypedStorage.resize_ = _original  # type: ignore[method-assign]
            _original = _wrapper = None


def n_listeners() -> int:
    with _lock:
        return len(_listeners)
