"""Text of the diffusion answers: a pipeline call, a training run, its fit and its plan (the CLI
prints these; nothing here prints). The verdict line is :meth:`Verdict.text
<memfit.estimate.verdict.Verdict.text>`, the one every command prints."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memfit.units import format_bytes as fb

if TYPE_CHECKING:  # the records' modules import torch; report/ does not
    from memfit.estimate.diffusion.pipeline import PipelineEstimate
    from memfit.estimate.diffusion.train import TrainEstimate
    from memfit.plan.diffusion_fit import PipelineFit
    from memfit.plan.diffusion_infer import PipelinePlan, PipelinePlans
    from memfit.plan.diffusion_train import TrainFit, TrainPlan


def render_pipeline(est: PipelineEstimate) -> str:
    """A pipeline call: the peak, the stages, the components, the verdict on the GPU asked."""
    j = est.job
    lines = [
        f"{est.name} ({est.pipeline}) {j.height}x{j.width}, {j.steps} steps, batch {j.batch}, "
        f"{j.precision}, offload {j.offload}"
        + (", vae slicing" if j.vae_slicing else "")
        + (", vae tiling" if j.vae_tiling else "")
        + (", attention slicing" if j.attention_slicing else ""),
        f"peak on the GPU: {fb(est.peak_bytes)} allocated (in {est.peak_stage})"
        + (
            f", {fb(est.peak_reserved_bytes)} reserved by the caching allocator"
            if est.peak_reserved_bytes is not None
            else ""
        ),
        "",
        f"{'stage':<12}{'peak':>12}{'weights':>12}{'activations':>13}{'carried':>11}  components",
    ]
    for s in est.stages:
        lines.append(
            f"{s.stage:<12}{fb(s.peak_bytes):>12}{fb(s.resident_weights_bytes):>12}"
            f"{fb(s.activation_peak_bytes):>13}{fb(s.carried_bytes):>11}  {', '.join(s.components)}"
        )
    lines += ["", f"{'component':<16}{'class':<28}{'weights':>12}{'activations':>13}  format"]
    for c in est.components:
        lines.append(
            f"{c.name:<16}{c.class_name:<28}{fb(c.weights_bytes):>12}"
            f"{fb(c.activation_peak_bytes):>13}  {c.storage or c.dtype}"
        )
    if est.host_weights_bytes:
        lines.append(f"\nhost RAM for offloaded weights: {fb(est.host_weights_bytes)}")
    if est.conv_workspace_bytes:
        lines.append(
            f"cuDNN convolution workspace: up to {fb(est.conv_workspace_bytes)} more where the "
            f"card has it free (peak up to {fb(est.peak_upper_bytes)} allocated)"
        )
    v = est.verdict
    if v is not None:
        lines.append(
            f"{v.text(est.gpu or 'the GPU')} (with {fb(est.overhead_bytes)} of CUDA context and "
            "workspaces)"
        )
        upper = est.device_used_upper_bytes
        if v.point_bytes <= v.capacity_bytes < upper:
            lines.append(
                "  the tensors fit; cuDNN's preferred convolution plans may want up to "
                f"{fb(upper - v.capacity_bytes)} more workspace than the card has free, and "
                "PyTorch then runs plans with less workspace, which can make the VAE decode slower"
            )
    lines += [f"note: {n}" for n in est.notes]
    lines.append(f"engine: {est.engine} ({est.engine_reason})")
    return "\n".join(lines)


def render_training(est: TrainEstimate) -> str:
    """A training run: the peak by phase and component, the verdict on the GPU asked."""
    lines = [
        f"{est.name} ({est.pipeline}) training: {est.job.flags()}",
        f"script: diffusers {est.script}",
        f"peak on the GPU: {fb(est.peak_bytes)} allocated (in {est.peak.phase}), "
        f"{fb(est.peak_reserved_bytes)} reserved by the caching allocator",
        "",
        f"{'phase':<16}{'peak':>12}{'params':>12}{'grads':>12}{'optim':>12}{'activ':>12}"
        f"{'temp':>12}",
    ]
    for p in est.phases:
        lines.append(
            f"{p.phase:<16}{fb(p.peak_bytes):>12}{fb(p.parameters_bytes):>12}"
            f"{fb(p.gradients_bytes):>12}{fb(p.optimizer_states_bytes):>12}"
            f"{fb(p.activations_bytes):>12}{fb(p.temporary_bytes):>12}"
        )
    peak = est.peak
    by_model = ", ".join(f"{k} {fb(v)}" for k, v in peak.by_model.items() if v)
    lines += ["", f"at the peak ({peak.phase}), by component: " + by_model]
    lines += ["", f"{'component':<16}{'class':<30}{'dtype':<10}{'weights':>12}  role"]
    for c in est.components:
        lines.append(
            f"{c.name:<16}{c.class_name:<30}{c.dtype:<10}{fb(c.weights_bytes):>12}  {c.role}"
            + (f" ({c.n_trainable:,} trainable)" if c.n_trainable else "")
        )
    v = est.verdict
    if v is not None:
        lines.append(
            f"\n{v.text(est.gpu or 'the GPU')} (with {fb(est.overhead_bytes)} of CUDA context and "
            "workspaces)"
        )
    lines += [f"note: {n}" for n in est.notes]
    return "\n".join(lines)


def render_training_fit(result: TrainFit) -> str:
    """``fit <pipeline> --mode train``: the largest batch / resolution, then its run."""
    b = result.budget
    if result.fits and result.verdict is not None:
        return (
            f"largest {result.solve} that fits {b.gpu_name} (limit {fb(b.limit_bytes)}): "
            f"{result.value}  (needs {fb(result.verdict.need_bytes)})\n"
            + render_training(result.estimate)
        )
    return f"does NOT fit {b.gpu_name} even at the smallest {result.solve}:\n" + render_training(
        result.estimate
    )


def render_training_plan(result: TrainPlan, model: str) -> str:
    """``plan <pipeline> --mode train``: every switch combination traced, cheapest first."""
    b = result.budget
    lines = [f"{model} training on {b.gpu_name} (limit {fb(b.limit_bytes)}), cheapest step first:"]
    for j, est, v in result.tried:
        mark = v.judgement.verdict if v.judgement.verdict != "does not fit" else "does NOT fit"
        lines.append(
            f"  {mark:<13}{fb(v.need_bytes):>12}  peak in {est.peak.phase:<10} "
            f"memfit estimate {model} --mode train {j.flags()}"
        )
    if not result.fits:
        lines.append("nothing fits: try a smaller --resolution or --batch, or LoRA")
    return "\n".join(lines)


def _mark(p: PipelinePlan) -> str:
    v = p.verdict.verdict
    return "does NOT fit" if v == "does not fit" else v


def render_pipeline_plan(result: PipelinePlans, model: str, gpu_flag: str | None = None) -> str:
    """``plan <pipeline> --mode infer``: the call as asked, then each plan that fits, best first,
    with its diffusers code, its need and THE verdict; ``gpu_flag``: the ``--gpu`` of the
    estimate commands it prints (default: the budget's GPU; "" for none)."""
    b = result.budget
    a = result.asked
    lines = [
        f"{model} ({result.pipeline}) inference on {b.gpu_name} (limit {fb(b.limit_bytes)}): "
        f"as asked ({a.job.height}x{a.job.width}, batch {a.job.batch}, {a.job.precision}, "
        f"offload {a.job.offload}) needs {fb(a.verdict.need_bytes)}: {_mark(a)}",
    ]
    fitting = result.fitting
    if not fitting:
        lines.append(
            f"nothing fits of the {len(result.plans)} settings tried (offload modes, VAE "
            "tiling, quantized weights, fewer images, smaller pictures)"
        )
        return "\n".join(lines)
    lines.append(
        "plans that fit, best first (memory-only before result-changing; then the slowdown "
        "rank: published timings of the offload mode x the weight format, a rank, not a time "
        "on this GPU):"
    )
    for i, p in enumerate(fitting, 1):
        kind = "memory-only" if p.memory_only else "changes the result"
        what = ", ".join(c.what for c in p.changes) or "as asked"
        host = p.estimate.host_weights_bytes
        lines.append(
            f"{i}. {what}  [{kind}]  needs {fb(p.verdict.need_bytes)}: {_mark(p)}; "
            f"slowdown rank x{p.slowdown:.1f}" + (f"; host RAM {fb(host)}" if host else "")
        )
        lines += [f"     {line}" for line in p.code]
        flag = f"--gpu {b.gpu_name}" if gpu_flag is None else gpu_flag
        lines.append(f"     memfit estimate {model} {p.job_flags} {flag}".rstrip())
    return "\n".join(lines)


def nearest_fit_line(result: PipelinePlans, model: str, gpu: str) -> str:
    """The line ``estimate`` ends with when the call does not fit: the first plan, and the
    command that lists them all."""
    cmd = f"memfit plan {model} {result.asked.job_flags} --gpu {gpu}"
    best = result.best
    if best is None:
        return f"no change memfit tries makes it fit (see: {cmd})"
    kind = "memory-only" if best.memory_only else "changes the result"
    what = ", ".join(c.what for c in best.changes)
    return (
        f"nearest change that fits: {what} [{kind}], needs {fb(best.verdict.need_bytes)} "
        f"({'; '.join(best.code)}); all plans: {cmd}"
    )


def render_pipeline_fit(result: PipelineFit, model: str) -> str:
    """``fit <pipeline> --mode infer``: the most images per prompt / the largest square picture
    that fits, then that call."""
    b = result.budget
    what = "images per prompt" if result.solve == "batch" else "square resolution (pixels)"
    est = result.estimate
    if result.fits:
        head = (
            f"largest {what} that fits {b.gpu_name} (limit {fb(b.limit_bytes)}): {result.value}"
            f"  (needs {fb(est.fits.need_bytes)})"
        )
    else:
        head = (
            f"does NOT fit {b.gpu_name} even at the smallest {what} (needs "
            f"{fb(est.fits.need_bytes)}); see: memfit plan {model} --mode infer --gpu {b.gpu_name}"
        )
    return head + "\n" + render_pipeline(est)
