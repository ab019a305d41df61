"""Watch a run: the per-step monitor, the OOM guard, leak-vs-cache diagnosis, and the run log.

Importing this package does not import torch; the monitor imports it when it starts.
"""

from memfit.monitor.diagnose import Diagnosis, diagnose
from memfit.monitor.log import RECORD_FIELDS, RunData, read_log
from memfit.monitor.oom import OOMAnalysis, oom_guard
from memfit.monitor.runtime import Monitor

__all__ = [
    "RECORD_FIELDS",
    "Diagnosis",
    "Monitor",
    "OOMAnalysis",
    "RunData",
    "diagnose",
    "oom_guard",
    "read_log",
]
