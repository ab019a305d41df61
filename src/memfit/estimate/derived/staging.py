"""CUDA reduction staging in a derived form, sized at the estimate's batch size and GPU.

``gpu_reduce_kernel`` takes a global-memory buffer and semaphores from the caching allocator when
it splits each output's inputs across thread blocks (:mod:`memfit.estimate.cuda_reduce`): a bias
or RMSNorm-weight gradient summed over every token. Their sizes are ceiling divisions of the
token count capped by the GPU's SM count — a step function of the batch size, not a line — so a
form does not solve them as sizes. The recorder keeps, for every reduction that runs the kernel
(whether or not it stages at the traced batch size), a birth and a death of the buffer and of the
semaphores, raw sizes 0, and the reduction's arguments (``run["stage"]``); :func:`solve_stage`
solves the arguments (input shape and strides per dimension) as ``a0 + a1 * batch``, and
:func:`staging_sizes` sizes the births at a batch size on a device, as the trace engine's
emulation does there. A reduction that does not stage there has 0-byte births: no event, as the
tracker records none (peaks, breakdowns and the allocator replay skip them).

A solved ``stage`` entry: ``[buffer birth, shape_a0, shape_a1, strides_a0, strides_a1, dims,
acc_bytes]`` (the semaphores' birth is the next one).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from memfit.errors import NotModelledError
from memfit.estimate import cuda_reduce
from memfit.estimate.derived.events import Sequence


def _line(v1: list[int], v2: list[int], x1: int, x2: int) -> tuple[list[int], list[int]] | None:
    a1 = [(b - a) // (x2 - x1) for a, b in zip(v1, v2, strict=True)]
    a0 = [a - d * x1 for a, d in zip(v1, a1, strict=True)]
    if any(c0 + c1 * x2 != b for c0, c1, b in zip(a0, a1, v2, strict=True)):
        return None
    return a0, a1


def solve_stage(stages: list[list[list[Any]]], points: tuple[int, ...]) -> list[list[Any]]:
    """The reductions of one run traced at ``points`` (one ``stage`` list per point: ``[birth,
    shape, strides, dims, acc_bytes]`` per reduction) with shape and strides solved as lines
    through the first two points and checked on the others; NotModelledError where the
    reductions differ or an argument is not a line in the batch size."""
    first = stages[0]
    if any(len(s) != len(first) for s in stages):
        raise _refuse(f"the traces at batch sizes {points} run different CUDA reductions")
    out = []
    for i, call in enumerate(first):
        calls = [s[i] for s in stages]
        if any(
            (c[0], c[3], c[4], len(c[1]), len(c[2]))
            != (call[0], call[3], call[4], len(call[1]), len(call[2]))
            for c in calls
        ):
            raise _refuse(f"the traces at batch sizes {points} run different CUDA reductions")
        shape = _line(calls[0][1], calls[1][1], points[0], points[1])
        strides = _line(calls[0][2], calls[1][2], points[0], points[1])
        ok = shape is not None and strides is not None
        for c, x in zip(calls[2:], points[2:], strict=True):
            ok = ok and _at(shape, x) == c[1] and _at(strides, x) == c[2]
        if not ok or shape is None or strides is None:
            raise _refuse(
                f"a CUDA reduction's input shape is not linear in the batch size ({points})"
            )
        out.append([call[0], shape[0], shape[1], strides[0], strides[1], call[3], call[4]])
    return out


def constant_stage(stage: list[list[Any]]) -> list[list[Any]]:
    """A run's recorded reductions kept as traced (no batch term)."""
    return [[s[0], s[1], [0] * len(s[1]), s[2], [0] * len(s[2]), s[3], s[4]] for s in stage]


def _at(line: tuple[list[int], list[int]] | None, x: int) -> list[int] | None:
    if line is None:
        return None
    return [a + b * x for a, b in zip(line[0], line[1], strict=True)]


def staging_sizes(
    run: dict[str, Any], x: int, device: cuda_reduce.ReduceDevice | None
) -> np.ndarray | None:
    """Per birth of ``run``: its staging bytes at batch size ``x`` on ``device`` (None: a GPU
    with no staging model, ROCm: 0), rounded to the allocator's 512 B blocks, 0 for every other
    birth; None where the run records no reduction. ``stage`` entries solved (7 fields) or as
    recorded (5 fields: ``[birth, shape, strides, dims, acc_bytes]``, the traced batch's own)."""
    stage = run.get("stage")
    if not stage:
        return None
    out = np.zeros(len(run["a0"]), dtype=np.int64)
    if device is None:
        return out
    for geometry, births in _by_geometry(stage).items():
        s0, s1, t0, t1, dims, acc = geometry
        shape = tuple(a + b * x for a, b in zip(s0, s1, strict=True))
        strides = tuple(a + b * x for a, b in zip(t0, t1, strict=True))
        buf, sem = _staging_blocks(shape, dims, acc, device, strides)
        if buf:
            out[births] = buf
            out[births + 1] = sem
    return out


#: Per stage list (by identity, kept alive with it): its births grouped by reduction geometry.
_GROUPS: dict[int, tuple[list[list[Any]], dict[tuple[Any, ...], np.ndarray]]] = {}


