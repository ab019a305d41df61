"""Optimizer states and step temporaries, per trainable parameter tensor.

States come from :mod:`memfit.estimate.optim_states` (one table for every engine). The step's
temporaries are what the implementation allocates beyond its states while it runs:

* ``adamw`` (torch ``_multi_tensor_adamw``, foreach): ``exp_avg_sq_sqrt = _foreach_sqrt(
  exp_avg_sqs)`` — one tensor per parameter, in the state dtype — then in-place ops;
* ``adamw-fused``, ``sgd``, ``sgd-momentum``, ``lion``, bitsandbytes 8-bit AdamW: in place
  (``_fused_adamw_``, ``_foreach_add_``, bitsandbytes' fused update kernels);
* ``muon`` (``torch.optim.Muon`` on the 2-D hidden weights, ``_single_tensor_muon``, then a
  foreach AdamW on the embeddings, the output head and the 1-D parameters): AdamW's square
  root over its group, or, per matrix in turn, the Nesterov ``update`` (n·b, kept alive by
  the caller through the whole Newton-Schulz loop), the current bf16 iterate and the next one
  (2·n each: the first is ``update``'s bf16 copy, or, for a bf16 gradient, the second
  iteration's input) and the Gram matrix and its update (2·m² each, m the smaller side): the
  largest of these is the step's transient (:func:`muon_temp_bytes`);
* ``adafactor`` (``torch.optim.Adafactor``, foreach, as memfit's trace runs it): the step's
  largest transient is the per-parameter ``p.norm(2)`` / ``grad.norm(dim)`` of the largest
  trainable tensor, 16 bytes per element for fp16/bf16 parameters (the norm upcasts to fp32 and
  keeps a squared copy), 8 for fp32 — measured on the trace, independent of the layer count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from memfit.estimate.analytic.attention import round_up
from memfit.estimate.analytic.graph import DTYPE_BYTES
from memfit.estimate.optim_states import CUDA_MIN_BLOCK_BYTES, model_optimizer_state_bytes

#: Optimizer step temporaries as a multiple of the trainable parameters' bytes (see above).
TEMP_PARAM_MULTIPLE = {
    "adamw": 1,
    "adamw-fused": 0,
    "adamw-8bit": 0,
    "paged-adamw-8bit": 0,
    "paged-adamw-32bit": 0,  # bitsandbytes' 32-bit kernel updates in place
    "lion": 0,
    "muon": 0,  # its AdamW group's square root and Newton-Schulz's transients: muon_temp_bytes
    "adafactor": 0,
    "sgd": 0,
    "sgd-momentum": 0,
    "none": 0,
}
#: Adafactor's transient per element of the largest trainable tensor (see above).
ADAFACTOR_NORM_BYTES = {"f32": 8, "bf16": 16, "f16": 16}

_TORCH_DTYPE = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}


@dataclass(frozen=True)
class OptimizerBytes:
    state_bytes: int
    temp_bytes: int
    paged_bytes: int = 0


def optimizer_bytes(
    optimizer: str,
    shapes: Sequence[tuple[tuple[int, ...], str]],
    grad_bytes: int,
    *,
    embedding_shapes: Sequence[tuple[tuple[int, ...], str]] = (),
) -> OptimizerBytes:
    """See :func:`_optimizer_bytes` (memoised: a model's shapes repeat across workloads)."""
    return _optimizer_bytes(optimizer, tuple(shapes), grad_bytes, tuple(embedding_shapes))


@lru_cache(maxsize=256)
def _optimizer_bytes(
    optimizer: str,
    shapes: tuple[tuple[tuple[int, ...], str], ...],
    grad_bytes: int,
    embedding_shapes: tuple[tuple[tuple[int, ...], str], ...],
) -> OptimizerBytes:
    """States and temporaries for trainable parameters of ``shapes`` ((shape, dtype) pairs).
    ``embedding_shapes``: the trainable ``nn.Embedding`` weights among them, which bitsandbytes'
    8-bit optimizers keep at 32 bits (HF Trainer's override). Each state tensor is rounded to
    the allocator's 512-byte blocks, as on the device."""
    if optimizer == "none" or not shapes:
        return OptimizerBytes(0, 0)
    rest = list(shapes)
    for e in embedding_shapes:
        rest.remove(e)
    if optimizer == "muon":  # the output head (an embedding's shape) goes to the AdamW group too
        embed = {s for s, _ in embedding_shapes}
        head = [sd for sd in rest if sd[0] in embed]
        rest = [sd for sd in rest if sd[0] not in embed]
        embedding_shapes = (*embedding_shapes, *head)
    by_dtype: dict[str, tuple[list[tuple[int, ...]], list[tuple[int, ...]]]] = {}
    for group_shapes, index in ((rest, 0), (list(embedding_shapes), 1)):
        for shape, dtype in group_shapes:
            by_dtype.setdefault(dtype, ([], []))[index].append(shape)
    states = paged = 0
    for dtype, (plain, embeddings) in by_dtype.items():
        r = model_optimizer_state_bytes(
            optimizer, plain, _TORCH_DTYPE[dtype], fp32_state_shapes=embeddings
        )
        states += r.total_bytes
        paged += r.paged_bytes
    temp = TEMP_PARAM_MULTIPLE.get(optimizer, 0) * grad_bytes
    if optimizer == "adafactor":
        shape, dtype = max(shapes, key=lambda sd: _numel(sd[0]))
        temp = ADAFACTOR_NORM_BYTES[dtype] * _numel(shape)
    if optimizer == "muon":
        temp = muon_temp_bytes(rest, list(embedding_shapes))
    return OptimizerBytes(states, temp, paged)


def muon_temp_bytes(
    matrices: Sequence[tuple[tuple[int, ...], str]], adamw: Sequence[tuple[tuple[int, ...], str]]
) -> int:
    """The largest transient of a Muon + AdamW step (module docstring): Muon's matrices one at a
    time (each tensor rounded to the allocator's 512-byte blocks), then AdamW's foreach square
    root over its whole group."""
    sqrt = sum(_block(DTYPE_BYTES[d] * _numel(s)) for s, d in adamw)
    worst = 0
    for shape, dtype in matrices:
        if len(shape) != 2:
            sqrt += _block(DTYPE_BYTES[dtype] * _numel(shape))
            continue
        n, m = _numel(shape), min(shape)
        # the caller's update, the current iterate (its bf16 copy at the first iteration, the
        # previous addmm's output after it: the caller keeps ``update`` alive either way), the
        # Gram matrix and its update, the next iterate
        worst = max(
            worst, _block(DTYPE_BYTES[dtype] * n) + 2 * _block(2 * n) + 2 * _block(2 * m * m)
        )
    return max(worst, sqrt)


def _block(n_bytes: int) -> int:
    """``n_bytes`` as the caching allocator hands them out (its 512-byte blocks)."""
    return round_up(n_bytes, CUDA_MIN_BLOCK_BYTES)


def step_temp_in_backward(optimizer: str) -> Callable[[Any], int]:
    """Bytes one parameter's own step allocates while it runs (``optimizer_in_bwd``: one
    optimizer per parameter, stepped by its post-accumulate-grad hook): the table's temporaries
    for that parameter alone (AdamW foreach: its ``exp_avg_sq`` square root; Adafactor: its
    norm's upcast copies)."""
    multiple = TEMP_PARAM_MULTIPLE.get(optimizer, 0)

    def temp(param: Any) -> int:
        if optimizer == "adafactor":
            return ADAFACTOR_NORM_BYTES.get(param.dtype, 16) * int(param.numel)
        return multiple * int(param.n_bytes)

    return temp


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


__all__ = ["DTYPE_BYTES", "OptimizerBytes", "optimizer_bytes", "step_temp_in_backward"]
