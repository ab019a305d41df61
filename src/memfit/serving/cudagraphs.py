"""vLLM's CUDA graphs at start-up: which graphs it captures, and the memory it counts for them.

Which graphs (read in vLLM's source, :mod:`memfit.serving.vllm_matrix`): the default
``cudagraph_mode`` FULL_AND_PIECEWISE captures one PIECEWISE graph per capture size (1, 2, 4,
steps of 8 to 256, of 16 beyond, up to ``min(2 x max_num_seqs, 512, max_num_batched_tokens)``)
and one FULL decode graph per capture size up to ``max_num_seqs``
(``vllm/v1/cudagraph_dispatcher.py``).

How much: from 0.18 ``GPUModelRunner.profile_cudagraph_memory`` (``vllm/v1/worker/
gpu_model_runner.py``) captures the two largest graphs of each mode and reports
``max(first capture of each mode) + sum over modes of (n - 1) x second capture`` ("Estimated CUDA
graph memory: X GiB total"); from 0.20 that estimate leaves the KV cache's budget. memfit
follows the same arithmetic:

- the **first capture** of the largest size holds that batch's activations in the graph pool:
  ``largest x hidden x dtype bytes x FIRST_CAPTURE_HIDDEN_FACTOR`` plus a fixed
  ``FIRST_CAPTURE_BASE_BYTES``;
- **each further graph** costs ``PER_GRAPH_BYTES`` (what the second capture adds: the graph's
  own driver-side memory and its non-shared outputs).

Constants and their sources (no log with all of model, flags and the estimate was found for a
model memfit counts, so they are not a fit with a stated error; see docs/serving.md):

- ``PER_GRAPH_BYTES`` 20 MiB: the published per-graph figures of vLLM 0.18-0.27 logs — "the
  real FULL graphs cost ~24 MiB each" (vllm-project/vllm#50780), 1.62 GiB for PIECEWISE=51 +
  FULL=35 graphs (vllm-project/vllm#39559: 19.5 MiB per extrapolated graph), 0.36 GiB for
  PIECEWISE=16 (gpustack/runner#251, 0.27.1: 23 MiB per graph);
- ``FIRST_CAPTURE_HIDDEN_FACTOR`` 8: the residual, normed and MLP-input buffers of the largest
  batch kept by the piecewise graphs (bf16, a few hidden-size tensors per batched token); with
  the base it is small next to the per-graph sum (Llama-3.1-8B at 512: 32 MiB);
- ``FIRST_CAPTURE_BASE_BYTES`` 64 MiB: cuBLAS / attention workspaces the first capture allocates.

Before 0.18 vLLM reports only the capture it ran after the KV cache ("Graph capturing finished
in N secs, took X GiB"); the llm-d H100 logs show -0.45 to 1.03 GiB there (a free-memory
difference, so negative when the profile's cached segments are reused), and memfit keeps its
0.5 GiB allowance for those versions, used only to warn.
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.serving.vllm_matrix import cudagraph_capture_sizes
from memfit.units import MiB

__all__ = ["CudaGraphPlan", "plan_cudagraphs"]

PER_GRAPH_BYTES = 20 * MiB
FIRST_CAPTURE_HIDDEN_FACTOR = 8
FIRST_CAPTURE_BASE_BYTES = 64 * MiB
#: Versions before the estimate (0.8-0.17) and V0: the allowance for the capture after the KV
#: cache (llm-d H100 logs: -0.45 to 1.03 GiB).
LEGACY_ALLOWANCE_BYTES = 512 * MiB


@dataclass(frozen=True, kw_only=True)
class CudaGraphPlan:
    """The graphs vLLM captures for one configuration and the bytes memfit counts for them."""

    n_piecewise: int
    n_full: int
    largest: int
    graph_bytes: int
    #: True: vLLM's own estimate arithmetic (0.18+); False: the flat pre-0.18 allowance
    estimated: bool

    @property
    def n_graphs(self) -> int:
        return self.n_piecewise + self.n_full


def plan_cudagraphs(
    *,
    minor: int,
    engine: str,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    hidden_size: int,
    act_bytes: int,
    enforce_eager: bool,
    sm100: bool = False,
) -> CudaGraphPlan:
    """What vLLM 0.``minor`` captures and what memfit counts for it (module docstring)."""
    if enforce_eager:
        return CudaGraphPlan(n_piecewise=0, n_full=0, largest=0, graph_bytes=0, estimated=False)
    ceiling = 1024 if sm100 and minor >= 28 else 512
    sizes = cudagraph_capture_sizes(
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, ceiling=ceiling
    )
    full = [s for s in sizes if s <= max_num_seqs]
    largest = sizes[-1] if sizes else 0
    if engine != "v1" or minor < 18:
        return CudaGraphPlan(
            n_piecewise=len(sizes),
            n_full=len(full),
            largest=largest,
            graph_bytes=LEGACY_ALLOWANCE_BYTES,
            estimated=False,
        )
    first = FIRST_CAPTURE_BASE_BYTES + largest * hidden_size * act_bytes * (
        FIRST_CAPTURE_HIDDEN_FACTOR
    )
    further = max(len(sizes) - 1, 0) + max(len(full) - 1, 0)
    return CudaGraphPlan(
        n_piecewise=len(sizes),
        n_full=len(full),
        largest=largest,
        graph_bytes=first + further * PER_GRAPH_BYTES,
        estimated=True,
    )
