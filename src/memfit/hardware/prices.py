"""On-demand prices of the catalog's GPUs, and the user's price file that overrides them.

The bundled table (``prices.json`` next to this module) holds, for every catalog GPU, the hourly
on-demand price of one GPU in US dollars with the page it was read from (``source``), the
provider and offer, and ``as_of``: the date the page gives for its prices, else the date it was
read (``YYYY-MM-DD``, or ``YYYY-MM`` where the page names only the month). A GPU without a public
price has ``usd_per_hour = None`` and a ``reason``; no figure is made up. Prices come from
several providers (a GPU's cheapest published on-demand offer among the pages read), change
monthly, and differ by region: they rank GPUs, they are not a quote (docs/decisions.md "GPU
prices").

A price file overrides rows, JSON always, YAML when PyYAML is installed (``.yaml`` / ``.yml``)::

    {"prices": {"H100": 2.49, "A10G": {"usd_per_hour": 1.01, "as_of": "2026-11-30",
                                        "provider": "AWS", "source": "https://..."}}}

GPU names are any spelling :func:`memfit.hardware.get_gpu` accepts; a bare number is the price;
``0`` is allowed (a card you own). The file is named by ``--prices FILE`` or the
``MEMFIT_PRICES`` environment variable (the flag wins) and read through :mod:`memfit.userfiles`.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from memfit.errors import SpecError, UnknownGPUError
from memfit.hardware.catalog import get_gpu, list_gpus
from memfit.userfiles import UserFileError, parse_json, read_text

PRICES_ENV = "MEMFIT_PRICES"
CATALOG_ORIGIN = "catalog"
_DATE = re.compile(r"^\d{4}-(0[1-9]|1[0-2])(-(0[1-9]|[12]\d|3[01]))?$")
_ENTRY_KEYS = ("usd_per_hour", "source", "as_of", "provider", "offer")


@dataclass(frozen=True, kw_only=True)
class GPUPrice:
    """One GPU's on-demand price (``usd_per_hour`` for one GPU) or, when None, the ``reason``.
    ``origin``: ``"catalog"`` or the path of the user's price file."""

    gpu: str
    usd_per_hour: float | None
    source: str | None = None
    as_of: str | None = None
    provider: str | None = None
    offer: str | None = None
    reason: str | None = None
    origin: str = CATALOG_ORIGIN

    def __post_init__(self) -> None:
        problems = []
        usd = self.usd_per_hour
        catalog = self.origin == CATALOG_ORIGIN
        if usd is None:
            if not self.reason:
                problems.append(f"{self.gpu}: a GPU without a price needs a reason")
        elif isinstance(usd, bool) or not isinstance(usd, (int, float)) or not math.isfinite(usd):
            problems.append(f"{self.gpu}: usd_per_hour ({usd!r}) must be a number")
        elif usd < 0 or (catalog and usd == 0):
            problems.append(f"{self.gpu}: usd_per_hour ({usd!r}) must be > 0 (0: a card you own)")
        if usd is not None and catalog:
            if not (self.source or "").startswith("https://"):
                problems.append(f"{self.gpu}: source ({self.source!r}) must be an https:// URL")
            if not self.provider:
                problems.append(f"{self.gpu}: a catalog price names its provider")
        if self.as_of is not None and not _DATE.match(self.as_of):
            problems.append(f"{self.gpu}: as_of ({self.as_of!r}) must be a date: YYYY-MM-DD")
        elif usd is not None and catalog and self.as_of is None:
            problems.append(f"{self.gpu}: a catalog price needs as_of (the date it was read)")
        if problems:
            raise SpecError.from_problems(problems)

    @property
    def known(self) -> bool:
        return self.usd_per_hour is not None

    def describe(self) -> str:
        """``$3.78/h (Lambda, 2026-05-07)``, or the reason there is none."""
        if self.usd_per_hour is None:
            return f"no price: {self.reason}"
        where = self.provider or ("your price file" if self.origin != CATALOG_ORIGIN else "")
        when = f", {self.as_of}" if self.as_of else ""
        return f"${self.usd_per_hour:.2f}/h ({where}{when})"

    def to_json(self) -> dict[str, Any]:
        return {
            "usd_per_hour": self.usd_per_hour,
            "source": self.source,
            "as_of": self.as_of,
            "provider": self.provider,
            "offer": self.offer,
            "reason": self.reason,
            "origin": self.origin,
        }


