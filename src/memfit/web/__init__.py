"""``memfit web``: the local calculator page and its JSON API (needs the ``web`` extra).

:mod:`memfit.web.query` turns a request into the ``memfit`` command line it stands for,
:mod:`memfit.web.workers` runs it in worker processes, :mod:`memfit.web.app` is the Starlette
application, :mod:`memfit.web.serve` runs it with uvicorn. Importing this package imports none of
the web libraries.
"""
