"""An allowance for cuDNN convolution workspaces, which a tensor trace does not see.

What PyTorch's source says (``aten/src/ATen/native/cudnn/Conv_v8.cpp``, the cuDNN v8 frontend
path PyTorch 2.x takes; read at a 2.x revision — the installed CPU wheel carries no cuDNN code):

* the workspace of the plan that runs is allocated through the caching allocator
  (``c10::cuda::CUDACachingAllocator::get()->allocate(workspace_size)`` in ``run_conv_plan``),
  so it counts in ``max_memory_allocated`` and ``max_memory_reserved``, and is freed after the
  convolution;
* with ``torch.backends.cudnn.benchmark`` off (the default), ``run_single_conv`` takes the engine
  configs of cuDNN's heuristics in order and runs the first whose workspace can be allocated
  (``try_configs`` catches ``c10::OutOfMemoryError`` and moves on; the caching allocator has
  already released its cached blocks and retried before raising), then cuDNN's fallback list; the
  plan that ran is cached per shape (``benchmark_cache``);
* with benchmark on, ``generate_and_filter_plans`` keeps the plans whose workspace is at most the
  largest cached block (``CUDACachingAllocator::cacheInfo``), allocates the largest of them,
  halving on OOM, times them, and empties the cache afterwards.

So the workspace is the size cuDNN's (closed) heuristics ask for on the card, up to what is free:
not computable from PyTorch's source, and a tensor peak that fits does not become an OOM through
it while a smaller plan fits. memfit therefore does not add it to the expected peak; it reports an
*allowance*: the largest explicit-GEMM workspace of the component's convolutions — one image's
unfolded input, ``C_in / groups · kh · kw · H_out · W_out`` elements (cuDNN's
``CUDNN_CONVOLUTION_FWD_ALGO_GEMM`` "expresses the convolution as an explicit matrix product" and
stores that matrix) — for 2-D and 3-D convolutions with a kernel larger than 1. This is a stated
rule, not a proven bound on every engine cuDNN may pick (FFT engines can ask for more); the
``--gpu`` verdict reports it beside the tensors' figure, which decides (docs/diffusion.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class ConvWorkspaceProbe:
    """Filled while a forward runs: the largest allowance over its convolutions, in bytes."""

    bytes: int = 0


@contextmanager
def conv_workspace_probe(model: torch.nn.Module) -> Iterator[ConvWorkspaceProbe]:
    """Forward hooks on every Conv2d / Conv3d of ``model`` recording the allowance above."""
    probe = ConvWorkspaceProbe()

    def hook(module: Any, args: tuple[Any, ...], output: Any) -> None:
        kernel = math.prod(module.kernel_size)
        if kernel <= 1 or not isinstance(output, torch.Tensor) or not args:
            return
        x = args[0]
        per_image = (x.shape[1] // module.groups) * kernel * math.prod(output.shape[2:])
        probe.bytes = max(probe.bytes, int(per_image) * x.element_size())

    handles = [
        m.register_forward_hook(hook)
        for m in model.modules()
        if isinstance(m, (torch.nn.Conv2d, torch.nn.Conv3d))
    ]
    try:
        yield probe
    finally:
        for h in handles:
            h.remove()
