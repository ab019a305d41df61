"""What SGLang's "Load weight end. ... mem usage=X GB" counts beyond the weights (torch-free).

SGLang's ``ModelRunner.load_model`` (``python/sglang/srt/model_executor/model_runner.py``, read in
the 0.4.1, 0.4.3, 0.4.4, 0.4.9 and 0.5.3 wheels) logs ``before_avail_memory -
after_avail_memory``, both from ``get_available_gpu_memory`` (``sglang/srt/utils.py``), which calls
``torch.cuda.empty_cache()`` and then ``torch.cuda.mem_get_info``: device free memory. So "mem
usage" is the weights plus what the caching allocator keeps reserved around them (a segment that
holds any live tensor is not released) plus what loading added outside torch. Two parts of it are
modelled here, from the source:

- The rotary ``cos_sin_cache`` stays fp32 on CUDA: ``RotaryEmbedding.__init__`` casts it to the
  model dtype only ``if not _is_cuda_available`` ("cache needs to be in FP32 for numerical
  stability", ``sglang/srt/layers/rotary_embedding.py`` of every release read). Its temporaries
  (``freqs``, ``cos``, ``sin``, each max_position x rotary_dim / 2 fp32) are freed at once.
- The caching allocator's segments: the model is built under ``torch.device("cuda")``
  (``model_loader/loader.py``), so each parameter is one request in construction order; a
  request above 10 MiB gets its own segment rounded up to 2 MiB, one of 1-10 MiB a share of a
  20 MiB segment, one of at most 1 MiB a share of a 2 MiB one (PyTorch
  ``c10/cuda/CUDACachingAllocator.cpp``: ``kMinLargeAlloc``, ``kRoundLarge``, ``kLargeBuffer``,
  ``kSmallBuffer``; best fit, remainders above 1 MiB split off). The tails no later request fills
  stay reserved after ``empty_cache``. The replay here follows those rules for one rank's
  parameters (memfit.estimate.allocator.caching is the full replay; serving may not import it).

- The process's first CUDA kernels (:data:`FIRST_KERNELS_BYTES`, at TP 1, releases before
  0.5.8). At TP > 1 the TP group's ``PyNcclCommunicator`` runs a warm-up all-reduce on a CUDA
  tensor before "Load weight begin" (``distributed/parallel_state.py``: ``if use_pynccl and
  self.world_size > 1``; ``device_communicators/pynccl.py``: "A small all_reduce for warmup",
  ``torch.zeros(1, device=device)``; both in the 0.4.6.post2 and 0.4.10 wheels). At TP 1 nothing
  launches a kernel before ``load_model`` ("Init torch distributed ends. mem usage=0.00 GB" in
  the TP-1 logs of 0.4.6.post2 and 0.5.6.post2), so the first ones (``RMSNorm``'s
  ``torch.ones``, ``layers/layernorm.py``; the rotary cache's ``arange`` / ``cos`` / ``sin`` /
  ``cat``) run between the two samples, and the device memory the driver commits for them
  (lazily loaded kernel modules: CUDA's "Lazy Loading", the default on Linux since CUDA 12.2) is
  in "mem usage". ``init_cublas`` runs after the KV pool, so no cuBLAS handle or workspace is in
  it (the rotary ``einsum("i,j -> ij")`` is an outer product that torch lowers to ``mul``, no
  matmul: checked with torch 2.13's profiler). The amount is not derived: it is fitted (see the
  constant) on the three native-Linux TP-1 logs of 0.4.1, 0.4.4 and 0.4.10, the same logs it is
  judged on.

  From 0.5.8 ``GroupCoordinator.__init__`` builds ``active_ranks = torch.ones(len(ranks), ...,
  device=self.device)`` for every group, world size 1 included (``distributed/parallel_state.py``
  of the 0.5.8 and 0.5.9 wheels; absent from 0.5.6's and 0.5.7's): the first kernel now runs in
  ``init_torch_distributed``, before "Load weight begin". The two TP-1 logs of SGLang's docs CI
  (February 2026, a 0.5.9-era main with 0.5.9's "Init torch distributed ends. elapsed=" line)
  show it: "Init torch distributed ends. ... mem usage=0.09 GB", and load "mem usage" equal to
  the replay (Llama-3.1-8B 15.02 GB, Qwen2.5-0.5B 0.98 GB). The series name "0.5" (the newest)
  counts as 0.5.8+.

Windows hosts (WSL2, Docker Desktop; ``windows_host``): the three Windows-desktop TP-1 logs keep
0.00-0.04 GiB beyond the replay, not 0.06-0.09, so the first-kernels term is left out for them.
Why is not established (the Windows driver's memory accounting, WDDM; or the GPUs: those three
are Ampere / Ada, the Linux ones Hopper / Blackwell): a Linux host on an Ampere or Ada GPU gets
the term, the side that over-predicts if the GPU is the cause.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from memfit.hardware.cuda_allocator import (
    MIN_BLOCK_BYTES,
    SMALL_SIZE_BYTES,
    round_size,
    segment_size,
)
from memfit.models import ModelSpec
from memfit.serving.layout import ROPE_FP32

__all__ = [
    "FIRST_KERNELS_BYTES",
    "FIRST_KERNELS_IN_INIT_FROM",
    "LoadReplay",
    "first_kernels_bytes",
    "first_kernels_in_load",
    "load_overhead_bytes",
    "load_tensor_sizes",
    "replay_load",
]

#: Bytes of the fp32 rotary cache SGLang keeps on CUDA.
ROPE_BYTES = 4
#: Marker in a request list: free the rotary cache's three temporaries (freqs, cos, sin).
FREE_TEMPORARIES = -1
#: SGLang's VocabParallelEmbedding pads the vocabulary to a multiple of 64 (x TP).
VOCAB_PAD = 64
#: The first kernels' device memory at TP 1 (module docstring), fitted: "mem usage" at load end
#: minus the replay's reserved bytes on the native-Linux TP-1 logs of benchmarks/data/
#: sglang_logs.jsonl is 0.068 GiB (Llama-3.1-8B, H100, 0.4.1), 0.089 GiB (Llama-3.1-8B, H100,
#: 0.4.4) and 0.064 GiB (Qwen3-0.6B, RTX 5080, 0.4.10), each +-0.005 GiB of log rounding; the TP-4
#: logs (QwQ-32B on L4, Qwen3-14B on RTX 4090) keep -0.002 and +0.004 GiB, i.e. none. 64 MiB, at
#: the smallest of the three, leaves the H100 logs 0.005 and 0.027 GiB under.
FIRST_KERNELS_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class LoadReplay:
    """One rank's load as the caching allocator holds it."""

    allocated_bytes: int  # the tensors (weights, rotary cache)
    reserved_bytes: int  # the segments that hold them after empty_cache
    rope_bytes: int  # the fp32 rotary cache among the tensors


