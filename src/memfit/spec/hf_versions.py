"""transformers-, peft- and accelerate-version rules of a training step
(``WorkloadSpec.transformers_version``, ``WorkloadSpec.peft_version``,
``WorkloadSpec.accelerate_version``).

memfit traces the installed transformers. A published measurement was made with the release of
its day; where that release ran the step differently in a way that moves memory, the rule is
here (torch-free: the spec checks it, the trace engine applies it, the analytic engine refuses
what it does not model).

* **A causal LM's forward returned fp32 logits before 4.46.** ``LlamaForCausalLM.forward`` ran
  ``logits = self.lm_head(hidden_states); logits = logits.float()`` and, with labels, the loss on
  ``shift_logits = logits[..., :-1, :].contiguous()`` (``CrossEntropyLoss``), returning the fp32
  ``logits`` in the output (transformers 002272831fba584eb30dca9729c1be456836960a,
  ``src/transformers/models/llama/modeling_llama.py``, the 4.38/4.39 tree; Mistral the same at
  005a187ea7c5a291ef79f737d47233641ac17f24, where the upcast had moved under ``if labels is not
  None`` but the fp32 ``logits`` were still returned). https://github.com/huggingface/transformers/
  pull/33902 ("Remove logits.float()", for 4.46) and the 4.46 ``self.loss_function``
  (``ForCausalLMLoss``, ``loss/loss_utils.py``) moved the upcast inside the loss: the output keeps
  the model's dtype. So up to 4.45 the caller holds fp32 logits (4 B per token x vocabulary, not
  2) for as long as it holds the output (a loop that keeps ``output`` through ``backward()``, as
  memfit's traced step and Answer.AI's fsdp_qlora ``train.py`` do), and the loss's forward makes
  a second fp32 copy (the shifted slice). Not modelled: the first ``ForCausalLMLoss`` releases
  still shifted the fp32 logits with ``.contiguous()`` (removed by
  https://github.com/huggingface/transformers/pull/35646, merged 2025-01), a transient copy at
  the loss; memfit runs every release from 4.46 as the installed one.
* **peft kept LoRA adapters in the base layer's dtype before 0.12.** ``LoraLayer.update_layer``
  created the adapters and moved them with ``self.to(weight.device, dtype=weight.dtype)`` when
  the base weight is a float (peft 6008f272a565f56c146c5d9fd78d00cb24392d7b,
  ``src/peft/tuners/lora/layer.py``): bf16 adapters on a bf16 base, and on a bitsandbytes 4-bit
  base stored in a bf16 ``quant_storage`` (FSDP-QLoRA). peft ae1ae20b7 ("Autocast adapter
  weights if fp16/bf16", #1706, 2024-05-16; first released in 0.12.0) added
  ``get_peft_model(..., autocast_adapter_dtype=True)``, which casts them to fp32: the adapters,
  their gradients and Adam states in fp32, and each adapter's input upcast to fp32. memfit traces
  the installed peft; for a release before 0.12 it passes ``autocast_adapter_dtype=False``, which
  leaves them in the base weight's dtype as the old ``update_layer`` did.
* **accelerate kept an FSDP1 SHARDED_STATE_DICT save's copies on the GPU before 0.31.**
  ``FullyShardedDataParallelPlugin.set_state_dict_type`` built a state-dict config only for
  FULL_STATE_DICT (huggingface/accelerate v0.28.0, ``utils/dataclasses.py``), so
  ``save_fsdp_model`` entered ``FSDP.state_dict_type(model, SHARDED_STATE_DICT, None, None)`` and
  torch's default ``ShardedStateDictConfig(offload_to_cpu=False)`` applied. accelerate 67308ca6
  ("Enable sharded cpu resume", #2762, 2024-05-10; first released in 0.31.0, still so at v1.14.0
  beb0672a) sets ``ShardedStateDictConfig(offload_to_cpu=True)``, and torch's
  ``_sharded_post_state_dict_hook`` then moves each clone to the CPU as it makes it
  (``sharded_tensor = sharded_tensor.cpu()``): the GPU holds one copy at a time
  (:mod:`memfit.estimate.fsdp1_save`).
"""

