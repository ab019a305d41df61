"""A LitGPT fine-tune config traced through LitGPT's own code (litgpt 0.5.13, lightning 2.6):
``litgpt/finetune/lora.py`` (``lora_r`` set) or ``litgpt/finetune/full.py``.

What runs, as ``litgpt finetune`` runs it:

* the model: ``Config.from_name(<checkpoint_dir's last part>)`` (or the folder's
  ``model_config.yaml``, read as data), ``litgpt.lora.GPT`` with the config's ``lora_*`` switches
  and ``mark_only_lora_as_trainable``, else ``litgpt.GPT``; built in the ``precision`` dtype
  (``bf16-true``: pure bf16, the LoRA weights too), ``model.max_seq_length`` set to
  ``train.max_seq_length`` (its RoPE cache);
* ``quantize: bnb.*``: Lightning's ``BitsandbytesPrecision(mode, dtype)`` with no
  ``ignore_modules`` converts **every** ``torch.nn.Linear`` (lightning/fabric/plugins/precision/
  bitsandbytes.py ``_convert_layers``) — the inner ``linear`` of each ``LoRALinear`` and the LM
  head too, where transformers keeps the output embeddings unquantized
  (``get_keys_to_not_convert``). memfit's stand-ins store what bitsandbytes stores and allocate
  what its kernels allocate (memfit.estimate.trace.quantized). ``finetune/lora.py`` then swaps
  the token embedding for bitsandbytes' ``StableEmbedding`` (fp32 layer norm of the embeddings);
  its optimizer is ``bnb.optim.PagedAdamW`` (32-bit paged states: CUDA unified memory, outside
  ``max_memory_allocated``; memfit counts them as AdamW states, of LoRA size);
* the 4-bit weights are quantized from fp16: Lightning's ``_Linear4bit.quantize`` runs
  ``weight.to(device, dtype=torch.half)`` before ``bnb.functional.quantize_4bit`` (lightning
  2.3 / 2.4 fabric/plugins/precision/bitsandbytes.py), so ``QuantState.dtype`` is fp16 and each
  4-bit matmul's ``dequantize_4bit(B, state).to(A.dtype)`` (bitsandbytes 0.42
  autograd/_functions.py ``MatMul4Bit``, forward and backward) holds an fp16 and a bf16 copy of
  the weight at once;
* the step: ``model(input_ids, lm_head_chunk_size=128)`` (LoRA; full: whole logits) through
  ``fabric.setup``'s ``_FabricModule.forward``, which returns ``precision.convert_output(out)``:
  every floating output cast to ``torch.get_default_dtype()`` — fp32 outside the precision's
  forward context (HalfPrecision and BitsandbytesPrecision, lightning fabric/wrappers.py,
  plugins/precision/half.py, bitsandbytes.py) — so the logits (chunks) reach the loss in fp32;
  LitGPT's ``chunked_cross_entropy``, ``fabric.backward``, with accumulation a second
  micro-batch, then ``optimizer.step()`` and ``zero_grad()``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from memfit.errors import SpecError
from memfit.estimate.trace.frameworks import finish
from memfit.estimate.trace.quantized import QuantizedLinear
from memfit.estimate.trace.steps import make_optimizer
from memfit.estimate.trace.user_step import trace_step
from memfit.userfiles import read_text

PRECISION_DTYPE = {
    "bf16-true": torch.bfloat16,
    "16-true": torch.float16,
    "32-true": torch.float32,
    "bf16-mixed": torch.float32,
    "16-mixed": torch.float32,
}
#: ``--quantize`` → memfit's stand-in format (Lightning's _NF4Linear: compress_statistics=False,
#: _NF4DQLinear: True; _FP4DQLinear is modelled as fp4).
QUANT_FORMAT = {
    "bnb.nf4": "nf4",
    "bnb.nf4-dq": "nf4-dq",
    "bnb.fp4": "fp4",
    "bnb.fp4-dq": "fp4",
    "bnb.int8": "int8",
}
LORA_SWITCHES = (
    "lora_query",
    "lora_key",
    "lora_value",
    "lora_projection",
    "lora_mlp",
    "lora_head",
)
#: LitGPT's LoRA defaults (litgpt/finetune/lora.py ``setup``).
LORA_DEFAULTS = {"lora_query": True, "lora_value": True}
LM_HEAD_CHUNK = 128
#: bitsandbytes releases whose ``MatMul4Bit.forward`` keeps its input for backward
#: (``ctx.tensors = (A, B)`` whenever the input needs a gradient, bitsandbytes/autograd/
#: _functions.py up to 0.42 — LitGPT 0.4's pin); 0.50 keeps ``(None, B)``. Releases 0.43-0.49
#: were not read: they are treated as 0.50.
BNB_KEEPS_INPUT_BEFORE = (0, 43)
#: the dtype Lightning's ``_Linear4bit.quantize`` casts a weight to before quantizing it
QUANTIZED_FROM = torch.float16


def fabric_output(out: Any) -> Any:
    """``_FabricModule.forward``'s ``precision.convert_output``: floating tensors (in a list
    too) cast to the default dtype, fp32 here (a no-op for fp32 tensors)."""
    if isinstance(out, list):
        return [fabric_output(t) for t in out]
    return out.to(torch.float32) if torch.is_floating_point(out) else out


def model_config(data: dict[str, Any]) -> Any:
    """LitGPT's ``Config`` (``litgpt.lora.Config`` with the ``lora_*`` keys when ``lora_r``)."""
    import yaml

    lora = data.get("lora_r") is not None
    if lora:
        from litgpt.lora import Config
    else:
        from litgpt.config import Config
    kwargs: dict[str, Any] = {}
    if lora:
        kwargs = {"lora_r": int(data["lora_r"]), "lora_alpha": int(data.get("lora_alpha", 16))}
        kwargs.update({k: bool(data.get(k, LORA_DEFAULTS.get(k, False))) for k in LORA_SWITCHES})
    ckpt = str(data.get("checkpoint_dir", ""))
    local = Path(ckpt).expanduser() / "model_config.yaml"
    if local.is_file():
        fields = yaml.safe_load(read_text(local, what="LitGPT model_config.yaml")) or {}
        return Config(**{**fields, **kwargs})
    name = Path(ckpt).name
    try:
        return Config.from_name(name, **kwargs)
    except ValueError:
        raise SpecError(
            f"checkpoint_dir ({ckpt!r}): {name!r} is not a LitGPT model name (litgpt/config.py); "
            "point checkpoint_dir at a folder with model_config.yaml"
        ) from None


