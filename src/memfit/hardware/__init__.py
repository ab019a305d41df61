"""GPUs as data (catalog) and the device memory a trace does not see (overhead)."""

from memfit.hardware.catalog import GPU, get_gpu, list_gpus
from memfit.hardware.overhead import DeviceOverhead, device_overhead

__all__ = ["GPU", "DeviceOverhead", "device_overhead", "get_gpu", "list_gpus"]
