"""The stages of FluxPipeline, StableDiffusionXLPipeline, StableDiffusion3Pipeline and
PixArtSigmaPipeline (diffusers 0.42.1), as shapes.

Each recipe says what ``pipe.__call__`` feeds each component (read from
``diffusers/pipelines/flux/pipeline_flux.py`` and
``diffusers/pipelines/stable_diffusion_xl/pipeline_stable_diffusion_xl.py``):

* FLUX: CLIP-L on 77 tokens (pooled output only), T5 on ``max_sequence_length`` tokens (default
  512), the transformer on ``(H/16)·(W/16)`` packed latent tokens of 64 channels plus the text
  tokens, no classifier-free guidance (FLUX.1-dev embeds the guidance scale), ``vae.decode`` of
  ``(B, 16, H/8, W/8)`` latents.
* SDXL: both CLIPs on 77 tokens with ``output_hidden_states=True``; the UNet on a doubled batch
  (guidance_scale 5.0 > 1 runs the negative prompt in the same call); ``vae.decode`` of
  ``(B, 4, H/8, W/8)``, upcast to fp32 when the VAE is fp16 and its config says ``force_upcast``.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import torch

from memfit.errors import NotModelledError, SpecError
from memfit.estimate.diffusion import blockwise
from memfit.estimate.diffusion.assemble import ComponentFacts, assemble, attention_sliced, switches
from memfit.estimate.diffusion.built import component_facts, component_layout
from memfit.estimate.diffusion.pipeline import (
    DTYPES,
    SUPPORTED,
    PipelineEstimate,
    build_component,
    trace_forward,
)
from memfit.estimate.diffusion.route import estimate_pipeline as estimate_pipeline
from memfit.estimate.diffusion.weights import WeightLayout, layout
from memfit.estimate.trace_cache import cached_record
from memfit.spec.diffusion import DiffusionJob


def _empty(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype)


def _ids(b: int, s: int) -> torch.Tensor:
    return torch.zeros((b, s), dtype=torch.long)


def _encoder_call(m: Any, **kw: Any) -> Any:
    return m(**kw)


def _vae_call(m: Any, *, latents: torch.Tensor) -> Any:
    return m.decode(latents, return_dict=False)[0]


def _recipe(
    pipeline: str,
    configs: dict[str, Any],
    job: DiffusionJob,
    dt: torch.dtype,
    index: dict[str, Any] | None = None,
) -> Any:
    """``{component: (make_inputs, call, stage)}`` for one pipeline call."""
    b, h, w = job.batch, job.height, job.width
    vae_ch = int(configs["vae"].get("latent_channels", 4))
    vae_dt = DTYPES[job.vae_precision] if job.vae_precision else dt
    # the pipelines' vae_scale_factor: 2 ** (len(vae.config.block_out_channels) - 1)
    vsf = 2 ** (len(configs["vae"].get("block_out_channels", [0, 0, 0, 0])) - 1)
    lh, lw = h // vsf, w // vsf
    if pipeline == "FluxPipeline":
        tcfg = configs["transformer"]
        seq = job.max_sequence_length or 512  # FluxPipeline.__call__'s default
        # FluxPipeline.prepare_latents: 2 * (H // (vsf * 2)), packed 2x2 into tokens
        lh, lw = 2 * (h // (vsf * 2)), 2 * (w // (vsf * 2))
        img = (lh // 2) * (lw // 2)
        tr = {
            "hidden_states": lambda: _empty(b, img, int(tcfg["in_channels"]), dtype=dt),
            "encoder_hidden_states": lambda: _empty(
                b, seq, int(tcfg["joint_attention_dim"]), dtype=dt
            ),
            "pooled_projections": lambda: _empty(b, int(tcfg["pooled_projection_dim"]), dtype=dt),
            "timestep": lambda: _empty(b, dtype=dt),
            "img_ids": lambda: _empty(img, 3, dtype=dt),
            "txt_ids": lambda: _empty(seq, 3, dtype=dt),
        }
        if tcfg.get("guidance_embeds"):
            tr["guidance"] = lambda: torch.empty((b,), dtype=torch.float32)
        steps: dict[str, tuple[Any, Any, str]] = {
            "text_encoder": (lambda: {"input_ids": _ids(b, 77)}, _encoder_call, "text_encode"),
            "text_encoder_2": (lambda: {"input_ids": _ids(b, seq)}, _encoder_call, "text_encode"),
            "transformer": (lambda: {k: f() for k, f in tr.items()}, _encoder_call, "denoise"),
        }
    elif pipeline == "StableDiffusionXLPipeline":
        ucfg = configs["unet"]
        b2 = 2 * b  # classifier-free guidance: negative and positive prompt in one batch
        enc: dict[str, Any] = {"output_hidden_states": True}
        ctx = int(ucfg["cross_attention_dim"])
        pooled = int(configs["text_encoder_2"].get("projection_dim", 1280))
        unet = {
            "sample": lambda: _empty(b2, int(ucfg["in_channels"]), lh, lw, dtype=dt),
            "timestep": lambda: _empty(1, dtype=dt),
            "encoder_hidden_states": lambda: _empty(b2, 77, ctx, dtype=dt),
        }

        def unet_call(m: Any, **kw: Any) -> Any:
            added = {
                "text_embeds": _empty(b2, pooled, dtype=dt),
                "time_ids": _empty(b2, 6, dtype=dt),
            }
            return m(**kw, added_cond_kwargs=added, return_dict=False)

        steps = {
            "text_encoder": (
                lambda: {"input_ids": _ids(b, 77), **enc},
                _encoder_call,
                "text_encode",
            ),
            "text_encoder_2": (
                lambda: {"input_ids": _ids(b, 77), **enc},
                _encoder_call,
                "text_encode",
            ),
            "unet": (lambda: {k: f() for k, f in unet.items()}, unet_call, "denoise"),
        }
        upcast = configs["vae"].get("force_upcast", True)
        if job.vae_precision is None and dt == torch.float16 and upcast:
            vae_dt = torch.float32
    elif pipeline == "StableDiffusion3Pipeline":
        steps = _sd3_steps(configs, job, dt, lh, lw)
    elif pipeline == "PixArtSigmaPipeline":
        steps = _pixart_steps(configs, job, dt, lh, lw)
    elif pipeline == "WanPipeline":
        from memfit.estimate.diffusion.wan import wan_recipe

        return wan_recipe(index or {}, configs, job, dt)
    else:
        raise NotModelledError(
            f"{pipeline} is not modelled yet (memfit composes {', '.join(SUPPORTED)}); its "
            "components can still be sized one by one as factories",
            engine="diffusion",
        )
    steps["vae"] = (
        lambda: {"latents": _empty(b, vae_ch, lh, lw, dtype=vae_dt)},
        _vae_call,
        "vae_decode",
    )
    return steps, vae_dt, []


def _sd3_steps(
    configs: dict[str, Any], job: DiffusionJob, dt: torch.dtype, lh: int, lw: int
) -> dict[str, tuple[Any, Any, str]]:
    """StableDiffusion3Pipeline (pipeline_stable_diffusion_3.py): each CLIP on 77 tokens with
    ``output_hidden_states=True``, T5 on ``max_sequence_length`` (default 256) unless the pipeline
    was built with ``text_encoder_3=None`` (then ``_get_t5_prompt_embeds`` returns zeros of the
    same shape); guidance 7.0 > 1 runs the transformer on a doubled batch of ``(16, H/8, W/8)``
    latents with 77 + 256 text tokens; ``vae.decode`` without upcasting."""
    tcfg = configs["transformer"]
    b, b2 = job.batch, 2 * job.batch
    seq = 77 + (job.max_sequence_length or 256)
    tr = {
        "hidden_states": lambda: _empty(b2, int(tcfg["in_channels"]), lh, lw, dtype=dt),
        "timestep": lambda: _empty(b2, dtype=dt),
        "encoder_hidden_states": lambda: _empty(
            b2, seq, int(tcfg["joint_attention_dim"]), dtype=dt
        ),
        "pooled_projections": lambda: _empty(b2, int(tcfg["pooled_projection_dim"]), dtype=dt),
    }

    def tr_call(m: Any, **kw: Any) -> Any:
        return m(**kw, return_dict=False)

    clip = {"output_hidden_states": True}
    steps: dict[str, tuple[Any, Any, str]] = {
        name: (lambda: {"input_ids": _ids(b, 77), **clip}, _encoder_call, "text_encode")
        for name in ("text_encoder", "text_encoder_2")
    }
    if not job.drop_text_encoder_3:
        t5_seq = job.max_sequence_length or 256
        steps["text_encoder_3"] = (
            lambda: {"input_ids": _ids(b, t5_seq)},
            _encoder_call,
            "text_encode",
        )
    steps["transformer"] = (lambda: {k: f() for k, f in tr.items()}, tr_call, "denoise")
    return steps


def _pixart_steps(
    configs: dict[str, Any], job: DiffusionJob, dt: torch.dtype, lh: int, lw: int
) -> dict[str, tuple[Any, Any, str]]:
    """PixArtSigmaPipeline (pipeline_pixart_sigma.py): T5 on ``max_sequence_length`` (default 300)
    tokens with their attention mask; guidance 4.5 > 1 runs the transformer on a doubled batch with
    ``added_cond_kwargs={"resolution": None, "aspect_ratio": None}``; ``vae.decode`` of the
    latents cast to the VAE's dtype."""
    tcfg = configs["transformer"]
    b, b2 = job.batch, 2 * job.batch
    seq = job.max_sequence_length or 300
    tr = {
        "hidden_states": lambda: _empty(b2, int(tcfg["in_channels"]), lh, lw, dtype=dt),
        "encoder_hidden_states": lambda: _empty(b2, seq, int(tcfg["caption_channels"]), dtype=dt),
        "encoder_attention_mask": lambda: torch.ones((b2, seq), dtype=torch.long),
        "timestep": lambda: torch.zeros((b2,), dtype=torch.long),
    }

    def tr_call(m: Any, **kw: Any) -> Any:
        cond = {"resolution": None, "aspect_ratio": None}
        return m(**kw, added_cond_kwargs=cond, return_dict=False)

    return {
        "text_encoder": (
            lambda: {"input_ids": _ids(b, seq), "attention_mask": torch.ones((b, seq))},
            _encoder_call,
            "text_encode",
        ),
        "transformer": (lambda: {k: f() for k, f in tr.items()}, tr_call, "denoise"),
    }


