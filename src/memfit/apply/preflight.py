"""How much memory this machine has free for a job memfit is about to run for real
(``memfit bench``, ``find_batch_size``), and the refusal when an estimate does not fit it.

CPU: ``MemAvailable`` of ``/proc/meminfo`` (what the kernel can hand out without swapping:
free pages plus reclaimable cache), else ``os.sysconf`` free pages. CUDA:
``torch.cuda.mem_get_info`` (free bytes on the device). None where neither can be read: then
nothing is refused.
"""

from __future__ import annotations

import os
from typing import Any

from memfit.errors import SpecError
from memfit.units import format_bytes
from memfit.userfiles import UserFileError, read_text


def available_memory_bytes(device: Any) -> int | None:
    """Free memory for ``device`` (a ``torch.device``, or "cpu" / "cuda[:N]"); None if unknown."""
    text = str(device)
    if text.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            return None
        free, _total = torch.cuda.mem_get_info(torch.device(text))
        return int(free)
    return _cpu_available_bytes()


def _cpu_available_bytes() -> int | None:
    try:
        for line in read_text("/proc/meminfo", what="meminfo", kernel_file=True).splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # kB
    except (UserFileError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def refuse_if_too_large(
    required_bytes: int | None, device: Any, *, what: str, force: bool, flag: str = "--force"
) -> None:
    """SpecError (exit 2) when ``required_bytes`` (memfit's estimate) exceed ``device``'s free
    memory, naming both and how to override; nothing when forced or unknown."""
    if force or required_bytes is None:
        return
    free = available_memory_bytes(device)
    if free is None or required_bytes <= free:
        return
    where = "device memory free" if str(device).startswith("cuda") else "RAM available"
    raise SpecError(
        f"{what} needs about {format_bytes(required_bytes)} (memfit's estimate) but this "
        f"machine has {format_bytes(free)} of {where} on {device}: it would exhaust the machine; "
        f"use a smaller model / batch / sequence, or pass {flag} to run it anyway"
    )
