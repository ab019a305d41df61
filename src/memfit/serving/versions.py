"""What differs between the vLLM versions memfit models: one row per version, each constant cited.

The algorithm (:mod:`memfit.serving.startup`) follows vLLM's own start-up accounting, read in

- V1 engine, ``vllm/v1/worker/gpu_worker.py`` (``Worker.init_device`` takes a ``MemorySnapshot``
  after NCCL init and sets ``requested_memory = total x gpu_memory_utilization``;
  ``determine_available_memory`` runs ``profile_run()`` inside ``memory_profiling`` and returns
  ``requested_memory - non_kv_cache_memory``, i.e. minus weights, the torch peak increase and the
  non-torch increase; ``compile_or_warm_up_model`` captures CUDA graphs *after* the KV cache is
  allocated, so graph memory comes on top of the budget), at commit 35d5cda1 (Dec 2025, the
  v0.12/v0.13 line) and 0012cf69 (the v0.8 line, where non-torch memory was measured as
  ``mem_get_info`` minus torch's current allocation);
- ``vllm/v1/core/kv_cache_utils.py`` (``get_kv_cache_config``, ``_check_enough_kv_cache_memory``,
  ``_report_kv_cache_config``; the "GPU KV cache size" and "Maximum concurrency" log lines);
- ``vllm/engine/arg_utils.py`` (``EngineArgs.get_batch_defaults``: the max_num_batched_tokens /
  max_num_seqs defaults by GPU memory, with A100s excluded from the large defaults, PR #17885);
- V0 engine, ``vllm/worker/worker.py`` (``determine_num_available_blocks``: the same profile,
  ``num_gpu_blocks = available // cache_block_size``) and ``vllm/engine/llm_engine.py``.

Measured constants (sampler bytes, non-torch memory, start-up context) are fitted to the published
logs named in each row and checked against the others in benchmarks/vllm_startup.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from importlib import metadata

from memfit.errors import NotModelledError, SpecError
from memfit.units import GiB, MiB

__all__ = [
    "DEFAULT_VERSION",
    "VERSIONS",
    "ModelledVersion",
    "VllmVersion",
    "default_version",
    "get_version",
    "release_minor",
    "resolve_version",
]


@dataclass(frozen=True, kw_only=True)
class VllmVersion:
    """The version-specific parts of vLLM's start-up memory accounting."""

    name: str
    engine: str  # "v1" | "v0"
    #: Bytes of sampler work per logit element in the profile run's dummy sampler pass
    #: (max_num_seqs rows x vocab): fp32 logits, the top-k/top-p sort (values + int64 indices),
    #: softmax probabilities and their temporaries.
    sampler_bytes_per_logit: float
    #: Non-torch memory grown during the profile run (``non_torch_increase``), one GPU / TP > 1.
    non_torch_bytes: int
    non_torch_tp_bytes: int
    #: Hybrid models (full + sliding-window layers) get one KV group per layer kind (the hybrid
    #: KV cache manager); before it, sliding-window layers were sized as full attention.
    hybrid_allocator: bool
    #: The "GPU KV cache size" line counts tokens as ``max_concurrency x max_model_len`` (newer)
    #: rather than ``num_blocks // n_groups x block_size``.
    tokens_from_concurrency: bool
    source: str
    #: The CUDA graph memory is estimated during profiling and subtracted from the KV budget
    #: (``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``, on by default from the 0.20.0 sdist).
    cudagraph_in_budget: bool = False
    #: The fused-MoE workspaces (``workspace13`` and ``workspace2``, ``M x topk x max(I, H)`` and
    #: ``M x topk x max(2 I, H)`` elements, fused_moe.py ``TritonExperts.workspace_shapes``) come
    #: from the persistent ``WorkspaceManager`` (vllm/v1/worker/workspace.py, modular_kernel.py
    #: ``_allocate_buffers``), so they are still held when the dummy sampler pass peaks: read in
    #: the v0.19.0 sdist; checked against its DeepSeek-V2-Lite / Qwen3-30B-A3B / Mixtral logs.
    moe_workspace_persists: bool = False
    #: What the process holds before vLLM's snapshot (CUDA context + torch; with TP/PP > 1 also
    #: NCCL), when measured for this row: None keeps memfit.serving.startup's 0.61 / 1.54 GiB
    #: (llm-d 0.1x logs). 0.19: ``init_cuda_memory_gib`` 0.51 GiB at TP 1 (all 1-GPU runs) and
    #: 1.53 GiB at TP 2 in the llm-d-planner v0.19.0 results_raw.csv.
    context_bytes: int | None = None
    context_dist_bytes: int | None = None
    #: The releases this row models, as they were checked: what was read, and what was not.
    covers: str = ""
    #: 0.34+: the extensible KV cache is the default on CUDA (vllm/config/vllm.py
    #: ``VllmConfig._resolve_extensible_kv_cache``): the cache is sized from the memory free after
    #: warmup and CUDA graph capture (memfit.serving.extensible), not from the profile's budget.
    extensible_kv_cache: bool = False

    def __post_init__(self) -> None:
        if self.engine not in ("v0", "v1"):
            raise SpecError(f"engine ({self.engine!r}) must be 'v0' or 'v1'")
        if self.sampler_bytes_per_logit <= 0:
            raise SpecError(
                f"sampler_bytes_per_logit ({self.sampler_bytes_per_logit}) must be positive"
            )


