"""Diffusion pipelines shipped with memfit: ``<name>/model_index.json`` + each component's config.

``index.json`` maps each name to ``{"hf_id", "pipeline", "source", "verbatim", "notes"}``:
``source`` says where the bytes were copied from (and the hub repo they reproduce); ``verbatim``
is False where the source itself says the values were transcribed rather than fetched whole.
No tokenizer files and no weights are shipped: only what decides the memory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

PIPELINES_DIR = Path(__file__).resolve().parent
INDEX_PATH = PIPELINES_DIR / "index.json"


@dataclass(frozen=True, kw_only=True)
class BundledPipeline:
    """One shipped pipeline tree and where its files came from."""

    name: str
    hf_id: str
    pipeline: str
    source: str
    verbatim: bool
    notes: str = ""

    @property
    def path(self) -> Path:
        return PIPELINES_DIR / self.name


@lru_cache(maxsize=1)
def _index() -> tuple[BundledPipeline, ...]:
    raw: dict[str, dict[str, Any]] = json.loads(INDEX_PATH.read_text(encoding="utf-8"))
    return tuple(
        BundledPipeline(
            name=name,
            hf_id=e["hf_id"],
            pipeline=e["pipeline"],
            source=e["source"],
            verbatim=bool(e["verbatim"]),
            notes=e.get("notes", ""),
        )
        for name, e in raw.items()
    )


def list_pipelines() -> list[BundledPipeline]:
    """Every shipped pipeline, in index order."""
    return list(_index())


def find_pipeline(model: str) -> BundledPipeline | None:
    """The shipped pipeline named ``model`` (its name or hub id, any case), else None."""
    key = model.strip().lower()
    for p in _index():
        if key in (p.name, p.hf_id.lower()):
            return p
    return None


def pipeline_dir(model: str) -> Path | None:
    """The directory holding ``model``'s ``model_index.json``: a bundled name or hub id, or a
    local directory that has one; else None (then ``model`` is not a diffusion pipeline)."""
    bundled = find_pipeline(model)
    if bundled is not None:
        return bundled.path
    try:  # ~nosuchuser: RuntimeError; a name too long to look up: OSError
        path = Path(model).expanduser()
        if path.is_dir() and (path / "model_index.json").is_file():
            return path
    except (RuntimeError, OSError, ValueError):
        return None  # not a local pipeline folder: the model reader names the problem
    return None
