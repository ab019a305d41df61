"""Serving runtimes: what ``vllm serve`` does with a model on a GPU (torch-free); the job,
:class:`~memfit.spec.serving.VllmConfig`, is in spec/.

>>> from memfit.serving import simulate_startup
>>> from memfit.spec.serving import VllmConfig
>>> from memfit.models import resolve_model
>>> from memfit.hardware.catalog import get_gpu
>>> s = simulate_startup(resolve_model("llama-3.1-8b").spec, get_gpu("H100"), VllmConfig())
>>> s.starts, s.kv_cache_tokens > 400_000
(True, True)
"""

from memfit.serving.startup import VllmStartup, simulate_startup, vllm_total_bytes
from memfit.serving.versions import DEFAULT_VERSION, VERSIONS, default_version, get_version

__all__ = [
    "DEFAULT_VERSION",
    "VERSIONS",
    "VllmStartup",
    "default_version",
    "get_version",
    "simulate_startup",
    "vllm_total_bytes",
]
