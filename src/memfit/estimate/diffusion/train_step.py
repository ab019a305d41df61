"""A diffusers training script's run, traced on fake tensors: set-up, then two training steps.

The components are built by diffusers / transformers from their configs on the meta device
(:func:`memfit.estimate.diffusion.pipeline.build_component`), set up as the script does
(:mod:`~memfit.estimate.diffusion.train_setup`: dtypes, ``requires_grad_``, peft's
``add_adapter``, ``enable_gradient_checkpointing``, ``cast_training_params``), turned into fake
CUDA tensors, and run through memfit's storage tracker:

1. ``precompute_text``: the text encoders under ``no_grad`` on the instance prompt (one prompt,
   the DreamBooth default), then deleted where the script deletes them;
2. ``cache_latents``: ``vae.encode`` of one batch (FLUX LoRA ``--cache_latents``: the
   ``latent_dist`` stays on the device; SDXL full: the dataset map, results on the host), then
   ``del vae``;
3. two steps of: ``vae_encode`` (``vae.encode(pixel_values).latent_dist.sample()``, when the
   latents are not cached); ``forward`` (trained text encoders, the noise, the denoiser under
   ``accelerator.autocast``, the script's loss); ``backward`` (``accelerator.backward``, fp16
   loss scaling, ``clip_grad_norm_(max_norm=1.0)``); ``optimizer`` (``step``,
   ``zero_grad(set_to_none=True)``).

FLUX's inputs are the script's: ``FluxPipeline._pack_latents`` of the noisy latents,
``_prepare_latent_image_ids``, ``guidance`` when the config has ``guidance_embeds``, the
flow-matching loss; SDXL's: ``DDPMScheduler.add_noise``, the six ``time_ids``, the
epsilon-prediction MSE in fp32.
"""

from __future__ import annotations

import contextlib
import gc
from pathlib import Path
from typing import Any

import torch

from memfit.errors import NotModelledError, TraceError
from memfit.estimate.diffusion.diffusers_import import diffusers_module
from memfit.estimate.diffusion.pipeline import build_component, read_tree
from memfit.estimate.diffusion.train import ComponentState, PhasePeak, TrainEstimate
from memfit.estimate.diffusion.train_setup import ScriptSetup, script_setup
from memfit.estimate.trace import build, steps
from memfit.estimate.trace.tracker import StorageTracker
from memfit.spec import WorkloadSpec
from memfit.spec.diffusion import DiffusionTrainJob

WEIGHT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "no": torch.float32}
#: accelerate's default ``--max_grad_norm`` in every script read (1.0): gradients are clipped.
MAX_GRAD_NORM = 1.0
STEP_OWNER = "(step)"


