"""The reverse questions for vLLM: how many requests of L tokens, how long a context, and which
GPU / count / TP / quantization / KV dtype serves N concurrent requests of L tokens.

Every answer is a :func:`~memfit.serving.startup.simulate_startup` run (milliseconds each), so it
carries the same accounting as ``memfit vllm``: concurrency is vLLM's own "Maximum concurrency for
L tokens per request" (KV blocks / blocks per request), capped by ``max_num_seqs``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from memfit.errors import SpecError
from memfit.hardware.catalog import GPU, list_gpus
from memfit.models import ModelSpec
from memfit.monotone import largest
from memfit.serving.command import serve_command
from memfit.serving.startup import (
    VllmStartup,
    batch_defaults,
    derived_max_model_len,
    simulate_startup,
    vllm_total_bytes,
)
from memfit.spec.serving import VllmConfig

__all__ = ["ServingOption", "plan_serving", "solve_concurrency", "solve_max_model_len"]

#: GPU counts a plan tries (one replica on TP GPUs).
TP_SIZES = (1, 2, 4, 8)


def solve_concurrency(spec: ModelSpec, gpu: GPU, config: VllmConfig) -> tuple[int, VllmStartup]:
    """Concurrent requests of ``config.max_model_len`` tokens vLLM holds (0 if it fails)."""
    s = simulate_startup(spec, gpu, config)
    if not s.starts:
        return 0, s
    return min(int(s.max_concurrency), s.max_num_seqs), s


def solve_max_model_len(
    spec: ModelSpec, gpu: GPU, config: VllmConfig, *, concurrency: int = 1
) -> tuple[int, VllmStartup | None]:
    """The largest ``--max-model-len`` that starts and holds ``concurrency`` requests of that
    length (0 if none), by bisection up to the model's derived max_model_len."""
    upper = derived_max_model_len(spec) or config.max_model_len
    if upper is None:
        raise SpecError("the config gives no max_position_embeddings: pass --seq to bound it")

    def ok(length: int) -> VllmStartup | None:
        s = simulate_startup(spec, gpu, replace(config, max_model_len=length))
        return s if s.starts and s.max_concurrency >= concurrency else None

    return largest(ok, upper)


@dataclass(frozen=True, kw_only=True)
class ServingOption:
    """One configuration that serves the requested load, and its ``vllm serve`` command."""

    gpu: str
    n_gpus: int
    config: VllmConfig
    startup: VllmStartup
    command: str

    def describe(self) -> str:
        c = self.config
        parts = [f"{self.n_gpus} x {self.gpu}", f"TP {c.tensor_parallel_size}"]
        parts.append(f"weights {self.startup.weight_format}")
        parts.append(f"KV {self.startup.kv_cache_dtype}")
        return ", ".join(parts)


def _candidates(
    gpu: GPU, max_gpus: int | None, allow_quant: bool
) -> list[tuple[int, str | None, str]]:
    out = []
    for tp in TP_SIZES:
        if max_gpus is not None and tp > max_gpus:
            break
        for quant in (None, "fp8") if allow_quant and gpu.supports_fp8 else (None,):
            for kv in ("auto", "fp8") if gpu.supports_fp8 else ("auto",):
                out.append((tp, quant, kv))
    # fewest GPUs first; then full-precision weights before fp8; then the model-dtype KV cache
    return sorted(out, key=lambda t: (t[0], t[1] is not None, t[2] != "auto"))


def plan_serving(
    spec: ModelSpec,
    model: str,
    *,
    concurrency: int,
    max_model_len: int,
    gpus: list[GPU] | None = None,
    max_gpus: int | None = None,
    allow_quant: bool = True,
    base: VllmConfig | None = None,
) -> list[ServingOption]:
    """Configurations that start and hold ``concurrency`` requests of ``max_model_len`` tokens:
    for each GPU the first that works in the order fewest GPUs, 16-bit weights, model-dtype KV."""
    if concurrency < 1 or max_model_len < 1:
        raise SpecError(
            f"concurrency ({concurrency}) and max_model_len ({max_model_len}) must be 1 or more"
        )
    base = base or VllmConfig()
    options: list[ServingOption] = []
    for gpu in gpus or [g for g in list_gpus() if g.vendor == "nvidia"]:
        for tp, quant, kv in _candidates(gpu, max_gpus, allow_quant):
            heads = (spec.text or spec).n_heads
            if heads and heads % tp:
                continue  # vLLM: the attention heads must divide by TP
            default_seqs = batch_defaults(gpu, vllm_total_bytes(gpu))[1]
            seqs = concurrency if concurrency > default_seqs else base.max_num_seqs
            config = replace(
                base,
                tensor_parallel_size=tp,
                quantization=quant,
                kv_cache_dtype=kv,
                max_model_len=max_model_len,
                max_num_seqs=seqs,
            )
            s = simulate_startup(spec, gpu, config)
            if s.starts and s.max_concurrency >= concurrency:
                options.append(
                    ServingOption(
                        gpu=gpu.name,
                        n_gpus=tp,
                        config=config,
                        startup=s,
                        command=serve_command(model, config),
                    )
                )
                break
    return sorted(options, key=lambda o: (o.n_gpus, o.startup.total_bytes))


def concurrency_check(
    spec: ModelSpec, gpu: GPU, *, n_gpus: int, context_tokens: int, want: int
) -> tuple[str, str, dict[str, int | float]]:
    """``upgrade``'s KV-cache concurrency item under vLLM: (status, evidence, numbers) for
    ``want`` requests of ``context_tokens`` on one ``vllm serve`` replica over ``n_gpus`` (TP)."""
    options = plan_serving(
        spec, spec.model_type or "model", concurrency=1, max_model_len=context_tokens,
        gpus=[gpu], max_gpus=n_gpus, allow_quant=False,
    )  # fmt: skip
    if not options:
        text = f"vLLM does not start with --max-model-len {context_tokens} on {n_gpus} x {gpu.name}"
        return "triggered", text, {"concurrency": want, "max_concurrency": 0}
    s = options[0].startup
    most = min(int(s.max_concurrency), s.max_num_seqs)
    per_request = s.kv.needed_bytes
    numbers: dict[str, int | float] = {
        "concurrency": want,
        "max_concurrency": most,
        "context_tokens": context_tokens,
        "kv_cache_bytes_per_request": per_request,
        "kv_cache_bytes_requested": per_request * want,
        "vllm_kv_cache_tokens": s.kv_cache_tokens,
    }
    text = (
        f"vLLM {s.version} ({options[0].describe()}): GPU KV cache {s.kv_cache_tokens:,} tokens, "
        f"maximum concurrency {s.max_concurrency:.2f}x for {context_tokens:,} tokens per request "
        f"({'fewer' if most < want else 'at least as many'} than the {want} requested)"
    )
    return ("triggered" if most < want else "not_triggered"), text, numbers