_PR10511 = "https://github.com/vllm-project/vllm/pull/10511"
_LLMD = (
    "https://github.com/llm-d/llm-d-benchmark/blob/main/config_explorer/"
    "empirical-vllm-memory-results.md"
)
_VLLM_SDIST = "https://pypi.org/project/vllm/0.20.0/#files"
_PLANNER = (
    "https://github.com/jgchn/llm-d-planner/blob/accuracy/accuracy/results/v0.19.0/"
    "accuracy_report.md"
)

VERSIONS: dict[str, VllmVersion] = {
    # V0 engine (default up to 0.7): 256 sequences profiled, logits in fp32 only (no top-k/top-p
    # sort in the dummy run): 4 B per logit; non-torch 1.79 GiB in PR #10511's Llama-3-8B log
    # (the snapshot then came before NCCL/cuBLAS init).
    "0.6": VllmVersion(
        name="0.6",
        covers=(
            "0.4-0.7 (V0 engine): PR #10511's accounting; the V0 sources were read at the v0.6 line"
        ),
        engine="v0",
        sampler_bytes_per_logit=4.0,
        non_torch_bytes=int(1.79 * GiB),
        non_torch_tp_bytes=int(3.58 * GiB),
        hybrid_allocator=False,
        tokens_from_concurrency=False,
        source=_PR10511,
    ),
    # V1 engine before the hybrid allocator (0.8-0.9).
    "0.9": VllmVersion(
        name="0.9",
        covers=(
            "0.8-0.9: V1 before the hybrid KV cache manager; gpu_worker.py read at commit 0012cf69"
        ),
        engine="v1",
        sampler_bytes_per_logit=38.3,
        non_torch_bytes=130 * MiB,
        non_torch_tp_bytes=int(0.55 * GiB),
        hybrid_allocator=False,
        tokens_from_concurrency=False,
        source=_LLMD,
    ),
    # V1 with the hybrid KV cache manager and the CUDAGraph debug line (0.10-0.13): sampler
    # 38.3 B/logit and non-torch 0.13 / 0.55 GiB fitted to the llm-d-benchmark H100 logs.
    "0.11": VllmVersion(
        name="0.11",
        covers=(
            "0.10-0.13: gpu_worker.py / kv_cache_utils.py read at commit 35d5cda1 "
            "(v0.12/v0.13 line); constants fitted to llm-d-benchmark logs"
        ),
        engine="v1",
        sampler_bytes_per_logit=38.3,
        non_torch_bytes=130 * MiB,
        non_torch_tp_bytes=int(0.55 * GiB),
        hybrid_allocator=True,
        tokens_from_concurrency=False,
        source=_LLMD,
    ),
    # 0.19: the dummy sampler pass is leaner (14.9 B/logit fitted to Llama-3.1-8B and
    # Qwen2.5-7B at 1024 x vocab); non-torch 0.25 GiB at TP=1, 2.1 GiB per GPU at TP>1 (custom
    # all-reduce and NCCL buffers grown during the profile run).
    "0.19": VllmVersion(
        name="0.19",
        covers=(
            "0.14-0.19: constants fitted to the llm-d-planner v0.19.0 logs; gpu_worker.py / "
            "config read in the v0.14.0-v0.19.0 sdists (graphs outside the budget: the "
            "estimate exists from 0.18 but VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS is off)"
        ),
        engine="v1",
        sampler_bytes_per_logit=14.9,
        non_torch_bytes=int(0.25 * GiB),
        non_torch_tp_bytes=int(2.1 * GiB),
        hybrid_allocator=True,
        tokens_from_concurrency=True,
        moe_workspace_persists=True,
        context_bytes=int(0.51 * GiB),
        context_dist_bytes=int(1.53 * GiB),
        source=_PLANNER,
    ),
    # 0.20 - 0.33: ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` defaults on (vllm/envs.py in the
    # 0.20.0 sdist: ``os.getenv(..., "1")``; its log line says "default since v0.21.0"), so
    # ``determine_available_memory`` subtracts ``profile_cudagraph_memory()``'s estimate from the
    # KV cache's budget (vllm/v1/worker/gpu_worker.py). Sampler and non-torch constants are
    # 0.19's (no published log with the activation / non-torch figures of these releases was
    # found to refit them). The per-release defaults are in memfit.serving.vllm_matrix.
    "0.20": VllmVersion(
        name="0.20",
        engine="v1",
        sampler_bytes_per_logit=14.9,
        non_torch_bytes=int(0.25 * GiB),
        non_torch_tp_bytes=int(2.1 * GiB),
        hybrid_allocator=True,
        tokens_from_concurrency=True,
        cudagraph_in_budget=True,
        moe_workspace_persists=True,
        context_bytes=int(0.51 * GiB),
        context_dist_bytes=int(1.53 * GiB),
        source=_VLLM_SDIST,
        covers=(
            "0.20-0.33: gpu_worker.py, gpu_model_runner.py, envs.py, config/cache.py and "
            "config/vllm.py read in the v0.20.0-v0.33.0 sdists (memfit.serving.vllm_matrix); "
            "sampler / non-torch constants are 0.19's, not refitted"
        ),
    ),
}
# 0.34: the extensible KV cache is the default on CUDA (vllm/config/vllm.py
# ``_resolve_extensible_kv_cache``; vllm/config/cache.py ``resolved_gpu_memory_utilization``:
# 1.0 when unset; ``DEFAULT_BLOCK_SIZE = 64``). The profile run is 0.20's, but
# ``profile_cudagraph_memory`` returns 0 with it (vllm/v1/worker/gpu/model_runner.py), and the
# cache is sized after warmup and capture by ``measure_kv_cache_bytes``
# (vllm/v1/worker/extensible_kv_cache.py): memfit.serving.extensible. Sampler / non-torch /
# context constants are 0.19's (no published 0.34 log was found to refit them).
VERSIONS["0.34"] = replace(
    VERSIONS["0.20"],
    name="0.34",
    cudagraph_in_budget=False,
    extensible_kv_cache=True,
    source="https://pypi.org/project/vllm/0.34.0/#files",
    covers=(
        "0.34: gpu_worker.py, extensible_kv_cache.py, gpu/warmup.py, config/cache.py, "
        "config/vllm.py and core/kv_cache_planning.py read in the v0.34.0 sdist; sampler / "
        "non-torch constants are 0.19's, not refitted"
    ),
)
#: The newest minor release memfit models (vLLM's current release on PyPI, 2026-12: 0.34.0).
LATEST_MINOR = 34
#: The version modelled when ``--vllm-version`` is not given and no vLLM is installed: the
#: newest modelled release (:func:`default_version` prefers the installed one).
DEFAULT_VERSION = f"0.{LATEST_MINOR}"

