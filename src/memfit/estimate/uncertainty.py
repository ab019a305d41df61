"""The range around an estimate: what the engine cannot know, calibrated per code path.

An estimate's number is a single allocation history; the real run differs by what memfit does not
see. The range splits the estimate into parts that are uncertain in different ways:

* **static** bytes — parameters, gradients, optimizer states, KV cache. Their layouts are exact
  (tests check them to the byte); what varies is what a runtime adds beside them (vLLM keeps a RoPE
  cache: +0.2 % of Llama-3.1-8B's weights).
* **dynamic** bytes — activations and temporaries. These depend on kernel choice, library
  versions and autograd's exact saving decisions.
* **cache** bytes — reserved minus allocated: the caching allocator's rounding and fragmentation,
  which depend on the whole allocation order (simulated, not known).
* **context** bytes — the CUDA context and module images, measured on Hopper, estimated elsewhere.

How far the truth strays depends on which code runs the job, so the bands are fitted per **code
path** (:data:`PATHS`), each on the measurements of jobs that ran that way
(``benchmarks/calibrate_uncertainty.py``, results in ``benchmarks/results/uncertainty.md``):

* ``current-hf`` — memfit's modelled Hugging Face path (transformers / peft on torch 2.5 or
  newer; measured: the H200 runs on torch 2.11 / transformers 5.17). The default; axolotl, TRL
  and LLaMA-Factory files run this path (transformers' Trainer), as do DDP and FSDP.
  A quantized job (bitsandbytes QLoRA, GPTQ / AWQ, fp8) through transformers is this path too:
  no QLoRA run on the current stack has been measured, its weights are exact (tests check the
  packed bytes) and its dequantization temporaries are traced through the real library code, so
  it takes the band of the stack it runs on, and its band line says it is unmeasured. The
  quantized evidence memfit has — LitGPT's QLoRA rows (bitsandbytes 0.42, LitGPT's own model
  code) and vLLM's quantized weights — is other frameworks' code and calibrates that path.
* ``other-framework`` — another framework's code runs the job: LitGPT / torchtune (their files
  traced through their own code, :mod:`memfit.estimate.trace.frameworks`), DeepSpeed (``--shard
  zero1|zero2|zero3``), vLLM.
* ``old-stack`` — the trace ran a torch older than 2.5 (:data:`CURRENT_STACK`): the HF-docs tables
  of PyTorch 2.2–2.4 runs allocate up to 23 % more than memfit's trace of today's stack.
* ``per-rank-closed-form`` — the per-rank closed form (:mod:`memfit.estimate.parallel`: pipeline,
  context, expert and sequence parallelism, Float8, and every layout ``plan --gpus`` prices)
  answered: no code was traced, torchtitan's or Megatron-LM's stack runs the job. Fitted on the
  published per-rank points that closed form estimates (``benchmarks/multigpu_parallel.py``, the
  full-training points of ``benchmarks/multigpu_points.py``), which measured a whole figure
  (torchtitan logs max reserved, Megatron-LM max allocated), not its parts: one fraction of each
  figure, every part the same band (:data:`WHOLE_FIGURE_PATHS`).

:func:`path_of` decides from the estimate itself (its workload, the versions it traced with, the
framework that answered); ``MemoryEstimate.band_path`` overrides it where the caller knows better
(a LitGPT / torchtune file answered through transformers' model; the per-rank closed form sets
its own path). A part with fewer than ``MIN_POINTS`` measurements on a path takes the widest band
of the paths that have them, and the band says so. The analytic engine adds its documented error
against the trace engine.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memfit.spec.rules import DEEPSPEED_SHARDS

if TYPE_CHECKING:
    from memfit.estimate.result import MemoryEstimate

#: The KV cache is static too: its size (layers x KV heads x head_dim x tokens) is exact.
STATIC_COMPONENTS = ("parameters", "gradients", "optimizer_states", "kv_cache")
DYNAMIC_COMPONENTS = ("activations", "temporary")
PARTS = ("static", "dynamic", "cache", "context")

CURRENT_HF, OTHER_FRAMEWORK, OLD_STACK = ("current-hf", "other-framework", "old-stack")
PER_RANK = "per-rank-closed-form"
DEFAULT_PATH = CURRENT_HF
#: Paths whose measurements are of a whole figure of an engine that splits no part off by
#: measurement (the per-rank closed form: the published points are torchtitan's max reserved and
#: Megatron-LM's max allocated, mostly reserved): fitted as one fraction of the figure, the same
#: band on every part, instead of part by part (which would leave the dynamic part with four
#: allocated points and the widest band of the other paths). The estimate's range is then that
#: fraction of each of its figures (:func:`ranges`).
WHOLE_FIGURE_PATHS = (PER_RANK,)
#: A trace on a torch older than this (major, minor) carries the old-stack band: the versions of
#: the HF-docs tables it is fitted on (PyTorch 2.2.0, 2.2.1, 2.4.0). The current-stack points ran
#: torch 2.11 / transformers 5.17 (the H200 runs); nothing was measured on torch 2.5-2.10, which
#: take the current band (docs/accuracy.md §8 says so).
CURRENT_STACK = {"torch": (2, 5)}
#: A path's part is fitted from at least this many measurements; below, it takes the widest band
#: of the paths that have them (benchmarks/calibrate_uncertainty.py).
MIN_POINTS = 5


@dataclass(frozen=True)
class Band:
    """How far the truth may lie below (``low``) and above (``high``) a part, as fractions of it."""

    low: float
    high: float


@dataclass(frozen=True, kw_only=True)
class PathBands:
    """One code path's bands: ``parts`` maps static / dynamic / cache / context to a
    :class:`Band`; ``n_points`` measurements fitted them (``evidence`` says which); ``fallback``
    names the parts with fewer than :data:`MIN_POINTS` of them, which carry the widest band of
    the paths that have them."""

    path: str
    label: str
    evidence: str
    n_points: int
    parts: Mapping[str, Band]
    fallback: tuple[str, ...] = field(default=())

    def describe(self) -> str:
        """``current Hugging Face stack band (50 points: H200 runs ...)``."""
        out = f"{self.label} band ({self.n_points} points: {self.evidence}"
        if self.fallback:
            out += f"; {', '.join(self.fallback)}: too few points, the widest band"
        return out + ")"

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "label": self.label,
            "evidence": self.evidence,
            "n_points": self.n_points,
            "fallback_parts": list(self.fallback),
            "parts": {k: {"low": b.low, "high": b.high} for k, b in self.parts.items()},
        }


#: Fitted by benchmarks/calibrate_uncertainty.py, per path, to cover every measurement of that
#: path above its estimate and 95 % of those below, metric by metric (results and the points
#: outside: benchmarks/results/uncertainty.md); tests/accuracy/test_uncertainty.py checks this
#: table is that fit of the committed points. The old stack's +240 % of the dynamic part comes
#: from Pythia-410m at 128 tokens (a fixed overhead of ~0.1 GiB against 40 MiB of activations).
PATHS: dict[str, PathBands] = {
    CURRENT_HF: PathBands(
        path=CURRENT_HF,
        label="current Hugging Face stack",
        evidence="14 H200 runs on torch 2.11 / transformers 5.17, Liger-Kernel's LlamaMLP on an "
        "H100; no quantized (QLoRA) job measured on this stack",
        n_points=50,
        parts={
            "static": Band(low=0.0, high=0.01),
            "dynamic": Band(low=0.105, high=0.005),
            "cache": Band(low=0.62, high=1.29),
            "context": Band(low=0.02, high=0.0),
        },
        fallback=("static",),
    ),
    OTHER_FRAMEWORK: PathBands(
        path=OTHER_FRAMEWORK,
        label="other framework",
        evidence="LitGPT / torchtune published peaks (LitGPT's QLoRA rows on bitsandbytes "
        "0.42 included), vLLM's weights (quantized ones included)",
        n_points=52,
        parts={
            "static": Band(low=0.0, high=0.01),
            "dynamic": Band(low=0.185, high=0.965),
            "cache": Band(low=0.62, high=1.29),
            "context": Band(low=0.02, high=0.0),
        },
        fallback=("cache", "context"),
    ),
    OLD_STACK: PathBands(
        path=OLD_STACK,
        label="old torch stack",
        evidence="HF-docs SDPA tables on PyTorch 2.2-2.4",
        n_points=34,
        parts={
            "static": Band(low=0.0, high=0.01),
            "dynamic": Band(low=0.0, high=2.4),
            "cache": Band(low=0.62, high=1.29),
            "context": Band(low=0.02, high=0.0),
        },
        fallback=("static", "cache", "context"),
    ),
    # one fraction of the whole figure, every part alike (WHOLE_FIGURE_PATHS): the worst
    # under-prediction, torchtitan's 405B 1F1B run (82.5 GiB reserved, estimate 74.9: -9.2 %;
    # -10.1 % until a resident pipeline stage's bf16 layer gradients were counted:
    # parallel.memory.unfolded_grad_bytes), needs +10.1 %; the worst over-prediction,
    # torchtitan's Llama-3-8B fsdp 2 x cp 4 run (84.0 GiB, +4.3 %), needs -4.5 % (its 405B
    # interleaved 1F1B run set -10.5 % until the pipeline ranks released a chunk's unsharded
    # gradients after its last backward: now -4.0 %)
    PER_RANK: PathBands(
        path=PER_RANK,
        label="per-rank closed form",
        evidence="published per-rank peaks of torchtitan (pp / cp / tp / FSDP2, 8-512 H100s) and "
        "Megatron-LM (dp / tp / pp, 8 GPUs) it estimates; no expert-parallel point",
        n_points=18,
        parts={part: Band(low=0.045, high=0.105) for part in PARTS},
    ),
}
#: The analytic engine's documented worst error against the trace engine on its calibration grid
#: (docs/accuracy.md), applied to the whole allocated estimate on both sides of a training job,
#: and to the activations and temporaries of an inference job: its weights and KV cache are the
#: checkpoint's tensors counted as the trace counts them (the inference grid, docs/accuracy.md
#: "inference on the fast path": allocated -1.51 ... +0.09 % of the trace, all of it in the
#: activations), while a training job's static part also holds the optimizer's and sharding's
#: closed forms.
ANALYTIC_BAND = Band(low=0.03, high=0.03)


def path_of(
    *, workload: Mapping[str, Any], environment: Mapping[str, str], framework: str | None = None
) -> str:
    """The code path of a job (module docstring): ``old-stack`` when ``environment`` (the
    versions a trace ran) is older than :data:`CURRENT_STACK`; else ``other-framework`` when
    ``framework`` (LitGPT, torchtune, vLLM) runs it or DeepSpeed shards it; else ``current-hf``
    (quantized weights included)."""
    if _older_than_measured(environment):
        return OLD_STACK
    if framework or workload.get("shard") in DEEPSPEED_SHARDS:
        return OTHER_FRAMEWORK
    return CURRENT_HF


def estimate_path(est: Any) -> str:
    """The path whose band ``est``'s range carries: its ``band_path`` where set, else
    :func:`path_of` its workload, environment and the framework that traced it."""
    explicit = getattr(est, "band_path", None)
    if explicit is not None:
        return str(explicit)
    return path_of(
        workload=getattr(est, "workload", {}) or {},
        environment=getattr(est, "environment", {}) or {},
        framework=(getattr(est, "trace", {}) or {}).get("framework"),
    )


def _older_than_measured(environment: Mapping[str, str]) -> bool:
    for package, floor in CURRENT_STACK.items():
        found = re.match(r"(\d+)\.(\d+)", str(environment.get(package, "")))
        if found and (int(found[1]), int(found[2])) < floor:
            return True
    return False


def ranges(est: MemoryEstimate, path: str | None = None) -> dict[str, tuple[int, int]]:
    """``{metric: (low, high)}`` for peak allocated, peak reserved and device used, with the
    bands of ``path`` (None: :func:`estimate_path`)."""
    bands = PATHS[path or estimate_path(est)].parts
    static = sum(est.components.get(c, 0) for c in STATIC_COMPONENTS)
    dynamic = sum(est.components.get(c, 0) for c in DYNAMIC_COMPONENTS)
    cache = max(est.peak_reserved_bytes - est.peak_allocated_bytes, 0)
    context = max(est.device_used_bytes - est.peak_reserved_bytes, 0)

    def spread(end: str) -> float:
        out = getattr(bands["static"], end) * static + getattr(bands["dynamic"], end) * dynamic
        if est.engine == "analytic":
            infer = est.workload.get("mode") == "infer"
            out += getattr(ANALYTIC_BAND, end) * (dynamic if infer else est.peak_allocated_bytes)
        return out

    alloc_low = est.peak_allocated_bytes - spread("low")
    alloc_high = est.peak_allocated_bytes + spread("high")
    res_low = est.peak_reserved_bytes - spread("low") - bands["cache"].low * cache
    res_high = est.peak_reserved_bytes + spread("high") + bands["cache"].high * cache
    res_low = max(res_low, alloc_low)
    dev_low = res_low + context - bands["context"].low * context
    dev_high = res_high + context + bands["context"].high * context
    return {
        "peak_allocated_bytes": (_floor(alloc_low), _ceil(alloc_high)),
        "peak_reserved_bytes": (_floor(res_low), _ceil(res_high)),
        "device_used_bytes": (_floor(dev_low), _ceil(dev_high)),
    }


def _floor(x: float) -> int:
    return max(int(x), 0)


def _ceil(x: float) -> int:
    return int(-(-x // 1))
