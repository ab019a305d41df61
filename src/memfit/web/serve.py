"""Running the calculator: uvicorn on a bound socket, the worker pool, the browser."""

from __future__ import annotations

import socket
import sys
import threading
import time
import webbrowser
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from memfit.errors import SpecError
from memfit.web.app import create_app, is_loopback
from memfit.web.scratch import PastedConfigs
from memfit.web.workers import CommandLine, ParserFactory, WorkerPool

#: Time an idle keep-alive connection stays open after a response (uvicorn's own bound; the
#: request head's deadline and the connection slots are memfit.web.connections').
KEEP_ALIVE_S = 5


def bind(host: str, port: int) -> socket.socket:
    """A listening socket, or a SpecError saying why not (port taken, unknown address)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise SpecError(
            f"cannot listen on {host}:{port} ({exc.strerror}): pick another --port or --host"
        ) from None
    sock.listen(64)
    return sock


def _server(app: Any, *, quiet: bool, **slots: Any) -> Any:
    """uvicorn serving ``app`` through the guarded h11 protocol (memfit.web.connections:
    a deadline for each request head, bounded slots per client that idle connections give up;
    ``slots``: its bounds, for tests). uvicorn's ``limit_concurrency`` stays off: it counts idle
    connections, so a few idle sockets made every request a 503."""
    import uvicorn

    from memfit.web.connections import guarded_protocol

    config = uvicorn.Config(
        app,
        http=guarded_protocol(**slots),
        log_level="warning" if quiet else "info",
        timeout_keep_alive=KEEP_ALIVE_S,
        lifespan="on",
    )
    return uvicorn.Server(config)


def serve(
    *,
    run: CommandLine,
    parser_factory: ParserFactory,
    host: str = "127.0.0.1",
    port: int = 8000,
    open_browser: bool = False,
    n_workers: int = 2,
    heavy_timeout_s: float = 300,
) -> int:
    """Serve until Ctrl-C. Returns the exit code. ``run`` and ``parser_factory``: the command
    line the API answers for (:func:`memfit.web.app.create_app`)."""
    sock = bind(host, port)
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{sock.getsockname()[1]}/"
    if not is_loopback(host):
        print(
            f"memfit web: listening on {host}, beyond this machine: anyone who can reach it can "
            "run estimates (local paths are refused)",
            file=sys.stderr,
        )
    pool = WorkerPool(
        run=run,
        parser_factory=parser_factory,
        n_workers=n_workers,
        n_heavy=1,
        heavy_timeout_s=heavy_timeout_s,
    )
    try:
        app = create_app(run=run, parser_factory=parser_factory, pool=pool, host=host)
        server = _server(app, quiet=False)
        print(f"memfit web: {url}  (Ctrl-C stops)", file=sys.stderr)
        if open_browser:
            threading.Timer(0.5, webbrowser.open, args=(url,)).start()
        server.run(sockets=[sock])
    finally:
        pool.close()
        sock.close()
    return 0


@contextmanager
def running(
    *,
    run: CommandLine,
    parser_factory: ParserFactory,
    n_workers: int = 2,
    heavy_timeout_s: float = 120,
    pasted: PastedConfigs | None = None,
    **slots: Any,
) -> Iterator[str]:
    """A server on a free loopback port in a background thread, for tests and benchmarks:
    yields its base URL, stops it (and its workers) on exit. ``slots``: the connection bounds
    (:func:`memfit.web.connections.guarded_protocol`'s arguments); ``pasted``: the scratch
    folder of pasted configs (the app's own when None)."""
    sock = bind("127.0.0.1", 0)
    pool = WorkerPool(
        run=run, parser_factory=parser_factory, n_workers=n_workers, heavy_timeout_s=heavy_timeout_s
    )
    app = create_app(run=run, parser_factory=parser_factory, pool=pool, pasted=pasted)
    server = _server(app, quiet=True, **slots)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        pool.close()
        sock.close()
