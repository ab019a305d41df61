"""GPUs as data (catalog), their on-demand prices (prices) and the device memory a trace does not
see (overhead)."""

from memfit.hardware.catalog import GPU, get_gpu, list_gpus
from memfit.hardware.overhead import DeviceOverhead, device_overhead
from memfit.hardware.prices import GPUPrice, PriceTable, load_prices

__all__ = [
    "GPU",
    "DeviceOverhead",
    "GPUPrice",
    "PriceTable",
    "device_overhead",
    "get_gpu",
    "list_gpus",
    "load_prices",
]
