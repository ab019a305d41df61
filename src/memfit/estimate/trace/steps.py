"""What the job runs, step by step: the training step and the generation loop, as HF users run them.

Training (two steps, so optimizer states exist at the second step's peak)::

    with autocast (amp-*): loss = model(**batch).loss      # phase "forward"
    (scaler.scale(loss) if 16-mixed else loss).backward()    # phase "backward"
    optimizer.step(); optimizer.zero_grad(set_to_none=...)   # phase "optimizer"

Inference of a causal LM follows ``generate()`` with a DynamicCache: a prefill of ``seq_len`` tokens
(in chunks of ``prefill_chunk_size`` when set) that keeps only the last position's logits
(``logits_to_keep=1``, where the model's forward takes it) and copies them to fp32, with the
(B, S) ``position_ids`` generate() builds from its attention mask (batch-sized rotary tables), then
``new_tokens - 1`` decode steps, each traced (up to ``MAX_TRACED_DECODE_STEPS``; beyond, memfit
jumps to the last step with the cache grown to its final length — its peak is the decode peak).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from memfit.errors import SpecError
from memfit.estimate.trace import media_inputs
from memfit.estimate.trace.tracker import StorageTracker
from memfit.models.model_spec import ModelSpec
from memfit.spec import PRECISION_RULES, WorkloadSpec
from memfit.spec.hf_versions import returns_fp32_logits

#: The autocast dtype of each precision that runs under autocast (``*-mixed``), from the one table.
AUTOCAST_DTYPE = {
    name: getattr(torch, r.compute) for name, r in PRECISION_RULES.items() if r.autocast
}


def make_optimizer(
    params: list[torch.nn.Parameter], name: str, model: torch.nn.Module | None = None
) -> torch.optim.Optimizer | None:
    """The optimizer as a CUDA run builds it (foreach is torch's default for CUDA tensors; fake CPU
    tensors would get the for-loop path, so the implementation is passed explicitly).

    bitsandbytes optimizers are stand-ins allocating what the real ones allocate on CUDA, set up
    as HF Trainer does (``model``'s embeddings keep 32-bit states); ``adafactor`` is
    transformers' Adafactor as HF Trainer's ``optim="adafactor"`` builds it; ``muon`` is
    torch.optim.Muon on the hidden matrices with AdamW on the rest (docs/optimizers.md).
    """
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, foreach=True)
    if name == "adamw-fused":
        return torch.optim.AdamW(params, lr=1e-4, fused=True)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, foreach=True)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=True)
    if name == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=1e-3, scale_parameter=False, relative_step=False)
    if name == "muon":
        from memfit.estimate.trace.muon import MuonWithAdamW

        return MuonWithAdamW(params, model)
    if name in ("adamw-8bit", "paged-adamw-8bit", "paged-adamw-32bit", "lion"):
        from memfit.estimate.trace.optimizers import make_bnb_optimizer

        return make_bnb_optimizer(name, params, model)
    return None


class InBackward:
    """``optimizer_in_bwd``: one optimizer per parameter, stepped in the parameter's
    post-accumulate-grad hook and zeroed there (``set_to_none``), as torchtune's
    ``training.register_optim_in_bwd_hooks`` and PyTorch's "optimizer step in backward" tutorial
    do: at most the gradients of one node are alive. ``state`` merges the per-parameter
    optimizers' states (memfit labels them); ``step`` / ``zero_grad`` do nothing (the steps
    happen inside backward)."""

    def __init__(
        self, params: list[torch.nn.Parameter], name: str, model: torch.nn.Module | None = None
    ) -> None:
        self.optimizers: dict[torch.nn.Parameter, Any] = {}
        for p in params:
            opt = make_optimizer([p], name, model)
            if opt is None:
                raise SpecError(f"optimizer_in_bwd with optimizer {name!r} is not modelled")
            p.register_post_accumulate_grad_hook(_step_and_zero(opt))
            self.optimizers[p] = opt

    @property
    def state(self) -> dict[Any, Any]:
        merged: dict[Any, Any] = {}
        for opt in self.optimizers.values():
            merged.update(opt.state)
        return merged

    @property
    def defaults(self) -> dict[str, Any]:
        return dict(next(iter(self.optimizers.values())).defaults)

    def step(self) -> None:
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        return None

    def register_step_pre_hook(self, hook: Any) -> None:
        return None


def _step_and_zero(opt: Any) -> Any:
    def hook(param: torch.Tensor) -> None:
        opt.step()
        opt.zero_grad(set_to_none=True)

    return hook


def example_inputs(
    config: dict[str, Any], workload: WorkloadSpec, task: str, *, cast_pixels: bool = False
) -> dict[str, Any]:
    """Token ids / pixels for one micro-batch (create inside FakeTensorMode)."""
    b, s = workload.batch_size, workload.seq_len
    spec = ModelSpec.from_config(config)
    vocab = spec.vocab_size or 32000
    if task in media_inputs.TASKS:  # images and audio: memfit.estimate.trace.media_inputs
        return media_inputs.media_inputs(config, workload, task, cast_pixels=cast_pixels)
    inputs: dict[str, Any]
    if task == "clip":
        size = int(spec.vision.get("image_size", 224)) if spec.vision else 224
        vocab = (spec.text.vocab_size if spec.text else None) or 49408  # CLIPTextConfig
        return {
            "input_ids": torch.randint(0, vocab, (b, s)),
            "pixel_values": torch.randn(b, 3, size, size),
            "return_loss": workload.is_train,
        }
    ids = torch.randint(0, vocab, (b, s))
    inputs = {"input_ids": ids}
    if task == "seq-cls" and workload.is_train:
        inputs["labels"] = torch.zeros(b, dtype=torch.long)
    elif task == "seq2seq" and workload.is_train:
        inputs["labels"] = torch.randint(0, vocab, (b, s))
    elif task == "causal-lm" and workload.is_train:
        inputs["labels"] = ids
    return inputs


@contextlib.contextmanager
def _autocast(workload: WorkloadSpec) -> Iterator[None]:
    dtype = AUTOCAST_DTYPE.get(workload.run_precision)
    if dtype is None:
        yield
        return
    with torch.autocast("cpu", dtype=dtype):
        yield


def label_model_state(
    tracker: StorageTracker, model: torch.nn.Module, optimizer: Any = None, scaler: Any = None
) -> set[int]:
    """Label parameters/buffers, gradients and optimizer states, owned by their module.

    Returns the tracker keys of paged optimizer states (CUDA unified memory, ``is_paged``)."""
    paged: set[int] = set()
    for mod_name, module in model.named_modules():
        for p in module.parameters(recurse=False):
            _label(tracker, p, "parameters", mod_name)
            if p.grad is not None:
                _label(tracker, p.grad, "gradients", mod_name)
            if optimizer is not None:
                for key, value in optimizer.state.get(p, {}).items():
                    if not isinstance(value, torch.Tensor):
                        continue
                    if key == "step" and not _step_on_device(optimizer):
                        tracker.ignore([value])  # a host-side scalar on CUDA runs
                    else:
                        k = _label(tracker, value, "optimizer_states", mod_name)
                        if k is not None and getattr(value, "is_paged", False):
                            paged.add(k)
        for b in module.buffers(recurse=False):
            _label(tracker, b, "parameters", mod_name)
    if scaler is not None:
        for value in vars(scaler).values():
            if isinstance(value, torch.Tensor):
                _label(tracker, value, "optimizer_states", "(grad scaler)")
    return paged


def _label(tracker: StorageTracker, t: torch.Tensor, label: str, module: str) -> int | None:
    key = tracker.track(t, label)
    if key is not None:
        tracker.storages[key].module = module
    return key


def _step_on_device(optimizer: Any) -> bool:
    d = optimizer.defaults
    return bool(d.get("fused") or d.get("capturable"))


def run_train_steps(
    model: torch.nn.Module,
    inputs: dict[str, Any],
    workload: WorkloadSpec,
    tracker: StorageTracker,
    *,
    n_steps: int = 2,
) -> set[int]:
    """Run ``n_steps`` training steps; returns the tracker keys of paged optimizer states."""
    params = [p for p in model.parameters() if p.requires_grad]
    name = workload.optimizer or "none"
    optimizer: Any = None
    if params and workload.optimizer_in_bwd:
        optimizer = InBackward(params, name, model)
    elif params:
        optimizer = make_optimizer(params, name, model)
    paged: set[int] = set()
    scaler = _LossScaler() if PRECISION_RULES[workload.run_precision].grad_scaler else None
    config = getattr(model, "config", None)
    legacy = returns_fp32_logits(workload.transformers_version, getattr(config, "model_type", None))
    for _ in range(n_steps):
        tracker.set_phase("forward")
        with _autocast(workload):
            if legacy and "labels" in inputs:
                out = _forward_fp32_logits(model, inputs)
            else:
                out = model(**inputs)
        loss = out.loss if hasattr(out, "loss") and out.loss is not None else _fallback_loss(out)
        tracker.set_phase("backward")
        (scaler.scale(loss) if scaler is not None else loss).backward()
        del out, loss
        label_model_state(tracker, model)
        tracker.set_phase("optimizer")
        if optimizer is not None:
            if scaler is not None:
                scaler.unscale_(params)
            optimizer.step()
            if scaler is not None:
                scaler.update()
            paged |= label_model_state(tracker, model, optimizer, scaler)
            optimizer.zero_grad(set_to_none=workload.zero_grad_set_to_none)
        else:
            model.zero_grad(set_to_none=workload.zero_grad_set_to_none)
    tracker.set_phase("end")
    return paged


def _forward_fp32_logits(model: torch.nn.Module, inputs: dict[str, Any]) -> Any:
    """A causal LM's training forward as transformers before 4.46 ran it
    (:mod:`memfit.spec.hf_versions`): the logits upcast to fp32 and returned in the output (the
    model's own dtype copy dropped), the loss a ``CrossEntropyLoss`` over the shifted fp32 slice
    copied with ``.contiguous()``. The installed forward runs without labels (its own loss
    would upcast again), then the old tail runs here."""
    labels = inputs["labels"]
    out = model(**{k: v for k, v in inputs.items() if k != "labels"})
    logits = out.logits.float()
    out["logits"] = logits  # the caller now holds the fp32 copy; the 16-bit one is freed
    shift_logits = logits[..., :-1, :].contiguous()
    shift_labels = labels[..., 1:].contiguous()
    out["loss"] = torch.nn.functional.cross_entropy(
        shift_logits.view(-1, shift_logits.shape[-1]), shift_labels.view(-1)
    )
    return out


class _LossScaler:
    """What ``torch.amp.GradScaler`` allocates on the device, without its host-side ``.item()``
    checks (fake tensors have no values): a scale and a growth tracker, a found-inf flag and the
    reciprocal scale per step, in-place unscaling of the gradients, the in-place scale update."""

    def __init__(self) -> None:
        self.scale_t = torch.full((), 65536.0, dtype=torch.float32)
        self.growth_tracker = torch.full((), 0, dtype=torch.int32)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale_t

    def unscale_(self, params: list[torch.nn.Parameter]) -> None:
        # GradScaler.unscale_ (torch/amp/grad_scaler.py, torch 2.13): the reciprocal in fp64,
        # then found_inf; _unscale_grads_ takes both through _MultiDeviceReplicator.get(), which
        # copies the master for the gradients' device (``copy=True``), and keeps the found_inf
        # copy (``found_inf_per_device``) until update(); the masters die with unscale_
        inv_scale = self.scale_t.double().reciprocal().float()
        found_inf = torch.full((), 0.0, dtype=torch.float32)
        inv_copy, self.found_inf = inv_scale.clone(), found_inf.clone()
        grads = [p.grad for p in params if p.grad is not None]
        torch._amp_foreach_non_finite_check_and_unscale_(grads, self.found_inf, inv_copy)

    def update(self) -> None:
        torch._amp_update_scale_(self.scale_t, self.growth_tracker, self.found_inf, 2.0, 0.5, 2000)
        del self.found_inf  # GradScaler.update() drops its per-optimizer state (found_inf) too


def _fallback_loss(out: Any) -> torch.Tensor:
    """Models without a built-in loss: the mean of the first output (a scalar to backprop)."""
    if hasattr(out, "pred_boxes"):  # DETR: media_inputs.detection_loss
        return media_inputs.detection_loss(out)
    first = out if isinstance(out, torch.Tensor) else out[0]
    return first.mean()


def run_inference(
    model: torch.nn.Module,
    inputs: dict[str, Any],
    workload: WorkloadSpec,
    task: str,
    tracker: StorageTracker,
) -> None:
    with torch.no_grad(), _autocast(workload):
        if task == "causal-lm":
            _generate(model, inputs["input_ids"], workload, tracker)
        elif task == "seq2seq":
            _generate_seq2seq(model, inputs["input_ids"], workload, tracker)
        elif task == "speech-seq2seq":
            media_inputs.run_speech_generation(model, inputs, workload, tracker)
        else:
            tracker.set_phase("forward")
            out = model(**inputs)
            del out
    tracker.set_phase("end")


def _next_token(out: Any, tracker: StorageTracker) -> torch.Tensor:
    logits = out.logits[:, -1, :].to(copy=True, dtype=torch.float32)
    tracker.label(_cache_tensors(_cache_of(out)), "kv_cache")
    return logits.argmax(-1, keepdim=True)


def _cache_of(out: Any) -> Any:
    """The cache a forward returned, under the name the model uses (``generate()``'s
    ``_update_model_kwargs_for_generation`` looks for ``past_key_values``, then
    ``cache_params``: Mamba, Mamba-2, FalconMamba return their state there)."""
    cache = getattr(out, "past_key_values", None)
    return cache if cache is not None else getattr(out, "cache_params", None)


def _cache_kwarg(model: torch.nn.Module) -> str:
    """The keyword the model's ``forward`` takes its cache by: ``cache_params`` for the Mamba
    families (``GenerationMixin._prepare_cache_for_generation``), else ``past_key_values``."""
    import inspect

    params = inspect.signature(model.forward).parameters
    if "cache_params" in params and "past_key_values" not in params:
        return "cache_params"
    return "past_key_values"


def _generate(
    model: torch.nn.Module, ids: torch.Tensor, workload: WorkloadSpec, tracker: StorageTracker
) -> None:
    tracker.set_phase("prefill")
    keep = logits_to_keep_kwargs(model)
    positions = generation_position_ids(model, ids)
    out = _prefill(model, ids, workload.prefill_chunk_size, keep, tracker, positions)
    token, cache = _next_token(out, tracker), _cache_of(out)
    cache_kw = _cache_kwarg(model)
    del out
    total = ids.shape[1] + workload.new_tokens - 1  # cache length after the last decode step
    tracker.set_phase("decode")
    for step in _decode_steps(workload.new_tokens):
        if step > MAX_TRACED_DECODE_STEPS:
            _grow_cache(cache, total - 1, tracker)
        pos: dict[str, torch.Tensor] = {}
        if positions is not None:  # _update_model_kwargs_for_generation: one more position
            if step > MAX_TRACED_DECODE_STEPS:  # the skipped steps' positions too
                positions = positions[..., :1] + torch.arange(total - 1)
            positions = torch.cat([positions, positions[..., -1:] + 1], dim=-1)
            pos = {"position_ids": positions[..., -1:].clone()}  # prepare_inputs_for_generation
        out = model(input_ids=token, **{cache_kw: cache}, use_cache=True, **keep, **pos)
        token = _next_token(out, tracker)
        del out


def generation_position_ids(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor | None:
    """The ``position_ids`` ``generate()`` passes: built from its (B, S) all-ones attention mask
    (``_prepare_attention_mask_for_generation``, then ``_prepare_position_ids_for_generation``:
    ``cumsum - 1``) when the model's ``forward`` takes ``position_ids`` — so (B, S), and the
    rotary cos/sin (learned position embeddings) of every pass are batch-sized, where a plain
    forward builds (1, S) from ``cache_position``. None for models whose forward does not take
    them or that are not ``GenerationMixin`` models."""
    import inspect

    prepare = getattr(model, "_prepare_position_ids_for_generation", None)
    if prepare is None or "position_ids" not in inspect.signature(model.forward).parameters:
        return None
    mask = torch.ones(ids.shape[:2], dtype=torch.long, device=ids.device)
    positions: torch.Tensor = prepare(ids, {"attention_mask": mask})
    return positions


def logits_to_keep_kwargs(model: torch.nn.Module) -> dict[str, int]:
    """``generate()`` sets ``logits_to_keep=1`` when the model's ``forward`` takes it
    (``GenerationMixin._supports_logits_to_keep``: the signature); others compute every
    position's logits."""
    import inspect

    return (
        {"logits_to_keep": 1}
        if "logits_to_keep" in inspect.signature(model.forward).parameters
        else {}
    )


def _prefill(
    model: torch.nn.Module,
    ids: torch.Tensor,
    chunk: int | None,
    keep: dict[str, int],
    tracker: StorageTracker,
    positions: torch.Tensor | None = None,
) -> Any:
    """``GenerationMixin._prefill``: one forward over the prompt, or with
    ``prefill_chunk_size`` the prompt split into chunks (``torch.split``), each a forward into
    the growing DynamicCache with its slice of ``position_ids``; ``outputs`` of one chunk stay
    referenced until the next one returns (transformers 5.x ``generation/utils.py``)."""
    if chunk is None or chunk >= ids.shape[1]:
        pos = {} if positions is None else {"position_ids": positions}
        return model(input_ids=ids, use_cache=True, **keep, **pos)
    out: Any = None
    past = 0
    cache_kw = _cache_kwarg(model)
    for piece in torch.split(ids, chunk, dim=-1):
        cache = _cache_of(out) if out is not None else None
        pos = {}
        if positions is not None:
            pos = {"position_ids": positions[..., past : past + piece.shape[-1]]}
        past += piece.shape[-1]
        out = model(input_ids=piece, **{cache_kw: cache}, use_cache=True, **keep, **pos)
        tracker.label(_cache_tensors(_cache_of(out)), "kv_cache")
    return out


#: Decode steps traced one by one. Each step grows the DynamicCache by one token (``torch.cat``),
#: which fragments the caching allocator; beyond this many steps memfit jumps to the last step with
#: the cache grown to its final length (allocated bytes within 0.5 %, never lower; reserved may be
#: lower). Each traced step of an 8B model costs ~0.25 s, so the cap keeps a generation estimate
#: near 5 s.
MAX_TRACED_DECODE_STEPS = 16


def _decode_steps(new_tokens: int) -> list[int]:
    """The decode steps traced: every step up to the cap, then the last one."""
    steps = list(range(1, min(new_tokens, MAX_TRACED_DECODE_STEPS + 1)))
    if new_tokens - 1 > MAX_TRACED_DECODE_STEPS:
        steps.append(new_tokens - 1)
    return steps


def _generate_seq2seq(
    model: torch.nn.Module, ids: torch.Tensor, workload: WorkloadSpec, tracker: StorageTracker
) -> None:
    tracker.set_phase("prefill")
    start = torch.zeros(ids.shape[0], 1, dtype=torch.long)
    encoder_outputs = model.get_encoder()(input_ids=ids)  # type: ignore[operator]
    out = model(encoder_outputs=encoder_outputs, decoder_input_ids=start, use_cache=True)
    token, cache = _next_token(out, tracker), out.past_key_values
    del out
    tracker.set_phase("decode")
    for step in _decode_steps(workload.new_tokens):
        if step > MAX_TRACED_DECODE_STEPS:
            _grow_cache(cache.self_attention_cache, workload.new_tokens - 1, tracker)
        out = model(
            encoder_outputs=encoder_outputs,
            decoder_input_ids=token,
            past_key_values=cache,
            use_cache=True,
        )
        token = _next_token(out, tracker)
        del out


def _cache_tensors(cache: Any) -> list[torch.Tensor]:
    if cache is None:
        return []
    caches = (
        [cache.self_attention_cache, cache.cross_attention_cache]
        if hasattr(cache, "self_attention_cache")
        else [cache]
    )
    out: list[torch.Tensor] = []
    for c in caches:
        for layer in getattr(c, "layers", []):
            out += [
                t
                for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
                if isinstance(t, torch.Tensor)
            ]
            for name in ("conv_states", "recurrent_states"):  # linear-attention / SSM layers
                states = getattr(layer, name, None)
                states = states.values() if isinstance(states, dict) else [states]
                out += [t for t in states if isinstance(t, torch.Tensor)]
    return out


def _grow_cache(cache: Any, length: int, tracker: StorageTracker) -> None:
    """Give every cache layer the length it has after ``length`` tokens (windowed layers keep
    ``sliding_window - 1``), as the skipped decode steps would have."""
    for layer in getattr(cache, "layers", []):
        keys = getattr(layer, "keys", None)
        if not isinstance(keys, torch.Tensor) or keys.dim() != 4:
            continue
        n = length
        if getattr(layer, "is_sliding", False):
            n = min(length, int(layer.sliding_window) - 1)
        values = layer.values  # MLA (DeepSeek V2/V3): values have their own head size
        layer.keys = torch.empty((*keys.shape[:2], n, keys.shape[3]), dtype=keys.dtype)
        layer.values = torch.empty((*values.shape[:2], n, values.shape[3]), dtype=values.dtype)
        if hasattr(layer, "cumulative_length"):
            layer.cumulative_length = length
        tracker.label([layer.keys, layer.values], "kv_cache")


# The decode helpers other generation loops share (media_inputs: Whisper's generate()).
next_token, decode_steps, grow_cache = _next_token, _decode_steps, _grow_cache
# The loss scaler a training loop outside this module runs (diffusion_train_step: accelerate's).
LossScaler = _LossScaler