#: Which row a release maps to: (first minor, row).
_RANGES = ((0, "0.6"), (8, "0.9"), (10, "0.11"), (14, "0.19"), (20, "0.20"), (34, "0.34"))


@dataclass(frozen=True, kw_only=True)
class ModelledVersion:
    """Which vLLM release an answer models and why: ``source`` is "--vllm-version" (asked),
    "installed" (the vLLM distribution in this environment) or "newest modelled"."""

    release: str
    source: str
    #: why the installed vLLM was not used, when one is installed but not modelled
    note: str | None = None


def _installed_vllm() -> str | None:
    """The installed vLLM distribution's version (importlib.metadata: vLLM is not imported)."""
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def default_version() -> ModelledVersion:
    """The release modelled when none is asked: the installed vLLM's, when it is installed and
    modelled; else the newest modelled release."""
    installed = _installed_vllm()
    if installed is None:
        return ModelledVersion(release=DEFAULT_VERSION, source="newest modelled")
    try:
        get_version(installed)
    except (SpecError, NotModelledError) as exc:
        return ModelledVersion(
            release=DEFAULT_VERSION,
            source="newest modelled",
            note=f"the installed vLLM {installed} is not modelled ({exc})",
        )
    return ModelledVersion(release=installed, source="installed")


def resolve_version(asked: str | None) -> ModelledVersion:
    """``--vllm-version`` when given (checked by :func:`get_version`), else
    :func:`default_version`."""
    if asked is None:
        return default_version()
    get_version(asked)
    return ModelledVersion(release=asked, source="--vllm-version")


def release_minor(text: str) -> int:
    """The minor release of ``text`` ("0.27.1" -> 27); SpecError as :func:`get_version`."""
    get_version(text)
    return int(text.strip().lower().removeprefix("v").split(".")[1])


def get_version(text: str) -> VllmVersion:
    """The row that models vLLM ``text`` ("0.10.1", "v0.19.0", "0.11"); SpecError otherwise,
    NotModelledError for a release newer than the newest modelled one."""
    t = text.strip().lower().removeprefix("v")
    parts = t.split(".")
    try:
        major, minor = int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise SpecError(
            f"--vllm-version ({text!r}) must be a version such as 0.34.0 or 0.11"
        ) from None
    if (major == 0 and minor > LATEST_MINOR) or major >= 1:  # released after memfit's rows
        raise NotModelledError(
            f"vLLM {text} is not modelled: memfit models vLLM 0.4 to 0.{LATEST_MINOR} (each "
            "release's start-up accounting read in its source); pass --vllm-version "
            f"0.{LATEST_MINOR} for the nearest modelled release",
            engine="vllm",
        )
    if minor < 4:
        raise SpecError(
            f"--vllm-version ({text!r}): memfit models vLLM 0.4 to 0.{LATEST_MINOR} (V0 engine up "
            f"to 0.7, V1 from 0.8); pass one of those"
        )
    row = "0.6"
    for first, name in _RANGES:
        if minor >= first:
            row = name
    return VERSIONS[row]
