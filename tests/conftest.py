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


# Triton's CPU interpreter (3.6 at least) turns a loop bound into an int with int() of a
# 1-element array, which NumPy 2.5 rejects; seen on the GPU image (Triton 3.6, NumPy 2.5).
INTERPRETER_NUMPY_ERROR = "only 0-dimensional arrays can be converted to Python scalars"


def skip_if_interpreter_numpy_error(output: str) -> None:
    import numpy
    import pytest
    import triton

    if INTERPRETER_NUMPY_ERROR in output:
        pytest.skip(f"Triton {triton.__version__}'s interpreter cannot run on NumPy {numpy.__version__} "
                    "(int() of a 1-element array); the compiled kernels are checked on the GPU")