def bnb_keeps_input(version: str | None = None) -> bool:
    """Whether the 4-bit matmul of bitsandbytes ``version`` (default: the installed one)
    keeps its input alive until backward."""
    if version is None:
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as installed

        try:
            version = installed("bitsandbytes")
        except PackageNotFoundError:
            return False
    parts = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    return parts < BNB_KEEPS_INPUT_BEFORE


class _KeepInput(torch.autograd.Function):
    """Holds ``x`` for backward (what old bitsandbytes' MatMul4Bit did); passes ``out`` on."""

    @staticmethod
    def forward(ctx: Any, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return out.view_as(out)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _LegacyBnb4(QuantizedLinear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        return _KeepInput.apply(out, x) if x.requires_grad else out


def build_model(
    data: dict[str, Any], seq_len: int, *, bnb_version: str | None = None
) -> torch.nn.Module:
    precision = str(data.get("precision", "bf16-true"))
    if precision not in PRECISION_DTYPE:
        raise SpecError(f"precision ({precision!r}) must be one of {', '.join(PRECISION_DTYPE)}")
    config = model_config(data)
    old = torch.get_default_dtype()
    torch.set_default_dtype(PRECISION_DTYPE[precision])
    try:
        with torch.device("meta"):
            if data.get("lora_r") is not None:
                from litgpt.lora import GPT, mark_only_lora_as_trainable

                model = GPT(config)
                mark_only_lora_as_trainable(model)
            else:
                from litgpt.model import GPT as FullGPT

                model = FullGPT(config)
            model.max_seq_length = seq_len
    finally:
        torch.set_default_dtype(old)
    quantize = data.get("quantize")
    if quantize is not None:
        if quantize not in QUANT_FORMAT:
            raise SpecError(f"quantize ({quantize!r}) must be one of {', '.join(QUANT_FORMAT)}")
        if "mixed" in precision:  # finetune/lora.py raises the same
            raise SpecError("quantize with a mixed precision: LitGPT supports only *-true")
        fmt = QUANT_FORMAT[quantize]
        legacy = fmt != "int8" and bnb_keeps_input(bnb_version)
        n = quantize_linears_(model, fmt, PRECISION_DTYPE[precision], legacy=legacy)
        model._memfit_bnb_keeps_input = legacy  # type: ignore[assignment]
        model._memfit_quantized = n  # type: ignore[assignment]
        _stable_embedding_(model)
    return model


def quantize_linears_(
    model: torch.nn.Module, fmt: str, dtype: torch.dtype, *, legacy: bool = False
) -> int:
    """Every ``torch.nn.Linear`` → a stand-in, as ``BitsandbytesPrecision`` converts them."""
    cls = _LegacyBnb4 if legacy else QuantizedLinear
    names = [n for n, m in model.named_modules() if type(m) is torch.nn.Linear]
    for name in names:
        linear: Any = model.get_submodule(name)
        stand_in = cls(
            fmt,
            int(linear.in_features),
            int(linear.out_features),
            bias=linear.bias is not None,
            dtype=dtype,
            compute_dtype=dtype,
            state_dtype=None if fmt == "int8" else QUANTIZED_FROM,
        )
        model.set_submodule(name, stand_in)
    return len(names)


def _stable_embedding_(model: Any) -> None:
    from bitsandbytes.nn import StableEmbedding

    old = model.transformer.wte
    with torch.device("meta"):
        new = StableEmbedding(old.num_embeddings, old.embedding_dim)
    model.transformer.wte = new.to(dtype=old.weight.dtype)
    model.transformer.wte.weight.requires_grad_(False)


def trace_litgpt(
    data: dict[str, Any], workload: Any, *, gpu: Any = None, bnb_version: str | None = None
) -> Any:
    """Estimate the LitGPT config ``data`` with ``workload``'s batch and length
    (``bnb_version``: the bitsandbytes release to model, default the installed one)."""
    from litgpt.utils import chunked_cross_entropy

    b, s = workload.batch_size, workload.seq_len
    lora = data.get("lora_r") is not None
    model = build_model(data, s, bnb_version=bnb_version)
    micro_batches = 2 if workload.grad_accum > 1 else 1
    name = workload.optimizer or "adamw"

    def optimizer(params: list[torch.nn.Parameter]) -> Any:
        return make_optimizer(params, name)

    def inputs() -> dict[str, torch.Tensor]:
        return {
            "input_ids": torch.zeros(b, s, dtype=torch.long),
            "labels": torch.zeros(b, s, dtype=torch.long),
        }

    def step(m: torch.nn.Module, opt: Any, batch: dict[str, torch.Tensor]) -> None:
        for _ in range(micro_batches):
            if lora:
                logits = fabric_output(m(batch["input_ids"], lm_head_chunk_size=LM_HEAD_CHUNK))
                logits[-1] = logits[-1][..., :-1, :]
                loss = chunked_cross_entropy(logits, batch["labels"][..., 1:])
            else:
                logits = fabric_output(m(batch["input_ids"]))
                loss = chunked_cross_entropy(logits[..., :-1, :], batch["labels"][..., 1:])
            del logits
            (loss / workload.grad_accum).backward()
        if opt is not None:
            opt.step()
            opt.zero_grad()

    label = Path(str(data.get("checkpoint_dir", "litgpt"))).name
    est = trace_step(step, model=model, optimizer=optimizer, inputs=inputs, gpu=gpu, name=label)
    n_quant = getattr(model, "_memfit_quantized", 0)
    notes = [
        f"traced through LitGPT's {'litgpt.lora.GPT' if lora else 'litgpt.GPT'} ({label}) and "
        f"its finetune step"
        + (
            f"; {data.get('quantize')}: all {n_quant} nn.Linear layers quantized, the LM head "
            "included (Lightning's BitsandbytesPrecision)"
            if n_quant
            else ""
        )
    ]
    if n_quant:
        notes.append(
            "LitGPT QLoRA: this engine's estimates are still below LitGPT's published peaks "
            "(19-36 % on the rows re-run, benchmarks/results/frameworks_published.md; the rest "
            "is unexplained): read it as a lower bound"
        )
    if getattr(model, "_memfit_bnb_keeps_input", False):
        notes.append("bitsandbytes < 0.43: each 4-bit layer keeps its input for backward")
    return finish(est, workload, "litgpt", notes)
