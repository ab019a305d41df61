"""The fits-which-GPU table of one estimate: every catalog GPU, THE verdict rule.

Each row's ``verdict`` is :func:`memfit.estimate.verdict.judge`, the one ``memfit estimate --gpu``
prints and the page's banner shows, of the estimate's device bytes (what ``nvidia-smi`` would
show: the point value) and the high end of its measured-error range (the need), on the GPU's
capacity (:func:`memfit.estimate.device.fit_verdict`) less the default headroom. ``fits`` is
``verdict == "fits"``; ``fits_high_end``: the high end alone within the capacity (no headroom).
Speed columns are the catalog's rates; price columns are the
catalog's price table (:func:`memfit.hardware.prices.load_prices`, with its source and date;
``$MEMFIT_PRICES`` overrides it), never made up here.
"""

from __future__ import annotations

from typing import Any

from memfit.errors import SpecError
from memfit.estimate.device import fit_verdict
from memfit.estimate.verdict import headroom_bytes, judge
from memfit.hardware import list_gpus
from memfit.hardware.prices import load_prices


def _price_fields(price: Any) -> dict[str, Any]:
    if price.usd_per_hour is None:
        return {"usd_per_hour": None, "price_reason": price.reason}
    return {
        "usd_per_hour": price.usd_per_hour,
        "price_source": price.source,
        "price_as_of": price.as_of,
    }


def gpu_table(
    device_used_bytes: int, device_used_bytes_high: int | None = None, paged_bytes: int = 0
) -> list[dict]:
    """One row per catalog GPU, smallest memory first. ``paged_bytes``: the estimate's paged
    optimizer states (``unified_memory_bytes``), evictable under THE verdict rule."""
    if device_used_bytes < 0:
        raise SpecError(f"device_used_bytes ({device_used_bytes}) must be 0 or more")
    high = device_used_bytes if device_used_bytes_high is None else device_used_bytes_high
    if high < device_used_bytes:
        raise SpecError(
            f"device_used_bytes_high ({high}) must be at least device_used_bytes "
            f"({device_used_bytes})"
        )
    rows = []
    prices = load_prices()
    for gpu in list_gpus():
        point, worst = fit_verdict(gpu, device_used_bytes), fit_verdict(gpu, high)
        assert point is not None and worst is not None  # a GPU was given
        v = judge(
            point_bytes=device_used_bytes,
            need_bytes=high,
            capacity_bytes=point.capacity_bytes,
            headroom_bytes=headroom_bytes(point.capacity_bytes),
            evictable_bytes=paged_bytes,
        )
        rows.append(
            {
                "gpu": gpu.name,
                "capacity_bytes": point.capacity_bytes,
                "free_bytes": point.free_bytes,
                "fits": v.fits,
                "verdict": v.verdict,
                "need_bytes": v.need_bytes,
                "headroom_bytes": v.headroom_bytes,
                "limit_bytes": v.limit_bytes,
                "margin_bytes": v.margin_bytes,
                "fits_high_end": worst.fits,
                "memory_bandwidth_gbps": gpu.memory_bandwidth_gbps,
                "bf16_dense_tflops": gpu.bf16_dense_tflops,
                **_price_fields(prices.of(gpu)),
            }
        )
    rows.sort(key=lambda r: (r["capacity_bytes"], r["gpu"]))
    return rows
