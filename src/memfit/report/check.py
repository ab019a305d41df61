"""What ``memfit check`` prints: the job read from the user's files, the verdict, the keys memfit
did not use and the fix as a diff (text), or one JSON object."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from memfit.estimate.analytic.api import DESCRIPTION_START
from memfit.estimate.result import MemoryEstimate
from memfit.jobfiles import FORMAT_NAMES, Job
from memfit.spec import WorkloadSpec
from memfit.units import format_bytes


def check_json(
    job: Job,
    model: str,
    workload: WorkloadSpec,
    est: MemoryEstimate,
    fix: Any,
    wrote: bool,
    answer: dict[str, Any],
    after: tuple[list[Any], MemoryEstimate] | None = None,
) -> dict[str, Any]:
    """``memfit check --json``: the files, the job read from them (and where each setting came
    from), the estimate, the keys memfit did not use, the fix (``fix``: a
    :class:`memfit.cli.check_fix.CheckFix`) and, after ``--write``, the written files' verdict."""
    return {
        "files": [{"path": f.path, "format": f.format} for f in job.files],
        "model": model,
        **answer,
        "workload": {k: v for k, v in asdict(workload).items() if k != "media"},
        "from": {
            name: {"key": s.key, "file": s.file, "value": s.raw}
            for name, s in job.fields.items()
            if not name.startswith("_")  # a reader's own note (jobfiles.torchtitan)
        },
        "estimate": est.to_json(),
        "fits": None if est.fits is None else est.fits.fits,
        "warnings": [{"key": w.key, "file": w.file, "message": w.message} for w in job.warnings],
        "not_used": [{"file": f, "key": k} for f, k in job.no_effect()],
        "unknown": [{"file": f, "key": k} for f, k in job.unknown()],
        "fix": None if fix is None else _fix_json(fix, wrote, after),
    }


def _fix_json(
    fix: Any, wrote: bool, after: tuple[list[Any], MemoryEstimate] | None
) -> dict[str, Any]:
    est = fix.estimate
    return {
        "changes": {f: new for f, (_, new) in fix.changes.items()},
        "before": {f: old for f, (old, _) in fix.changes.items()},
        "keys": [{"file": k.file, "key": k.key, "old": k.old, "new": k.new} for k in fix.keys],
        "plan": fix.plan,
        "unexpressed": fix.unexpressed,
        "diff": "".join(e.diff() for e in fix.edits),
        "device_used_bytes": None if est is None else est.device_used_bytes,
        "verdict": None if est is None or est.fits is None else est.fits.verdict,
        "written": wrote and after is not None,
        "backups": []
        if after is None
        else [{"path": w.path, "backup": w.backup} for w in after[0]],
        "written_verdict": None
        if after is None or after[1].fits is None
        else after[1].fits.verdict,
        "written_device_used_bytes": None if after is None else after[1].device_used_bytes,
        "message": fix.message,
        "price": None if fix.price is None else fix.price.to_json(),
        "changes_result": list(fix.result_changes),
        "why": fix.why,
        "other": None if fix.other is None else _fix_json(fix.other, False, None),
    }


#: The engines' descriptions of themselves (the analytic engine's, and the framework traces'
#: "traced through …"): "answered by" names the engine; its caveats (version notes) stay.
_ENGINE_NOTES = (DESCRIPTION_START, "traced through")


def render_check(
    job: Job,
    model: str,
    est: MemoryEstimate,
    fix: Any,
    wrote: bool,
    answer: dict[str, Any],
    after: tuple[list[Any], MemoryEstimate] | None = None,
) -> str:
    """``memfit check``: the files, the job, the verdict, what answered, the warnings and unused
    keys, then the fix as the keys it sets and a diff of the files, the edited files' verdict,
    and after ``--write`` the written files' verdict and how to restore the originals."""
    out = ["memfit check: " + ", ".join(f"{f.path} ({FORMAT_NAMES[f.format]})" for f in job.files)]
    out.append(f"model: {model}")
    out.append(
        "job: "
        + ", ".join(
            f"{name}={s.value}" + (f" [{s.key}]" if not s.key.startswith("(") else " [default]")
            for name, s in job.fields.items()
            if name != "model" and not name.startswith("_")
        )
    )
    if answer.get("not_runnable"):
        out.append(answer["not_runnable"])
        out.append(_verdict_line("peak on the device, in fp16 (the fix below)", est))
    else:
        out.append(_verdict_line("peak on the device", est))
    out.append(f"answered by: {answer['answered_by']}")
    if answer["note"]:
        out.append(f"note: {answer['note']}")
    # the estimate's own notes (what it counts or leaves out: accumulation, paged states,
    # compile), less the engine's description, which "answered by" already names
    out += [f"note: {n}" for n in est.notes if not n.startswith(_ENGINE_NOTES)]
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
        out += _render_fix(fix, wrote, after)
    return "\n".join(out)


