"""The ``python -m sglang.launch_server`` command line of an :class:`SglangConfig`."""

from __future__ import annotations

import shlex

from memfit.serving.command import hub_id
from memfit.spec.sglang import SglangConfig

__all__ = ["launch_command"]


def launch_command(model: str, config: SglangConfig) -> str:
    """``python -m sglang.launch_server --model-path <hub id> …`` with every flag that differs
    from SGLang's default."""
    parts = ["python", "-m", "sglang.launch_server", "--model-path", shlex.quote(hub_id(model))]
    for flag, value, default in (
        ("--tp-size", config.tp_size, 1),
        ("--dp-size", config.dp_size, 1),
        ("--ep-size", config.ep_size, 1),
        ("--mem-fraction-static", config.mem_fraction_static, None),
        ("--context-length", config.context_length, None),
        ("--max-running-requests", config.max_running_requests, None),
        ("--max-total-tokens", config.max_total_tokens, None),
        ("--chunked-prefill-size", config.chunked_prefill_size, None),
        ("--kv-cache-dtype", config.kv_cache_dtype, "auto"),
        ("--cuda-graph-max-bs", config.cuda_graph_max_bs, None),
        ("--page-size", config.page_size, 1),
        ("--quantization", config.quantization, None),
        ("--dtype", config.dtype, "auto"),
        ("--attention-backend", config.attention_backend, None),
    ):
        if value != default:
            parts += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    if config.enable_dp_attention:
        parts.append("--enable-dp-attention")
    if config.disable_cuda_graph:
        parts.append("--disable-cuda-graph")
    return " ".join(parts)
