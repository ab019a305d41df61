"""The web calculator: one Starlette application, the page and its JSON API.

Routes (all GET; the server takes no request bodies):

- ``/``: the calculator page (static HTML, CSS and JS shipped in ``memfit/web/static``; nothing is
  fetched from elsewhere, and the Content-Security-Policy forbids it);
- ``/api/estimate``, ``/api/plan``, ``/api/fit``, ``/api/upgrade``: the query as that command's
  flags (``?model=gpt2&batch=4&seq=1024``); the body is exactly what ``memfit COMMAND ... --json``
  prints, the exit code in the ``X-Memfit-Exit`` header, the command line in ``X-Memfit-Command``;
  a bad input is a 400 ``{"error": the CLI's message, "exit_code": 2}``;
- ``/api/command/{command}``: the shell command a query stands for (``memfit estimate ...``);
- ``/api/schema``: the form's fields (the one flags table, through the CLI's parser), the bundled
  models, the GPU catalog, the engines;
- ``/api/gpu-table?device_used_bytes=N[&device_used_bytes_high=M][&unified_memory_bytes=P]``:
  fits-which-GPU rows (P: paged optimizer states, evictable under the verdict rule).

Bounds: the URL (so every input) is at most :data:`MAX_URL_BYTES`; jobs run in a
:class:`~memfit.web.workers.WorkerPool` (bounded in number, heavy ones one at a time, each in
time); with the server on a loopback address only ``Host: 127.0.0.1`` / ``localhost`` / ``[::1]``
are served (a web page elsewhere cannot reach it by DNS rebinding).
"""

from __future__ import annotations

import argparse
import json
from contextlib import asynccontextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from memfit.errors import MemfitError
from memfit.estimate import ENGINES
from memfit.flags import flags_for
from memfit.hardware import list_gpus
from memfit.models import list_bundled
from memfit.version import __version__
from memfit.web.gpu_table import gpu_table
from memfit.web.query import COMMANDS, Job, build_job, options
from memfit.web.scratch import PastedConfigs
from memfit.web.workers import (
    Busy,
    CommandLine,
    Outcome,
    ParserFactory,
    TimedOut,
    WorkerDied,
    WorkerPool,
)

STATIC = Path(__file__).with_name("static")
MAX_URL_BYTES = 16 * 1024
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
#: The page loads only itself: no CDN, no font service, no analytics.
CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)


#: ``Host`` headers a loopback server answers (anything else is a page elsewhere, rebinding DNS).
SERVED_HOSTS = ("127.0.0.1", "localhost", "[::1]")


def request_host(scope: Any) -> str:
    """The request's ``Host`` header without its port (``[::1]:8000`` -> ``[::1]``)."""
    host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), "")
    if host.startswith("["):
        return host[: host.find("]") + 1]
    return host.rsplit(":", 1)[0] if ":" in host else host


