"""Optimizer-state bytes, per parameter tensor and per model, for every optimizer memfit knows.

Torch-free: the analytic engine imports it. Each optimizer is described by the state tensors its
implementation allocates for one parameter of a given shape and dtype (:func:`state_tensors`);
every total is a sum over those tensors, each rounded up to the CUDA caching allocator's 512-byte
blocks (``round_to=1`` gives the raw tensor bytes). ``n`` is the parameter's element count and
``b`` its element size in bytes. Sources and the tests behind each line: docs/optimizers.md.

==================  ===========================================  ==================================
optimizer           per-parameter state (what is allocated)      implementation modelled
==================  ===========================================  ==================================
adamw               exp_avg, exp_avg_sq: 2·n·b                   torch.optim.AdamW (foreach); the
                                                                 ``step`` counter stays on the host
adamw-fused         2·n·b + a 4-byte fp32 ``step`` on the GPU    torch.optim.AdamW(fused=True)
adamw-8bit          n ≥ 4096: two uint8 states 2·n + two fp32    bitsandbytes AdamW8bit (≥ 0.44:
                    absmax vectors 2·4·⌈n/256⌉; n < 4096 or an   block 256; 2048 before) as HF
                    fp32-override param: two fp32 states 8·n.    Trainer ``optim="adamw_8bit"``
                    Once per model: two 256-entry fp32 maps      runs it (nn.Embedding weights
                                                                 keep 32-bit states)
paged-adamw-8bit    as adamw-8bit; ``state1``/``state2`` of      bitsandbytes PagedAdamW8bit
                    params with n ≥ 100 000 live in CUDA
                    unified memory (``paged_bytes``)
paged-adamw-32bit   two fp32 states 8·n (whatever b is);         bitsandbytes PagedAdamW32bit
                    paged as paged-adamw-8bit                    (HF ``optim="paged_adamw_32bit"``)
adafactor           ≥ 2-D: fp32 row (∏shape[:-1]) + column       transformers.optimization.Adafactor
                    (∏shape[:-2]·shape[-1]) factors; 1-D: a       (HF Trainer ``optim="adafactor"``,
                    full fp32 n·4; plus a fp32 scalar ``RMS``    beta1=None: no first moment)
lion                one fp32 momentum: 4·n (whatever b is)       bitsandbytes Lion (32-bit), HF
                                                                 Trainer ``optim="lion_32bit"``
muon                2-D hidden matrices: momentum_buffer n·b;    torch.optim.Muon (torch >= 2.9) on
                    embeddings, the output head and 1-D          the 2-D hidden weights, AdamW
                    parameters: AdamW's 2·n·b                    (foreach) on the rest, as torch's
                                                                 docs and Moonlight run it
sgd                 nothing                                      torch.optim.SGD, momentum 0
sgd-momentum        momentum_buffer: n·b                         torch.optim.SGD(momentum=0.9)
none                nothing
==================  ===========================================  ==================================
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from memfit.errors import SpecError

#: Elements per quantization block of bitsandbytes' block-wise 8-bit optimizers since 0.44.0
#: (PR bitsandbytes-foundation/bitsandbytes#1365 changed it from 2048, the paper's value).
BNB_BLOCK_SIZE = 256
#: bitsandbytes ``min_8bit_size`` default: smaller parameters keep 32-bit states.
BNB_MIN_8BIT_SIZE = 4096
#: bitsandbytes ``get_state_buffer`` pages a state only for parameters with at least this many
#: elements (``p.numel() < 1e5`` takes an ordinary device buffer).
BNB_PAGED_MIN_NUMEL = 100_000
#: Entries of a bitsandbytes quantization map (``create_dynamic_map``: 256 fp32 code values).
BNB_QMAP_ENTRIES = 256
#: The CUDA caching allocator hands out multiples of 512 bytes (``kMinBlockSize``).
CUDA_MIN_BLOCK_BYTES = 512

FP32_BYTES = 4
UINT8_BYTES = 1

#: What every name in ``memfit.spec.OPTIMIZERS`` means here (keys of :func:`state_tensors`).
OPTIMIZER_NAMES = (
    "adamw",
    "adamw-fused",
    "adamw-8bit",
    "paged-adamw-8bit",
    "paged-adamw-32bit",
    "adafactor",
    "lion",
    "muon",
    "sgd",
    "sgd-momentum",
    "none",
)
#: bitsandbytes ``PagedAdamW32bit`` (``bnb.optim.AdamW(optim_bits=32, is_paged=True)``): two fp32
#: states per parameter from ``get_state_buffer``, paged as the 8-bit ones are
PAGED_ADAMW_32BIT = "paged-adamw-32bit"
#: Optimizers whose 32-bit fallback applies (bitsandbytes 8-bit optimizers).
BNB_8BIT = ("adamw-8bit", "paged-adamw-8bit")

#: Parameter dtypes accepted, by name, with their element size in bytes.
PARAM_DTYPE_BYTES = {
    "float32": 4,
    "fp32": 4,
    "float16": 2,
    "fp16": 2,
    "bfloat16": 2,
    "bf16": 2,
}


@dataclass(frozen=True)
class StateTensor:
    """One tensor an optimizer keeps for a parameter: its element count and element size."""

    name: str
    numel: int
    itemsize: int
    paged: bool = False

    def n_bytes(self, round_to: int = CUDA_MIN_BLOCK_BYTES) -> int:
        raw = self.numel * self.itemsize
        return -(-raw // round_to) * round_to if round_to > 1 else raw


@dataclass(frozen=True)
class OptimizerStateBytes:
    """Optimizer-state bytes of a whole model.

    ``total_bytes`` counts every state on the device, the paged ones and the ``shared_bytes``
    included; ``paged_bytes`` is the part in CUDA unified memory (paged optimizers only);
    ``shared_bytes`` the tables allocated once for all parameters (bitsandbytes' quantization
    maps).
    """

    total_bytes: int
    paged_bytes: int
    shared_bytes: int


def state_tensors(
    optimizer: str,
    shape: Sequence[int],
    param_dtype: str = "bfloat16",
    *,
    fp32_states: bool = False,
    block_size: int = BNB_BLOCK_SIZE,
) -> list[StateTensor]:
    """The state tensors ``optimizer`` allocates for one parameter of ``shape`` and ``param_dtype``.

    ``fp32_states``: a bitsandbytes per-parameter override to 32-bit states (HF Trainer sets it
    for every ``nn.Embedding`` weight; ``bnb.nn.StableEmbedding`` sets it for itself); for
    ``muon``, a parameter of its AdamW group (the embeddings and the output head). The
    bitsandbytes quantization maps shared by all parameters are not included
    (:func:`shared_state_tensors`).
    """
    _check_optimizer(optimizer)
    n = _numel(shape)
    b = _itemsize(param_dtype)
    if optimizer in ("adamw", "adamw-fused"):
        states = [StateTensor("exp_avg", n, b), StateTensor("exp_avg_sq", n, b)]
        if optimizer == "adamw-fused":
            states.append(StateTensor("step", 1, FP32_BYTES))
        return states
    if optimizer in BNB_8BIT:
        paged = optimizer.startswith("paged") and n >= BNB_PAGED_MIN_NUMEL
        if fp32_states or n < BNB_MIN_8BIT_SIZE:
            return [StateTensor(f"state{i}", n, FP32_BYTES, paged) for i in (1, 2)]
        if not isinstance(block_size, int) or block_size < 1:
            raise SpecError(f"block_size ({block_size!r}) must be a positive integer")
        blocks = -(-n // block_size)
        return [
            StateTensor("state1", n, UINT8_BYTES, paged),
            StateTensor("state2", n, UINT8_BYTES, paged),
            StateTensor("absmax1", blocks, FP32_BYTES),
            StateTensor("absmax2", blocks, FP32_BYTES),
        ]
    if optimizer == PAGED_ADAMW_32BIT:  # Optimizer2State, optim_bits=32: fp32 state buffers
        paged = n >= BNB_PAGED_MIN_NUMEL
        return [StateTensor(f"state{i}", n, FP32_BYTES, paged) for i in (1, 2)]
    if optimizer == "adafactor":
        return _adafactor_states(shape, n)
    if optimizer == "lion":
        return [StateTensor("state1", n, FP32_BYTES)]
    if optimizer == "muon":  # fp32_states: a parameter of Muon's AdamW group (embeddings, head)
        if fp32_states or len(tuple(shape)) != 2:
            return [StateTensor("exp_avg", n, b), StateTensor("exp_avg_sq", n, b)]
        return [StateTensor("momentum_buffer", n, b)]
    if optimizer == "sgd-momentum":
        return [StateTensor("momentum_buffer", n, b)]
    return []  # sgd (momentum 0), none


def _adafactor_states(shape: Sequence[int], n: int) -> list[StateTensor]:
    """transformers' Adafactor: fp32 factors (the gradient is upcast first) and an fp32 ``RMS``."""
    rms = StateTensor("RMS", 1, FP32_BYTES)
    if len(shape) >= 2:
        rows = math.prod(shape[:-1])
        cols = math.prod(shape[:-2]) * shape[-1]
        return [
            StateTensor("exp_avg_sq_row", rows, FP32_BYTES),
            StateTensor("exp_avg_sq_col", cols, FP32_BYTES),
            rms,
        ]
    return [StateTensor("exp_avg_sq", n, FP32_BYTES), rms]