class PriceTable(Mapping[str, GPUPrice]):
    """Prices by canonical GPU name; ``files``: the user price files applied, in order."""

    def __init__(self, prices: Mapping[str, GPUPrice], files: tuple[str, ...] = ()) -> None:
        self._prices = dict(prices)
        self.files = files

    def __getitem__(self, name: str) -> GPUPrice:
        return self._prices[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._prices)

    def __len__(self) -> int:
        return len(self._prices)

    def of(self, gpu: Any) -> GPUPrice:
        """The price of ``gpu`` (a catalog record, or any object with a ``name``: a GPU the
        catalog does not hold has no price, and says so)."""
        name = gpu if isinstance(gpu, str) else gpu.name
        found = self._prices.get(name)
        if found is not None:
            return found
        return GPUPrice(
            gpu=name, usd_per_hour=None, reason="not in the price table (add it with --prices)"
        )


@functools.lru_cache(maxsize=1)
def bundled_prices() -> PriceTable:
    """The catalog's prices (``prices.json``), checked against the catalog's names."""

    from importlib import resources  # tempfile, shutil, bz2 (~0.015 s): when prices are read

    text = resources.files("memfit.hardware").joinpath("prices.json").read_text("utf-8")
    rows = json.loads(text)["prices"]
    prices = {
        name: GPUPrice(gpu=name, **{k: v for k, v in row.items() if k != "_comment"})
        for name, row in rows.items()
    }
    names = {g.name for g in list_gpus()}
    if set(prices) != names:  # pragma: no cover - guarded by a test
        raise RuntimeError(f"prices.json and the catalog differ: {sorted(set(prices) ^ names)}")
    return PriceTable(prices)


def load_prices(
    path: str | os.PathLike[str] | None = None, *, environ: Mapping[str, str] | None = None
) -> PriceTable:
    """The bundled prices, overridden by the price file ``path`` (default: ``$MEMFIT_PRICES``,
    if set). Bad input raises :class:`~memfit.userfiles.UserFileError` or
    :class:`~memfit.errors.SpecError` (exit 2), naming the file and every problem."""
    env = os.environ if environ is None else environ
    chosen = os.fspath(path) if path is not None else (env.get(PRICES_ENV) or None)
    table = bundled_prices()
    if chosen is None:
        return table
    merged = dict(table)
    merged.update(read_price_file(chosen))
    return PriceTable(merged, files=(chosen,))


def read_price_file(path: str) -> dict[str, GPUPrice]:
    """The prices a user file sets, by canonical GPU name."""

    what = "price file"
    text = read_text(path, what=what)
    if path.lower().endswith((".yaml", ".yml")):
        try:
            import yaml
        except ImportError:
            raise UserFileError(
                f"{what} {path!r} is YAML, which needs PyYAML (pip install pyyaml); "
                "or write it as JSON"
            ) from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise UserFileError(f"{what} {path!r} is not valid YAML: {exc}") from None
    else:
        data = parse_json(text, what=what, source=path)
    return parse_prices(data, source=path)


def parse_prices(data: Any, *, source: str) -> dict[str, GPUPrice]:
    """``{"prices": {GPU: price | {usd_per_hour, source, as_of, provider, offer}}}`` (the
    ``prices`` wrapper is optional) as price records; every problem reported together."""

    if isinstance(data, dict) and set(data) == {"prices"}:
        data = data["prices"]
    if not isinstance(data, dict) or not data:
        raise SpecError(
            f"price file {source!r} must map GPU names to prices, e.g. "
            '{"prices": {"H100": 2.49}}; got ' + (type(data).__name__ if data else "nothing")
        )
    out: dict[str, GPUPrice] = {}
    problems: list[str] = []
    for key, value in data.items():
        try:
            name = get_gpu(str(key)).name
        except UnknownGPUError as exc:
            problems.append(str(exc))
            continue
        entry = value if isinstance(value, dict) else {"usd_per_hour": value}
        unknown = sorted(str(k) for k in entry if k not in _ENTRY_KEYS)
        if unknown:
            problems.append(
                f"{key}: unknown field(s) {', '.join(unknown)} (allowed: {', '.join(_ENTRY_KEYS)})"
            )
            continue
        if "usd_per_hour" not in entry or entry["usd_per_hour"] is None:
            problems.append(f"{key}: needs usd_per_hour (US dollars per GPU-hour)")
            continue
        text = {k: str(v) for k, v in entry.items() if k != "usd_per_hour"}
        try:
            out[name] = GPUPrice(
                gpu=name, usd_per_hour=entry["usd_per_hour"], origin=source, **text
            )
        except SpecError as exc:
            problems += exc.problems
    if problems:
        raise SpecError(f"price file {source!r}: " + "; ".join(problems))
    return out
