"""The model configs shipped with memfit: ``configs/<name>.json`` plus ``configs/index.json``.

Each ``<name>.json`` is the model's ``config.json`` exactly as published on the Hugging Face hub
(the URL is in the index as ``source_url``), so memfit can size the popular models with no network
and no hub token. ``index.json`` maps each name to::

    {"hf_id": "org/name", "source_url": "https://huggingface.co/<hf_id>/blob/main/config.json",
     "family": "llama-3.1", "task": "causal-lm" | "seq-cls" | "seq2seq" | "vision",
     "gated": bool, "aliases": ["older/hub-id", ...],   # aliases is optional
     "content_from": "where the file's contents were copied from"}   # optional

Names are lower-case with dashes. Lookup is case-insensitive and also accepts the hub id (or an
alias) of a bundled model, so ``meta-llama/Llama-2-7b-hf`` resolves to the bundled file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

CONFIGS_DIR = Path(__file__).resolve().parent / "configs"
INDEX_PATH = CONFIGS_DIR / "index.json"


@dataclass(frozen=True, kw_only=True)
class BundledModel:
    """One shipped config: where it came from and what kind of model it describes."""

    name: str
    hf_id: str
    family: str
    task: str
    source_url: str
    gated: bool = False
    aliases: tuple[str, ...] = ()
    #: Where the file's contents were taken from when that is not the hub file itself (a copy in
    #: a public repository, or a multimodal config's text tower), with what is not sourced.
    content_from: str = ""

    @property
    def config_path(self) -> Path:
        return CONFIGS_DIR / f"{self.name}.json"


@lru_cache(maxsize=1)
def _index() -> tuple[BundledModel, ...]:
    raw: dict[str, dict[str, Any]] = json.loads(INDEX_PATH.read_text(encoding="utf-8"))
    return tuple(
        BundledModel(
            name=name,
            hf_id=entry["hf_id"],
            family=entry["family"],
            task=entry["task"],
            source_url=entry["source_url"],
            gated=bool(entry.get("gated", False)),
            aliases=tuple(entry.get("aliases", ())),
            content_from=str(entry.get("content_from", "")),
        )
        for name, entry in raw.items()
    )


@lru_cache(maxsize=1)
def _lookup_table() -> dict[str, BundledModel]:
    table: dict[str, BundledModel] = {}
    for model in _index():
        for key in (model.name, model.hf_id, *model.aliases):
            table[key.lower()] = model
    return table


def list_bundled() -> list[BundledModel]:
    """Every shipped model, in index order (grouped by family)."""
    return list(_index())


def find_bundled(model: str) -> BundledModel | None:
    """The bundled model named ``model`` (name, hub id or alias; any case), else None."""
    return _lookup_table().get(model.strip().lower())


def bundled_names() -> list[str]:
    """Every spelling :func:`find_bundled` accepts, lower-cased (used for close-match hints)."""
    return list(_lookup_table())
