"""The CUDA GEMM ladder (baselines.wmma): compiles for sm_90a, and is correct.

- `compile` tests run nvcc on each kernel source (no torch headers in them) and
  a host-compiler syntax check of the torch binding; no GPU needed.
- `gpu` tests build the extension and check every rung against an fp32
  reference: error at most 2x that of torch.mm in bf16 plus a quarter ulp.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from baselines.wmma import CSRC, RUNGS, SOURCES  # pure Python; builds nothing

KERNEL_SOURCES = [s for s in SOURCES if s.endswith(".cu")]


def _nvcc() -> str | None:
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home and (Path(cuda_home) / "bin" / "nvcc").exists():
        return str(Path(cuda_home) / "bin" / "nvcc")
    return shutil.which("nvcc")


def _cuda_include(nvcc: str) -> Path | None:
    """The CUDA include directory that goes with nvcc (which may be a wrapper script)."""
    homes = [os.environ.get("CUDA_HOME"), str(Path(nvcc).resolve().parent.parent), "/usr/local/cuda"]
    try:  # nvcc --dryrun prints the include path it would use
        dry = subprocess.run([nvcc, "--dryrun", "-x", "cu", "-c", os.devnull], capture_output=True, text=True, timeout=60)
        homes += [m.group(1) for m in re.finditer(r'INCLUDES="-I(\S+?)"', dry.stdout + dry.stderr)]
    except (OSError, subprocess.SubprocessError):
        pass
    for h in filter(None, homes):
        for inc in (Path(h) / "include", Path(h)):
            if (inc / "cuda_runtime_api.h").exists():
                return inc
    return None


# ----------------------------------------------------------------------------- compile (CPU)


@pytest.mark.compile
@pytest.mark.parametrize("source", KERNEL_SOURCES)
def test_kernel_compiles_for_sm90a(source, tmp_path):
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found (set CUDA_HOME or put nvcc on PATH)")
    from torch.utils import cpp_extension

    # the defines torch adds when it builds the extension (e.g. no implicit bf16 conversions)
    torch_flags = list(getattr(cpp_extension, "COMMON_NVCC_FLAGS", []))
    cmd = [
        nvcc, "-gencode=arch=compute_90a,code=sm_90a", "-O3", "-std=c++17", *torch_flags,
        "-Xptxas=-v,-warn-spills,-warn-lmem-usage", "-Xcompiler=-Wall,-Wextra",
        "-c", str(CSRC / source), "-o", str(tmp_path / (source + ".o")),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"nvcc failed:\n{log}"
    assert "warning" not in log.lower(), f"nvcc warnings:\n{log}"
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", log)]
    assert spills and max(spills) == 0, f"register spills in {source}:\n{log}"
    if source == "wmma.cu":
        # 4x4 accumulator fragments plus two sets of A/B fragments per warp must fit in registers
        regs = [int(n) for n in re.findall(r"Used (\d+) registers", log)]
        assert regs and max(regs) <= 255, log


@pytest.mark.compile
def test_binding_compiles(tmp_path):
    """Syntax-check binding.cpp against this torch's headers with the host compiler."""
    cxx = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    nvcc = _nvcc()
    if cxx is None or nvcc is None:
        pytest.skip("needs a host C++ compiler and nvcc (for the CUDA runtime headers)")
    from torch.utils.cpp_extension import include_paths

    cuda_include = _cuda_include(nvcc)
    if cuda_include is None:
        pytest.skip(f"CUDA runtime headers not found for {nvcc}")
    incs = [*include_paths(), sysconfig.get_paths()["include"]]
    # CPU-only torch wheels ship c10/cuda headers but not this generated one; an
    # empty stand-in is enough for a syntax check.
    stub = tmp_path / "stub"
    if not any((Path(p) / "c10/cuda/impl/cuda_cmake_macros.h").exists() for p in incs):
        (stub / "c10/cuda/impl").mkdir(parents=True)
        (stub / "c10/cuda/impl/cuda_cmake_macros.h").write_text("")
    # c++20: what recent torch builds extensions with (older torch headers accept it too)
    cmd = [cxx, "-fsyntax-only", "-std=c++20", "-Wall", "-Wextra", "-DTORCH_EXTENSION_NAME=ladder_check"]
    for p in [*incs, str(stub)]:
        cmd += ["-isystem", p]  # warnings in torch's own headers are not ours
    cmd += [f"-I{cuda_include}", f"-I{CSRC}", str(CSRC / "binding.cpp")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"binding.cpp does not compile:\n{log[-6000:]}"
    assert "warning" not in log.lower(), log[-6000:]


def test_wmma_tile_requirement_matches_kernel():
    """The Python-side shape check uses the block tile and K step wmma.cu is built with."""
    from baselines.wmma import _MULTIPLE_OF

    src = (CSRC / "wmma.cu").read_text()
    m = re.search(r"constexpr int BM = (\d+), BN = (\d+), BK = (\d+);", src)
    assert m, "tile constants not found in wmma.cu"
    assert _MULTIPLE_OF["wmma"] == tuple(int(x) for x in m.groups())


def test_python_api_validation():
    """Input checks run before anything is built (no GPU or nvcc needed)."""
    from baselines.wmma import gemm

    a = torch.randn(128, 64).bfloat16()
    with pytest.raises(ValueError, match="rung"):
        gemm(a, a.t(), rung="cublas")
    with pytest.raises(TypeError, match="bfloat16"):
        gemm(a.float(), a.t().float())
    with pytest.raises(ValueError, match="CUDA"):
        gemm(a, a.t().contiguous())
    with pytest.raises(TypeError, match="torch.Tensor"):
        gemm(a, None)


# ----------------------------------------------------------------------------- GPU


def _check_rung(rung: str, M: int, N: int, K: int, out_dtype=torch.bfloat16, seed: int = 0) -> None:
    from baselines.wmma import gemm

    g = torch.Generator().manual_seed(seed)
    a = torch.randn(M, K, generator=g).bfloat16().cuda()
    b = torch.randn(K, N, generator=g).bfloat16().cuda()
    out = gemm(a, b, rung=rung, out_dtype=out_dtype)
    assert out.dtype == out_dtype and out.shape == (M, N)
    assert torch.isfinite(out).all()
    if out_dtype == torch.float32:
        ref = a.double() @ b.double()
        # The same-precision torch op: bf16 tensor-core products, fp32 output (cuBLAS).
        try:
            same = torch.mm(a, b, out_dtype=torch.float32)
        except (TypeError, RuntimeError):
            same = a.float() @ b.float()
    else:
        ref = a.float() @ b.float()
        same = torch.mm(a, b)
    e_ours = (out.double() - ref.double()).abs().max().item()
    e_torch = (same.double() - ref.double()).abs().max().item()
    eps = 0.25 * torch.finfo(out_dtype).eps * ref.abs().max().item() + 1e-6
    assert e_ours <= 2 * e_torch + eps, f"{rung} {M}x{N}x{K}: error {e_ours:.3g} vs torch {e_torch:.3g}"


@pytest.fixture(scope="module")
def ladder():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability(0) != (9, 0):
        pytest.skip("needs an sm_90 (Hopper) GPU")
    from baselines.wmma import build

    build()  # first call compiles (about a minute), later ones load from the cache


@pytest.mark.gpu
@pytest.mark.parametrize("rung", RUNGS)
# K = 192 and 320: 3 and 5 K-tiles of the wmma rung (BK = 64, a 3-slot ring), so
# the ring is filled exactly and wrapped around.
@pytest.mark.parametrize("shape", [(256, 256, 256), (384, 512, 192), (4096, 4096, 4096)], ids=str)
def test_rung_correct(rung, shape, ladder):
    _check_rung(rung, *shape)


@pytest.mark.gpu
@pytest.mark.parametrize("rung", RUNGS)
def test_rung_fp32_out(rung, ladder):
    _check_rung(rung, 256, 512, 320, out_dtype=torch.float32, seed=1)


@pytest.mark.gpu
@pytest.mark.parametrize("K", [64, 128])
def test_wmma_fewer_k_tiles_than_stages(K, ladder):
    """1 or 2 K-tiles: the prologue commits empty groups, the main loop refills nothing."""
    _check_rung("wmma", 256, 512, K, seed=3)


@pytest.mark.gpu
@pytest.mark.parametrize("rung", ["naive", "smem"])
def test_ragged_shapes(rung, ladder):
    """The untiled rungs take any size."""
    _check_rung(rung, 100, 70, 33, seed=2)


@pytest.mark.gpu
def test_tile_requirements_are_checked(ladder):
    from baselines.wmma import gemm

    a = torch.randn(128, 64, device="cuda").bfloat16()
    b = torch.randn(64, 128, device="cuda").bfloat16()
    with pytest.raises(ValueError, match="N % 256"):
        gemm(a, b, rung="wmma")
    a = torch.randn(128, 96, device="cuda").bfloat16()
    b = torch.randn(96, 256, device="cuda").bfloat16()
    with pytest.raises(ValueError, match="K % 64"):  # BK = 64
        gemm(a, b, rung="wmma")