def estimate_training(
    root: Path,
    job: DiffusionTrainJob,
    *,
    name: str,
    gpu: Any = None,
    execution: str = "fake",
    emulate_cuda: bool = True,
    overrides: dict[str, dict[str, Any]] | None = None,
) -> TrainEstimate:
    """Trace the training run of the pipeline at ``root`` (``execution="real"``: on real CPU
    tensors, for tests; pass ``emulate_cuda=False`` with it). ``overrides``: config keys to
    change per component (the block counts diffusion_train_fast extrapolates over)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from memfit.estimate.trace.engine import cuda_emulation_for, replay_reserved

    index, configs = read_tree(root)
    for comp, changes in (overrides or {}).items():
        configs[comp] = {**configs[comp], **changes}
    pipeline = str(index["_class_name"])
    setup = script_setup(pipeline, job)
    wdt = WEIGHT_DTYPES[job.mixed_precision]
    real = execution == "real"
    models = _build(index, configs, setup, job, wdt, real=real)
    states = _states(index, setup, models, wdt)
    fake: Any = contextlib.nullcontext() if real else FakeTensorMode(allow_non_fake_inputs=True)
    if not real:
        for m in models.values():
            build.meta_to_fake_(m, fake)
    container = torch.nn.ModuleDict(models)
    models.clear()  # the container holds the only references: deleting frees the weights
    tracker = StorageTracker(device_type="cpu")
    workload = WorkloadSpec(mode="train", precision=job.precision, attention="sdpa")
    run = _Run(pipeline, configs, setup, job, wdt, container)
    with fake, cuda_emulation_for(workload, emulate_cuda, gpu=gpu), tracker:
        steps.label_model_state(tracker, container)
        tracker.watch_modules(container)
        try:
            run.go(tracker)
        except (RuntimeError, TypeError, ValueError, NotImplementedError) as exc:
            raise TraceError(
                f"could not run the {pipeline} training step on fake tensors: "
                f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            ) from exc
    reserved = replay_reserved(tracker.events or [], gpu, True)
    phases = tuple(run.early.get(p) or phase_peak(tracker, p, s)
                   for p, s in tracker.phase_peaks.items() if p not in ("init", "end"))  # fmt: skip
    notes = _notes(setup, job)
    est = TrainEstimate(
        name=name,
        pipeline=pipeline,
        script=setup.script,
        job=job,
        phases=phases,
        components=states,
        peak_reserved_bytes=reserved,
        notes=notes,
    )
    return est if gpu is None else est.judge_on(gpu)  # THE verdict on the GPU asked


def _build(
    index: dict[str, Any],
    configs: dict[str, Any],
    setup: ScriptSetup,
    job: DiffusionTrainJob,
    wdt: torch.dtype,
    *,
    real: bool,
) -> dict[str, torch.nn.Module]:
    from peft import LoraConfig

    models: dict[str, torch.nn.Module] = {}
    for c in setup.components:
        library, class_name = index[c.name]
        if real:
            torch.manual_seed(0)
            model = _cpu_component(library, class_name, configs[c.name])
        else:
            model = build_component(library, class_name, configs[c.name])
        model.requires_grad_(c.role == "full")
        if c.dtype == "weight":
            with _quiet_to():
                model.to(wdt)
        if c.lora_targets:
            assert job.lora_rank is not None
            targets = c.lora_targets
            if job.lora_targets and c.name == setup.denoiser:
                targets = job.lora_targets
            cfg = LoraConfig(
                r=job.lora_rank,
                lora_alpha=job.lora_rank,
                init_lora_weights="gaussian",
                target_modules=list(targets),
            )
            model.add_adapter(cfg)  # type: ignore[operator]
        if c.role != "frozen":
            model.train()
            if job.checkpointing:
                m: Any = model
                if c.name == setup.denoiser:
                    m.enable_gradient_checkpointing()
                else:
                    m.gradient_checkpointing_enable()
        else:
            model.eval()
        if job.mixed_precision == "fp16" and c.role != "frozen":
            from diffusers.training_utils import cast_training_params

            cast_training_params(model, dtype=torch.float32)
        models[c.name] = model
    return models


@contextlib.contextmanager
def _quiet_to() -> Any:
    """diffusers warns that ``.to(dtype)`` ignores ``_keep_in_fp32_modules``: the scripts do
    exactly that (``unet.to(device, dtype=weight_dtype)``), so the warning is about the job."""
    import logging

    log = logging.getLogger("diffusers.models.modeling_utils")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _cpu_component(library: str, class_name: str, config: dict[str, Any]) -> torch.nn.Module:
    """The component with real CPU weights (tests compare a real run with the fake trace)."""
    cfg = {k: v for k, v in config.items() if k != "quantization_config"}
    if library == "diffusers":
        return getattr(diffusers_module(), class_name).from_config(cfg)  # type: ignore[no-any-return]
    import transformers

    conf = transformers.AutoConfig.for_model(**cfg)
    return getattr(transformers, class_name)(conf)  # type: ignore[no-any-return]


def _states(
    index: dict[str, Any],
    setup: ScriptSetup,
    models: dict[str, torch.nn.Module],
    wdt: torch.dtype,
) -> tuple[ComponentState, ...]:
    out = []
    for c in setup.components:
        m = models[c.name]
        params = list(m.parameters())
        role = {"full": "trained", "lora": "lora"}.get(c.role, "frozen")
        if c.freed != "never":
            role = f"freed {c.freed.replace('_', ' ')}"
        out.append(
            ComponentState(
                name=c.name,
                class_name=index[c.name][1],
                dtype=str(wdt if c.dtype == "weight" else torch.float32).replace("torch.", ""),
                role=role,
                weights_bytes=sum(p.numel() * p.element_size() for p in params)
                + sum(b.numel() * b.element_size() for b in m.buffers()),
                n_params=sum(p.numel() for p in params),
                n_trainable=sum(p.numel() for p in params if p.requires_grad),
            )
        )
    return tuple(out)


def phase_peak(tracker: StorageTracker, phase: str, snap: Any) -> PhasePeak:
    comp = tracker.breakdown(snap)
    by_model: dict[str, int] = {}
    for module, n in tracker.by_module(snap).items():
        owner = module.split(".", 1)[0] if not module.startswith("(") else STEP_OWNER
        by_model[owner] = by_model.get(owner, 0) + n
    return PhasePeak(
        phase=phase,
        peak_bytes=snap.total_bytes,
        parameters_bytes=comp.get("parameters", 0),
        gradients_bytes=comp.get("gradients", 0),
        optimizer_states_bytes=comp.get("optimizer_states", 0),
        activations_bytes=comp.get("activations", 0),
        temporary_bytes=sum(v for k, v in comp.items() if k not in (
            "parameters", "gradients", "optimizer_states", "activations")),
        by_model=dict(sorted(by_model.items(), key=lambda kv: -kv[1])),
    )  # fmt: skip


def _notes(setup: ScriptSetup, job: DiffusionTrainJob) -> tuple[str, ...]:
    notes = [
        f"follows diffusers {setup.script} (one instance prompt, no prior preservation, no "
        "validation during training, max_grad_norm 1.0)"
    ]
    freed = [c.name for c in setup.components if c.freed != "never"]
    if freed:
        notes.append(f"deleted after set-up as the script does: {', '.join(freed)}")
    if setup.denoiser == "unet" and job.lora_rank is not None:
        notes.append(
            "train_dreambooth_lora_sdxl.py keeps both text encoders on the device: its "
            "`del tokenizers, text_encoders` deletes the lists, not text_encoder_one/_two"
        )
    if job.cache_latents:
        notes.append(
            "--cache-latents: one batch's latent_dist is counted on the device; the script "
            "keeps one per batch of the dataset (each further batch adds as much)"
        )
    return tuple(notes)


class _Run:
    """The script's set-up and training loop for one pipeline, on the tracker's tensors."""

    def __init__(
        self,
        pipeline: str,
        configs: dict[str, Any],
        setup: ScriptSetup,
        job: DiffusionTrainJob,
        wdt: torch.dtype,
        models: torch.nn.ModuleDict,
    ) -> None:
        self.flux = pipeline == "FluxPipeline"
        self.configs, self.setup, self.job, self.wdt, self.models = (
            configs, setup, job, wdt, models)  # fmt: skip
        vae_cfg = configs["vae"]
        self.vsf = 2 ** (len(vae_cfg.get("block_out_channels", [0, 0, 0, 0])) - 1)
        self.latent_hw = job.resolution // self.vsf
        self.vae_dtype = next(models["vae"].parameters()).dtype
        self.text: tuple[torch.Tensor, ...] | None = None
        self.cached: Any = None
        #: breakdowns of the set-up phases, taken before their components are freed
        self.early: dict[str, PhasePeak] = {}
        trainable = [p for p in models.parameters() if p.requires_grad]
        self.params = trainable
        self.optimizer = _optimizer(trainable, job.optimizer)
        self.scaler = steps.LossScaler() if job.mixed_precision == "fp16" else None

    # -- set-up --------------------------------------------------------------------------
    def go(self, tracker: StorageTracker) -> None:
        if self.setup.precompute_text:
            tracker.set_phase("precompute_text")
            with torch.no_grad():
                text = self.encode_text(1)
            self.text = text if self.setup.denoiser == "transformer" or self.job.lora_rank else None
            self._free(tracker, "after_text")
        if self.setup.precompute_latents:
            tracker.set_phase("cache_latents")
            with torch.no_grad():
                px = self.pixels()
                dist = self.models["vae"].encode(px).latent_dist  # type: ignore[operator]
                del px
            self.cached = dist if self.setup.latents_on_device else None
            del dist
            self._free(tracker, "after_latents")
        for _ in range(2):
            self.step(tracker)
        tracker.set_phase("end")

    def _free(self, tracker: StorageTracker, when: str) -> None:
        """``del component; free_memory()``: its weights leave the device. The tracker stops
        counting them explicitly (``ignore``) because transformers keeps references to a module
        it has run on fake tensors that a real process would not hold on the device."""
        for c in self.setup.components:
            if c.freed == when and c.name in self.models:
                if tracker.phase not in self.early:  # its breakdown, before it is ignored
                    self.early[tracker.phase] = phase_peak(
                        tracker, tracker.phase, tracker.phase_peaks[tracker.phase]
                    )
                model = self.models[c.name]
                tracker.ignore([*model.parameters(), *model.buffers()])
                del self.models[c.name], model
        gc.collect()

    def pixels(self) -> torch.Tensor:
        r = self.job.resolution
        return torch.randn(self.job.batch, 3, r, r, dtype=self.vae_dtype)

    # -- one step ------------------------------------------------------------------------
    def step(self, tracker: StorageTracker) -> None:
        tracker.set_phase("vae_encode")
        latents = self.latents()
        tracker.set_phase("forward")
        loss = self.flux_loss(latents) if self.flux else self.sdxl_loss(latents)
        del latents
        tracker.set_phase("backward")
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        del loss
        if self.scaler is not None:
            self.scaler.unscale_(self.params)  # accelerator.clip_grad_norm_ unscales first
        torch.nn.utils.clip_grad_norm_(self.params, MAX_GRAD_NORM, foreach=True)
        steps.label_model_state(tracker, self.models)
        tracker.set_phase("optimizer")
        if self.optimizer is not None:
            self.optimizer.step()
            if self.scaler is not None:
                self.scaler.update()
            steps.label_model_state(tracker, self.models, self.optimizer, self.scaler)
            self.optimizer.zero_grad(set_to_none=True)

    def latents(self) -> torch.Tensor:
        vae_cfg = self.configs["vae"]
        scale = float(vae_cfg.get("scaling_factor", 0.18215))
        shift = vae_cfg.get("shift_factor")
        if self.cached is not None:
            x = self.cached.sample()
        elif self.setup.encode_each_step:
            px = self.pixels()
            x = self.models["vae"].encode(px).latent_dist.sample()  # type: ignore[operator]
            del px
        else:  # train_text_to_image_sdxl.py: the dataset's precomputed latents, moved in
            c = int(vae_cfg.get("latent_channels", 4))
            hw = self.latent_hw
            return torch.empty(self.job.batch, c, hw, hw, dtype=torch.float32)
        x = (x - float(shift)) * scale if shift is not None else x * scale
        return x.to(self.wdt)

    def encode_text(self, b: int) -> tuple[torch.Tensor, ...]:
        """The script's ``encode_prompt`` for ``b`` prompts (token ids of its max lengths)."""
        m = self.models
        if self.flux:
            seq = self.job.sequence_length
            pooled = m["text_encoder"](_ids(b, 77), output_hidden_states=False).pooler_output
            embeds = m["text_encoder_2"](_ids(b, seq), output_hidden_states=False)[0]
            txt_ids = torch.zeros(seq, 3, dtype=self.wdt)
            return embeds.to(self.wdt), pooled.to(self.wdt), txt_ids
        hidden = []
        pooled = None
        for name in ("text_encoder", "text_encoder_2"):
            out = m[name](_ids(b, 77), output_hidden_states=True, return_dict=False)
            pooled = out[0]
            hidden.append(out[-1][-2])
            del out
        embeds = torch.concat(hidden, dim=-1)
        del hidden
        assert pooled is not None
        return embeds, pooled.view(b, -1)

    def text_for_step(self, b: int) -> tuple[torch.Tensor, ...]:
        if self.text is None and not self.setup.precompute_text:
            with self.autocast():
                return self.encode_text(b)
        if self.text is None:  # SDXL full: the dataset's embeddings, moved in per batch
            pooled = int(self.configs["text_encoder_2"].get("projection_dim", 1280))
            ctx = int(self.configs["unet"]["cross_attention_dim"])
            return (
                torch.empty(b, 77, ctx, dtype=self.wdt),
                torch.empty(b, pooled, dtype=self.wdt),
            )
        return tuple(t.repeat(b, *([1] * (t.dim() - 1))) if t.dim() > 2 or t.shape[0] == 1
                     else t for t in self.text)  # fmt: skip

    def autocast(self) -> Any:
        dtype = steps.AUTOCAST_DTYPE.get(self.job.precision)
        return torch.autocast("cpu", dtype=dtype) if dtype else contextlib.nullcontext()

    def flux_loss(self, x: torch.Tensor) -> torch.Tensor:
        pipe = diffusers_module().FluxPipeline
        b, c, h, w = x.shape
        embeds, pooled, txt_ids = self.text_for_step(b)
        noise = torch.randn_like(x)
        sigmas = torch.rand(b, dtype=x.dtype).view(b, 1, 1, 1)
        noisy = (1.0 - sigmas) * x + sigmas * noise
        packed = pipe._pack_latents(noisy, batch_size=b, num_channels_latents=c, height=h, width=w)
        del noisy
        img_ids = pipe._prepare_latent_image_ids(b, h // 2, w // 2, x.device, self.wdt)
        guidance = None
        if self.configs["transformer"].get("guidance_embeds"):
            guidance = torch.full((b,), 3.5, dtype=torch.float32)
        timesteps = torch.rand(b, dtype=torch.float32) * 1000
        with self.autocast():
            pred = self.models["transformer"](
                hidden_states=packed,
                timestep=timesteps / 1000,
                guidance=guidance,
                pooled_projections=pooled,
                encoder_hidden_states=embeds,
                txt_ids=txt_ids,
                img_ids=img_ids,
                return_dict=False,
            )[0]
        del packed, embeds, pooled
        pred = pipe._unpack_latents(
            pred, height=h * self.vsf, width=w * self.vsf, vae_scale_factor=self.vsf
        )
        weighting = torch.ones_like(sigmas)  # compute_loss_weighting_for_sd3("none")
        target = noise - x
        per = (weighting.float() * (pred.float() - target.float()) ** 2).reshape(b, -1)
        return torch.mean(per, 1).mean()

    def sdxl_loss(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        embeds, pooled = self.text_for_step(b)
        noise = torch.randn_like(x)
        timesteps = torch.randint(0, 1000, (b,)).long()
        noisy = diffusers_module().DDPMScheduler().add_noise(x, noise, timesteps)
        noisy = noisy.to(self.wdt)
        time_ids = torch.empty(b, 6, dtype=self.wdt)
        with self.autocast():
            pred = self.models["unet"](
                noisy,
                timesteps,
                embeds,
                added_cond_kwargs={"time_ids": time_ids, "text_embeds": pooled},
                return_dict=False,
            )[0]
        del noisy, embeds, pooled
        return torch.nn.functional.mse_loss(pred.float(), noise.float(), reduction="mean")


def _optimizer(params: list[torch.nn.Parameter], name: str) -> Any:
    """The script's optimizer: ``prodigyopt.Prodigy`` with the scripts' defaults (lr 1.0,
    decoupled weight decay, no bias correction, no safeguard warm-up), else memfit's AdamW /
    bitsandbytes AdamW8bit stand-in (as ``bnb.optim.AdamW8bit`` allocates, no 32-bit overrides)."""
    if name == "prodigy":
        try:
            from prodigyopt import Prodigy
        except ImportError as exc:
            raise NotModelledError(
                "--optimizer prodigy needs the prodigyopt package (pip install "
                "'memfit[diffusion]')",
                engine="diffusion-train",
            ) from exc
        import io

        with contextlib.redirect_stdout(io.StringIO()):  # it prints "Using decoupled weight decay"
            return Prodigy(params, lr=1.0, weight_decay=1e-4, decouple=True)
    return steps.make_optimizer(params, name, None)


def _ids(b: int, s: int) -> torch.Tensor:
    return torch.zeros((b, s), dtype=torch.long)
