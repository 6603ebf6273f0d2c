import os

import pytest

# Compile for Hopper whatever the machine (the DSL defaults to sm_100a without a GPU).
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")


def _hopper() -> tuple[bool, str]:
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    if not torch.cuda.is_available():
        return False, "needs an sm_90 (Hopper) GPU; no CUDA device here"
    cap = torch.cuda.get_device_capability(0)
    if cap != (9, 0):
        return False, f"needs an sm_90 (Hopper) GPU; found {torch.cuda.get_device_name(0)} (sm_{cap[0]}{cap[1]})"
    return True, ""


def pytest_collection_modifyitems(config, items):
    # Decided at run time, not import time: collection must work without a GPU.
    ok, reason = None, ""
    for item in items:
        if "gpu" in item.keywords or "bench" in item.keywords:
            if ok is None:
                ok, reason = _hopper()
            if not ok:
                item.add_marker(pytest.mark.skip(reason=reason))