def _to_dtype(model: torch.nn.Module, dt: torch.dtype, library: str) -> torch.nn.Module:
    """``from_pretrained(torch_dtype=dt)``: every weight in ``dt`` except those the class keeps
    in fp32. diffusers (``ModelMixin.from_pretrained``): ``_keep_in_fp32_modules`` whatever the
    dtype, matched as substrings of parameter names; transformers 5: ``_keep_in_fp32_modules``
    only for fp16, ``_keep_in_fp32_modules_strict`` for fp16 and bf16."""
    import logging

    log = logging.getLogger("diffusers.models.modeling_utils")
    level = log.level
    log.setLevel(logging.ERROR)  # its warning about .to() is about exactly what follows
    try:
        model = model.to(dt).eval()
    finally:
        log.setLevel(level)
    if dt == torch.float32:
        return model
    keep = list(getattr(model, "_keep_in_fp32_modules", None) or [])
    if library == "transformers":
        keep = keep if dt == torch.float16 else []
        keep += list(getattr(model, "_keep_in_fp32_modules_strict", None) or [])
    for name, sub in model.named_modules():
        parts = name.split(".")
        if any((k in name) if library == "diffusers" else (k in parts) for k in keep):
            for p in sub.parameters(recurse=False):
                p.data = p.data.to(torch.float32)
    return model


_DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
#: (tree, component, dtype, input shapes, decode/attention options) -> (activation peak,
#: output bytes, forward events, convolution-workspace allowance): a component's trace does not
#: depend on the offload mode or the weight format, so one process sizing several settings
#: traces each component once.
_TRACES: dict[tuple[Any, ...], tuple[int, int, list[tuple[str, int, int]], int]] = {}


def _trace_key(root: Path, comp: str, dt: torch.dtype, job: DiffusionJob) -> tuple[Any, ...]:
    shape = (job.batch, job.height, job.width, job.max_sequence_length, job.num_frames)
    options = (job.vae_slicing, job.vae_tiling) if comp == "vae" else (job.attention_slicing,)
    return (str(root.resolve()), comp, str(dt), shape, options)


def _trace_record(model: torch.nn.Module, make_inputs: Any, call: Any) -> dict[str, Any]:
    """One component's forward traced, as the JSON record the trace cache keeps."""
    from memfit.estimate.diffusion.workspace import conv_workspace_probe

    events: list[tuple[str, int, int]] = []
    with conv_workspace_probe(model) as probe:
        act, out = trace_forward(model, make_inputs, call, events=events)
    return {"activation": act, "output": out, "events": [list(e) for e in events],
            "workspace": probe.bytes}  # fmt: skip


