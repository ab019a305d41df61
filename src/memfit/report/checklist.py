"""Text of the checklists, ``memfit upgrade`` and ``memfit doctor``: one line per check with its
mark and status, its evidence, and its next step where the check gives one (the CLI prints
these; nothing here prints)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from memfit.estimate.verdict import DOES_NOT_FIT, Verdict
from memfit.report.advice import render_advice
from memfit.units import format_bytes

if TYPE_CHECKING:
    from memfit.plan.checklist import CheckResult
    from memfit.plan.doctor_findings import DoctorReport
    from memfit.plan.upgrade import UpgradeVerdict

#: The mark of each status, in both vocabularies (upgrade's items, doctor's findings).
STATUS_MARK = {
    "triggered": "[x]",
    "yes": "[x]",
    "not_triggered": "[ ]",
    "no": "[ ]",
    "not_applicable": "[-]",
    "unknown": "[?]",
}
#: GPUs listed in the text output of ``upgrade`` (``--json`` lists all).
N_RESOLVING_SHOWN = 8


def verdict_text(v: Verdict, gpu: str) -> str:
    """THE verdict in words, with one "needs" figure: the verdict's ``need_bytes`` (the upper
    end, the figure the checks and ``--json`` give). :meth:`Verdict.text` says the same for
    ``fits`` and ``tight``; for ``does not fit`` it leads with the point value, which a checklist
    names instead (the estimate), so its lines carry one "needs" figure."""
    if v.verdict != DOES_NOT_FIT:
        return v.text(gpu)
    return (
        f"{v.verdict.upper()} on {gpu}: needs {format_bytes(v.need_bytes)} (upper end) of its "
        f"{format_bytes(v.limit_bytes)} limit; even the estimate, "
        f"{format_bytes(v.point_bytes)}, is {format_bytes(v.point_bytes - v.capacity_bytes)} "
        f"over its {format_bytes(v.capacity_bytes)}"
    )


def render_checks(results: Sequence[CheckResult]) -> list[str]:
    """Each result: ``[x] title: status``, its evidence, and ``next: ...`` unless it is clear."""
    lines = []
    for r in results:
        lines.append(f"{STATUS_MARK[r.status]} {r.title}: {r.status.replace('_', ' ')}")
        lines.append(f"    {r.evidence}")
        if r.next_step is not None and not r.clear:
            lines.append(f"    next: {r.next_step}")
    return lines


def render_upgrade(v: UpgradeVerdict) -> str:
    r = v.request
    job = f"{r.mode} seq {r.seq_len}"
    if r.mode == "infer":
        job += f", {v.concurrency} concurrent requests of {v.context_tokens} tokens"
    elif r.global_batch:
        job += f", global batch {r.global_batch}"
    lines = [f"memfit upgrade: {v.model_name}, {job}, on {r.gpus} x {v.gpu_name}"]
    if v.plan.as_asked is not None:
        lines.append(f"as asked: {verdict_text(v.plan.as_asked, v.gpu_name)}")
    lines.append("")
    lines += render_checks(v.items)
    lines += ["", f"verdict: {v.summary}"]
    if v.resolving:
        lines.append("GPUs that resolve the triggered items:")
        lines.append(render_advice(v.resolving[:N_RESOLVING_SHOWN]))
        if len(v.resolving) > N_RESOLVING_SHOWN:
            lines.append(f"... and {len(v.resolving) - N_RESOLVING_SHOWN} more (--json)")
    lines += [f"note: {n}" for n in v.notes]
    return "\n".join(lines)


def render_doctor(r: DoctorReport) -> str:
    where = f" on {r.gpu_name}" if r.gpu_name else ""
    lines = [
        f"memfit doctor: {r.model_name}{where}: {len(r.applying)} of {len(r.findings)} mistakes "
        f"apply, {sum(f.applies == 'unknown' for f in r.findings)} unknown "
        f"(engine {r.estimate.engine})",
    ]
    if r.verdict is not None and r.gpu_name:
        lines.append(f"verdict: {verdict_text(r.verdict, r.gpu_name)}")
    lines.append("")
    lines += render_checks(r.findings)
    lines += [f"note: {n}" for n in r.notes]
    return "\n".join(lines)
