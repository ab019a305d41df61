"""The dtypes LLaMA-Factory trains in, as memfit's ``precision`` (read_llamafactory's rule).

LLaMA-Factory does not train the model Hugging Face's Trainer would load by default; it casts
(hiyouga/LLaMA-Factory@c867e280, v0.9.3 era; the same outcome for a bf16 checkpoint in v0.9.4+):

1. The compute dtype: bfloat16 with ``bf16: true`` or ``pure_bf16: true``, float16 with
   ``fp16: true`` (``src/llamafactory/hparams/parser.py`` ``get_train_args``: "Post-process model
   arguments"); neither: ``infer_optim_dtype`` (``src/llamafactory/extras/misc.py``), bfloat16
   where the GPU has it and the checkpoint is bf16, else float16 (``model/patcher.py``
   ``patch_config``).
2. The load dtype: ``patch_config`` sets ``init_kwargs["torch_dtype"] = compute_dtype`` unless
   DeepSpeed ZeRO-3 runs without ``quantization_bit`` ("do not cast data type of the model
   deepspeed zero3 without qlora"). FSDP changes only the device map, not the dtype. (v0.9.4,
   commits 3c17f272 / 55590f5e, load ``torch_dtype="auto"``, the checkpoint's dtype: bf16 for
   every current LLM, the same bytes.)
3. The trainable parameters: ``init_adapter`` (``model/adapter.py``) casts them to float32
   (``cast_trainable_params_to_fp32``) unless ``pure_bf16`` / ``use_badam``, or ZeRO-3 without
   quantization (DeepSpeed keeps the fp32 masters itself).

So a LoRA / QLoRA job trains a 16-bit frozen base with fp32 adapters under the Trainer's
autocast: memfit's ``bf16-true`` / ``16-true`` (its engines keep LoRA adapters in fp32); a full
fine-tune upcasts every weight to fp32: ``bf16-mixed``. A freeze job holds its frozen layers in
16 bits and its trainable layers in fp32, which no memfit precision is: ``bf16-mixed`` (frozen
layers counted in fp32, and the final norm and LM head, which it freezes, counted trainable:
over, never under; not yet modelled exactly). Under DeepSpeed (any stage) the engine holds the
model in its 16-bit dtype with fp32 masters whatever the load dtype, which memfit's ``*-mixed``
under ZeRO already models (``spec.rules.run_precision``): an adapter job under a ZeRO shard (from
the file's ``deepspeed`` or another file) is read ``*-mixed`` (``files.combine``).
"""

from __future__ import annotations

from memfit.jobfiles.names import MIXED, TRUE
from memfit.jobfiles.reader import KeyReader, as_bool, is_unset

#: The commit whose source the rule is read from (module docstring).
LLAMAFACTORY_SOURCE = "hiyouga/LLaMA-Factory@c867e280 src/llamafactory/model/patcher.py"
#: Where freeze tuning's trainable set and fp32 upcast are read (``_setup_freeze_tuning``: the
#: last ``freeze_trainable_layers`` layers' parameters, plus ``freeze_extra_modules``, are
#: trainable and cast to fp32; every other parameter ``requires_grad_(False)`` in the load dtype).
FREEZE_SOURCE = "hiyouga/LLaMA-Factory@01d87b82 src/llamafactory/model/adapter.py"


def _compute_dtype(r: KeyReader) -> tuple[str, str, str]:
    """(dtype, key, raw) of LLaMA-Factory's compute dtype for this file."""
    for key, dtype in (("pure_bf16", "bf16"), ("bf16", "bf16"), ("fp16", "fp16")):
        value = r.flat.get(key)
        if not is_unset(value) and as_bool(r, key, value):
            return dtype, key, str(value).lower()
    # infer_optim_dtype: bf16 on a GPU with bf16 (memfit's check notes the fp16 counterpart
    # on one without)
    return "bf16", "bf16", "false (default)"


def llamafactory_precision_(r: KeyReader, kind: str, quantized: bool) -> None:
    """Replace the Trainer reading of ``bf16`` / ``fp16`` (autocast over fp32 weights) with the
    dtypes LLaMA-Factory loads and trains in (module docstring), and say which rule applied. An
    adapter job's reading is marked ``load_dtype``: under a DeepSpeed ZeRO shard, which another
    file may name, :func:`memfit.jobfiles.files.combine` reads it as DeepSpeed runs it."""
    if r.has("pure_bf16") and as_bool(r, "pure_bf16", r.flat["pure_bf16"]):
        return  # read as bf16-true already: every weight and state in bf16
    dtype, key, raw = _compute_dtype(r)
    current = next((s for s in reversed(r.settings) if s.field == "precision"), None)
    if kind == "lora":
        r.drop_setting("precision")
        r.set("precision", TRUE[dtype], key, raw, load_dtype=True)
        what = "QLoRA: the non-quantized weights" if quantized else "LoRA: the frozen base"
        r.warn(
            key,
            f"estimated as {TRUE[dtype]} ({MIXED[dtype]} under DeepSpeed ZeRO, which holds the "
            "16-bit model and fp32 masters itself): LLaMA-Factory loads the model in its compute "
            f"dtype ({what} in {dtype}) and upcasts the trainable adapters to fp32 "
            f"({LLAMAFACTORY_SOURCE} patch_config; model/adapter.py init_adapter), not an fp32 "
            f"model under autocast as Hugging Face's Trainer alone runs {key}: true",
        )
    elif kind == "freeze" and current is not None and not r.has("deepspeed"):
        r.warn(
            key,
            f"estimated as {current.value}, an over-estimate: LLaMA-Factory trains the last "
            "freeze_trainable_layers layers in fp32 and holds everything else — the embeddings, "
            f"the other layers, the final norm and the LM head — frozen in {dtype} "
            f"({FREEZE_SOURCE} _setup_freeze_tuning); memfit counts every weight in fp32 (2 "
            "bytes per frozen parameter over) and trains the final norm and an untied LM head "
            "too (their fp32 gradients and AdamW states, 12 bytes per parameter over: about "
            "6 GiB for Llama-3.1-8B's head)",
        )