def _up(x: int, a: int) -> int:
    return -(-x // a) * a


def load_tensor_sizes(spec: ModelSpec, *, tp: int, dtype_bytes: int) -> list[int] | None:
    """One rank's requests in SGLang's construction order, for a dense or MoE decoder in the
    model dtype: a positive entry allocates that many bytes, ``FREE_TEMPORARIES`` frees the
    rotary cache's temporaries; None for layouts not drawn here (MLA, quantized checkpoints)."""
    t = spec.text or spec
    h, v, n, i = t.hidden_size, t.vocab_size, t.n_layers, t.intermediate_size
    heads = t.n_heads
    if not (h and v and n and i and heads) or t.get("kv_lora_rank") or spec.quantization:
        return None
    kv = t.n_kv_heads or heads
    hd = t.head_dim or h // heads
    b = dtype_bytes
    q, k = max(heads // tp, 1) * hd, max(kv // tp, 1) * hd
    vp = _up(v, VOCAB_PAD * tp) // tp
    qkv_bias = bool(t.get("attention_bias")) or t.model_type in ("qwen2", "qwen2_moe")
    qk_norm = t.model_type in ("qwen3", "qwen3_moe")
    experts = t.n_experts or 0
    ei = t.expert_intermediate_size or i
    sizes = [vp * h * b]
    rot, rows = t.rotary_dim, t.max_positions
    for layer in range(n):
        sizes.append((q + 2 * k) * h * b)
        if qkv_bias:
            sizes.append((q + 2 * k) * b)
        sizes.append(h * q * b)
        if qk_norm:
            sizes += [hd * b, hd * b]
        if layer == 0 and rot and rows:  # get_rope's one cache, built in the first layer
            half = rows * rot // 2 * ROPE_BYTES
            sizes += [half, half, half, rows * rot * ROPE_BYTES, FREE_TEMPORARIES]
        if experts:
            sizes += [experts * h * b, experts * 2 * _up(ei, tp) // tp * h * b]
            sizes.append(experts * h * _up(ei, tp) // tp * b)
        else:
            sizes += [2 * (i // tp) * h * b, h * (i // tp) * b]
        sizes += [h * b, h * b]
    sizes.append(h * b)
    if not t.tie_word_embeddings:
        sizes.append(vp * h * b)
    return sizes


class _Segments:
    """The large and small pools of the caching allocator, for allocations and whole frees
    of blocks (merging with free neighbours in their segment, as ``free_block`` does)."""

    def __init__(self) -> None:
        self.segments: list[list[list[int]]] = []  # [size, live] blocks, address order
        self.small: list[bool] = []

    def malloc(self, n_bytes: int) -> tuple[int, int]:
        size = round_size(n_bytes)
        is_small = size <= SMALL_SIZE_BYTES
        best: tuple[int, int, int] | None = None  # (block size, segment, index)
        for s, seg in enumerate(self.segments):
            if self.small[s] != is_small:
                continue
            for j, (bsize, live) in enumerate(seg):
                if not live and bsize >= size and (best is None or bsize < best[0]):
                    best = (bsize, s, j)
        if best is None:
            seg_size = segment_size(size)
            self.segments.append([[seg_size, 0]])
            self.small.append(is_small)
            best = (seg_size, len(self.segments) - 1, 0)
        bsize, s, j = best
        rest = bsize - size
        if rest >= MIN_BLOCK_BYTES if is_small else rest > SMALL_SIZE_BYTES:
            self.segments[s][j] = [size, 1]
            self.segments[s].insert(j + 1, [rest, 0])
        else:
            self.segments[s][j][1] = 1
        return s, id(self.segments[s][j])

    def free(self, where: tuple[int, int]) -> None:
        s, key = where
        seg = self.segments[s]
        j = next(k for k, blk in enumerate(seg) if id(blk) == key)
        seg[j][1] = 0
        if j + 1 < len(seg) and not seg[j + 1][1]:
            seg[j][0] += seg.pop(j + 1)[0]
        if j > 0 and not seg[j - 1][1]:
            seg[j - 1][0] += seg.pop(j)[0]

    def reserved_after_empty_cache(self) -> int:
        return sum(sum(b[0] for b in seg) for seg in self.segments if any(b[1] for b in seg))


def replay_load(spec: ModelSpec, *, tp: int, dtype_bytes: int) -> LoadReplay | None:
    """Replay one rank's load through the caching allocator's rules (None: layout not drawn)."""
    sizes = load_tensor_sizes(spec, tp=tp, dtype_bytes=dtype_bytes)
    if sizes is None:
        return None
    pools = _Segments()
    live: list[tuple[tuple[int, int], int]] = []
    allocated = rope = 0
    for n in sizes:
        if n == FREE_TEMPORARIES:  # freqs, cos, sin: the three requests before the cache
            for where, size in live[-4:-1]:
                pools.free(where)
                allocated -= size
            rope = live[-1][1]
            del live[-4:-1]
            continue
        live.append((pools.malloc(n), n))
        allocated += n
    return LoadReplay(
        allocated_bytes=allocated,
        reserved_bytes=pools.reserved_after_empty_cache(),
        rope_bytes=rope,
    )


#: The first release whose ``init_torch_distributed`` launches a kernel at TP 1 (module
#: docstring: ``GroupCoordinator``'s ``active_ranks``), as (minor, patch) of 0.x.y
FIRST_KERNELS_IN_INIT_FROM = (5, 8)
_RELEASE = re.compile(r"^0\.(\d+)(?:\.(\d+))?")


def first_kernels_in_load(sglang_version: str) -> bool:
    """Whether SGLang ``sglang_version`` (a release, "0.5.6.post2", or a series name: "0.4",
    "0.4.7"; "0.5", the newest, counts as 0.5.8+) runs its first CUDA kernels inside
    ``load_model`` at TP 1 (module docstring): every release before 0.5.8."""
    match = _RELEASE.match(sglang_version)
    if match is None:
        return False
    minor, patch = int(match.group(1)), match.group(2)
    if sglang_version == "0.4.7":  # the series name: 0.4.7-0.5.2
        return True
    if patch is None:  # "0.4": 0.4.0-0.4.6; "0.5": the newest
        return minor < FIRST_KERNELS_IN_INIT_FROM[0]
    return (minor, int(patch)) < FIRST_KERNELS_IN_INIT_FROM


def first_kernels_bytes(*, tp: int, sglang_version: str = "0.4", windows_host: bool = False) -> int:
    """The first CUDA kernels' device memory that "mem usage" at load end holds: at TP 1 on a
    Linux host for releases before 0.5.8 (:func:`first_kernels_in_load`, module docstring); 0 at
    TP > 1 (the NCCL warm-up ran before "Load weight begin"), from 0.5.8 (committed in
    ``init_torch_distributed``) and on a Windows host (WSL2, Docker Desktop)."""
    in_load = tp == 1 and first_kernels_in_load(sglang_version)
    return FIRST_KERNELS_BYTES if in_load and not windows_host else 0


def load_overhead_bytes(
    spec: ModelSpec,
    *,
    tp: int,
    dtype_bytes: int,
    sglang_version: str = "0.4",
    windows_host: bool = False,
) -> int | None:
    """ "mem usage" at load end minus the weights memfit counts (:func:`rank_weights
    <memfit.serving.layout.rank_weights>`, whose rotary cache is in the model dtype): the
    allocator's unreleased tails, the fp32 rotary cache's extra bytes and the first kernels'
    memory (:func:`first_kernels_bytes`); None for layouts :func:`load_tensor_sizes` does not
    draw."""
    r = replay_load(spec, tp=tp, dtype_bytes=dtype_bytes)
    if r is None:
        return None
    text = spec.text or spec
    fp32 = text.model_type in ROPE_FP32
    counted = r.rope_bytes if fp32 else r.rope_bytes // ROPE_BYTES * dtype_bytes
    tails = r.reserved_bytes - r.allocated_bytes
    return (
        tails
        + r.rope_bytes
        - counted
        + first_kernels_bytes(tp=tp, sglang_version=sglang_version, windows_host=windows_host)
    )
