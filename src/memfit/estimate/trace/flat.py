"""The trace's flat numbers and how they become an engine result (torch-free).

A traced run is summarised as a flat ``{key: number}`` dict (``phase/<phase>/peak``,
``phase/<phase>/comp/<component>``, ``phase/<phase>/mod/<module>``, ``reserved``, ``n_params``,
``backend/<kernel>``). The trace engine (:mod:`memfit.estimate.trace.engine`) produces them by
running the model; the derived engine (:mod:`memfit.estimate.derived`) by replaying recorded
allocations. Both extrapolate over layer counts and build the :class:`EngineResult` here, so the
two engines cannot drift apart in those steps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memfit.errors import TraceError
from memfit.estimate.pipeline import EngineResult, PhaseResult, ReservedRule
from memfit.estimate.result import COMPONENTS

Flat = dict[str, float]

#: How far (relative) the check run's reserved bytes may lie from the line through the base and
#: step runs for that line to be taken to the model's depth (:func:`with_reserved_floor`). Measured
#: off by 0.1-0.8 % on Llama-2-7B / 70B and Yi-34B on one GPU, by 7-15 % where the line ran far
#: off at depth (Yi-34B FSDP2 QLoRA: +286 %; a 50-layer tiny Llama with checkpointing: +29 %).
RESERVED_LINE_REL = 0.02


def extrapolated(
    run: Callable[[dict[str, int]], Flat],
    targets: dict[str, int],
    period: dict[str, int],
    prefix: dict[str, int] | None = None,
) -> tuple[Flat, float | None]:
    """The flat numbers at ``targets`` layer counts from runs at a few counts (see the trace
    engine's module docstring), and the relative error of the check run (None: no
    extrapolation, ``targets`` were run as they are)."""
    # Two periods at the base: with a single block the first and last block coincide, and under
    # checkpointing the backward peak then sits at a different relative point of the step. A
    # stack's leading layers unlike the rest (``prefix``) are all in the base, so the slope is
    # the repeated layers' (DeepSeek's 3 dense layers of 61 made every layer dense: -78 %).
    lead = prefix or {}
    base = {k: lead.get(k, 0) + 2 * period[k] for k in targets}
    growing = [k for k in targets if targets[k] > base[k]]
    if (
        not targets
        or any(targets[k] < base[k] for k in targets)
        or not any(targets[k] >= base[k] + 2 * period[k] for k in growing)
    ):
        return run(targets), None
    at_base = run(base)
    slopes: dict[str, Flat] = {}
    steps: list[Flat] = []
    for k in growing:
        step = run({**base, k: base[k] + period[k]})
        steps.append(step)
        slopes[k] = {
            key: (step.get(key, 0) - at_base.get(key, 0)) / period[k]
            for key in set(step) | set(at_base)
        }
    checked = max(growing, key=lambda k: targets[k] - base[k])
    check_counts = {**base, checked: base[checked] + 2 * period[checked]}
    check = run(check_counts)
    predicted = affine(at_base, slopes, base, check_counts)
    error = max(
        (abs(predicted.get(k, 0) - v) / max(v, 1) for k, v in check.items() if k.endswith("/peak")),
        default=0.0,
    )
    out = affine(at_base, slopes, base, targets)
    line = predicted.get("reserved")
    holds = line is not None and abs(line - check.get("reserved", 0)) <= RESERVED_LINE_REL * line
    return with_reserved_floor(out, [at_base, *steps, check], line_holds=holds), error


def peak_live(flat: Flat) -> float:
    """The highest phase's live bytes (``phase/<phase>/peak``) in ``flat``."""
    return max((v for k, v in flat.items() if k.endswith("/peak") and k.count("/") == 2), default=0)


def with_reserved_floor(out: Flat, runs: list[Flat], *, line_holds: bool) -> Flat:
    """``out`` (the runs' line at the model's depth) with its ``reserved`` bytes no lower than its
    live peak plus the largest overhead (reserved minus live peak) of the traced ``runs``, and
    that floor alone where the check run is off the reserved bytes' line (``line_holds`` False).

    The line through the allocator replays at 2 and 3 layers, taken to 50-80 layers, is right
    where the check run (4 layers) lies on it: Llama-2-70B at batch 1 x 4096 (the overhead grows
    0.8 GiB a layer: +3.8 % against the full trace, docs/accuracy.md section 3). Where the
    check run is off it, the line is a segment that one depth split and another did not,
    multiplied by the depth: the FSDP2 QLoRA job of Yi-34B (60 layers) read 126.8 GiB reserved
    for 29.4 GiB allocated, where the full trace replays 32.9 GiB (the floor: 32.88 GiB). Where
    the line grew more slowly than the live peak it fell below it (the same job on one GPU:
    reserved = allocated, 6.8 % under the full trace; the floor: 1.7 % under). Compared with full
    traces in tests/estimate/trace/test_extrapolation.py and tests/estimate/derived/
    test_extrapolated_reserved.py. Flats without ``reserved`` (no allocator replay) are
    returned as they are."""
    if "reserved" not in out or any("reserved" not in run for run in runs):
        return out
    overhead = max(run["reserved"] - peak_live(run) for run in runs)
    floor = round(peak_live(out) + max(overhead, 0))
    return {**out, "reserved": max(out["reserved"], floor) if line_holds else floor}


def affine(
    at_base: Flat, slopes: dict[str, Flat], base: dict[str, int], counts: dict[str, int]
) -> Flat:
    """``at_base`` moved by ``slopes`` (per layer of each stack) to ``counts`` layers."""
    out = dict(at_base)
    for k, slope in slopes.items():
        for key, s in slope.items():
            out[key] = out.get(key, 0) + s * (counts[k] - base[k])
    return {k: round(v) for k, v in out.items()}


def engine_result(
    flat: Flat,
    *,
    name: str,
    trace: dict[str, Any],
    notes: list[str],
    environment: dict[str, str],
    engine: str = "trace",
) -> EngineResult:
    """The flat numbers (extrapolated or not, ``reserved`` replayed) as the record
    :func:`memfit.estimate.pipeline.assemble` turns into the estimate."""
    phases: dict[str, PhaseResult] = {}
    for key in flat:
        parts = key.split("/")
        if parts[0] == "phase" and parts[2] == "peak":
            phase = parts[1]
            prefix = f"phase/{phase}/mod/"
            phases[phase] = PhaseResult(
                components={c: int(flat.get(f"phase/{phase}/comp/{c}", 0)) for c in COMPONENTS},
                modules={
                    k.split("/", 3)[3]: int(v) for k, v in flat.items() if k.startswith(prefix)
                },
                unified_bytes=int(flat.get(f"phase/{phase}/unified", 0)),
            )
    if not phases:
        raise TraceError("the traced step allocated nothing on the device")
    return EngineResult(
        engine=engine,
        model_name=name,
        n_params=int(flat["n_params"]),
        n_trainable_params=int(flat["n_trainable"]),
        phases=phases,
        reserved=ReservedRule(replayed_bytes=int(flat.get("reserved", 0))),
        environment=environment,
        host_memory_bytes=int(flat.get("host_memory", 0)),
        attention_backends={
            k.split("/", 1)[1]: int(v) for k, v in flat.items() if k.startswith("backend/")
        },
        trace={**trace, "n_ops": int(flat.get("n_ops", 0))},
        notes=notes,
    )