def _valid_record(r: dict[str, Any]) -> bool:
    """Whether a kept record is one :func:`_trace_record` writes (whole, non-negative bytes)."""
    counts = [r["activation"], r["output"], r["workspace"]]
    events = r["events"]
    return (
        all(type(v) is int and v >= 0 for v in counts)
        and isinstance(events, list)
        and all(
            isinstance(e, list) and len(e) == 3 and isinstance(e[0], str)
            and type(e[1]) is int and type(e[2]) is int
            for e in events
        )
    )  # fmt: skip


def _from_record(r: dict[str, Any]) -> tuple[int, int, list[tuple[str, int, int]], int]:
    events = [(str(a), int(b), int(c)) for a, b, c in r["events"]]
    return int(r["activation"]), int(r["output"]), events, int(r["workspace"])


def _prepare(model: torch.nn.Module, comp: str, job: DiffusionJob) -> None:
    """The pipeline's memory switches that change the traced code: VAE slicing/tiling and
    ``enable_attention_slicing`` (``DiffusionPipeline.set_attention_slice`` calls
    ``set_attention_slice("auto")`` on every component that has it)."""
    m: Any = model
    if comp == "vae":
        if job.vae_slicing:
            m.enable_slicing()
        if job.vae_tiling:
            m.enable_tiling()
    elif attention_sliced(comp, job) and hasattr(m, "set_attention_slice"):
        m.set_attention_slice("auto")


#: Components built on the meta device in this process, by the canonical JSON of (library,
#: class, config, dtype, the switches applied, fp32 modules kept): a layout reads a module without
#: changing it, so every variant of a search that lays one out again under another weight format
#: reuses it. A traced module is taken out (``meta_to_fake_`` swaps its weights for fake tensors);
#: the oldest goes beyond :data:`MAX_BUILT` (a long-lived web worker sizing many pipelines).
_MODELS: dict[str, torch.nn.Module] = {}
MAX_BUILT = 16


class _Builds:
    """The components of one pipeline call, each built on the meta device on first need only
    (:mod:`memfit.estimate.diffusion.built`): in its dtype, the job's switches applied, and the
    modules transformers keeps in fp32 under bitsandbytes when asked."""

    def __init__(self, index: dict[str, Any], configs: dict[str, Any], job: DiffusionJob,
                 dtype_of: dict[str, torch.dtype]) -> None:  # fmt: skip
        self._index, self._configs, self._job, self._dtype_of = index, configs, job, dtype_of

    def _key(self, comp: str, keep_fp32: bool) -> str:
        parts = [*self._index[comp], self._configs[comp], str(self._dtype_of[comp]),
                 switches(comp, self._job), keep_fp32]  # fmt: skip
        return json.dumps(parts, sort_keys=True, default=str)

    def _build(self, comp: str, keep_fp32: bool) -> torch.nn.Module:
        library, class_name = self._index[comp]
        model = build_component(library, class_name, self._configs[comp])
        model = _to_dtype(model, self._dtype_of[comp], library)
        _prepare(model, comp, self._job)
        if keep_fp32:
            _keep_in_fp32(model, _not_converted(model, "transformers"))
        return model

    def model(self, comp: str, *, keep_fp32: bool = False) -> torch.nn.Module:
        """The module to read (facts, layouts): built once, kept."""
        key = self._key(comp, keep_fp32)
        if key not in _MODELS:
            while len(_MODELS) >= MAX_BUILT:
                del _MODELS[next(iter(_MODELS))]
            _MODELS[key] = self._build(comp, keep_fp32)
        return _MODELS[key]

    def to_trace(self, comp: str, *, keep_fp32: bool = False) -> torch.nn.Module:
        """The module to trace: the kept one, taken out (tracing changes it), or a new build."""
        return _MODELS.pop(self._key(comp, keep_fp32), None) or self._build(comp, keep_fp32)


