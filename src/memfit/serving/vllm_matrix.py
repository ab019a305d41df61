"""vLLM's memory-relevant defaults, release by release, as read in its source at each tag.

Each row was read in the release's source distribution on PyPI (``vllm-X.Y.0.tar.gz``, its
sha256 in :data:`SDIST_SHA256`, so the exact files can be fetched again), in these files:

- ``vllm/config/cache.py``: ``CacheConfig.gpu_memory_utilization`` (0.9; ``Field(default=0.92)``
  from 0.20.0) and the block size (``vllm/platforms/cuda.py`` sets 16 up to 0.17;
  ``CacheConfig.DEFAULT_BLOCK_SIZE = 16`` from 0.18, **64 in 0.34.0**);
- ``vllm/engine/arg_utils.py`` ``EngineArgs.get_batch_defaults``: 8192 batched tokens / 1024
  sequences for ``vllm serve`` on GPUs of 70 GiB or more (A100s excluded), else 2048 / 256 — the
  same in every release read;
- ``vllm/config/vllm.py`` ``VllmConfig._set_cudagraph_sizes`` (``vllm/config/__init__.py`` in
  0.11): ``max_cudagraph_capture_size = min(max_num_seqs x 2, 512, max_num_batched_tokens)``,
  the capture sizes ``[1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16)`` up to it; from
  0.28.0 the 512 ceiling is 1024 on data-centre Blackwell (SM100);
- the default ``cudagraph_mode``: FULL_AND_PIECEWISE (``vllm/config/__init__.py`` 0.11, then the
  ``-O2`` optimization level's table in ``vllm/config/vllm.py`` / ``compilation.py``): PIECEWISE
  graphs for every capture size, and FULL decode graphs for the sizes up to ``max_num_seqs``
  (``vllm/v1/cudagraph_dispatcher.py`` ``initialize_cudagraph_keys``);
- ``vllm/envs.py`` ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` and ``vllm/v1/worker/gpu_worker.py``
  ``determine_available_memory``: from 0.18.0 ``GPUModelRunner.profile_cudagraph_memory`` captures
  the two largest graphs of each mode while profiling and estimates ``first capture + (n - 1) x
  second capture`` per mode (the largest first capture of the modes, plus each mode's per-graph
  sum); the estimate is subtracted from the KV cache's budget only when the variable is on — off
  by default in 0.18 / 0.19, **on by default from 0.20.0** (its log line says "default since
  v0.21.0", but the 0.20.0 sdist already reads ``os.getenv(..., "1")``). Before 0.18 graphs are
  captured after the KV cache is allocated, outside the budget.
- 0.34.0 makes the "extensible KV cache" (sized from measured memory, ``gpu_memory_utilization``
  resolved to 1.0) the default on CUDA (``CacheConfig.resolved_gpu_memory_utilization``,
  ``VllmConfig._resolve_extensible_kv_cache``); with it ``profile_cudagraph_memory`` returns 0
  (vllm/v1/worker/gpu/model_runner.py) and the cache is sized after warmup and capture
  (modelled in :mod:`memfit.serving.extensible`).

- ``vllm/v1/core/kv_cache_utils.py`` ``_get_kv_cache_groups_uniform_page_size``: hybrid models'
  KV group size is the smallest layer kind's count, or the largest when below ``ratio`` times
  it: no such rule in 0.11.0, 1.25 in 0.12-0.17, 1.5 from 0.18 (0.33 and 0.34: the same function
  in ``vllm/v1/core/kv_cache_planning.py``, ``max_num_layers < min_num_layers * 1.5``).

0.15.x has no source distribution on PyPI and was not read; its row repeats 0.14's and 0.16's
(equal in every field below).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "SDIST_SHA256",
    "VLLM_MATRIX",
    "VllmRelease",
    "cudagraph_capture_sizes",
    "release",
]

#: sha256 of ``vllm-X.Y.0.tar.gz`` on PyPI, the source each row was read in.
SDIST_SHA256 = {
    11: "f435a64c24e9c4178d657a76f8edd8548ddc444012f7d06a9f79ac3a6392bfae",
    12: "dc2863be80260f378f1e72f9b82b4009610e434d05fdd7067383b231b89c4f4a",
    13: "4ad43db45fef37114b550d03a4f423fb3fa3a31d8bc09ee810ef8b9cdcd4b5fe",
    14: "ed86c6a9d22fbfd059648794493cad88444c71688f3ff6efcb26c5ca353f0e5d",
    16: "1f684bb31fbef59d862e2fe666e23a41f1d39d93f86215ce1ce1db89a8f5665b",
    17: "b0b62e58ef4eb633ef371f2726976372cf6dfcb7ff2ea9ddf7194c1930d5629a",
    18: "9a1bee091db8dbb4664a2a09cd9c61912e9912a44af1ce12b8593a231d05971c",
    19: "81e59cf87175e7a62eb8d9acf5989484bbd17089d5eface353f89067bda282d9",
    20: "a6d50152936ee292455af3ffbe359f7a284ac43bf3b68caccf29f368e196cc72",
    21: "05ff89c3e926b88b77d7878e317a659ffba678afc21c1d48952037aa5457f058",
    22: "6d41581a9e5288cd69278518a550c6d7ce510ae27a506556a3427d01284be7fe",
    23: "760269db3d9611e12e524681df1bca0977d5d2f5fcb4481cc34d33efc4ae7ff5",
    24: "0862453adc1f3339f1a0c9dca1179c34d6ed6e118f87b6e5bddd120af614ac66",
    25: "7e04e2b37164de8c4012f27f75af6c4768039b32610865e9b6fb8c49c34a84aa",
    26: "23e9fa19d7e20ce7dcc1c074d41503e2116d23f19e688f5d5ea91b741f958502",
    27: "862671641625d6cfb7aaab98a5386126738b59ca50e5d01ca539a4e32f63ffcb",
    28: "ac96dd0ec5be9c13f2aa4bfb50498c4727110406f6e4980b58a4097e4d18634a",
    29: "c03feb07943ecae9e69e7dc424d7c5569ecf8d1292513aef2a4de67af381cd97",
    30: "5f8f4e890c042ffa1c3e103f81c35e2d96f60a0a175ac43a4adbae7006bef62b",
    31: "dde46f1efbe846e5bd0c5c4ec6ec71842c42254c7ff3d9bebb2a57028715d380",
    32: "d2c957d5eee3d0985012151315ddc62cbe0cd368fc96a5fc3510438d9dddf2ad",
    33: "f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112",
    34: "fcad848b246a9d8652b47e6425af92334dc02492f9802720f54e27b823cf0113",
}


@dataclass(frozen=True, kw_only=True)
class VllmRelease:
    """One minor release's memory-relevant defaults (V1 engine, ``vllm serve``, CUDA)."""

    minor: int
    gpu_memory_utilization: float
    block_size: int
    #: (max_num_batched_tokens, max_num_seqs) on GPUs of 70 GiB or more (not A100) / others
    batch_defaults_large: tuple[int, int]
    batch_defaults_small: tuple[int, int]
    #: ``min(max_num_seqs x 2, ceiling)``: 512, and 1024 on SM100 from 0.28
    capture_ceiling: int
    capture_ceiling_sm100: int
    cudagraph_mode: str
    #: ``profile_cudagraph_memory`` exists (the estimate is computed while profiling)
    profiles_cudagraphs: bool
    #: ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` defaults on: the estimate leaves the KV budget
    cudagraph_estimate_in_budget: bool
    #: the extensible KV cache is the default (memfit.serving.extensible)
    extensible_kv_cache: bool = False
    #: hybrid KV groups (``_get_kv_cache_groups_uniform_page_size``, vllm/v1/core/
    #: kv_cache_utils.py): the group size is the largest layer kind's count when it is below this
    #: many times the smallest's, else the smallest (1.0: always the smallest)
    kv_group_ratio: float = 1.5

    @property
    def source(self) -> str:
        return f"vllm-0.{self.minor}.0.tar.gz (PyPI, sha256 {SDIST_SHA256.get(self.minor, 'n/a')})"


