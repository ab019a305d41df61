"""How a job is answered, not what it is (torch-free): :class:`EstimateOptions`.

The engine (``--engine``), the disk caches (``--no-cache``), whether a ``package.module:function``
MODEL may run its code (``--allow-code``) and a hub config its own code (``--trust-remote-code``),
and whether deep models are traced in part and extrapolated (``--extrapolate``). One record, built
by the CLI from its flags and taken by :func:`memfit.estimate`, :func:`memfit.fit` and
:func:`memfit.plan`; :func:`memfit.estimate.options.using_options` applies it to everything
called inside it.
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.spec.arguments import argument_problems
from memfit.spec.rules import raise_if

#: The values of ``engine``: the policy's choice, or one engine without fallback
#: (:mod:`memfit.estimate.policy` states the rule).
ENGINES = ("auto", "analytic", "derived", "trace")


@dataclass(frozen=True, kw_only=True)
class EstimateOptions:
    """``engine``: ``auto`` (the fastest engine that models the job) or one engine alone.
    ``use_cache``: read and write the disk caches of derived forms and trace answers.
    ``allow_code``: a ``pkg.mod:fn`` MODEL may be imported and called (runs that code).
    ``trust_remote_code``: a hub config may need the repo's own Python code (runs it).
    ``extrapolate``: None traces models up to 48 layers whole and extrapolates deeper ones from a
    few layers; True / False force either.
    ``confirm``: the trace confirms every fast (analytic) answer ``auto`` gives; without it, the
    trace confirms only where the fast answer's validated band could change the verdict."""

    engine: str = "auto"
    use_cache: bool = True
    allow_code: bool = False
    trust_remote_code: bool = False
    extrapolate: bool | None = None
    confirm: bool = False

    def __post_init__(self) -> None:
        problems = []
        if self.engine not in ENGINES:
            problems.append(
                f"engine ({self.engine!r}) must be one of {', '.join(ENGINES)}: --engine auto "
                "lets memfit choose"
            )
        if not isinstance(self.use_cache, bool):
            problems.append(f"use_cache ({self.use_cache!r}) must be True or False")
        if not isinstance(self.confirm, bool):
            problems.append(f"confirm ({self.confirm!r}) must be True or False")
        problems += argument_problems(
            allow_code=self.allow_code,
            trust_remote_code=self.trust_remote_code,
            extrapolate=self.extrapolate,
        )
        raise_if(problems)
