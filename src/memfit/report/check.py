"""What ``memfit check`` prints: the job read from the user's files, the verdict, the keys memfit
did not use and the fix as a diff (text), or one JSON object."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from memfit.estimate.result import MemoryEstimate
from memfit.jobfiles import FORMAT_NAMES, Job
from memfit.spec import WorkloadSpec
from memfit.units import format_bytes


def check_json(
    job: Job,
    model: str,
    workload: WorkloadSpec,
    est: MemoryEstimate,
    fix: dict[str, Any] | None,
    wrote: bool,
    answer: dict[str, Any],
) -> dict[str, Any]:
    """``memfit check --json``: the files, the job read from them (and where each setting came
    from), the estimate, the keys memfit did not use, and the fix."""
    return {
        "files": [{"path": f.path, "format": f.format} for f in job.files],
        "model": model,
        **answer,
        "workload": {k: v for k, v in asdict(workload).items() if k != "media"},
        "from": {
            name: {"key": s.key, "file": s.file, "value": s.raw} for name, s in job.fields.items()
        },
        "estimate": est.to_json(),
        "fits": None if est.fits is None else est.fits.fits,
        "warnings": [{"key": w.key, "file": w.file, "message": w.message} for w in job.warnings],
        "not_used": [{"file": f, "key": k} for f, k in job.no_effect()],
        "unknown": [{"file": f, "key": k} for f, k in job.unknown()],
        "fix": None
        if fix is None
        else {
            "changes": fix["changes"],
            "unexpressed": fix["unexpressed"],
            "diff": "".join(e.diff() for e in fix["edits"]),
            "written": wrote and bool(fix["edits"]),
            "message": fix.get("message"),
        },
    }


def render_check(
    job: Job,
    model: str,
    est: MemoryEstimate,
    fix: dict[str, Any] | None,
    wrote: bool,
    answer: dict[str, Any],
) -> str:
    """``memfit check``: the files, the job, the verdict, what answered, the warnings and unused
    keys, then the fix as a diff of the files (``fix``: the planner's edits, or a message)."""
    out = ["memfit check: " + ", ".join(f"{f.path} ({FORMAT_NAMES[f.format]})" for f in job.files)]
    out.append(f"model: {model}")
    out.append(
        "job: "
        + ", ".join(
            f"{name}={s.value}" + (f" [{s.key}]" if not s.key.startswith("(") else " [default]")
            for name, s in job.fields.items()
            if name != "model"
        )
    )
    line = (
        f"peak on the device: {format_bytes(est.device_used_bytes)} "
        f"(allocated {format_bytes(est.peak_allocated_bytes)})"
    )
    if est.fits is not None:
        verdict = (est.fits.verdict or ("fits" if est.fits.fits else "does not fit")).upper()
        line += f" — {verdict} on {est.fits.gpu} ({format_bytes(est.fits.capacity_bytes)})"
    out.append(line)
    out.append(f"answered by: {answer['answered_by']}")
    if answer["note"]:
        out.append(f"note: {answer['note']}")
    for w in job.warnings:
        out.append(f"warning: {w.describe()}")
    unknown = job.unknown()
    if unknown:
        out.append(
            "unknown keys (not read by memfit): " + ", ".join(f"{k} ({f})" for f, k in unknown)
        )
    no_effect = job.no_effect()
    if no_effect:
        out.append(
            f"not used (no effect on memory): {len(no_effect)} keys — "
            + ", ".join(k for _, k in no_effect[:12])
            + (" …" if len(no_effect) > 12 else "")
            + " (all in --json)"
        )
    if fix is not None:
        if fix.get("message"):
            out.append(fix["message"])
        else:
            out.append(
                "fix: "
                + ", ".join(f"{k} → {v}" for k, v in fix["changes"].items())
                + f" (needs {format_bytes(fix['need_bytes'])})"
            )
            for e in fix["edits"]:
                out.append(e.diff().rstrip("\n"))
            if fix["unexpressed"]:
                out.append("not expressible in these files: " + ", ".join(fix["unexpressed"]))
            if any(e.refused is not None for e in fix["edits"]):
                out.append("not written: edit the keys above by hand (--write refuses this file)")
            elif fix["edits"]:
                out.append("written." if wrote else "apply with --write")
    return "\n".join(out)
