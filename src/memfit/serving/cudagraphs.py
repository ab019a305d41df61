"""vLLM's CUDA graphs at start-up: which graphs it captures, and the memory it counts for them.

Which graphs (read in vLLM's source, :mod:`memfit.serving.vllm_matrix`): the default
``cudagraph_mode`` FULL_AND_PIECEWISE captures one PIECEWISE graph per capture size (1, 2, 4,
steps of 8 to 256, of 16 beyond, up to ``min(2 x max_num_seqs, 512, max_num_batched_tokens)``)
and one FULL decode graph per capture size up to ``max_num_seqs``
(``vllm/v1/cudagraph_dispatcher.py``).

How much: vLLM's estimate (0.18+, ``GPUModelRunner.profile_cudagraph_memory`` in
``vllm/v1/worker/gpu_model_runner.py``) captures the two largest graphs of each mode and reports
``max(first capture of each mode) + sum over modes of (n - 1) x second capture`` ("Estimated CUDA
graph memory: X GiB total"); from 0.20 it leaves the KV cache's budget. The capture itself runs
after the KV cache is allocated ("Graph capturing finished in N secs, took X GiB"). Both grow with
the number of graphs and, per graph, with the layers on the rank (a piecewise graph is one CUDA
graph per layer's piece; a FULL graph replays every layer), so memfit models each as

    bytes = n_graphs x (PER_GRAPH_BASE + PER_GRAPH_PER_LAYER x layers on the rank)

with the constants least-squares fitted to the 34 vLLM 0.19.0 H100 runs of the llm-d-planner
accuracy data (github.com/jgchn/llm-d-planner, accuracy/results/v0.19.0/results_raw.csv at commit
30ec05f7: ``cuda_graph_estimated_gib`` and ``cuda_graph_actual_gib``, 8-80 layers, TP 1-4, PP
1-4, 102 graphs each): leave-one-out error of the capture: median 4.4 %, 28 of 34 within 20 %;
of vLLM's own estimate: median 11 %, 22 of 34 within 20 % (its two-sample extrapolation is
noisy: 1.69 GiB for Llama-3.1-8B at TP 2, 0.57 at TP 4). Outside 20 %: DeepSeek-V2-Lite's MoE
capture (**-50 %**, under), Gemma 3 (+21 to +39 %), 7-8B models at TP 4 (+31 to +35 %).
benchmarks/vllm_startup.py reproduces the fit and the leave-one-out errors. Every run has 102
graphs, so the scaling with ``max_num_seqs`` (the graph count) is vLLM's per-graph arithmetic,
not a fitted figure.

V0 and V1 before the FULL_AND_PIECEWISE default (0.8-0.10) keep a flat 0.5 GiB allowance, used
only to warn (the llm-d logs show -0.45 to 1.03 GiB for 0.1x captures: a free-memory difference,
negative when the profile's cached segments are reused).
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.serving.vllm_matrix import cudagraph_capture_sizes
from memfit.units import GiB, MiB

__all__ = ["CudaGraphPlan", "plan_cudagraphs"]

#: (base, per layer) bytes per captured graph, fitted as the module docstring says.
CAPTURE_PER_GRAPH = (int(0.39132 * GiB / 102), int(0.015806 * GiB / 102))
ESTIMATE_PER_GRAPH = (int(0.29888 * GiB / 102), int(0.017158 * GiB / 102))
#: V0 and 0.8-0.10: the allowance for the capture after the KV cache (llm-d H100 logs).
LEGACY_ALLOWANCE_BYTES = 512 * MiB
#: First release with FULL_AND_PIECEWISE by default (``vllm/config/__init__.py``, 0.11.0)
FIRST_MODELLED_MINOR = 11
#: First release whose profile computes the estimate (``profile_cudagraph_memory``, 0.18.0)
FIRST_ESTIMATE_MINOR = 18


@dataclass(frozen=True, kw_only=True)
class CudaGraphPlan:
    """The graphs vLLM captures for one configuration and the bytes memfit counts for them."""

    n_piecewise: int
    n_full: int
    largest: int
    #: what the capture takes after the KV cache ("Graph capturing finished … took X GiB")
    capture_bytes: int
    #: vLLM's own estimate while profiling (0.18+; 0 before): "Estimated CUDA graph memory"
    estimate_bytes: int

    @property
    def n_graphs(self) -> int:
        return self.n_piecewise + self.n_full

    @property
    def estimated(self) -> bool:
        return self.estimate_bytes > 0


def plan_cudagraphs(
    *,
    minor: int,
    engine: str,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    n_layers: int,
    enforce_eager: bool,
    sm100: bool = False,
) -> CudaGraphPlan:
    """What vLLM 0.``minor`` captures for a rank holding ``n_layers`` layers, and the bytes
    memfit counts for it (module docstring)."""
    if enforce_eager:
        return CudaGraphPlan(n_piecewise=0, n_full=0, largest=0, capture_bytes=0, estimate_bytes=0)
    ceiling = 1024 if sm100 and minor >= 28 else 512
    sizes = cudagraph_capture_sizes(
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, ceiling=ceiling
    )
    full = [s for s in sizes if s <= max_num_seqs]
    n = len(sizes) + len(full)
    largest = sizes[-1] if sizes else 0
    if engine != "v1" or minor < FIRST_MODELLED_MINOR:
        capture = LEGACY_ALLOWANCE_BYTES
    else:
        capture = n * (CAPTURE_PER_GRAPH[0] + CAPTURE_PER_GRAPH[1] * n_layers)
    estimate = 0
    if engine == "v1" and minor >= FIRST_ESTIMATE_MINOR:
        estimate = n * (ESTIMATE_PER_GRAPH[0] + ESTIMATE_PER_GRAPH[1] * n_layers)
    return CudaGraphPlan(
        n_piecewise=len(sizes),
        n_full=len(full),
        largest=largest,
        capture_bytes=capture,
        estimate_bytes=estimate,
    )