def shared_state_tensors(optimizer: str) -> list[StateTensor]:
    """Tensors allocated once per optimizer, whatever the number of parameters: bitsandbytes'
    signed and unsigned dynamic quantization maps (present once any parameter is 8-bit)."""
    _check_optimizer(optimizer)
    if optimizer in BNB_8BIT:
        return [
            StateTensor("qmap1", BNB_QMAP_ENTRIES, FP32_BYTES),
            StateTensor("qmap2", BNB_QMAP_ENTRIES, FP32_BYTES),
        ]
    return []


def optimizer_state_bytes(
    optimizer: str,
    shape: Sequence[int],
    param_dtype: str = "bfloat16",
    *,
    fp32_states: bool = False,
    round_to: int = CUDA_MIN_BLOCK_BYTES,
    block_size: int = BNB_BLOCK_SIZE,
) -> int:
    """Device bytes of the states ``optimizer`` keeps for one parameter (shared maps excluded).

    >>> optimizer_state_bytes("adamw-8bit", (4096, 4096), round_to=1)  # 2·n + 2·4·n/256
    34078720
    """
    tensors = state_tensors(
        optimizer, shape, param_dtype, fp32_states=fp32_states, block_size=block_size
    )
    return sum(t.n_bytes(round_to) for t in tensors)


