"""THE verdict rule: whether a job fits a GPU, stated once, used by every command.

Given the estimate's point value and the upper end of its measured-error range for device
memory (``device_used_bytes``: what ``nvidia-smi`` shows, :mod:`memfit.estimate.uncertainty`),
a GPU's capacity (what CUDA can hand out) and a headroom kept free:

========================  ====================================================  =========
verdict                   rule                                                  exit code
========================  ====================================================  =========
``fits``                  upper end + headroom <= capacity                      0
``tight``                 not ``fits``, but the point value <= capacity: the    1
                          job may run, inside its own error bar or the
                          headroom (fragmentation, NCCL buffers, other
                          processes)
``does not fit``          point value > capacity                                1
========================  ====================================================  =========

Paged optimizer states (bitsandbytes' paged optimizers: CUDA unified memory, "to transfer memory
from the GPU to the CPU when GPU memory is exhausted") are *evictable*: the driver moves them to
host RAM when the rest of the job needs the room, and pages them back for the optimizer step.
:func:`judge` takes them as ``evictable_bytes``: the point value and the need are of what must stay
resident (the estimate less the paged states), and :attr:`Verdict.evicted_bytes` says how much of
the paged states will not fit beside it (host RAM it takes, traffic every step). docs/decisions.md
("Paged optimizer states in the verdict") gives the evidence.

``tight`` exits 1: a CI gate that runs ``memfit estimate ... --gpu L4`` before a training job
must not pass a job that the estimate's own error bar says may run out of memory; the text and
``--json`` (``fits.verdict``) tell it from ``does not fit``. ``estimate``, ``fit`` (the largest
value whose verdict is ``fits``), ``plan`` (a plan is a plan when it ``fits``), ``upgrade``,
``doctor``, the monitor's receipt, the diffusion pipeline and training answers, the
variable-length runs of ``fit`` / ``plan --seq-dist`` and the web page all call :func:`judge`
(:func:`judge_point` where an answer has no measured range).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memfit.estimate.uncertainty import ranges
from memfit.units import format_bytes

#: Fraction of the capacity left free by default. vLLM's default ``gpu_memory_utilization`` of
#: 0.9 leaves 10 % for what its profiling run misses; memfit's upper range end already covers the
#: estimator's error, so it keeps half of that: 5 %.
DEFAULT_HEADROOM = 0.05

FITS, TIGHT, DOES_NOT_FIT = "fits", "tight", "does not fit"
VERDICTS = (FITS, TIGHT, DOES_NOT_FIT)
#: The exit code of each verdict, the same for every command.
EXIT_CODES = {FITS: 0, TIGHT: 1, DOES_NOT_FIT: 1}


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """One job against one GPU: the verdict, the numbers it came from, and the margin
    (``limit_bytes - need_bytes``: negative when the upper end overflows the limit)."""

    verdict: str
    point_bytes: int
    need_bytes: int  # the upper end of the device-memory range (resident: paged states left out)
    capacity_bytes: int
    headroom_bytes: int
    #: paged (evictable) optimizer-state bytes left out of ``point_bytes`` / ``need_bytes``
    paged_bytes: int = 0

    @property
    def evicted_bytes(self) -> int:
        """Paged bytes that do not fit beside the resident need within the limit: the driver
        keeps them in host RAM and pages them in for each optimizer step (0: all stay on the
        device)."""
        return max(0, min(self.paged_bytes, self.need_bytes + self.paged_bytes - self.limit_bytes))

    @property
    def limit_bytes(self) -> int:
        return self.capacity_bytes - self.headroom_bytes

    @property
    def margin_bytes(self) -> int:
        return self.limit_bytes - self.need_bytes

    @property
    def fits(self) -> bool:
        return self.verdict == FITS

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "point_bytes": self.point_bytes,
            "need_bytes": self.need_bytes,
            "capacity_bytes": self.capacity_bytes,
            "headroom_bytes": self.headroom_bytes,
            "limit_bytes": self.limit_bytes,
            "margin_bytes": self.margin_bytes,
            **(
                {"paged_bytes": self.paged_bytes, "evicted_bytes": self.evicted_bytes}
                if self.paged_bytes
                else {}
            ),
        }

    def text(self, gpu: str) -> str:
        """``FITS on L4: needs 8.40 GiB (upper end) of 21.37 GiB, margin 12.97 GiB``."""

        need, limit = format_bytes(self.need_bytes), format_bytes(self.limit_bytes)
        head = f"{self.verdict.upper()} on {gpu}"
        if self.verdict == FITS:
            margin = format_bytes(self.margin_bytes)
            text = f"{head}: needs {need} (upper end) of {limit}, margin {margin}"
            if self.evicted_bytes:
                text += (
                    f"; {format_bytes(self.evicted_bytes)} of the "
                    f"{format_bytes(self.paged_bytes)} paged optimizer states do not fit beside "
                    "it: the driver keeps them in host RAM and pages them in for every "
                    "optimizer step (slower steps; that much host RAM free)"
                )
            elif self.paged_bytes:
                text += f" (+ {format_bytes(self.paged_bytes)} paged optimizer states, which fit)"
            return text
        if self.verdict == TIGHT:
            return (
                f"{head}: the estimate ({format_bytes(self.point_bytes)}) fits "
                f"{format_bytes(self.capacity_bytes)}, but its upper end ({need}) exceeds the "
                f"limit {limit} ({format_bytes(self.headroom_bytes)} headroom) by "
                f"{format_bytes(-self.margin_bytes)}: it may run out of memory"
            )
        return (
            f"{head}: needs {format_bytes(self.point_bytes)} (estimate), "
            f"{format_bytes(self.point_bytes - self.capacity_bytes)} more than its "
            f"{format_bytes(self.capacity_bytes)}"
        )


def judge(
    *,
    point_bytes: int,
    need_bytes: int,
    capacity_bytes: int,
    headroom_bytes: int,
    evictable_bytes: int = 0,
) -> Verdict:
    """The verdict rule of the module docstring. ``evictable_bytes``: paged optimizer states
    inside ``point_bytes`` and ``need_bytes``, which the driver evicts to host RAM under
    pressure: the rule is applied to the rest."""
    paged = max(0, min(int(evictable_bytes), point_bytes))
    point_bytes, need_bytes = point_bytes - paged, need_bytes - paged
    if need_bytes + headroom_bytes <= capacity_bytes:
        verdict = FITS
    elif point_bytes <= capacity_bytes:
        verdict = TIGHT
    else:
        verdict = DOES_NOT_FIT
    return Verdict(
        verdict=verdict,
        point_bytes=point_bytes,
        need_bytes=need_bytes,
        capacity_bytes=capacity_bytes,
        headroom_bytes=headroom_bytes,
        paged_bytes=paged,
    )


def headroom_bytes(capacity_bytes: int, headroom: float = DEFAULT_HEADROOM) -> int:
    return round(capacity_bytes * headroom)


def judge_point(point_bytes: int, capacity_bytes: int, headroom: int | None = None) -> Verdict:
    """:func:`judge` of an answer with no measured error range (a diffusion pipeline or training
    run, a variable-length run's replay): the point value is the need. ``headroom`` (bytes)
    None: :data:`DEFAULT_HEADROOM` of the capacity."""
    return judge(
        point_bytes=point_bytes,
        need_bytes=point_bytes,
        capacity_bytes=capacity_bytes,
        headroom_bytes=headroom_bytes(capacity_bytes) if headroom is None else headroom,
    )


def upper_device_bytes(est: Any) -> int:
    """The upper end of an estimate's device-memory range (never below its point value)."""
    low_high = est.ranges.get("device_used_bytes")
    if low_high is None:
        low_high = ranges(est)["device_used_bytes"]
    return max(int(low_high[1]), int(est.device_used_bytes))


def evictable_bytes(est: Any) -> int:
    """An estimate's paged optimizer-state bytes (CUDA unified memory the driver may evict)."""
    return int(getattr(est, "unified_memory_bytes", 0) or 0)


def resident_need_bytes(est: Any) -> int:
    """The need :func:`judge_estimate` charges a GPU with: the upper end of the device-memory
    range less the paged (evictable) optimizer states. THE "needs" figure of an estimate."""
    return upper_device_bytes(est) - min(evictable_bytes(est), int(est.device_used_bytes))


def judge_estimate(est: Any, capacity_bytes: int, headroom: float = DEFAULT_HEADROOM) -> Verdict:
    """:func:`judge` of a :class:`~memfit.estimate.result.MemoryEstimate` on a capacity."""
    return judge(
        point_bytes=int(est.device_used_bytes),
        need_bytes=upper_device_bytes(est),
        capacity_bytes=capacity_bytes,
        headroom_bytes=headroom_bytes(capacity_bytes, headroom),
        evictable_bytes=evictable_bytes(est),
    )