_LARGE = (8192, 1024)
_SMALL = (2048, 256)


def _row(minor: int) -> VllmRelease:
    return VllmRelease(
        minor=minor,
        gpu_memory_utilization=0.92 if minor >= 20 else 0.9,
        block_size=64 if minor >= 34 else 16,
        batch_defaults_large=_LARGE,
        batch_defaults_small=_SMALL,
        capture_ceiling=512,
        capture_ceiling_sm100=1024 if minor >= 28 else 512,
        cudagraph_mode="FULL_AND_PIECEWISE",
        profiles_cudagraphs=minor >= 18,
        cudagraph_estimate_in_budget=minor >= 20,
        extensible_kv_cache=minor >= 34,
        kv_group_ratio=1.0 if minor < 12 else 1.25 if minor < 18 else 1.5,
    )


#: Every minor release read (0.11 - 0.34; 0.15 from its neighbours, see the module docstring).
VLLM_MATRIX: dict[int, VllmRelease] = {m: _row(m) for m in range(11, 35)}


def release(minor: int) -> VllmRelease | None:
    """The row of vLLM 0.``minor``, or None before 0.11 (the V0 / early V1 rows are in
    :mod:`memfit.serving.versions`)."""
    return VLLM_MATRIX.get(minor)


def cudagraph_capture_sizes(
    *,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    ceiling: int = 512,
    max_capture_size: int | None = None,
) -> list[int]:
    """vLLM's default ``cudagraph_capture_sizes`` (``VllmConfig._set_cudagraph_sizes``):
    1, 2, 4, then steps of 8 below 256 and of 16 from 256, up to ``min(2 x max_num_seqs,
    ceiling, max_num_batched_tokens)``; ``max_capture_size`` (``--max-cudagraph-capture-size``)
    replaces ``min(2 x max_num_seqs, ceiling)``, still capped by the batched tokens
    (``vllm/config/vllm.py`` of the v0.19.0 sdist)."""
    top = min(max_num_seqs * 2, ceiling, max_num_batched_tokens)
    if max_capture_size is not None:
        top = min(max_capture_size, max_num_batched_tokens)
    sizes = [s for s in (1, 2, 4) if s <= top]
    if top >= 8:
        sizes += list(range(8, min(top + 1, 256), 8))
    if top >= 256:
        sizes += list(range(256, top + 1, 16))
    return sizes
