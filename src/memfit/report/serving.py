"""What ``memfit vllm`` and ``fit`` / ``plan --runtime vllm`` print: vLLM's start-up lines, the
verdict and the way out (text), or one JSON record per start-up."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memfit.serving.solve import ServingOption
from memfit.serving.startup import NotModelledServing, VllmStartup
from memfit.units import GiB


def startup_json(
    s: VllmStartup, command: str | None = None, nearest: ServingOption | None = None
) -> dict[str, Any]:
    """The ``--json`` record of one VllmStartup, with the ``vllm serve`` command line (and, for
    one that fails, the nearest configuration that starts)."""
    out = {**s.to_json(), "command": command}
    if nearest is not None:
        out["nearest_start"] = {
            "gpus": nearest.n_gpus,
            "gpu": nearest.gpu,
            "describe": nearest.describe(),
            "command": nearest.command,
        }
    return out


def render_startup(s: VllmStartup, model: str, nearest: ServingOption | None = None) -> str:
    """The start-up lines, the verdict and the way out (``nearest``: the nearest configuration
    that starts, found by the serving planner)."""
    g = 1 / GiB
    why = {"installed": "the installed vLLM", "newest modelled": "newest modelled release"}
    out = [
        f"vLLM {s.release or s.version} ({s.engine.upper()} engine; "
        f"{why.get(s.version_source, s.version_source)}) serving {model} on {s.gpu} "
        f"(per GPU: {s.total_bytes * g:.2f} GiB, weights {s.weight_format}):"
    ]
    if s.refused_layout:  # vLLM stops before it loads the model: no memory lines, no memory fix
        out.append(f"FAILS: {s.error}")
        return "\n".join(out + [f"note: {n}" for n in s.notes])
    out += [f"  {line}" for line in s.log_lines()]
    out.append(
        f"  [memfit] activation peak {s.activation_peak_bytes * g:.2f} GiB, non-torch "
        f"{s.non_torch_bytes * g:.2f} GiB, CUDA graphs ~{s.cuda_graph_bytes * g:.2f} GiB "
        f"({_graph_place(s)}); max_num_seqs "
        f"{s.max_num_seqs}, max_num_batched_tokens {s.max_num_batched_tokens}"
    )
    if s.starts:
        out.append("STARTS")
    else:
        out.append(f"FAILS: {s.error}")
        if s.largest_max_model_len:
            out.append(f"  largest --max-model-len that starts: {s.largest_max_model_len}")
        if s.smallest_gpu_memory_utilization is not None:
            out.append(
                f"  smallest --gpu-memory-utilization that starts: "
                f"{s.smallest_gpu_memory_utilization:.2f}"
            )
        else:
            out.append(
                "  no --gpu-memory-utilization fits this GPU: more GPUs (TP), "
                "quantization or a shorter --max-model-len"
            )
        if nearest is not None:
            out.append(f"  nearest change that starts: {nearest.describe()}: {nearest.command}")
    out += [f"note: {n}" for n in s.notes]
    return "\n".join(out)


def _graph_place(s: VllmStartup) -> str:
    if s.extensible is not None:
        return "measured before the KV cache is sized"
    return f"{'inside' if s.cudagraph_in_budget else 'outside'} the budget"


def serving_plan_json(
    options: Sequence[ServingOption], concurrency: int, max_model_len: int
) -> dict[str, Any]:
    """``plan --runtime vllm --json``: every option that serves the load, best first."""
    return {
        "runtime": "vllm", "concurrency": concurrency, "max_model_len": max_model_len,
        "fits": bool(options),
        "options": [{"gpu": o.gpu, "n_gpus": o.n_gpus, "command": o.command,
                     **startup_json(o.startup, o.command)} for o in options],
    }  # fmt: skip


def render_serving_plan(
    options: Sequence[ServingOption], concurrency: int, max_model_len: int, *, where: str | None
) -> str:
    """``plan --runtime vllm``: the best option and its command, then up to five others.
    ``where``: the GPU asked for (None: the catalog)."""
    if not options:
        where = where or "any catalog GPU (1-8 per replica)"
        return (
            f"NOTHING FITS: no vLLM configuration on {where} holds {concurrency} requests of "
            f"{max_model_len:,} tokens (tried TP 1-8, fp8 weights and fp8 KV where the GPU has "
            "fp8)"
        )
    best = options[0]
    out = [
        f"vLLM serves {concurrency} concurrent requests of {max_model_len:,} tokens on "
        f"{best.describe()}: max concurrency {best.startup.max_concurrency:.2f}x",
        best.command,
    ]
    out += [
        f"  also: {o.describe()} ({o.startup.max_concurrency:.2f}x): {o.command}"
        for o in options[1:6]
    ]
    return "\n".join(out)


def render_not_modelled(n: NotModelledServing, model: str) -> str:
    """A vLLM question memfit does not model: the reason, then the nearest answer it has."""
    g = 1 / GiB
    out = [f"NOT MODELLED: {n.reason}"]
    if n.weights_bytes is not None:
        verdict = "more than" if n.weights_exceed_budget else "within"
        out.append(
            f"  nearest answer: {model}'s weights alone are {n.weights_bytes * g:.2f} GiB in the "
            f"model dtype, {verdict} vLLM's {n.requested_bytes * g:.2f} GiB budget on {n.gpu} "
            "(--gpu-memory-utilization x total; activations, KV cache and CUDA graphs not counted)"
        )
    out.append(f"  its inference outside vLLM: {n.nearest_command}")
    return "\n".join(out)
