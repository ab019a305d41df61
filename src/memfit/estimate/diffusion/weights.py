"""What a diffusion component's weights take on the device under diffusers' memory features.

Each rule follows the library code that applies it (diffusers 0.42.1, transformers 5, bitsandbytes
0.45+, torchao 0.10+, ggml's block layouts) and works on the module tree built on the meta device:

* **Quantized linears** (``--quant`` for the denoiser, ``--text-encoder-quant`` for the largest
  text encoder, as diffusers' ``PipelineQuantizationConfig(quant_mapping=...)`` examples do):
  every ``torch.nn.Linear`` weight is replaced (diffusers' and transformers' bitsandbytes and
  torchao quantizers convert every Linear unless told to skip one; the GGUF files of FLUX quantize
  the 2-D weights). Biases and every other parameter keep the component's dtype. Bytes per weight
  element, with the per-block scales, are in :data:`memfit.spec.diffusion.FORMATS`.
* **Layerwise casting** (``ModelMixin.enable_layerwise_casting(storage_dtype=float8_e4m3fn)``,
  ``hooks/layerwise_casting.py``): the parameters of every Conv/Linear/Embedding-like layer
  (``hooks/_common.py: _GO_LC_SUPPORTED_PYTORCH_LAYERS``) whose name matches none of
  ``DEFAULT_SKIP_MODULES_PATTERN`` plus the class's ``_skip_layerwise_casting_patterns`` are
  stored in fp8 (one byte).
* **Transient**: each quantized / fp8-stored layer holds its weight in the compute dtype while it
  runs (bitsandbytes' ``dequantize_4bit``, diffusers' ``GGUFLinear.forward`` →
  ``dequantize_gguf_tensor``, torchao's weight-only linear casting the int8/fp8 data to the input
  dtype, the layerwise-casting pre-forward hook ``module.to(compute_dtype)``): the largest such
  layer's weight in the compute dtype is added to the component's activation peak, an upper
  bound (it assumes the largest layer runs at the forward's peak).
* **Group offloading** (``hooks/group_offloading.py``): ``block_level`` makes one group of each
  ``num_blocks_per_group`` children of every top-level ``ModuleList``/``Sequential`` and one
  "unmatched" group of everything else at the top level, onloaded for the whole forward;
  ``leaf_level`` one group per supported leaf layer. With ``use_stream`` the next group is
  prefetched while the current one runs: two groups are on the device.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memfit.spec.diffusion import FORMATS, LAYERWISE_STORAGE_BYTES

if TYPE_CHECKING:  # torch is imported where a module is laid out: WeightLayout is torch-free
    import torch

#: diffusers/hooks/layerwise_casting.py: DEFAULT_SKIP_MODULES_PATTERN (regexes, re.search).
LAYERWISE_SKIP = ("pos_embed", "patch_embed", "norm", "^proj_in$", "^proj_out$")


def _supported_layers() -> tuple[type[torch.nn.Module], ...]:
    """diffusers/hooks/_common.py ``_GO_LC_SUPPORTED_PYTORCH_LAYERS``."""
    import torch

    nn = torch.nn
    return (
        nn.Conv1d,
        nn.Conv2d,
        nn.Conv3d,
        nn.ConvTranspose1d,
        nn.ConvTranspose2d,
        nn.ConvTranspose3d,
        nn.Linear,
        nn.Embedding,
    )


@dataclass(frozen=True, kw_only=True)
class WeightLayout:
    """One component's device weights under its storage format, and the groups offloading moves."""

    weights_bytes: int
    largest_leaf_bytes: int
    transient_bytes: int
    #: block_level groups: the unmatched group, and the largest matched group
    unmatched_bytes: int
    largest_block_bytes: int
    storage: str
    #: each weight tensor as the allocator replay loads it, in module order: (bytes of the
    #: 16-bit copy bitsandbytes quantizes from on the device, or 0; the stored tensors' bytes)
    tensor_allocs: tuple[tuple[int, tuple[int, ...]], ...] = ()

    def group_resident_bytes(self, offload_type: str, use_stream: bool) -> int:
        """Weights on the device while the component runs under group offloading."""
        n_groups = 2 if use_stream else 1
        if offload_type == "leaf_level":
            return n_groups * self.largest_leaf_bytes
        return self.unmatched_bytes + n_groups * self.largest_block_bytes


#: WeightLayout's byte fields (every one a whole non-negative count).
LAYOUT_BYTES = ("weights_bytes", "largest_leaf_bytes", "transient_bytes", "unmatched_bytes",
                "largest_block_bytes")  # fmt: skip


def layout_from_record(r: dict[str, Any]) -> WeightLayout:
    """A layout from its JSON record (``built._layout_record``; the shipped forms keep them)."""
    return WeightLayout(
        **{f: int(r[f]) for f in LAYOUT_BYTES},
        storage=str(r["storage"]),
        tensor_allocs=tuple((int(a), tuple(int(n) for n in b)) for a, b in r["tensor_allocs"]),
    )


def _own(module: torch.nn.Module) -> list[torch.Tensor]:
    return [*module.parameters(recurse=False), *module.buffers(recurse=False)]