def _trace_built(
    build: _Builds, comp: str, legacy: bool, make_inputs: Any, call: Any
) -> dict[str, Any]:
    """The component's record: traced with its stacks cut to four blocks each where the middle
    blocks repeat one pattern (:mod:`memfit.estimate.diffusion.blockwise`), else whole."""
    model = build.to_trace(comp, keep_fp32=legacy)
    if blockwise.stacks_of(model):
        record = _trace_cut_record(model, make_inputs, call)
        if record is not None:
            return record
        model = build.to_trace(comp, keep_fp32=legacy)  # the cut one is spent: built again
    return _trace_record(model, make_inputs, call)


def _trace_cut_record(model: torch.nn.Module, make_inputs: Any, call: Any) -> dict[str, Any] | None:
    """:func:`_trace_record` of ``model`` from a trace of its stacks cut to four blocks, the
    middle block's events repeated for the others; None where they do not repeat."""
    from memfit.estimate.diffusion.workspace import conv_workspace_probe

    stacks = blockwise.stacks_of(model)
    kept = blockwise.cut_(model, stacks)
    events: list[tuple[str, int, int]] = []
    marks: list[int] = []
    with conv_workspace_probe(model) as probe:
        _, out = trace_forward(model, make_inputs, call, events=events, marked=kept, marks=marks)
    if len(marks) != len(kept):
        return None  # a kept block ran more or less than once: not a plain loop
    full = blockwise.expand(events, marks, [cut for cut, _ in stacks])
    if full is None:
        return None
    return {"activation": blockwise.peak_bytes(full), "output": out,
            "events": [list(e) for e in full], "workspace": probe.bytes}  # fmt: skip


def _layout_built(build: _Builds, comp: str, legacy: bool, args: dict[str, Any]) -> WeightLayout:
    return layout(build.model(comp, keep_fp32=legacy), **args)


def _keep_in_fp32(model: torch.nn.Module, keep: tuple[str, ...]) -> None:
    """transformers 4.x under bitsandbytes: the ``_keep_in_fp32_modules`` weights in fp32."""
    for name, sub in model.named_modules():
        if any(k in name.split(".") for k in keep):
            for p in sub.parameters(recurse=False):
                p.data = p.data.to(torch.float32)


def _not_converted(model: torch.nn.Module, library: str) -> tuple[str, ...]:
    """Modules the quantizer leaves unquantized: transformers' quantizers add the class's
    ``_keep_in_fp32_modules`` (T5: ``wo``) to ``modules_to_not_convert``; diffusers' bitsandbytes
    quantizer does too (``keep_in_fp32_modules``), and diffusers' denoisers here declare none."""
    return tuple(getattr(model, "_keep_in_fp32_modules", None) or ())


