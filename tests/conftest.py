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


class RecordedBuilds(dict):
    """{CompileKey: recipe} of every kernel asked for; `last` is the latest key."""

    last = None


@pytest.fixture
def recorded_builds(monkeypatch):
    """KERNELS with nothing compiled: every kernel the host code asks for is recorded and
    answered with a placeholder. The front dict is emptied on every ask (so each one reaches
    the recorder) and restored afterwards, so no placeholder outlives the test."""
    from cute_kernels.runtime import KERNELS

    seen = RecordedBuilds()

    def record(key, recipe):
        seen.setdefault(key, recipe)
        seen.last = key
        KERNELS._fast.clear()
        return object()

    monkeypatch.setattr(KERNELS, "_fast", {})
    monkeypatch.setattr(KERNELS, "get", record)
    return seen


@pytest.fixture
def gemm_keys(recorded_builds):
    """The CompileKey that matmul.api.get_kernel uses for (cfg, epilogue), nothing compiled."""
    import torch

    from cute_kernels.matmul.api import get_kernel
    from cute_kernels.matmul.config import Epilogue

    def key(cfg, epi=None, c_dt=torch.float32):
        get_kernel("gemm_sm90", torch.bfloat16, torch.bfloat16, c_dt, "k", "k", cfg, epi or Epilogue())
        return recorded_builds.last

    return key


@pytest.fixture(autouse=True)
def _release_gpu_memory_between_tests(request):
    # Under pytest-xdist several workers share one GPU: cached blocks one test leaves behind
    # must not starve the next test of another worker.
    yield
    if os.environ.get("PYTEST_XDIST_WORKER") and "gpu" in request.keywords:
        import torch

        torch.cuda.empty_cache()