def model_optimizer_state_bytes(
    optimizer: str,
    shapes: Iterable[Sequence[int]],
    param_dtype: str = "bfloat16",
    *,
    fp32_state_shapes: Iterable[Sequence[int]] = (),
    round_to: int = CUDA_MIN_BLOCK_BYTES,
    block_size: int = BNB_BLOCK_SIZE,
) -> OptimizerStateBytes:
    """Optimizer-state bytes of a model whose trainable parameters have ``shapes``.

    ``fp32_state_shapes`` are further trainable parameters that a bitsandbytes 8-bit optimizer
    keeps at 32 bits by override (HF Trainer: every ``nn.Embedding`` weight, once even if tied),
    or that Muon leaves to its AdamW group (embeddings, the output head); for the other
    optimizers they are ordinary parameters.
    """
    total = paged = 0
    any_8bit = False
    groups = ((shapes, False), (fp32_state_shapes, True))
    for group, fp32 in groups:
        for shape in group:
            for t in state_tensors(
                optimizer, shape, param_dtype, fp32_states=fp32, block_size=block_size
            ):
                n_bytes = t.n_bytes(round_to)
                total += n_bytes
                paged += n_bytes if t.paged else 0
                any_8bit = any_8bit or t.itemsize == UINT8_BYTES
    shared = sum(t.n_bytes(round_to) for t in shared_state_tensors(optimizer)) if any_8bit else 0
    return OptimizerStateBytes(total_bytes=total + shared, paged_bytes=paged, shared_bytes=shared)


def _check_optimizer(optimizer: str) -> None:
    if optimizer not in OPTIMIZER_NAMES:
        raise SpecError(f"optimizer ({optimizer!r}) must be one of {', '.join(OPTIMIZER_NAMES)}")


def _numel(shape: Sequence[int]) -> int:
    dims = tuple(shape)
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims):
        raise SpecError(
            f"parameter shape ({shape!r}) must be a sequence of non-negative integers, "
            "e.g. (4096, 4096)"
        )
    return math.prod(dims)


def _itemsize(param_dtype: str) -> int:
    size = PARAM_DTYPE_BYTES.get(param_dtype)
    if size is None:
        raise SpecError(
            f"param_dtype ({param_dtype!r}) must be one of {', '.join(PARAM_DTYPE_BYTES)}"
        )
    return size
