"""Target architecture handling.

Every kernel in this package is built for sm_90a (Hopper, with the arch-specific
wgmma/setmaxnreg instructions). The CuTe DSL picks its target from the GPU it
finds, and on a machine without one it silently falls back to sm_100a, so we
pin the target before cutlass is first imported.
"""

from __future__ import annotations

import functools
import os

TARGET_ARCH = "sm_90a"


def pin_target_arch() -> None:
    """Make the DSL compile for sm_90a whatever machine we are on."""
    os.environ["CUTE_DSL_ARCH"] = TARGET_ARCH


pin_target_arch()


class UnsupportedDeviceError(ValueError):
    """Raised when a tensor lives on a device our kernels cannot run on."""


@functools.lru_cache(maxsize=None)
def _device_capability(index: int) -> tuple[tuple[int, int], str, int]:
    import torch

    props = torch.cuda.get_device_properties(index)
    return (props.major, props.minor), props.name, props.multi_processor_count


def check_device(t, what: str = "tensor") -> int:
    """Check that `t` is a CUDA tensor on an sm_90 GPU; return the SM count.

    Raises a ValueError naming the device and what is needed otherwise.
    """
    import torch

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cuda":
        raise UnsupportedDeviceError(
            f"{what} is on {t.device}; cute_kernels runs on CUDA tensors on an "
            f"NVIDIA Hopper GPU (sm_90). Move it with .cuda()."
        )
    cap, name, sms = _device_capability(t.device.index or 0)
    if cap != (9, 0):
        raise UnsupportedDeviceError(
            f"{what} is on {name} (sm_{cap[0]}{cap[1]}); these kernels are built for "
            f"sm_90a and need a Hopper GPU (H100/H200, compute capability 9.0)."
        )
    return sms


def num_sms(device_index: int = 0) -> int:
    return _device_capability(device_index)[2]


def is_hopper_available() -> bool:
    """True when an sm_90 GPU is present (for tests and benchmarks; never at import)."""
    try:
        import torch

        return torch.cuda.is_available() and _device_capability(0)[0] == (9, 0)
    except Exception:
        return False
