"""The public functions' own arguments (besides the specs), checked once with field, value, rule.

A ``WorkloadSpec`` checks its fields; what a function takes beside it — the workload itself, the
switches, the GPU — is checked here, so ``memfit.estimate("gpt2", "train")`` is a SpecError that
says what to pass instead of an AttributeError from deep inside an engine.
"""

from __future__ import annotations

from typing import Any

from memfit.spec.rules import MODES, raise_if
from memfit.spec.workload import WorkloadSpec

#: Arguments that are True or False (None allowed where the function gives None a meaning).
SWITCHES = ("trust_remote_code", "allow_code", "force")
OPTIONAL_SWITCHES = ("extrapolate",)


def argument_problems(**arguments: Any) -> list[str]:
    """The problems of the named arguments (unknown names are not checked)."""

    out: list[str] = []
    if "workload" in arguments:
        w = arguments["workload"]
        if w is not None and not isinstance(w, WorkloadSpec):
            hint = (
                f"memfit.WorkloadSpec(mode={w!r})"
                if w in MODES
                else "memfit.WorkloadSpec(batch_size=..., seq_len=...)"
            )
            out.append(f"workload ({w!r}) must be a WorkloadSpec or None; pass {hint}")
    for name in SWITCHES:
        if name in arguments and not isinstance(arguments[name], bool):
            out.append(f"{name} ({arguments[name]!r}) must be True or False")
    for name in OPTIONAL_SWITCHES:
        value = arguments.get(name)
        if value is not None and not isinstance(value, bool):
            out.append(f"{name} ({value!r}) must be True, False or None")
    gpu = arguments.get("gpu")
    if "gpu" in arguments and gpu is not None and not (isinstance(gpu, str) or _is_gpu(gpu)):
        out.append(f"gpu ({gpu!r}) must be a GPU name (see `memfit gpus`), a catalog GPU or None")
    return out


def check_arguments(**arguments: Any) -> None:
    """Raise one SpecError listing :func:`argument_problems`."""
    raise_if(argument_problems(**arguments))


def _is_gpu(value: Any) -> bool:
    return hasattr(value, "memory_bytes") and hasattr(value, "name")