class TraceSource:
    """The records of one pipeline call from the components built and traced here
    (:class:`memfit.estimate.diffusion.assemble.Source`): facts and layouts kept by
    :mod:`memfit.estimate.diffusion.built`, forward records by :data:`_TRACES` and the trace
    cache."""

    def __init__(self, root: Path, index: dict[str, Any], configs: dict[str, Any],
                 job: DiffusionJob, steps: dict[str, Any],
                 dtype_of: dict[str, torch.dtype]) -> None:  # fmt: skip
        self._root, self._index, self._configs, self._job = root, index, configs, job
        self._steps, self._dtype_of = steps, dtype_of
        self._build = _Builds(index, configs, job, dtype_of)

    def facts(self, comp: str) -> ComponentFacts:
        return component_facts([*self._index[comp], self._configs[comp]],
                               functools.partial(self._build.model, comp))  # fmt: skip

    def layout(self, comp: str, legacy: bool, options: dict[str, Any],
               lay_args: dict[str, Any]) -> WeightLayout:  # fmt: skip
        args = {**lay_args, "compute_dtype": DTYPES[_DTYPE_NAMES_BY_STR[lay_args["compute_dtype"]]]}
        run = functools.partial(_layout_built, self._build, comp, legacy, args)
        return component_layout([*self._index[comp], self._configs[comp]], options, run)

    def trace(self, comp: str, legacy: bool) -> tuple[int, int, list[tuple[str, int, int]], int]:
        make_inputs, call, _ = self._steps[comp]
        key = (*_trace_key(self._root, comp, self._dtype_of[comp], self._job), legacy)
        if key not in _TRACES:
            parts = {"component": [*self._index[comp], self._configs[comp]], "trace": key[1:]}
            trace = functools.partial(_trace_built, self._build, comp, legacy, make_inputs, call)
            _TRACES[key] = _from_record(cached_record(parts, trace, valid=_valid_record))
        return _TRACES[key]


_DTYPE_NAMES_BY_STR = {str(v): k for k, v in DTYPES.items()}


def _checked_recipe(
    index: dict[str, Any], configs: dict[str, Any], job: DiffusionJob
) -> tuple[dict[str, Any], torch.dtype, list[str]]:
    """The recipe of one call of the pipeline (``_recipe``), after refusing what it cannot run."""
    pipeline = str(index["_class_name"])
    dt = DTYPES[job.precision]
    if job.drop_text_encoder_3 and "text_encoder_3" not in index:
        raise SpecError(
            f"--no-text-encoder-3: {pipeline} has no text_encoder_3 (it is an SD3 option)"
        )
    if job.num_frames is not None and pipeline != "WanPipeline":
        raise SpecError(
            f"num_frames {job.num_frames}: {pipeline} makes images; --num-frames is for video "
            "pipelines (WanPipeline)"
        )
    if pipeline not in SUPPORTED:
        _recipe(pipeline, configs, job, dt)  # raises NotModelledError naming the pipeline
    steps, vae_dt, recipe_notes = _recipe(pipeline, configs, job, dt, index)
    return steps, vae_dt, list(recipe_notes)


def trace_source(
    root: Path, index: dict[str, Any], configs: dict[str, Any], job: DiffusionJob
) -> tuple[TraceSource, dict[str, Any]]:
    """The trace source of one call and its recipe's steps (``{component: (inputs, call,
    stage)}``): what a derivation traces at each sample size."""
    steps, vae_dt, _ = _checked_recipe(index, configs, job)
    dtype_of = {c: vae_dt if c == "vae" else DTYPES[job.precision] for c in steps}
    return TraceSource(root, index, configs, job, steps, dtype_of), steps


def traced_pipeline(
    root: Path,
    index: dict[str, Any],
    configs: dict[str, Any],
    job: DiffusionJob,
    *,
    name: str,
    gpu: Any = None,
) -> PipelineEstimate:
    """The pipeline at ``root`` (its ``index`` and component ``configs``) traced and composed:
    :func:`memfit.estimate.diffusion.route.estimate_pipeline` on a cache miss."""
    steps, vae_dt, recipe_notes = _checked_recipe(index, configs, job)
    dtype_of = {c: vae_dt if c == "vae" else DTYPES[job.precision] for c in steps}
    source = TraceSource(root, index, configs, job, steps, dtype_of)
    return assemble(
        index, configs, job, name=name, gpu=gpu,
        stages={c: stage for c, (_, _, stage) in steps.items()},
        dtype_of={c: _DTYPE_NAMES[d] for c, d in dtype_of.items()},
        recipe_notes=recipe_notes, source=source,
    )  # fmt: skip
