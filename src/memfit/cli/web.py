"""``memfit web``: the local calculator page and its JSON API, added to memfit.cli's parser."""

from __future__ import annotations

import argparse
import functools
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

from memfit.flags import EXIT_BAD_INPUT, port, positive_int
from memfit.web.serve import serve
from memfit.web.workers import CommandLine, ParserFactory

WEB_EXAMPLES = """examples:
  memfit web                       # http://127.0.0.1:8000, this machine only
  memfit web --port 8080 --open    # and open it in the browser
  curl 'http://127.0.0.1:8000/api/estimate?model=gpt2&batch=4&seq=1024&engine=analytic'

The page works offline (no CDN; its script, style and charts are shipped with memfit). The API
answers exactly what `memfit estimate|plan|fit|upgrade ... --json` prints for the same flags.
Needs the web extra: pip install 'memfit[web]'.
"""
INSTALL_HINT = "memfit web needs the web extra: pip install 'memfit[web]' (starlette, uvicorn)"


def register(
    sub: Any, *, run: CommandLine, parser_factory: ParserFactory
) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Add ``web``; return its handler, which serves the command line ``run`` runs on the
    parser ``parser_factory`` builds (:mod:`memfit.cli.entry` passes its own: the web package
    sits below the CLI and takes them injected)."""
    w = sub.add_parser(
        "web",
        help="a local calculator page (and JSON API) for estimates, plans and fits",
        description="Serve the memfit calculator on this machine: model, job and techniques in a "
        "form (state in the URL), the estimate's breakdown as a chart, the fits-which-GPU table, "
        "plan, fit and upgrade, and /api/<command> answering the CLI's --json.",
        epilog=WEB_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    w.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    w.add_argument("--port", type=port, default=8000, help="port (default 8000)")
    w.add_argument("--open", action="store_true", help="open the page in the default browser")
    w.add_argument("--workers", type=positive_int, default=2, help="job processes (default 2)")
    w.add_argument(
        "--timeout", type=positive_int, default=300, help="seconds a trace or plan may run"
    )
    return {"web": functools.partial(cmd_web, run=run, parser_factory=parser_factory)}


def cmd_web(args: argparse.Namespace, *, run: CommandLine, parser_factory: ParserFactory) -> int:
    if importlib.util.find_spec("starlette") is None or importlib.util.find_spec("uvicorn") is None:
        print(f"memfit: error: {INSTALL_HINT}", file=sys.stderr)
        return EXIT_BAD_INPUT

    return serve(
        run=run,
        parser_factory=parser_factory,
        host=args.host,
        port=args.port,
        open_browser=args.open,
        n_workers=args.workers,
        heavy_timeout_s=args.timeout,
    )
