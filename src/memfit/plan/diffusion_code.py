"""A diffusion pipeline call's settings as diffusers code and as ``memfit estimate`` flags (what
:mod:`memfit.plan.diffusion_infer` prints for each plan).

Each change from the call as asked is a :class:`Change`: what it is, whether it leaves the
picture as it is (``memory-only``: offload modes, VAE tiling / slicing, attention slicing) or
changes it (weight formats, no T5, another size or image count), and the diffusers code that
sets it (diffusers 0.42: ``DiffusionPipeline.enable_*``, ``PipelineQuantizationConfig``,
``ModelMixin.enable_layerwise_casting``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from memfit.flags import flags_for
from memfit.spec.diffusion import BACKEND, FORMATS, DiffusionJob

MEMORY_ONLY, CHANGES_RESULT = "memory-only", "changes the result"


@dataclass(frozen=True, kw_only=True)
class Change:
    """One switch a plan sets: what it is, its kind, and the diffusers code."""

    what: str
    kind: str
    code: str

    def to_json(self) -> dict[str, str]:
        return {"change": self.what, "kind": self.kind, "code": self.code}


#: ``Change.what`` endings of a weight format set at load time (``quant_mapping`` entries)
_FORMAT_SUFFIXES = tuple(f" in {q}" for q in (*FORMATS, "none"))
_DEFAULT = DiffusionJob()


def describe(cand: DiffusionJob, asked: DiffusionJob, est: Any) -> tuple[Change, ...]:
    """The changes from ``asked`` to ``cand``, each as diffusers code."""
    out: list[Change] = []
    if (cand.offload, cand.offload_type, cand.use_stream) != (
        asked.offload, asked.offload_type, asked.use_stream
    ):  # fmt: skip
        what = f"offload {cand.offload}"
        if cand.offload == "group":
            what += f" ({cand.offload_type}{', stream' if cand.use_stream else ''})"
        out.append(Change(what=what, kind=MEMORY_ONLY, code=_offload_code(cand)))
    if cand.vae_tiling != asked.vae_tiling:
        out.append(Change(what="vae tiling (tile-to-tile tone may vary, diffusers docs)",
                          kind=MEMORY_ONLY, code="pipe.vae.enable_tiling()"))  # fmt: skip
    if cand.vae_slicing != asked.vae_slicing:
        out.append(Change(what="vae slicing", kind=MEMORY_ONLY, code="pipe.vae.enable_slicing()"))
    if cand.attention_slicing != asked.attention_slicing:
        out.append(Change(what="attention slicing", kind=MEMORY_ONLY,
                          code="pipe.enable_attention_slicing()"))  # fmt: skip
    den = "transformer" if any(c.name == "transformer" for c in est.components) else "unet"
    if cand.layerwise_casting != asked.layerwise_casting:
        out.append(Change(
            what=f"{den} stored in fp8", kind=CHANGES_RESULT,
            code=f"pipe.{den}.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, "
            f"compute_dtype={_torch_dtype(cand)})",
        ))  # fmt: skip
    if cand.quant != asked.quant:
        out.append(Change(what=f"{den} in {cand.quant}", kind=CHANGES_RESULT,
                          code=_quant_code(den, cand.quant, "diffusers", cand)))  # fmt: skip
    if cand.text_encoder_quant != asked.text_encoder_quant:
        te = max((c for c in est.components if c.name.startswith("text_encoder")),
                 key=lambda c: c.weights_bytes).name  # fmt: skip
        out.append(
            Change(
                what=f"{te} in {cand.text_encoder_quant}",
                kind=CHANGES_RESULT,
                code=_quant_code(te, cand.text_encoder_quant, "transformers", cand),
            )
        )
    if cand.drop_text_encoder_3 != asked.drop_text_encoder_3:
        out.append(
            Change(
                what="no T5 (text_encoder_3)",
                kind=CHANGES_RESULT,
                code="text_encoder_3=None, tokenizer_3=None",
            )
        )
    if cand.batch != asked.batch:
        out.append(Change(what=f"num_images_per_prompt {cand.batch}", kind=CHANGES_RESULT,
                          code=f"pipe(prompt, num_images_per_prompt={cand.batch})"))  # fmt: skip
    if (cand.height, cand.width) != (asked.height, asked.width):
        out.append(
            Change(
                what=f"height x width {cand.height}x{cand.width}",
                kind=CHANGES_RESULT,
                code=f"pipe(prompt, height={cand.height}, width={cand.width})",
            )
        )
    return tuple(out)


def _torch_dtype(job: DiffusionJob) -> str:
    return {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp32": "torch.float32"}[
        job.precision
    ]


def _offload_code(job: DiffusionJob) -> str:
    if job.offload == "group":
        extra = (", use_stream=True" if job.use_stream else
                 f", num_blocks_per_group={job.num_blocks_per_group}")  # fmt: skip
        return (
            'pipe.enable_group_offload(onload_device="cuda", offload_device="cpu", '
            f'offload_type="{job.offload_type}"{extra})'
        )
    return {
        "none": 'pipe.to("cuda")',
        "model": "pipe.enable_model_cpu_offload()",
        "sequential": "pipe.enable_sequential_cpu_offload()",
    }[job.offload]


def _quant_code(comp: str, fmt: str, library: str, job: DiffusionJob) -> str:
    """``quant_mapping`` entry of ``PipelineQuantizationConfig`` for ``comp`` in ``fmt``."""
    dtype = _torch_dtype(job)
    if BACKEND.get(fmt) == "bitsandbytes":
        kw = (
            "load_in_8bit=True" if fmt == "int8" else
            f'load_in_4bit=True, bnb_4bit_quant_type="{fmt[:3]}", bnb_4bit_compute_dtype={dtype}'
            + (", bnb_4bit_use_double_quant=True" if fmt == "nf4-dq" else "")
        )  # fmt: skip
        config = f"{library}.BitsAndBytesConfig({kw})"
    elif BACKEND.get(fmt) == "torchao":
        kind = "int8_weight_only" if fmt == "torchao-int8wo" else "float8_weight_only"
        config = f'{library}.TorchAoConfig("{kind}")'
    else:  # GGUF: a pre-quantized checkpoint of the denoiser
        return (
            f'"{comp}": GGUF {fmt[5:].upper()} checkpoint (from_single_file, '
            f"GGUFQuantizationConfig(compute_dtype={dtype}))"
        )
    return f'"{comp}": {config}'


#: (flag, DiffusionJob field) of the rows the pipeline shares with text jobs
_SHARED_FLAGS = (("--batch", "batch"), ("--precision", "precision"), ("--quant", "quant"))


def job_flags(job: DiffusionJob) -> str:
    """``job`` as ``memfit estimate PIPELINE --mode infer`` flags: those that differ from the
    defaults, by the one flag table (:data:`memfit.flags.FLAGS`)."""
    names = {f.name for f in fields(DiffusionJob)}
    rows = [(name, field) for name, field in _SHARED_FLAGS]
    rows += [(f.name, f.field) for f in flags_for("estimate")
             if f.target == "pipeline" and f.field in names]  # fmt: skip
    kinds = {f.name: f.kind for f in flags_for("estimate")}
    out = ["--mode infer"]
    for name, field in rows:
        value, default = getattr(job, field), getattr(_DEFAULT, field)
        if value == default or value is None:
            continue
        out.append(name if kinds.get(name) == "switch" else f"{name} {value}")
    return " ".join(out)


def code_lines(changes: tuple[Change, ...], pipeline: str) -> list[str]:
    """The plan as diffusers code: the load (quantized components in one
    ``PipelineQuantizationConfig``, SD3 without its T5), the switches, the call."""
    load = [c.code for c in changes if c.what.endswith(_FORMAT_SUFFIXES)]
    extra = [c.code for c in changes if c.code.startswith("text_encoder_3=")]
    args = ["..."]
    if load:
        mapping = ", ".join(load)
        args.append(f"quantization_config=PipelineQuantizationConfig(quant_mapping={{{mapping}}})")
    args += extra
    out = [f"pipe = {pipeline}.from_pretrained({', '.join(args)})"] if len(args) > 1 else []
    out += [c.code for c in changes if c.code.startswith("pipe.")]
    call = [c.code for c in changes if c.code.startswith("pipe(")]
    if call:
        kw = ", ".join(c[len("pipe(prompt, ") : -1] for c in call)
        out.append(f"pipe(prompt, {kw})")
    return out
