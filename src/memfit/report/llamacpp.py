"""What ``memfit llama-server`` prints: the buffer lines llama.cpp logs at start-up, the verdict
on the GPU, and the largest ``-ngl`` and ``-c`` that fit (text), or the record's JSON."""

from __future__ import annotations

from typing import Any

from memfit.estimate.llamacpp import LlamaCppEstimate
from memfit.units import GiB


def llamacpp_json(e: LlamaCppEstimate, command: str | None = None) -> dict[str, Any]:
    """The ``--json`` record: the estimate's own JSON and the ``llama-server`` line it sized."""
    return {**e.to_json(), "command": command}


def render_llamacpp(e: LlamaCppEstimate) -> str:
    g = 1 / GiB
    d = e.busiest
    where = f" on {e.gpu}" + (f" x{len(e.devices)}" if len(e.devices) > 1 else "")
    out = [f"llama.cpp serving {e.model}{where} (-ngl {e.n_gpu_layers}, -c {e.n_ctx}):"]
    out += [f"  {line}" for line in e.log_lines()]
    out.append(
        f"  [memfit] {d.name}: {d.total_bytes * g:.2f} GiB = model {d.model_bytes * g:.2f} + KV "
        f"{d.kv_bytes * g:.2f} + compute {d.compute_bytes * g:.2f} + CUDA pool "
        f"{d.pool_bytes * g:.2f} + CUDA context {d.context_bytes * g:.2f} GiB"
    )
    if e.verdict is not None and e.gpu is not None:
        out.append(e.verdict.text(e.gpu))
    if e.largest_n_gpu_layers is not None:
        out.append(
            f"  largest -ngl that fits at -c {e.n_ctx}: {e.largest_n_gpu_layers} "
            f"(of {e.n_layer + 1}: {e.n_layer} layers + output)"
        )
    if e.largest_ctx_size is not None:
        ctx = e.largest_ctx_size
        out.append(
            f"  largest -c that fits at -ngl {e.n_gpu_layers}: {ctx}" if ctx
            else f"  no -c fits at -ngl {e.n_gpu_layers}: offload fewer layers"
        )  # fmt: skip
    out += [f"note: {n}" for n in e.notes]
    return "\n".join(out)