def _verdict_line(what: str, est: MemoryEstimate) -> str:
    line = (
        f"{what}: {format_bytes(est.device_used_bytes)} "
        f"(allocated {format_bytes(est.peak_allocated_bytes)})"
    )
    if est.unified_memory_bytes:
        line += f", {format_bytes(est.unified_memory_bytes)} of it paged optimizer states"
    if est.fits is not None:
        verdict = (est.fits.verdict or ("fits" if est.fits.fits else "does not fit")).upper()
        line += f" — {verdict} on {est.fits.gpu} ({format_bytes(est.fits.capacity_bytes)})"
        v = est.verdict
        if v is not None and v.paged_bytes:
            line += (
                f": needs {format_bytes(v.need_bytes)} resident (upper end), "
                f"{format_bytes(v.evicted_bytes)} of the paged states in host RAM"
            )
    return line


def _render_fix(fix: Any, wrote: bool, after: tuple[list[Any], MemoryEstimate] | None) -> list[str]:
    if fix.message:
        out = [fix.message]
        if fix.other is not None:  # a fix that changes the result, named, not written
            out.append(f"a fix that changes the result fits ({fix.why}):")
            out += _indented(_option_lines(fix.other, diff=True))
        return out + (["nothing written."] if wrote else [])
    out = _option_lines(fix, diff=False)
    for e in fix.edits:
        out.append(e.diff().rstrip("\n"))
    if fix.refused:
        if fix.estimate is not None:
            out.append(_verdict_line("the job with these keys set", fix.estimate))
        out.append("not written: edit the keys above by hand (--write refuses this file)")
        return out
    if fix.estimate is not None:
        out.append(_verdict_line("the edited files", fix.estimate))
    if fix.price is not None:
        out.append(f"  {fix.price.text()}")
    if fix.other is not None:
        out.append(f"{fix.why}; the other fix, not written:")
        out += _indented(_option_lines(fix.other, diff=False, verdict=True))
    elif fix.why:
        out.append(fix.why)
    if after is None:
        out.append("apply with --write" if not wrote else "nothing written.")
        return out
    written, est = after
    for w in written:
        out.append(f"wrote {w.path}; original kept as {w.backup} (restore: mv {w.backup} {w.path})")
    out.append(_verdict_line("the written files, read again", est))
    return out


def _option_lines(fix: Any, *, diff: bool, verdict: bool = False) -> list[str]:
    """A fix's keys, what it changes of the result, and (``diff``) its diff with the edited
    files' verdict and price, or (``verdict``) that verdict and price on one line."""
    by_file: dict[str, list[str]] = {}
    for k in fix.keys:
        by_file.setdefault(k.file, []).append(k.describe())
    out = ["fix: " + "; ".join(f"{f}: {', '.join(keys)}" for f, keys in by_file.items())]
    out += [f"  changes the result: {c}" for c in fix.result_changes]
    if fix.changes and not verdict:
        out.append(
            "  (memfit reads the edited files as: "
            + ", ".join(f"{f} {old} → {new}" for f, (old, new) in fix.changes.items())
            + f"; tried as: {fix.plan})"
        )
    if diff or verdict:
        if diff:
            out += [e.diff().rstrip("\n") for e in fix.edits]
        if fix.estimate is not None:
            line = _verdict_line("the edited files", fix.estimate)
            out.append(line + (f"; {fix.price.text()}" if fix.price is not None else ""))
    return out


def _indented(lines: list[str]) -> list[str]:
    return ["  " + part for line in lines for part in line.split("\n")]