from __future__ import annotations

import re

#: What a version string may look like ("4.40", "4.40.0.dev0", "4.37.2").
VERSION_RE = re.compile(r"^\d+(\.\d+){0,3}([.+-]?[0-9A-Za-z.+-]*)?$")
#: The first transformers release whose causal-LM forward keeps the model's dtype for the
#: returned logits (the upcast moved into ``ForCausalLMLoss``; see the module docstring).
FP32_LOGITS_UNTIL = (4, 46)
#: The model types whose pre-4.46 forward was read to upcast (cited above); Yi and most
#: Llama-architecture checkpoints are ``llama``.
FP32_LOGITS_MODEL_TYPES = ("llama", "mistral")


#: The first peft release that casts bf16 / fp16 adapters to fp32 (``autocast_adapter_dtype``).
PEFT_FP32_ADAPTERS_SINCE = (0, 12)


def parse(version: str) -> tuple[int, ...]:
    """The leading release numbers ("4.40.0.dev0" -> (4, 40, 0))."""
    nums = re.findall(r"\d+", version.split("+")[0].split("dev")[0])
    return tuple(int(n) for n in nums[:3])


def version_problem(name: str, value: object) -> str | None:
    """The rule of ``transformers_version``: None (the installed one) or a version string."""
    if value is None or (isinstance(value, str) and VERSION_RE.match(value)):
        return None
    return f"{name} ({value!r}) must be a version such as '4.40' or '4.37.2' (or unset)"


def returns_fp32_logits(version: str | None, model_type: str | None) -> bool:
    """Whether transformers ``version``'s causal LM of ``model_type`` returns fp32 logits from a
    training forward (and shifts them with a fp32 copy): False for None (the installed one)."""
    if version is None or model_type not in FP32_LOGITS_MODEL_TYPES:
        return False
    return parse(version)[:2] < FP32_LOGITS_UNTIL


def autocasts_adapters(peft_version: str | None) -> bool:
    """Whether peft ``peft_version`` casts 16-bit LoRA adapters to fp32 (None: the installed
    one, which does)."""
    return peft_version is None or parse(peft_version)[:2] >= PEFT_FP32_ADAPTERS_SINCE


#: The first accelerate release whose SHARDED_STATE_DICT config offloads to the CPU (above).
ACCELERATE_SHARDED_OFFLOAD_SINCE = (0, 31)


def sharded_save_offloads(accelerate_version: str | None) -> bool:
    """Whether accelerate ``accelerate_version`` moves a SHARDED_STATE_DICT save's copies to
    the CPU as they are made (None: the installed one, which does)."""
    return (
        accelerate_version is None
        or parse(accelerate_version)[:2] >= ACCELERATE_SHARDED_OFFLOAD_SINCE
    )


def peft_note(peft_version: str | None) -> str | None:
    """The line an estimate of a LoRA job naming an old ``peft_version`` carries."""
    if autocasts_adapters(peft_version):
        return None
    return (
        f"peft {peft_version}: LoRA adapters in the base layer's dtype (no fp32 autocast before "
        "0.12; memfit.spec.hf_versions)"
    )


def rule_note(version: str | None, model_type: str | None) -> str | None:
    """The line an estimate carries for a job naming ``version``."""
    if version is None:
        return None
    if returns_fp32_logits(version, model_type):
        return (
            f"transformers {version}: the causal LM's forward upcasts the logits to fp32 and "
            "returns them (held with the output through backward) and the loss shifts them "
            "with a fp32 copy, as before 4.46 (memfit.spec.hf_versions)"
        )
    if model_type not in FP32_LOGITS_MODEL_TYPES and parse(version)[:2] < FP32_LOGITS_UNTIL:
        return (
            f"transformers {version}: no version rule known for model_type {model_type!r}; "
            "traced as the installed transformers"
        )
    return None
