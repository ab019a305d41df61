"""The one place an :class:`~memfit.spec.options.EstimateOptions` is applied (torch-free).

Three of its settings reach code far below the call that takes them (the planner's searches,
the checklists' estimators, every MODEL resolved on the way), so they are carried by context
variables, each owned by its module: the engine policy (:func:`memfit.estimate.policy.use_engine`),
the disk caches (:func:`memfit.estimate.derived.cache.disabled`) and code-running MODELs
(:func:`memfit.models.source.allowing_code`). :func:`using_options` is the only function that
sets them from options; ``trust_remote_code`` and ``extrapolate`` are passed as arguments.

``confirm`` (the trace confirms every fast answer) is a context variable of the policy too
(:func:`memfit.estimate.policy.use_confirm`).

A setting left at its default (``engine="auto"``, ``use_cache=True``, ``allow_code=False``,
``confirm=False``)
leaves the enclosing one as it is, so a library call inside ``with use_engine("trace"):`` or
``with allowing_code():`` keeps what its caller set.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from memfit.models.source import allowing_code
from memfit.spec.options import EstimateOptions


@contextlib.contextmanager
def using_options(options: EstimateOptions) -> Iterator[EstimateOptions]:
    """Inside the block, everything answers with ``options``' engine, caches and code rule (the
    settings that differ from the defaults; see the module docstring). The engine policy (every
    fast engine, ~0.25 s) and the derived cache (numpy, ~0.15 s) are imported only where a setting
    needs them: ``memfit models`` and ``gpus`` run under the default options and load neither."""
    with contextlib.ExitStack() as stack:
        if options.engine != "auto":
            from memfit.estimate.policy import use_engine

            stack.enter_context(use_engine(options.engine))
        if not options.use_cache:
            from memfit.estimate.derived.cache import disabled

            stack.enter_context(disabled())
        if options.allow_code:
            stack.enter_context(allowing_code(True))
        if options.confirm:
            from memfit.estimate.policy import use_confirm

            stack.enter_context(use_confirm())
        yield options
