"""Human-readable rendering of estimates (the CLI prints these; nothing here prints)."""

from __future__ import annotations

from collections.abc import Sequence

from memfit.estimate.result import COMPONENTS, MemoryEstimate
from memfit.models.bundled import BundledModel
from memfit.models.media import inputs_phrase
from memfit.models.pipelines import BundledPipeline
from memfit.units import format_bytes


def _count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return str(n)


def _workload_line(est: MemoryEstimate) -> str:
    w = est.workload
    shape = f"batch {w['batch_size']} × seq {w['seq_len']}"
    if w.get("inputs"):  # an image / speech model: its own terms (memfit.models.media)
        shape = inputs_phrase(w["inputs"], w["batch_size"], w["mode"])
    parts = [w["mode"], shape, w["precision"]]
    if w["mode"] == "infer" and w.get("new_tokens"):
        parts.append(f"{w['new_tokens']} new tokens")
    if w.get("prefill_chunk_size"):
        parts.append(f"prefill in chunks of {w['prefill_chunk_size']}")
    backends = ", ".join(f"{k} ×{v}" for k, v in sorted(est.attention_backends.items()))
    parts.append(f"attention {w['attention']}" + (f" ({backends})" if backends else ""))
    if w["mode"] == "train":
        parts.append(f"checkpointing {w['checkpointing']}")
        parts.append(f"optimizer {w['optimizer']}")
        if w.get("lora_rank"):
            targets = w.get("lora_targets")
            shown = targets if isinstance(targets, str) else ",".join(targets or [])
            parts.append(f"LoRA r={w['lora_rank']} on {shown}")
            if w.get("lora_modules_to_save"):
                saved = ",".join(w["lora_modules_to_save"])
                parts.append(f"{saved} trained in full (modules_to_save)")
            if w.get("lora_dropout"):
                parts.append(f"lora_dropout {w['lora_dropout']}")
        if w.get("transformers_version"):
            parts.append(f"transformers {w['transformers_version']}'s step")
        if w.get("peft_version"):
            parts.append(f"peft {w['peft_version']}'s adapters")
        if w.get("freeze_layers"):
            parts.append(f"first {w['freeze_layers']} layers frozen")
    if w.get("quant", "none") != "none":
        group = f" (group {w['quant_group_size']})" if w.get("quant_group_size") else ""
        parts.append(f"weights {w['quant']}{group}")
        if w.get("prepare_kbit"):
            parts.append("prepare_model_for_kbit_training (fp32 around them)")
    if (
        w.get("gpus", 1) > 1
        or w.get("shard", "none") != "none"
        or w.get("offload", "none") != "none"
    ):
        layout = [f"{w['gpus']} GPUs", f"shard {w['shard']}"]
        if w.get("tp", 1) > 1:
            layout.append(f"tp {w['tp']}")
        if w.get("pp", 1) > 1:
            virtual = w.get("pp_virtual_stages", 1)
            chunks = f" x {virtual} chunks" if virtual > 1 else ""
            layout.append(f"pp {w['pp']} ({w.get('pp_schedule', '1f1b')}{chunks})")
        if w.get("cp", 1) > 1:
            layout.append(f"cp {w['cp']} ({w.get('cp_rotate', 'allgather')})")
        if w.get("ep", 1) > 1:
            layout.append(f"ep {w['ep']}" + (f" etp {w['etp']}" if w.get("etp", 1) > 1 else ""))
        if w.get("offload", "none") != "none":
            layout.append(f"offload {w['offload']}")
        if w.get("dp_replicate", 1) > 1:  # FSDP2 / HSDP (par-a)
            layout.append(f"HSDP replicate {w['dp_replicate']}")
        if "reshard_after_forward" in w:
            layout.append(f"reshard_after_forward {w['reshard_after_forward']}")
        if "zero_hpz_partition_size" in w:
            layout.append(f"ZeRO++ hpZ {w['zero_hpz_partition_size']}")
        if w.get("fsdp_version", 2) == 1:  # FSDP1 (issue 30)
            layout.append("FSDP1")
        parts.append(" ".join(layout) + " (per-GPU figures)")
    return ", ".join(parts)


def _range(est: MemoryEstimate, metric: str) -> str:
    if metric not in est.ranges:
        return ""
    low, high = est.ranges[metric]
    return f"  [{format_bytes(low)} – {format_bytes(high)}]"