def _by_geometry(stage: list[list[Any]]) -> dict[tuple[Any, ...], np.ndarray]:
    """``stage``'s births by their reduction's geometry (solved, or as recorded: a trace's run
    replayed at its own batch), so that each geometry is sized once per estimate: every layer
    of a stack repeats its reductions."""
    kept = _GROUPS.get(id(stage))
    if kept is not None and kept[0] is stage:
        return kept[1]
    groups: dict[tuple[Any, ...], list[int]] = {}
    for entry in stage:
        birth, s0, s1, t0, t1, dims, acc = entry if len(entry) == 7 else constant_stage([entry])[0]
        key = (tuple(s0), tuple(s1), tuple(t0), tuple(t1), tuple(dims), acc)
        groups.setdefault(key, []).append(birth)
    out = {k: np.asarray(v, dtype=np.int64) for k, v in groups.items()}
    _GROUPS[id(stage)] = (stage, out)
    return out


@functools.lru_cache(maxsize=8192)
def _staging_blocks(
    shape: tuple[int, ...],
    dims: tuple[int, ...],
    acc: int,
    device: cuda_reduce.ReduceDevice,
    strides: tuple[int, ...],
) -> tuple[int, int]:
    """One reduction's staging blocks, rounded (0, 0: none); memoised, as every layer of a
    stack repeats its reductions' geometry."""
    buf, sem = cuda_reduce.reduce_staging_bytes(
        list(shape), list(dims), acc_bytes=acc, device=device, strides=list(strides)
    )
    if not buf:
        return 0, 0
    return cuda_reduce.rounded(buf), cuda_reduce.rounded(sem)


def _refuse(why: str) -> NotModelledError:
    return NotModelledError(f"no derived form for this job: {why}", engine="derived")


# ---------------------------------------------------------------- grown forms (grown.py)
# A staging birth's payload: ``(part, shape, strides, dims, acc_bytes)`` as traced (``part`` 0:
# the buffer, 1: the semaphores), ``(0, 0, (part, shape_a0, shape_a1, strides_a0, strides_a1,
# dims, acc_bytes))`` once solved: its size 0 in the sequence, sized by an estimate from the
# arguments (derived/staging.py).


def staged_payload(
    seq: tuple[Sequence, list[Any]], run: dict[str, Any]
) -> tuple[Sequence, list[Any]]:
    """``seq`` with the payload of each staging birth of ``run`` its reduction's arguments."""
    stage = {}
    for birth, shape, strides, dims, acc in run.get("stage", []):
        for part in (0, 1):
            stage[birth + part] = (part, tuple(shape), tuple(strides), tuple(dims), acc)
    if not stage:
        return seq
    items, pay = seq
    out = list(pay)
    birth = 0
    for i, item in enumerate(items.items):
        if item[0] == "a":
            if birth in stage:
                out[i] = stage[birth]
            birth += 1
    return items, out


def stage_line(r1: tuple[Any, ...], r2: Any, x1: int) -> tuple[Any, ...]:
    if not isinstance(r2, tuple) or (r1[0], r1[3], r1[4]) != (r2[0], r2[3], r2[4]):
        raise NotModelledError(
            f"no layer growth: batch {x1} and {x1 + 1} run different CUDA reductions",
            engine="derived",
        )
    lines = []
    for v1, v2 in ((r1[1], r2[1]), (r1[2], r2[2])):
        if len(v1) != len(v2):
            raise NotModelledError(
                "no layer growth: a CUDA reduction's input rank depends on the batch",
                engine="derived",
            )
        d = [b - a for a, b in zip(v1, v2, strict=True)]
        lines += [tuple(a - c * x1 for a, c in zip(v1, d, strict=True)), tuple(d)]
    return (r1[0], *lines, r1[3], r1[4])


def constant_payload(r: Any) -> Any:
    """A payload of batch 1's run kept as traced: ``(size, 0)``, a staging birth's arguments
    with no batch term."""
    if r is None:
        return None
    if isinstance(r, tuple):
        zero = (0,) * len(r[1]), (0,) * len(r[2])
        return (0, 0, (r[0], r[1], zero[0], r[2], zero[1], r[3], r[4]))
    return (r, 0)


def stage_at(pay: list[Any], b: int) -> list[tuple[Any, ...]]:
    """The staging births' arguments at batch ``b``, in order, from traced payloads or solved
    ones."""
    out = []
    for p in pay:
        if isinstance(p, tuple) and len(p) == 5:  # traced
            out.append(p[:3])
        elif isinstance(p, tuple) and len(p) == 3:  # solved
            part, s0, s1, t0, t1, _dims, _acc = p[2]
            shape = tuple(a + c * b for a, c in zip(s0, s1, strict=True))
            strides = tuple(a + c * b for a, c in zip(t0, t1, strict=True))
            out.append((part, shape, strides))
    return out


def stage_of(seq: Sequence, pay: list[Any]) -> list[list[Any]]:
    """The grown run's ``stage`` entries (derived/staging.py) from its solved payloads."""
    stage: list[list[Any]] = []
    birth = 0
    for item, p in zip(seq.items, pay, strict=True):
        if item[0] != "a":
            continue
        if isinstance(p, tuple) and len(p) == 3:
            part, s0, s1, t0, t1, dims, acc = p[2]
            if part == 0:
                stage.append([birth, list(s0), list(s1), list(t0), list(t1), list(dims), acc])
            elif not stage or stage[-1][0] != birth - 1:
                raise NotModelledError(
                    "no layer growth: a CUDA reduction's semaphores do not follow its buffer",
                    engine="derived",
                )
        birth += 1
    return stage


__all__ = [
    "constant_payload",
    "constant_stage",
    "solve_stage",
    "stage_at",
    "stage_line",
    "stage_of",
    "staged_payload",
    "staging_sizes",
]
