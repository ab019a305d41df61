"""The library versions the analytic programs were written against, and a note when they differ.

Every family declaration, block and temporary in :mod:`memfit.estimate.analytic` follows the
``modeling_*.py`` files of one transformers release and the kernels of one torch release
(:data:`WRITTEN_AGAINST`), and was checked against the trace engine running those versions
(docs/accuracy.md §6, §11). The analytic engine does not import either library, so it cannot follow
another version: where the installed ones differ in major.minor, its estimates carry a note saying
so (read from package metadata, no import). The derived and trace engines follow the installed
versions (docs/engines.md).
"""

from __future__ import annotations

import functools

#: package -> the major.minor the analytic programs were written and validated against.
WRITTEN_AGAINST = {"transformers": "5.23", "torch": "2.13"}


def installed_version(package: str) -> str | None:
    """The installed version of ``package`` (package metadata, no import), None if absent.
    ``importlib.metadata`` (~0.03 s of imports) loads when a version is first asked."""
    import importlib.metadata

    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def major_minor(version: str) -> str:
    """``"5.23.0+cu121"`` -> ``"5.23"``."""
    return ".".join(version.split("+")[0].split(".")[:2])


@functools.lru_cache(maxsize=1)
def version_notes() -> tuple[str, ...]:
    """One note per library whose installed major.minor differs from :data:`WRITTEN_AGAINST`
    (none where it is absent: then only the analytic engine runs, and says what it models)."""
    notes = []
    for package, written in WRITTEN_AGAINST.items():
        got = installed_version(package)
        if got is None or major_minor(got) == written:
            continue
        notes.append(
            f"analytic engine: installed {package} {got} differs from {written}, the version its "
            "programs were written and validated against; a model whose code changed since may "
            "allocate differently: --engine derived or --engine trace follow the installed "
            "version"
        )
    return tuple(notes)
