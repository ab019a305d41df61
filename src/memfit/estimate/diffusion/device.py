"""A diffusion answer's device memory (what ``nvidia-smi`` shows) and THE verdict on a GPU.

The traced tensors and the allocator replay do not hold the CUDA context, nor (without the replay)
the cuBLAS workspaces (:mod:`memfit.hardware.overhead`). The device bytes are the larger of

* the allocated peak + the context and the workspaces (``total_bytes``), and
* the replayed reserved peak + what lives outside the caching allocator
  (``outside_allocator_bytes``: the replay already holds the workspaces).

The verdict is :func:`memfit.estimate.verdict.judge`, the rule of every other kind, with that
figure as both the point and the need (:func:`memfit.estimate.verdict.judge_point`): a diffusion
answer has no measured error range (the cuDNN convolution-workspace allowance is not one:
PyTorch's cuDNN path runs a plan with less workspace when the preferred one's cannot be
allocated, so it is reported beside the verdict, not in it).
Capacity: :attr:`memfit.hardware.gpu.GPU.capacity_bytes` (what CUDA can hand out), as for text
models; headroom: :data:`memfit.estimate.verdict.DEFAULT_HEADROOM` of
it unless a budget says otherwise.
"""

from __future__ import annotations

from typing import Any

from memfit.estimate.verdict import Verdict
from memfit.hardware.overhead import device_overhead


def device_bytes(
    peak_bytes: int, reserved_bytes: int | None, arch: str | None, *, training: bool
) -> int:
    """The device bytes of the module docstring (``reserved_bytes`` None: not replayed)."""

    ov = device_overhead(arch, training=training)
    need = peak_bytes + ov.total_bytes
    if reserved_bytes is not None:
        need = max(need, reserved_bytes + ov.outside_allocator_bytes)
    return need


def fits_json(v: Verdict, keys: dict[str, Any]) -> dict[str, Any]:
    """The ``fits`` object of a diffusion answer's JSON: the keys it always had (``keys``, in
    their order: ``gpu``, ``capacity_bytes``, ``overhead_bytes``, ``need_bytes``, ``fits``...),
    then the standard verdict object's other keys (``verdict``, ``point_bytes``,
    ``headroom_bytes``, ``limit_bytes``, ``margin_bytes``)."""
    out = dict(keys)
    for key, value in v.to_json().items():
        out.setdefault(key, value)
    return out