def render_estimate(est: MemoryEstimate, *, top: int = 5) -> str:
    lines = [
        f"memfit estimate: {est.model_name} ({_count(est.n_params)} params, "
        f"{_count(est.n_trainable_params)} trainable)",
        f"workload: {_workload_line(est)}",
        _engine_line(est),
        "",
        f"{'component':<20}{'at peak (' + est.peak_phase + ')':>22}",
    ]
    for comp in COMPONENTS:
        lines.append(f"  {comp:<18}{format_bytes(est.components[comp]):>22}")
    lines += [
        f"{'peak allocated':<20}{format_bytes(est.peak_allocated_bytes):>22}"
        f"{_range(est, 'peak_allocated_bytes')}   max_memory_allocated()",
        f"{'peak reserved':<20}{format_bytes(est.peak_reserved_bytes):>22}"
        f"{_range(est, 'peak_reserved_bytes')}   max_memory_reserved()",
        f"{'CUDA context':<20}{format_bytes(est.cuda_context_bytes):>22}",
        f"{'device used':<20}{format_bytes(est.device_used_bytes):>22}"
        f"{_range(est, 'device_used_bytes')}   what nvidia-smi shows",
    ]
    if est.host_memory_bytes:
        lines.append(f"{'host RAM':<20}{format_bytes(est.host_memory_bytes):>22}   offloaded")
    if est.unified_memory_bytes:
        lines.append(
            f"{'unified (paged)':<20}{format_bytes(est.unified_memory_bytes):>22}"
            "   paged optimizer states (in optimizer_states)"
        )
    lines += [
        f"[low – high] range: {est.band.describe()}; docs/accuracy.md §8",
        "",
        "phase peaks: "
        + " · ".join(
            f"{p.phase} {format_bytes(p.peak_allocated_bytes)}" for p in est.phases.values()
        ),
    ]
    if est.top_modules and top > 0:
        lines.append(f"top modules at the peak ({est.peak_phase}; '*' = summed over layers):")
        for m in est.top_modules[:top]:
            lines.append(f"  {m.name or '(outside modules)':<48}{format_bytes(m.n_bytes):>14}")
    lines.append(verdict_line(est))
    lines += [f"note: {n}" for n in est.notes]
    return "\n".join(lines)


def _engine_line(est: MemoryEstimate) -> str:
    env = ", ".join(f"{k} {v}" for k, v in est.environment.items() if k != "python")
    t = est.trace
    how = ""
    if t.get("extrapolated"):
        how = f"; traced a few layers, extrapolated to {t.get('layers')}"
    if t.get("cached"):
        how += f"; from the trace cache (traced in {t.get('wall_s', 0):.1f} s; --no-cache traces)"
    elif "wall_s" in t:
        how += f"; {t['wall_s']:.1f} s"
    why = f"\n  why: {est.engine_reason}" if est.engine_reason else ""
    return f"engine: {est.engine} ({env}){how}{why}{_confirmed_line(est.confirmed)}"


def _confirmed_line(confirmed: bool | None) -> str:
    """Whether the trace confirmed the answer (nothing where no confirmation applies)."""
    if confirmed is None:
        return ""
    if confirmed:
        return "\n  confirmed: yes (the trace engine's bytes)"
    return (
        "\n  confirmed: no (the analytic engine's validated answer, not traced; --confirm "
        "traces it)"
    )


def verdict_line(est: MemoryEstimate) -> str:
    if est.fits is None:
        return "verdict: no GPU given (--gpu NAME adds a fits / free-memory verdict)"
    return f"verdict: {est.fits.judgement().text(est.fits.gpu)}"


def render_models(models: Sequence[BundledModel], pipelines: Sequence[BundledPipeline]) -> str:
    """``memfit models``: the shipped configs (name, family, task, source), then the shipped
    diffusion pipelines."""
    # columns as wide as their longest entry (+2): a long name never runs into its family
    n = max([len("name"), *(len(r.name) for r in models)]) + 2
    f = max([len("family"), *(len(r.family) for r in models)]) + 2
    out = [f"{'name':<{n}}{'family':<{f}}{'task':<12}source"]
    out += [f"{r.name:<{n}}{r.family:<{f}}{r.task:<12}{r.source_url}" for r in models]
    out.append("\ndiffusion pipelines (memfit estimate NAME --mode infer; docs/diffusion.md):")
    p_n = max([0, *(len(p.name) for p in pipelines)]) + 2
    p_w = max([0, *(len(p.pipeline) for p in pipelines)]) + 2
    out += [f"{p.name:<{p_n}}{p.pipeline:<{p_w}}{p.hf_id}" for p in pipelines]
    return "\n".join(out)
