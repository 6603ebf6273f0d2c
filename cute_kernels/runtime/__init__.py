"""Shared runtime: target arch, dtype map, compile cache, device checks."""

from .arch import TARGET_ARCH, UnsupportedDeviceError, check_device, is_hopper_available, num_sms
from .cache import KERNELS, CompileKey, KernelCache, cache_dir

__all__ = [
    "TARGET_ARCH",
    "UnsupportedDeviceError",
    "check_device",
    "is_hopper_available",
    "num_sms",
    "KERNELS",
    "CompileKey",
    "KernelCache",
    "cache_dir",
]
