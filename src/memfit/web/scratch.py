"""Where a pasted config.json lives while its request runs: a bounded scratch folder, emptied
after each request.

The worker runs the command line ``memfit estimate FOLDER``, so a pasted config must be a file
while its job runs, and only then (issue 33: every distinct config used to stay on disk until
the server stopped, 300 requests -> 301 folders). :class:`PastedConfigs` writes the config when a
request starts (:meth:`PastedConfigs.holding`) under a name of its content, counts the requests
that use it (two requests with the same config share the folder) and removes the folder when the
last one ends, whatever the outcome. At most :data:`MAX_HELD_CONFIGS` distinct configs are on
disk at once (each is at most ``CONFIG_MAX_CHARS``); a request beyond that is told the server is
busy (:class:`~memfit.web.workers.Busy`, a 503), and nothing is ever left behind.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from memfit.web.workers import Busy

#: Distinct pasted configs on disk at once (the requests in flight: workers plus those waiting).
MAX_HELD_CONFIGS = 32


class PastedConfigs:
    """The server's scratch folder for pasted configs (``root``: a fresh temporary one when
    None, removed by :meth:`close`)."""

    def __init__(self, root: Path | None = None, *, max_held: int = MAX_HELD_CONFIGS) -> None:
        self._own = root is None
        self.root = Path(tempfile.mkdtemp(prefix="memfit-web-")) if root is None else root
        self.max_held = max_held
        self._users: dict[Path, int] = {}
        self._lock = threading.Lock()

    def folder_for(self, text: str) -> Path:
        """The folder ``text`` is written to while a request uses it (a name of its content)."""
        return self.root / f"pasted-{hashlib.sha256(text.encode()).hexdigest()[:16]}"

    @contextmanager
    def holding(self, text: str) -> Iterator[Path]:
        """``text`` as ``FOLDER/config.json`` for the ``with`` block; removed after the last
        request that uses it. Raises Busy when :attr:`max_held` configs are already held."""
        folder = self.folder_for(text)
        with self._lock:
            if folder not in self._users:
                if len(self._users) >= self.max_held:
                    raise Busy(
                        f"{self.max_held} pasted configs are being estimated: try again when "
                        "one finishes"
                    )
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "config.json").write_text(text, encoding="utf-8")
            self._users[folder] = self._users.get(folder, 0) + 1
        try:
            yield folder
        finally:
            with self._lock:
                self._users[folder] -= 1
                if not self._users[folder]:
                    del self._users[folder]
                    shutil.rmtree(folder, ignore_errors=True)

    def held(self) -> list[Path]:
        """The folders on disk now (for tests and the server's own checks)."""
        return sorted(p for p in self.root.iterdir() if p.is_dir()) if self.root.exists() else []

    def close(self) -> None:
        if self._own:
            shutil.rmtree(self.root, ignore_errors=True)