def _all(module: torch.nn.Module) -> list[torch.Tensor]:
    return [*module.parameters(), *module.buffers()]


def _bytes_of(t: torch.Tensor) -> int:
    return int(t.numel() * t.element_size())


def layout(
    model: torch.nn.Module,
    *,
    quant: str = "none",
    layerwise: str | None = None,
    compute_dtype: torch.dtype | None = None,
    num_blocks_per_group: int = 1,
    not_converted: tuple[str, ...] = (),
) -> WeightLayout:
    """Device bytes of ``model``'s weights with ``quant`` applied to its linears or ``layerwise``
    storage to its supported layers (one of them at most), and its offload groups.
    ``not_converted``: module names the quantizer skips (transformers 5's quantizers skip the
    class's ``_keep_in_fp32_modules``: ``get_modules_to_not_convert`` in quantizers/base.py)."""
    per: dict[int, int] = {}  # id(tensor) -> device bytes
    parts: dict[int, tuple[int, tuple[int, ...]]] = {}  # quantized ones: as loaded
    transient = 0
    import torch

    dt = torch.bfloat16 if compute_dtype is None else compute_dtype
    compute_bytes = torch.empty((), dtype=dt).element_size()
    skip = [*LAYERWISE_SKIP, *(getattr(model, "_skip_layerwise_casting_patterns", None) or [])]
    supported = _supported_layers()
    for name, module in model.named_modules():
        own = _own(module)
        for t in own:
            per.setdefault(id(t), _bytes_of(t))
        if (
            quant != "none"
            and isinstance(module, torch.nn.Linear)
            and not any(k in name.split(".") for k in not_converted)
        ):
            w = module.weight
            per_elem, per_row = FORMATS[quant]
            per[id(w)] = int(w.numel() * per_elem + w.shape[0] * per_row)
            transient = max(transient, w.numel() * compute_bytes)
            parts[id(w)] = _stored_parts(quant, w.numel(), w.shape[0], compute_bytes)
        elif (
            layerwise is not None
            and isinstance(module, supported)
            and not any(re.search(p, name) for p in skip)
        ):
            store = LAYERWISE_STORAGE_BYTES[layerwise]
            for t in module.parameters(recurse=False):
                per[id(t)] = t.numel() * store
            transient = max(transient, sum(p.numel() for p in module.parameters(False)))
    if layerwise is not None:
        transient *= compute_bytes

    def total(m: torch.nn.Module, recurse: bool = True) -> int:
        seen = {
            id(t): per[id(t)] for t in ([*m.parameters(), *m.buffers()] if recurse else _own(m))
        }
        return sum(seen.values())

    unmatched_ids = {id(t) for t in _own(model)}  # a set: a tied weight counts once
    block = 0
    for child in model.children():
        if isinstance(child, (torch.nn.ModuleList, torch.nn.Sequential)):
            kids = list(child)
            for i in range(0, len(kids), num_blocks_per_group):
                group = {id(t) for k in kids[i : i + num_blocks_per_group] for t in _all(k)}
                block = max(block, sum(per[k] for k in group))
        else:
            unmatched_ids.update(id(t) for t in _all(child))
    unmatched = sum(per[k] for k in unmatched_ids)
    leaf = max((total(m, recurse=False) for m in model.modules()), default=0)
    storage = quant if quant != "none" else (f"{layerwise} layerwise" if layerwise else "")
    return WeightLayout(
        weights_bytes=total(model),
        largest_leaf_bytes=leaf,
        transient_bytes=transient,
        unmatched_bytes=unmatched,
        largest_block_bytes=block,
        storage=storage,
        tensor_allocs=tuple(parts.get(k, (0, (n,))) for k, n in per.items()),
    )


def _stored_parts(quant: str, n: int, rows: int, compute_bytes: int) -> tuple[int, tuple[int, ...]]:
    """How a quantized weight reaches the device: bitsandbytes moves the 16-bit tensor to the
    device and quantizes it there (``Params4bit._quantize`` / ``Int8Params._quantize`` on
    ``.to(device)``), leaving the packed data and its scales; the other formats arrive stored."""
    per_elem, per_row = FORMATS[quant]
    if quant in ("nf4", "fp4"):
        return n * compute_bytes, (-(-n // 2), -(-n // 64) * 4)
    if quant == "nf4-dq":
        return n * compute_bytes, (-(-n // 2), -(-n // 64), -(-n // (64 * 256)) * 4)
    if quant == "int8":
        return n * compute_bytes, (n, rows * 4)
    return 0, (int(n * per_elem + rows * per_row),)


def quantized_components(
    configs: dict[str, Any], denoiser: str, weights: dict[str, int], job: Any
) -> dict[str, str]:
    """``{component: format}``: ``job.quant`` on the denoiser, ``job.text_encoder_quant`` on the
    largest text encoder (the T5 of FLUX / SD3, as diffusers' docs and blog quantize)."""
    out: dict[str, str] = {}
    if job.quant != "none":
        out[denoiser] = job.quant
    if job.text_encoder_quant != "none":
        encoders = [c for c in configs if c.startswith("text_encoder") and c in weights]
        if encoders:
            out[max(encoders, key=lambda c: weights[c])] = job.text_encoder_quant
    return out
