"""The settings the trace engine refuses, judged from the workload alone (torch-free).

The trace engine runs transformers' own loss and torch's checkpoint: a chunked or fused
cross-entropy and checkpoints kept in host RAM are the analytic engine's alone. The trace engine
raises this refusal itself (``engine._trace_run``); the engine policy asks first
(``memfit.estimate.policy.run_engine``), so a confirmation the trace would refuse costs no torch
import and no model build (issue 32: ``plan``'s recommended plan with a fused loss paid ~20 s
for the refusal).
"""

from __future__ import annotations

from memfit.errors import NotModelledError
from memfit.spec import WorkloadSpec


def refusal(workload: WorkloadSpec) -> NotModelledError | None:
    """The trace engine's refusal of ``workload`` (a NotModelledError to raise), or None."""
    if workload.loss != "full" or workload.checkpointing == "offload":
        return NotModelledError(
            f"loss {workload.loss!r} / checkpointing {workload.checkpointing!r}: the trace "
            "engine runs transformers' own loss and torch's checkpoint; a chunked or fused "
            "cross-entropy and checkpoints kept in host RAM are modelled by the analytic engine "
            "(--engine analytic)",
            engine="trace",
        )
    if workload.kernels != "hf":
        return NotModelledError(
            f"kernels {workload.kernels!r}: the trace engine runs transformers' modules and "
            "peft's LoRA layers; Unsloth's fused kernels are modelled by the analytic engine "
            "(--engine analytic)",
            engine="trace",
        )
    return None


def refused_setting(workload: WorkloadSpec) -> str | None:
    """What in ``workload`` the trace engine refuses (:func:`refusal`), in a few words for a
    sentence ("the trace engine cannot run a fused cross-entropy"); None where it runs it."""
    if refusal(workload) is None:
        return None
    if workload.loss != "full":
        return f"a {workload.loss} cross-entropy"
    if workload.checkpointing == "offload":
        return "checkpoints kept in host RAM"
    return f"{workload.kernels} kernels"