def is_loopback(host: str) -> bool:
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def schema(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """What the page builds its form from. ``workload``: the rows of the one flags table that
    ``memfit estimate`` takes (a new row appears in the form by itself); ``options``: every
    option each API command accepts, read from ``parser`` (the CLI's)."""
    workload = [
        {
            "key": f.name[2:],
            "kind": f.kind,
            "choices": list(f.choices) if f.choices else None,
            "default": f.default,
            "help": f.help,
            "always": f.always,
        }
        for f in flags_for("estimate")
    ]
    return {
        "version": __version__,
        "workload": workload,
        "options": {
            c: [asdict(o) | {"key": o.key} for o in options(parser, c).values()] for c in COMMANDS
        },
        "models": [asdict(m) for m in list_bundled()],
        "gpus": [
            {
                "name": g.name,
                "memory_bytes": g.memory_bytes,
                "capacity_bytes": g.capacity_bytes,
                "capacity_measured": g.capacity_measured,
            }
            for g in list_gpus()
        ],
        "engines": list(ENGINES),
    }


def _run_job(pool: WorkerPool, pasted: PastedConfigs, job: Job) -> Outcome:
    """Run ``job`` on ``pool``, its pasted config on disk only meanwhile."""
    if job.config is None:
        return pool.run(job.argv, heavy=job.heavy)
    with pasted.holding(job.config):
        return pool.run(job.argv, heavy=job.heavy)


def create_app(
    *,
    run: CommandLine,
    parser_factory: ParserFactory,
    pool: WorkerPool | None = None,
    host: str = "127.0.0.1",
    pasted: PastedConfigs | None = None,
) -> Any:
    """The ASGI application. ``run`` and ``parser_factory``: the command line the API stands
    for (``memfit web`` passes :func:`memfit.cli.main` and :func:`memfit.cli.build_parser`).
    ``pool``: the workers (made with them, and closed, by the app when None). ``pasted``: the
    scratch folder of pasted configs (a fresh one, removed with the app, when None)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import FileResponse, JSONResponse, Response
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    state: dict[str, Any] = {"pool": pool}
    allow_paths = is_loopback(host)
    configs = pasted if pasted is not None else PastedConfigs()
    state["pasted"] = configs
    parser = parser_factory()
    cached_schema = schema(parser)

    @asynccontextmanager
    async def lifespan(app: Any) -> Any:
        own = state["pool"] is None
        if own:
            state["pool"] = WorkerPool(run=run, parser_factory=parser_factory)
        try:
            yield
        finally:
            if own:
                state["pool"].close()
            if pasted is None:
                configs.close()

    def error(status: int, message: str, exit_code: int = 2) -> JSONResponse:
        return JSONResponse({"error": message, "exit_code": exit_code}, status_code=status)

    async def index(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers={"Content-Security-Policy": CSP})

    async def api_schema(request: Request) -> Response:
        return JSONResponse(cached_schema)

    async def api_command(request: Request) -> Response:
        try:
            job = build_job(
                parser,
                request.path_params["command"],
                request.query_params.multi_items(),
                pasted=configs,
                allow_paths=allow_paths,
            )
        except MemfitError as exc:
            return error(400, f"memfit: error: {exc}")
        return JSONResponse({"command": job.command_line(), "json": job.command_line(json=True)})

    async def api_gpu_table(request: Request) -> Response:
        q = request.query_params
        try:
            used = int(q.get("device_used_bytes", ""))
            high = int(q["device_used_bytes_high"]) if "device_used_bytes_high" in q else None
            paged = int(q.get("unified_memory_bytes", "0") or 0)
            return JSONResponse(gpu_table(used, high, paged))
        except ValueError:
            return error(400, "memfit: error: device_used_bytes must be a whole number of bytes")
        except MemfitError as exc:
            return error(400, f"memfit: error: {exc}")

    async def api_run(request: Request) -> Response:
        from anyio import to_thread

        command = request.path_params["command"]
        try:
            job = build_job(
                parser,
                command,
                request.query_params.multi_items(),
                pasted=configs,
                allow_paths=allow_paths,
            )
            outcome = await to_thread.run_sync(lambda: _run_job(state["pool"], configs, job))
        except Busy as exc:
            return error(503, f"memfit: error: {exc}")
        except TimedOut as exc:
            return error(504, f"memfit: error: {exc}")
        except WorkerDied as exc:
            return error(500, f"memfit: error: {exc}", exit_code=70)
        except MemfitError as exc:
            return error(400, f"memfit: error: {exc}")
        headers = {"X-Memfit-Exit": str(outcome.exit_code), "X-Memfit-Command": job.command_line()}
        if job.not_taken:
            headers["X-Memfit-Not-Taken"] = ", ".join(job.not_taken)
        try:  # 0 fits, 1 does not fit, 2 for upgrade's "undetermined": all print the JSON
            body = json.loads(outcome.stdout)
        except ValueError:
            status = 500 if outcome.exit_code not in (1, 2) else 400
            return error(status, outcome.error_line, outcome.exit_code)
        return JSONResponse(body, headers=headers)

    async def bound_url(scope: Any, receive: Any, send: Any, app: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
        response = None
        if size > MAX_URL_BYTES:
            response = error(414, f"memfit: error: the request ({size} bytes) is over the limit")
        elif allow_paths and request_host(scope) not in SERVED_HOSTS:
            response = error(400, "memfit: error: this server answers only to localhost")
        if response is not None:
            await response(scope, receive, send)
            return
        await app(scope, receive, send)

    routes = [
        Route("/", index),
        Route("/api/schema", api_schema),
        Route("/api/gpu-table", api_gpu_table),
        Route("/api/command/{command}", api_command),
        Route("/api/{command}", api_run),
        Mount("/static", app=StaticFiles(directory=STATIC), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)

    async def asgi(scope: Any, receive: Any, send: Any) -> None:
        await bound_url(scope, receive, send, app)

    asgi.state = state  # type: ignore[attr-defined]
    return asgi
