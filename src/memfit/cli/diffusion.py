"""``memfit estimate <pipeline>``: diffusion pipeline inference (docs/diffusion.md).

A bundled pipeline name (``memfit models``), its hub id, or a local directory with a
``model_index.json`` is sized by :mod:`memfit.estimate.diffusion.pipelines`; everything else
goes to the ordinary ``estimate``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from memfit.errors import SpecError

#: estimate flags that mean nothing to a pipeline run: refused when set, not ignored.
_REFUSED = {
    "lora_rank": None,
    "checkpointing": None,
    "shard": None,
    "optimizer": None,
}


def is_pipeline(model: str) -> bool:
    from memfit.models.pipelines import pipeline_dir

    return pipeline_dir(model) is not None


def refuse_pipeline_flags(args: argparse.Namespace) -> None:
    """A diffusion-pipeline flag on a model that is not a pipeline: refused, not ignored."""
    from memfit.flags import flags_for

    for f in flags_for("estimate"):
        if f.target == "pipeline" and getattr(args, f.dest, None) not in (None, False):
            raise SpecError(
                f"{f.name} applies to diffusion pipelines only, and {args.model!r} is not one "
                "(a bundled pipeline in `memfit models`, or a directory with a model_index.json)"
            )


def _job(args: argparse.Namespace) -> Any:
    from memfit.spec.diffusion import DiffusionJob

    if getattr(args, "offload", None) not in (None, "none"):
        raise SpecError(
            "--offload is ZeRO/FSDP training offload; for a diffusion pipeline use "
            "--pipeline-offload model|sequential|group"
        )
    if args.pipeline_offload != "group":
        for dest in ("offload_type", "num_blocks_per_group", "use_stream"):
            if getattr(args, dest, None) not in (None, False):
                raise SpecError(
                    f"--{dest.replace('_', '-')} is a group-offload setting: add "
                    "--pipeline-offload group"
                )
    for dest in _REFUSED:
        value = getattr(args, dest, None)
        if value not in (None, "none", False):
            raise SpecError(f"--{dest.replace('_', '-')} does not apply to a diffusion pipeline")
    kwargs: dict[str, Any] = {
        "batch": args.batch,
        "precision": args.precision or "bf16",
        "vae_slicing": bool(args.vae_slicing),
        "vae_tiling": bool(args.vae_tiling),
        "use_stream": bool(getattr(args, "use_stream", False)),
        "attention_slicing": bool(getattr(args, "attention_slicing", False)),
        "drop_text_encoder_3": bool(getattr(args, "drop_text_encoder_3", False)),
        "quant": getattr(args, "quant", None) or "none",
    }
    for dest, key in (
        ("height", "height"),
        ("width", "width"),
        ("steps", "steps"),
        ("num_frames", "num_frames"),
        ("vae_precision", "vae_precision"),
        ("pipeline_offload", "offload"),
        ("offload_type", "offload_type"),
        ("num_blocks_per_group", "num_blocks_per_group"),
        ("layerwise_casting", "layerwise_casting"),
        ("text_encoder_quant", "text_encoder_quant"),
    ):
        if getattr(args, dest, None) is not None:
            kwargs[key] = getattr(args, dest)
    return DiffusionJob(**kwargs)


def cmd_estimate_pipeline(args: argparse.Namespace) -> int:
    from memfit.api import estimate
    from memfit.cli import diffusion_train as cli_diffusion_train

    if getattr(args, "mode", "train") == "train":  # the diffusers training scripts
        return cli_diffusion_train.cmd_estimate(args)
    cli_diffusion_train.refuse_train_flags_in_inference(args)
    job = _job(args)
    if sys.stderr.isatty() and not args.json:
        print(f"tracing {args.model}'s components on fake tensors ...", file=sys.stderr)
    gpu = None
    if args.gpu:
        from memfit.hardware.catalog import get_gpu

        gpu = get_gpu(args.gpu)
    est = estimate(args.model, job, gpu=gpu)
    fits = None
    if gpu is not None:
        from memfit.hardware.overhead import device_overhead

        # the verdict adds the CUDA context and cuBLAS workspaces of an inference process
        # (hardware/overhead.py), which the tensor peak does not hold; with the allocator replay,
        # what nvidia-smi adds on top of the reserved peak (the replay holds the workspaces)
        ov = device_overhead(gpu.arch, training=False)
        overhead = ov.total_bytes
        need = est.peak_bytes + overhead
        upper = est.peak_upper_bytes + overhead
        if est.peak_reserved_bytes is not None:
            overhead = ov.outside_allocator_bytes
            need = max(need, est.peak_reserved_bytes + overhead)
            upper = max(upper, (est.peak_reserved_upper_bytes or 0) + overhead)
        # the cuDNN workspace allowance (diffusion_workspace.py) does not decide the verdict:
        # PyTorch's cuDNN path skips a plan whose workspace cannot be allocated and runs one
        # with less, so a job whose tensors fit runs; the verdict says when the allowance does
        # not fit (the decode may then take slower plans, and a measured peak on a larger card
        # is higher)
        fits = {
            "gpu": gpu.name,
            "capacity_bytes": gpu.memory_bytes,
            "overhead_bytes": overhead,
            "need_bytes": need,
            "need_with_conv_workspace_bytes": upper,
            "fits": need <= gpu.memory_bytes,
            "fits_with_conv_workspace": upper <= gpu.memory_bytes,
        }
    if args.json:
        print(json.dumps({**est.to_json(), "fits": fits}, indent=2))
    else:
        print(render(est, fits))
    return 1 if fits is not None and not fits["fits"] else 0


def render(est: Any, fits: dict[str, Any] | None) -> str:
    from memfit.units import format_bytes as fb

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
    if fits is not None:
        verdict = "fits" if fits["fits"] else "does NOT fit"
        if fits["fits"] and not fits["fits_with_conv_workspace"]:
            verdict = (
                "fits (the tensors fit; cuDNN's preferred convolution plans may want up to "
                f"{fb(fits['need_with_conv_workspace_bytes'] - fits['capacity_bytes'])} more "
                "workspace than the card has free, and PyTorch then runs plans with less "
                "workspace, which can make the VAE decode slower)"
            )
        lines.append(
            f"{fits['gpu']} ({fb(fits['capacity_bytes'])}): {verdict} (needs "
            f"{fb(fits['need_bytes'])} with {fb(fits['overhead_bytes'])} of CUDA context and "
            "workspaces)"
        )
    lines += [f"note: {n}" for n in est.notes]
    return "\n".join(lines)
