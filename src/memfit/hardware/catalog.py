"""The GPU catalog: the rows of :mod:`memfit.hardware.datacenter` and :mod:`memfit.hardware.desktop`
(the record and its conventions: :mod:`memfit.hardware.gpu`), looked up by any spelling. On-demand
prices: :mod:`memfit.hardware.prices`."""

from __future__ import annotations

import re

from memfit.errors import UnknownGPUError
from memfit.hardware.datacenter import DATACENTER_GPUS
from memfit.hardware.desktop import DESKTOP_GPUS
from memfit.hardware.gpu import ARCHS, FORM_FACTORS, GPU, TENSOR_PRECISIONS, VENDORS

__all__ = ["ARCHS", "FORM_FACTORS", "GPU", "TENSOR_PRECISIONS", "VENDORS", "get_gpu", "list_gpus"]

#: By vendor, then generation (a stable sort keeps each module's order within a generation).
_CATALOG: tuple[GPU, ...] = tuple(
    sorted(
        DATACENTER_GPUS + DESKTOP_GPUS,
        key=lambda g: (VENDORS.index(g.vendor), ARCHS.index(g.arch)),
    )
)

# Vendor and product-line words that carry no information for matching a name.
_NOISE_WORDS = {"nvidia", "tesla", "geforce", "amd", "instinct", "gpu"}


def _normalize(name: str) -> str:
    """Lower case, vendor words dropped, spaces, dashes and underscores removed."""
    words = re.split(r"[\s_\-]+", name.strip().lower())
    return "".join(word for word in words if word not in _NOISE_WORDS)


def _build_index() -> dict[str, GPU]:
    index: dict[str, GPU] = {}
    for gpu in _CATALOG:
        for spelling in (gpu.name, *gpu.aliases):
            key = _normalize(spelling)
            other = index.get(key)
            if other is not None and other is not gpu:  # pragma: no cover - guarded by a test
                raise RuntimeError(f"GPU alias {spelling!r} names both {other.name} and {gpu.name}")
            index[key] = gpu
    return index


_INDEX = _build_index()


def list_gpus() -> list[GPU]:
    """Every GPU in the catalog, in catalog order (by vendor and generation)."""
    return list(_CATALOG)


def get_gpu(name: str) -> GPU:
    """Look a GPU up by name or alias, ignoring case, spaces, dashes and vendor words.

    ``"h100"`` alone means the H100 SXM (``H100-80GB``). An unknown or ambiguous name raises
    :class:`UnknownGPUError` with the closest catalog names.
    """
    gpu = _INDEX.get(_normalize(name))
    if gpu is not None:
        return gpu
    matches = _close_matches(name)
    hint = f"did you mean {', '.join(matches)}? " if matches else ""
    raise UnknownGPUError(
        f"unknown GPU {name!r}: {hint}run `memfit gpus` for the list", close_matches=matches
    )


def _close_matches(name: str, *, n_matches: int = 3, n_family: int = 6) -> list[str]:
    """Canonical names that ``name`` starts (a family such as "a100": up to ``n_family``),
    else up to ``n_matches`` look-alikes."""
    query = _normalize(name)
    if not query:
        return []
    prefixed = sorted({gpu.name for key, gpu in _INDEX.items() if key.startswith(query)})
    if prefixed:
        return prefixed[:n_family]
    import difflib  # ~0.015 s of imports: a name the catalog lacks, only

    scores: dict[str, float] = {}
    for key, gpu in _INDEX.items():
        score = difflib.SequenceMatcher(None, query, key).ratio()
        if score >= 0.75:
            scores[gpu.name] = max(score, scores.get(gpu.name, 0.0))
    return sorted(scores, key=lambda gpu_name: (-scores[gpu_name], gpu_name))[:n_matches]
