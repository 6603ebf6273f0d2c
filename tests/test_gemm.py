"""GEMM tests: compile tier (CPU, sm_90a PTX) and gpu tier (correctness on an H100)."""

from __future__ import annotations

import functools
import glob
import math
import re

import pytest
import torch

from cute_kernels.matmul.config import GemmConfig
from cute_kernels.matmul.heuristics import CANDIDATES, default_config
from cute_kernels.matmul.reference import apply_activation
from tests.ptx_check import ptxas_report as _ptxas_report

# --------------------------------------------------------------------------- compile tier

COMPILE_CASES = [(cfg, {}, "k", "k", torch.bfloat16) for cfg in CANDIDATES] + [
    (GemmConfig(128, 256, 2, 1), dict(activation="gelu_tanh", bias=True, residual=True, alpha=True, beta=True), "k", "k", torch.bfloat16),
    (GemmConfig(128, 256, 2, 1), dict(activation="gelu", bias=True), "k", "k", torch.float16),
    (GemmConfig(128, 128, 1, 1), dict(activation="relu", bias=True, residual=True), "m", "n", torch.bfloat16),
    (GemmConfig(128, 256, 1, 1), {}, "k", "n", torch.float16),
    (GemmConfig(128, 160, 2, 1), dict(bias=True, residual=True), "k", "k", torch.bfloat16),  # GPT-2 XL c_proj
    # TMA-loaded residual slabs, two slots per ping-pong warpgroup
    (GemmConfig(64, 64, 1, 1, pingpong=True), dict(residual=True, beta=True), "k", "k", torch.bfloat16),
    # the 2 x 2 cluster that long-K 64 x 64 tiles get (default_config)
    (GemmConfig(64, 64, 2, 2, pingpong=True), dict(bias=True, residual=True), "k", "k", torch.bfloat16),
    # 8-CTA clusters (4 x 2) of 64 x 128 ping-pong tiles (default_config, M = 512 with long K)
    (GemmConfig(64, 128, 4, 2, pingpong=True), dict(activation="gelu_tanh", bias=True), "k", "k", torch.bfloat16),
    # 192 accumulators per ping-pong thread: the residual goes through TMA slabs (no spill)
    (GemmConfig(128, 192, 2, 1, pingpong=True), dict(activation="gelu_tanh", bias=True, residual=True, alpha=True,
                                                     beta=True), "k", "k", torch.bfloat16),
    (GemmConfig(128, 160, 2, 1, pingpong=True), dict(bias=True, residual=True), "m", "n", torch.float16),
    # 192-row tiles: three consumer warpgroups under ptxas's 128-register cap (512 threads)
    (GemmConfig(192, 192, 2, 1), dict(activation="gelu_tanh", bias=True, alpha=True), "k", "k", torch.bfloat16),
    (GemmConfig(192, 160, 1, 2), dict(row_scale="vector", col_scale="vector"), "k", "k", torch.bfloat16),
    (GemmConfig(192, 168, 2, 1, swap_ab=True), {}, "k", "k", torch.bfloat16),
]


@pytest.mark.compile
@pytest.mark.parametrize(
    "cfg,epi,a_major,b_major,dtype",
    COMPILE_CASES,
    ids=[f"{c.tile_m}x{c.tile_n}-c{c.cluster_m}x{c.cluster_n}-{'-'.join(sorted(e)) or 'plain'}-{am}{bm}-{str(dt)[6:]}" for c, e, am, bm, dt in COMPILE_CASES],
)
def test_compiles_for_sm90a(tmp_path, cfg, epi, a_major, b_major, dtype):
    from cute_kernels.matmul.api import _compile
    from cute_kernels.matmul.config import Epilogue

    fn = _compile(dtype, dtype, dtype, a_major, b_major, cfg, Epilogue(**epi), "Float32", keep_dir=str(tmp_path))
    assert fn is not None
    ptx_files = glob.glob(str(tmp_path / "*.ptx"))
    assert ptx_files, "no PTX was written"
    ptx = open(ptx_files[0]).read()
    assert ".target sm_90a" in ptx
    assert "wgmma.mma_async" in ptx
    assert "cp.async.bulk.tensor" in ptx
    assert "setmaxnreg" in ptx
    # PDL: one wait before any global access (it precedes every TMA load), one trigger after the loads.
    assert ptx.count("griddepcontrol.wait;") == 1 and ptx.count("griddepcontrol.launch_dependents;") == 1
    assert ptx.index("griddepcontrol.wait;") < ptx.index("cp.async.bulk.tensor")
    report = _ptxas_report(ptx_files[0])
    if report:
        spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
        assert spills and all(s == ("0", "0") for s in spills), report


@pytest.mark.compile
def test_compiles_without_pdl(tmp_path):
    """pdl=False (the probes' side-by-side build) leaves out both griddepcontrol instructions."""
    from cute_kernels.matmul.api import _compile
    from cute_kernels.matmul.config import Epilogue

    _compile(torch.bfloat16, torch.bfloat16, torch.bfloat16, "k", "k", GemmConfig(128, 128, 2, 1), Epilogue(), "Float32",
             keep_dir=str(tmp_path), pdl=False)
    assert "griddepcontrol" not in open(glob.glob(str(tmp_path / "*.ptx"))[0]).read()


@pytest.mark.compile
@pytest.mark.parametrize("b_major", ["n", "k"])
def test_b_kn_entry_is_the_same_kernel(tmp_path, b_major):
    """gemm() hands the kernel torch.mm's b [K, N] itself (b_kn): the permutation happens at
    trace time, so the PTX is the one compiled for the [N, K] view."""
    from cute_kernels.matmul.api import _compile
    from cute_kernels.matmul.config import Epilogue

    ptx = []
    for b_kn in (False, True):
        d = tmp_path / str(b_kn)
        d.mkdir()
        _compile(torch.bfloat16, torch.bfloat16, torch.bfloat16, "k", b_major, GemmConfig(128, 128, 2, 1), Epilogue(),
                 "Float32", keep_dir=str(d), b_kn=b_kn)
        ptx.append(open(glob.glob(str(d / "*.ptx"))[0]).read())
    assert "wgmma.mma_async" in ptx[0] and ptx[0] == ptx[1]


@pytest.mark.compile
def test_kernel_cache_memory_disk_and_stale_entries(tmp_path, monkeypatch):
    """KernelCache: one compile, then memory hits; a fresh cache (a new process) loads the
    exported object from disk instead of compiling; a truncated object is rebuilt. What it
    hands out is the bare tvm_ffi.Function either way (direct_callable)."""
    import tvm_ffi

    from cute_kernels.matmul.api import _compile
    from cute_kernels.matmul.config import Epilogue
    from cute_kernels.runtime.cache import CompileKey, KernelCache, cache_dir

    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CUTE_KERNELS_DISK_CACHE", raising=False)
    build = functools.partial(_compile, torch.bfloat16, torch.bfloat16, torch.bfloat16, "k", "k",
                              GemmConfig(64, 64, 1, 1, pingpong=True), Epilogue(), "Float32")
    key = CompileKey.of("test_cache", build)

    def never():
        raise AssertionError("compiled although the cache holds the kernel")

    first = KernelCache()
    fn = first.get(key, build)
    assert isinstance(fn, tvm_ffi.Function) and first.get(key, never) is fn
    assert (first.stats["compiles"], first.stats["hits"]) == (1, 1)
    second = KernelCache()
    assert isinstance(second.get(key, never), tvm_ffi.Function) and second.stats["disk_loads"] == 1
    (obj,) = cache_dir().glob("test_cache-*.o")
    if obj.with_suffix(".so").exists():  # linked beside the object where a C compiler is present
        obj.with_suffix(".so").unlink()
        assert isinstance(KernelCache().get(key, never), tvm_ffi.Function)  # the object through the DSL
    obj.write_bytes(obj.read_bytes()[:100])
    obj.with_suffix(".so").unlink(missing_ok=True)
    third = KernelCache()
    assert isinstance(third.get(key, build), tvm_ffi.Function) and third.stats["compiles"] == 1


@pytest.mark.compile
def test_fp32_output_fused_epilogue_compiles(tmp_path):
    """The 32-bit epilogue (per-warp boxes) with every operand: bias, scales, gelu, residual."""
    from cute_kernels.matmul.api import _compile
    from cute_kernels.matmul.config import Epilogue

    epi = Epilogue(activation="gelu_tanh", bias=True, residual=True, row_scale="vector", col_scale="vector")
    _compile(torch.bfloat16, torch.bfloat16, torch.float32, "k", "k", GemmConfig(128, 256, 2, 1), epi, "Float32",
             keep_dir=str(tmp_path))
    ptx = open(glob.glob(str(tmp_path / "*.ptx"))[0]).read()
    assert "cp.async.bulk.tensor" in ptx and "wgmma.mma_async" in ptx


SWIGLU_COMPILE_CASES = [
    (GemmConfig(128, 256, 2, 1), torch.bfloat16),
    (GemmConfig(128, 128, 2, 1, pingpong=True), torch.bfloat16),
    (GemmConfig(128, 192, 1, 2, pingpong=True), torch.float16),
    (GemmConfig(64, 64, 1, 1, pingpong=True), torch.bfloat16),
    (GemmConfig(256, 128, 1, 2), torch.bfloat16),  # the autotuner's swiglu candidates include 256-row tiles
]


@pytest.mark.compile
@pytest.mark.parametrize("cfg,dtype", SWIGLU_COMPILE_CASES,
                         ids=[f"{c.tile_m}x{c.tile_n}-c{c.cluster_m}x{c.cluster_n}{'-pp' if c.pingpong else ''}-{str(d)[6:]}"
                              for c, d in SWIGLU_COMPILE_CASES])
def test_swiglu_compiles_for_sm90a(tmp_path, cfg, dtype):
    """The SwiGLU epilogue: B is [gate; up] seen as tiles of matching gate and up rows, one
    4-D TMA box per tile (multicast when the cluster shares B), silu from ex2 and rcp,
    no spills."""
    from cute_kernels.matmul.api import _compile
    from cute_kernels.matmul.config import Epilogue

    _compile(dtype, dtype, dtype, "k", "k", cfg, Epilogue(activation="swiglu"), "Float32", keep_dir=str(tmp_path))
    ptx_files = glob.glob(str(tmp_path / "*.ptx"))
    ptx = open(ptx_files[0]).read()
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor.4d" in ptx
    assert "ex2.approx" in ptx and "rcp.approx" in ptx and "div.rn.f32" not in ptx
    if cfg.cluster_m > 1:
        assert re.search(r"cp\.async\.bulk\.tensor\.4d\S*multicast", ptx)
    report = _ptxas_report(ptx_files[0])
    if report:
        spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
        assert spills and all(s == ("0", "0") for s in spills), report


def test_swiglu_config_divides_the_output():
    """swiglu_config keeps the plain GEMM's pick when its half tile divides N, else narrows it;
    N not a multiple of 32 has no config."""
    from cute_kernels.matmul.api import swiglu_config

    for M, N, K in [(8192, 14336, 4096), (8192, 8192, 2048), (8192, 18944, 3584), (300, 1408, 2048), (64, 96, 128),
                    (8192, 224, 1024)]:
        cfg = swiglu_config(M, N, K)
        assert cfg is not None and cfg.split_k == 1 and N % (cfg.tile_n // 2) == 0, (M, N, K, cfg)
        assert cfg.tile_n in (64, 128, 192, 256)
        cfg.validate()
    assert swiglu_config(8192, 100, 1024) is None


SPLIT_COMPILE_CASES = [
    (GemmConfig(64, 64, 1, 1, pingpong=True, split_k=2), {}, "k", "k", torch.bfloat16),
    (GemmConfig(128, 128, 2, 1, pingpong=True, split_k=2), {"bias", "residual", "alpha", "beta"}, "k", "k", torch.bfloat16),
    (GemmConfig(128, 256, 2, 1, split_k=2), {"bias"}, "k", "k", torch.bfloat16),
    (GemmConfig(128, 128, 2, 1, split_k=2), {"residual"}, "k", "k", torch.bfloat16),
    (GemmConfig(128, 96, 2, 1, split_k=2), {}, "m", "n", torch.float16),
    # 160 accumulators a consumer thread: the most a split-K residual class is tuned with
    # (tuning.cache.SPLIT_RESIDUAL_SPILL_ACC)
    (GemmConfig(128, 160, 2, 1, pingpong=True, split_k=2), {"bias", "residual"}, "k", "k", torch.bfloat16),
    (GemmConfig(256, 160, 2, 1, split_k=2), {"residual"}, "k", "k", torch.float16),
]


@pytest.mark.compile
@pytest.mark.parametrize(
    "cfg,epi,a_major,b_major,dtype",
    SPLIT_COMPILE_CASES,
    ids=[f"{c.tile_m}x{c.tile_n}-c{c.cluster_m}x{c.cluster_n}{'-pp' if c.pingpong else ''}-{'-'.join(sorted(e)) or 'plain'}"
         f"-{am}{bm}-{str(dt)[6:]}" for c, e, am, bm, dt in SPLIT_COMPILE_CASES],
)
def test_split_k_compiles_for_sm90a(tmp_path, cfg, epi, a_major, b_major, dtype):
    """The split-K kernel (split count at run time): partials through a global workspace,
    the finisher's counter protocol (acquire load, acq_rel add), the fused epilogue."""
    from cute_kernels.matmul.api import _compile
    from cute_kernels.matmul.config import Epilogue

    act = "gelu_tanh" if "bias" in epi else "none"
    _compile(dtype, dtype, dtype, a_major, b_major, cfg, Epilogue(activation=act, **{e: True for e in epi}), "Float32",
             keep_dir=str(tmp_path))
    ptx_files = glob.glob(str(tmp_path / "*.ptx"))
    with open(ptx_files[0]) as f:
        ptx = f.read()
    assert ".target sm_90a" in ptx and "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx
    assert "setmaxnreg" in ptx
    assert "ld.acquire.gpu" in ptx and "atom.global.acq_rel.add" in ptx and "fence.acq_rel.gpu" in ptx
    report = _ptxas_report(ptx_files[0])
    if report:
        spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
        assert spills and all(s == ("0", "0") for s in spills), report


@pytest.mark.compile
def test_split_k_residual_spills_from_192_accumulators(tmp_path):
    """Why the tuner keeps split-K residual classes under SPLIT_RESIDUAL_SPILL_ACC: the split
    build loads the residual through registers and ptxas spills at 192 accumulators a thread.
    Should this build stop spilling, the rule in tuning.cache can go."""
    from cute_kernels.matmul.api import _compile
    from cute_kernels.matmul.config import Epilogue
    from cute_kernels.tuning.cache import SPLIT_RESIDUAL_SPILL_ACC, accumulators_per_thread

    cfg = GemmConfig(128, 192, 2, 1, pingpong=True, split_k=2)
    assert accumulators_per_thread(cfg) == SPLIT_RESIDUAL_SPILL_ACC
    _compile(torch.bfloat16, torch.bfloat16, torch.bfloat16, "k", "k", cfg, Epilogue(bias=True, residual=True),
             "Float32", keep_dir=str(tmp_path))
    report = _ptxas_report(glob.glob(str(tmp_path / "*.ptx"))[0])
    if not report:
        pytest.skip("no ptxas here")
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    assert any(s != ("0", "0") for s in spills), "the split-K residual build no longer spills at 192: drop the rule"


def test_split_k_compile_key(gemm_keys):
    """Split or not is compiled in (a different kernel); the split count is not."""
    base = GemmConfig(64, 64, 1, 1, pingpong=True)
    assert gemm_keys(base) != gemm_keys(GemmConfig(64, 64, 1, 1, pingpong=True, split_k=2))
    assert gemm_keys(GemmConfig(64, 64, 1, 1, pingpong=True, split_k=2)) == gemm_keys(
        GemmConfig(64, 64, 1, 1, pingpong=True, split_k=5))


def test_config_validation_and_heuristic():
    with pytest.raises(ValueError):
        GemmConfig(96, 256).validate()
    # stages: None (as many as fit, up to MAX_AB_STAGES) or a depth that fits
    from cute_kernels.matmul.config import MAX_AB_STAGES, stages_that_fit

    assert GemmConfig(64, 32, swap_ab=True).ab_stages(2, 2) == MAX_AB_STAGES
    assert GemmConfig(64, 32, swap_ab=True, stages=16).ab_stages(2, 2) == 16
    assert GemmConfig(128, 256, stages=3).ab_stages(2, 2) == 3
    with pytest.raises(ValueError, match="stages"):
        GemmConfig(64, 32, swap_ab=True, stages=1).validate()
    with pytest.raises(ValueError, match="fits"):
        GemmConfig(128, 256, stages=stages_that_fit(GemmConfig(128, 256), 2, 2) + 1).validate()
    with pytest.raises(ValueError):
        GemmConfig(256, 256).validate()
    # whole_tile_epi: one smem buffer per slab (13 of 128 x 8 at swap width 104), cooperative only;
    # by default for swap_ab widths of 8 mod 16 (8-column slabs) that keep 5 A/B stages with it
    from cute_kernels.matmul.config import epi_buffers, epi_group, whole_tile_epilogue

    assert epi_buffers(GemmConfig(128, 104, swap_ab=True), 2) == 13
    assert stages_that_fit(GemmConfig(128, 104, swap_ab=True), 2, 2) == 6
    assert epi_buffers(GemmConfig(128, 104, swap_ab=True, whole_tile_epi=False), 2) == 2
    assert stages_that_fit(GemmConfig(128, 104, swap_ab=True, whole_tile_epi=False), 2, 2) == 7
    # The ring's 8-column slabs go out in store groups of up to 32 columns, where the group's
    # buffers cost no A/B stage: 4 for 256 x 152 (4 stages either way), 2 for 128 x 200 (5).
    assert epi_group(GemmConfig(256, 152, 2, 1, swap_ab=True), 2) == 4
    assert epi_group(GemmConfig(128, 200, 2, 1, swap_ab=True), 2) == 2
    assert epi_group(GemmConfig(128, 104, swap_ab=True), 2) == 1  # whole tile
    assert epi_group(GemmConfig(256, 144, 2, 1, swap_ab=True), 2) == 1  # 16-column slabs
    assert epi_group(GemmConfig(128, 104, 1, 2, pingpong=True, swap_ab=True), 2) == 1
    assert epi_group(GemmConfig(256, 152, 2, 1, swap_ab=True), 4) == 1  # 32-bit outputs
    assert whole_tile_epilogue(GemmConfig(64, 104, swap_ab=True), 2) and whole_tile_epilogue(GemmConfig(128, 152, swap_ab=True), 2)
    assert not whole_tile_epilogue(GemmConfig(128, 168, swap_ab=True), 2)  # 4 stages with it
    assert not whole_tile_epilogue(GemmConfig(64, 112, swap_ab=True), 2)  # 16-column slabs
    # 192-row tiles: three cooperative warpgroups of 64 rows, 16-bit, unsplit, tile_n <= 192
    from cute_kernels.matmul.config import epi_tile

    assert GemmConfig(192, 176).num_mma_warpgroups == 3 and epi_tile(GemmConfig(192, 176)) == (192, 16)
    GemmConfig(192, 184, swap_ab=True).validate()
    for cfg, why in [(GemmConfig(192, 128, pingpong=True), "cooperative"), (GemmConfig(192, 208), "tile_n"),
                     (GemmConfig(192, 128, split_k=2), "split-K"), (GemmConfig(192, 120), "multiple of 16"),
                     (GemmConfig(192, 200, swap_ab=True), "tile_n")]:
        with pytest.raises(ValueError, match=why):
            cfg.validate()
    with pytest.raises(ValueError, match="16-bit"):
        GemmConfig(192, 128).validate(in_bytes=1)
    assert not whole_tile_epilogue(GemmConfig(128, 160, swap_ab=True), 2)  # 32-column slabs
    assert not whole_tile_epilogue(GemmConfig(128, 104, swap_ab=True), 4)  # int32 out: per-warp boxes
    assert whole_tile_epilogue(GemmConfig(128, 160, whole_tile_epi=True), 2)
    with pytest.raises(ValueError, match="whole_tile_epi"):
        GemmConfig(128, 128, pingpong=True, whole_tile_epi=True).validate()
    for cfg in CANDIDATES:
        cfg.validate()
    assert default_config(8192, 8192, 8192).tile_mn == (256, 160)  # 256-row tiles from 2048 rows (16-bit)
    assert default_config(8192, 8192, 8192, in_bytes=1).tile_mn == (128, 256)
    small = default_config(1, 768, 768)
    assert small.cluster_m == 1
    # 64 x 64 tiles get a 2 x 2 cluster only for 16-bit inputs, long K and enough tiles.
    assert default_config(512, 768, 3072) == GemmConfig(64, 64, 2, 2, pingpong=True)
    assert default_config(512, 768, 768).cluster_mn == (1, 1)
    # (at 256 rows and long K an unclustered one-wave 64 x 64 grid gives way to 64 x 128 in 4 x 2)
    assert default_config(256, 768, 3072) == GemmConfig(64, 128, 4, 2, pingpong=True)
    assert default_config(256, 768, 768).cluster_mn == (1, 1)
    assert default_config(512, 768, 3072, in_bytes=1).cluster_mn == (1, 1)
    # ... and only where the cluster grid fits one wave of resident clusters (30 of 4 CTAs).
    # (128x4096x4096: 64 x 64 in 2 x 2 would be 33 clusters; 64 x 128 in 2 x 2 is 16)
    assert default_config(128, 4096, 4096) == GemmConfig(64, 128, 2, 2, pingpong=True)
    # M = 512 with long K: 64 x 128 ping-pong tiles in clusters of 4 x 2.
    assert default_config(512, 1600, 6400) == GemmConfig(64, 128, 4, 2, pingpong=True)
    assert default_config(512, 1600, 6400, in_bytes=1) == GemmConfig(64, 128, 4, 2, pingpong=True)
    assert default_config(256, 4096, 4096).tile_mn != (64, 128)  # 16 clusters of 8: two waves
    # Large ping-pong tiles where a hidden epilogue pays (short K, 8-bit inputs)...
    assert default_config(8192, 768, 3072) == GemmConfig(128, 192, 2, 1, pingpong=True)
    assert default_config(8192, 6400, 1600) == GemmConfig(128, 160, 2, 1, pingpong=True)
    assert default_config(8192, 14336, 4096, in_bytes=1) == GemmConfig(128, 160, 2, 1, pingpong=True)
    # ... but 128 x 256 cooperative for big square 16-bit problems, and 128 x 96 for
    # few-tile 8-bit ones at short K.
    assert default_config(4096, 4096, 4096) == GemmConfig(128, 256, 2, 1)
    assert default_config(512, 3072, 768, in_bytes=1).tile_mn == (128, 96)
    with pytest.raises(ValueError, match="at most 8"):
        GemmConfig(64, 128, 4, 4, pingpong=True).validate()


def test_public_api_rejects_cpu_and_bad_input():
    import cute_kernels as ck

    a = torch.randn(16, 32, dtype=torch.bfloat16)
    b = torch.randn(32, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="CUDA"):
        ck.gemm(a, b)
    with pytest.raises(TypeError):
        ck.gemm(a.float(), b.float())
    with pytest.raises(TypeError):
        ck.gemm(a, b.half())
    with pytest.raises(ValueError, match="CUDA"):
        ck.linear(a, b.t().contiguous())


# --------------------------------------------------------------------------- gpu tier


def _err_rule(ours: torch.Tensor, torch_op: torch.Tensor, ref: torch.Tensor) -> None:
    """Our error vs the fp32 reference must be at most 2x torch's same-precision error."""
    assert torch.isfinite(ours).all(), "non-finite values in the output (unwritten or overflow)"
    e_ours = (ours.float() - ref).abs().max().item()
    e_torch = (torch_op.float() - ref).abs().max().item()
    scale = ref.abs().max().item()
    assert e_ours <= 2 * e_torch + 1e-6 * max(scale, 1.0), f"error {e_ours:.4g} vs torch {e_torch:.4g} (|ref| max {scale:.3g})"


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K,cfg,epi", [
    (1001, 1536, 1024, GemmConfig(192, 128), {}),
    (1001, 1536, 1024, GemmConfig(192, 192, 1, 2), dict(bias=True)),
    (777, 2304, 640, GemmConfig(192, 176, 2, 1), dict(activation="gelu_tanh", bias=True)),
    (2049, 1920, 4096, GemmConfig(192, 160), dict(row_scale="vector", col_scale="vector")),
    (5, 1536, 512, GemmConfig(192, 64), dict(alpha=True)),
    (300, 2304, 1024, GemmConfig(192, 152, swap_ab=True), {}),
    (83, 1152, 768, GemmConfig(192, 88, swap_ab=True), {}),
])
def test_gemm_192_row_tiles(M, N, K, cfg, epi):
    """The three-warpgroup 192-row tile with each epilogue it takes, ragged M and N tiles."""
    from cute_kernels.matmul.api import run_gemm
    from cute_kernels.matmul.config import Epilogue

    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16) if epi.get("bias") else None
    rs = torch.rand(M, device="cuda") + 0.5 if epi.get("row_scale") else None
    cs = torch.rand(N, device="cuda") + 0.5 if epi.get("col_scale") else None
    alpha = 0.5 if epi.get("alpha") else 1.0
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    run_gemm(a, w, out, epi=Epilogue(**epi), bias=bias, row_scale=rs, col_scale=cs, alpha=alpha, config=cfg)

    def epilogue(acc):
        acc = acc * alpha
        if rs is not None:
            acc = acc * rs[:, None] * cs[None, :]
        if bias is not None:
            acc = acc + bias.float()
        return apply_activation(acc, epi.get("activation"))

    _err_rule(out, epilogue(torch.nn.functional.linear(a, w).float()).to(torch.bfloat16),
              epilogue(a.double() @ w.double().t()).float())


MS = [1, 7, 128, 129, 4096]
NS = [8, 50257, 768, 3072]
KS = [8, 72, 768, 3072]


@pytest.mark.gpu
@pytest.mark.parametrize("M", MS)
@pytest.mark.parametrize("N", NS)
@pytest.mark.parametrize("K", KS)
def test_gemm_shapes(M, N, K):
    import cute_kernels as ck

    if M * N * K > 4096 * 50257 * 768:
        pytest.skip("largest corner covered by the 4096 x 50257 x 768 case")
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    b = w.t()  # [K, N], column-major: the F.linear layout
    out = ck.gemm(a, b)
    ref = a.float() @ b.float()
    _err_rule(out, a @ b, ref)
    assert out.shape == (M, N)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(129, 768, 72), (4096, 3072, 768), (7, 50257, 768)])
def test_gemm_layouts(layout, dtype, shape):
    import cute_kernels as ck

    M, N, K = shape
    a = torch.randn(M, K, device="cuda", dtype=dtype) if layout[0] == "n" else torch.randn(K, M, device="cuda", dtype=dtype).t()
    b = torch.randn(K, N, device="cuda", dtype=dtype) if layout[1] == "n" else torch.randn(N, K, device="cuda", dtype=dtype).t()
    out = torch.full((M, -(-N // 8) * 8), float("nan"), device="cuda", dtype=dtype)[:, :N] if N % 8 else torch.full((M, N), float("nan"), device="cuda", dtype=dtype)
    if N % 8 == 0:
        ck.gemm(a, b, out=out)
    else:
        out = ck.gemm(a, b)
    _err_rule(out, a @ b, a.float() @ b.float())


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["offset1", "odd_n_padded", "odd_stride", "contiguous"])
@pytest.mark.parametrize("M,N,K", [(300, 1601, 1600), (129, 768, 3072)])
def test_linear_residual_layouts(layout, M, N, K):
    """The epilogue reads the residual as 4-byte column pairs: misaligned bases and odd row
    strides go through a copy, odd N reads its padding column; the recorded plan re-checks
    the residual's alignment per call (second call with an offset-by-one residual)."""
    import cute_kernels as ck

    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K**0.5
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)

    def residual(kind):
        if kind == "offset1":
            return torch.randn(M * N + 1, device="cuda", dtype=torch.bfloat16)[1:].view(M, N)
        if kind == "odd_n_padded":
            return torch.randn(M, N + 7 + (N % 2), device="cuda", dtype=torch.bfloat16)[:, :N]
        if kind == "odd_stride":
            return torch.randn(M, N + 1 + (N + 1) % 2, device="cuda", dtype=torch.bfloat16)[:, :N]
        return torch.randn(M, N, device="cuda", dtype=torch.bfloat16)

    for kind in (layout, "offset1"):
        res = residual(kind)
        out = ck.linear(x, w, bias, residual=res)
        ref = ck.linear_ref(x.float(), w.float(), bias.float(), residual=res.float())
        _err_rule(out, torch.nn.functional.linear(x, w, bias) + res, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("shape", [(3, 17, 768, 3072), (4, 1024, 1600, 6400), (1, 7, 50257, 768)])
def test_linear_epilogues(activation, with_bias, with_residual, shape):
    import cute_kernels as ck

    B, S, N, K = shape
    x = torch.randn(B, S, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K**0.5
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16) if with_bias else None
    res = torch.randn(B, S, N, device="cuda", dtype=torch.bfloat16) if with_residual else None
    alpha, beta = (0.5, 2.0) if with_residual else (1.0, 1.0)
    out = ck.linear(x, w, bias, activation=activation, residual=res, alpha=alpha, beta=beta)
    ref = ck.linear_ref(x.float(), w.float(), None if bias is None else bias.float(), activation=activation,
                        residual=None if res is None else res.float(), alpha=alpha, beta=beta)
    # torch's bf16 path: each op rounds to bf16, as an unfused eager model would.
    t = torch.nn.functional.linear(x, w) * alpha
    if bias is not None:
        t = t + bias
    t = apply_activation(t.float(), activation).to(torch.bfloat16)
    if res is not None:
        t = t + beta * res
    _err_rule(out, t, ref)


# One shape per path of the heuristic (matmul/heuristics.py): 1 x 2 clusters walked along N,
# 2 x 2 clusters at few M tiles, 64 x 128 tiles in 1 x 2 / 2 x 2 / 4 x 2 clusters, and a split-K
# pick; M is never a multiple of 8.
HEURISTIC_PATHS = [(627, 4096, 4096), (534, 6144, 4096), (138, 28672, 1024), (10, 4608, 3584), (131, 3840, 1280),
                   (299, 1600, 6400), (206, 2048, 8192), (4209, 4096, 1024)]


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K", HEURISTIC_PATHS)
@pytest.mark.parametrize("epi", ["plain", "bias_gelu", "bias_residual"])
def test_every_heuristic_path_with_fused_epilogues(M, N, K, epi):
    import cute_kernels as ck

    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K**0.5
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16) if epi != "plain" else None
    res = torch.randn(M, N, device="cuda", dtype=torch.bfloat16) if epi == "bias_residual" else None
    act = "gelu" if epi == "bias_gelu" else None
    out = ck.linear(x, w, bias, activation=act, residual=res)
    ref = ck.linear_ref(x.float(), w.float(), None if bias is None else bias.float(), activation=act,
                        residual=None if res is None else res.float())
    t = torch.nn.functional.linear(x, w, bias)
    t = apply_activation(t.float(), act).to(torch.bfloat16)
    if res is not None:
        t = t + res
    _err_rule(out, t, ref)


@pytest.mark.gpu
def test_nan_inf_propagate_and_empty():
    import cute_kernels as ck

    a = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
    a[3, 5] = float("nan")
    a[7, 9] = float("inf")
    out, ref = ck.gemm(a, b), a @ b
    assert torch.equal(torch.isnan(out), torch.isnan(ref))
    assert torch.isnan(out[3]).all() and not torch.isnan(out[4]).any()
    assert ck.gemm(a[:0], b).shape == (0, 256)
    assert ck.gemm(a[:, :0], b[:0]).abs().sum() == 0


@pytest.mark.gpu
def test_gpu_bad_input():
    import cute_kernels as ck

    a = torch.randn(64, 32, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="shape mismatch"):
        ck.gemm(a, torch.randn(33, 8, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(TypeError):
        ck.gemm(a.float(), a.float().t())
    with pytest.raises(TypeError):
        ck.gemm(a.to(torch.int8), a.to(torch.int8).t())
    with pytest.raises(ValueError):
        ck.linear(a, torch.randn(16, 32, device="cuda", dtype=torch.bfloat16), torch.randn(15, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(ValueError):
        ck.linear(a, torch.randn(16, 32, device="cuda", dtype=torch.bfloat16), activation="swish")


@pytest.mark.gpu
def test_unaligned_strides_fall_back_to_padded_copy():
    import cute_kernels as ck

    a = torch.randn(100, 77, device="cuda", dtype=torch.bfloat16)  # K=77: rows not 16-byte aligned
    b = torch.randn(77, 33, device="cuda", dtype=torch.bfloat16)
    _err_rule(ck.gemm(a, b), a @ b, a.float() @ b.float())
    big = torch.randn(64, 200, device="cuda", dtype=torch.bfloat16)[:, 1:129]  # misaligned base
    bb = torch.randn(128, 64, device="cuda", dtype=torch.bfloat16)
    _err_rule(ck.gemm(big, bb), big @ bb, big.float() @ bb.float())


# One shape per H200-fitted rule: the sparse-tail split, the whole-wave 192-row tiles (a weight
# whose rows do not divide by 192), the wide-weight extra token tile, the even narrow weight's
# one-wave tile at long K, the large-M 256-row tile in 1 x 2, the odd narrow weight's 1 x 2 tiles.
# Each pick runs as the heuristic names it and as dispatch runs it
# (a shipped tuning table may hold the class).
RULE_SHAPES = [((149, 57344, 8192), GemmConfig(128, 160, 2, 1, split_k=2, swap_ab=True)),
               ((153, 37888, 3584), GemmConfig(192, 80, 1, 2, swap_ab=True)),
               ((633, 28672, 4096), GemmConfig(128, 160, 1, 2, pingpong=True, swap_ab=True)),
               ((1875, 1024, 4096), GemmConfig(128, 128, 2, 1, swap_ab=True)),
               ((3712, 10240, 8192), GemmConfig(256, 144, 1, 2, swap_ab=True)),
               ((3828, 1600, 6400), GemmConfig(128, 192, 1, 2, swap_ab=True))]


@pytest.mark.gpu
@pytest.mark.parametrize("shape,cfg", RULE_SHAPES, ids=[f"{m}x{n}x{k}" for (m, n, k), _ in RULE_SHAPES])
def test_h200_rule_picks_run_correctly(shape, cfg):
    import cute_kernels as ck
    from cute_kernels.matmul import api

    M, N, K = shape
    assert api._pick_config(M, N, K, 2, True, None, True) == cfg
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K**0.5
    t, ref = torch.nn.functional.linear(x, w), x.float() @ w.float().t()
    _err_rule(ck.gemm(x, w.t(), config=cfg), t, ref)
    _err_rule(ck.linear(x, w), t, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 768, 768), (300, 520, 208), (2048, 3072, 768)])
def test_gemm_fp32_output(shape):
    import cute_kernels as ck

    M, N, K = shape
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16).t()
    out = ck.gemm(a, b, out_dtype=torch.float32)
    assert out.dtype == torch.float32
    _err_rule(out, (a @ b).float(), a.float() @ b.float())


# --------------------------------------------------------------------------- split-K (gpu)

SPLIT_CFGS = {
    "64x64pp": lambda s: GemmConfig(64, 64, 1, 1, pingpong=True, split_k=s),
    "128x128pp-c2": lambda s: GemmConfig(128, 128, 2, 1, pingpong=True, split_k=s),
    "128x256-c2": lambda s: GemmConfig(128, 256, 2, 1, split_k=s),
    "128x96-c1x2": lambda s: GemmConfig(128, 96, 1, 2, split_k=s),
}


def _torch_linear(x, w, bias, activation, res, alpha, beta):
    """torch's bf16 path: each op rounds to bf16, as an unfused eager model would."""
    t = torch.nn.functional.linear(x, w) * alpha
    if bias is not None:
        t = t + bias
    t = apply_activation(t.float(), activation).to(x.dtype)
    if res is not None:
        t = t + beta * res
    return t


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", CANDIDATES, ids=lambda c: f"{c.tile_m}x{c.tile_n}c{c.cluster_m}{c.cluster_n}"
                         f"{'P' if c.pingpong else ''}")
def test_every_candidate_full_epilogue(cfg):
    """Every candidate config (not only the heuristic's picks at the test shapes) with the
    full epilogue: several tiles per CTA (ping-pong warpgroups alternate), ragged edges,
    a partial last k-tile."""
    _check_full_epilogue(cfg, 4100, 2000, 700)  # 187+ tiles: CTAs of the persistent grid run two or more


def _check_full_epilogue(cfg, M, N, K):
    """run_gemm with `cfg` and every epilogue operand against torch's bf16 path."""
    import cute_kernels as ck
    from cute_kernels.matmul.api import _alloc_out, _prepare_operand, run_gemm
    from cute_kernels.matmul.config import Epilogue

    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K**0.5
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    res = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    epi = Epilogue(activation="gelu_tanh", bias=True, residual=True, alpha=True, beta=True)
    out = _alloc_out(M, N, torch.bfloat16, "cuda").fill_(float("nan"))
    run_gemm(_prepare_operand(x, "m"), _prepare_operand(w, "n"), out, epi=epi, bias=bias, residual=res,
             alpha=0.5, beta=2.0, config=cfg)
    ref = ck.linear_ref(x.float(), w.float(), bias.float(), activation="gelu_tanh", residual=res.float(),
                        alpha=0.5, beta=2.0)
    _err_rule(out, _torch_linear(x, w, bias, "gelu_tanh", res, 0.5, 2.0), ref)


WHOLE_TILE_CFGS = [GemmConfig(128, 160, 2, 1, whole_tile_epi=True), GemmConfig(64, 128, 1, 2, whole_tile_epi=True),
                   GemmConfig(128, 96, 1, 2, split_k=3, whole_tile_epi=True)]


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", WHOLE_TILE_CFGS, ids=lambda c: f"{c.tile_m}x{c.tile_n}s{c.split_k}")
@pytest.mark.parametrize("shape", [(4100, 2000, 700), (299, 5120, 1280), (130, 520, 1000)])
def test_whole_tile_epilogue(cfg, shape):
    """whole_tile_epi: every slab staged before one barrier and the TMA stores, with the full
    epilogue; several tiles per CTA (the next tile waits for the stores' reads), one wave,
    split-K."""
    _check_full_epilogue(cfg, *shape)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg_name", list(SPLIT_CFGS))
@pytest.mark.parametrize("split", [2, 3, 5])
@pytest.mark.parametrize("shape", [(1, 1600, 1600), (8, 1600, 6400), (512, 768, 3072), (512, 768, 768),
                                   (77, 1600, 1600), (77, 1600, 1000), (130, 520, 1000), (3, 1598, 999),
                                   (1355, 3584, 1000), (2100, 1598, 999)])
def test_split_k_forced(cfg_name, split, shape):
    """Forced split-K through run_gemm with the full epilogue, vs the fp32 reference.

    K=1000 ends in a partial k-tile; K=999 (rows not 16-byte aligned) goes through the
    padded copy; N=1598 gives a padded workspace and output row. The last two shapes
    take more than one wave of clusters: whole tiles first, the last wave's tiles split."""
    import cute_kernels as ck
    from cute_kernels.matmul.api import (
        SplitKLaunch,
        _alloc_out,
        _prepare_operand,
        kernel_for,
        run_gemm,
    )
    from cute_kernels.matmul.config import Epilogue

    M, N, K = shape
    torch.manual_seed(0)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K**0.5
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    res = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    epi = Epilogue(activation="gelu_tanh", bias=True, residual=True, alpha=True, beta=True)
    xp, wp = _prepare_operand(x, "m"), _prepare_operand(w, "n")
    out = _alloc_out(M, N, torch.bfloat16, "cuda").fill_(float("nan"))
    cfg = SPLIT_CFGS[cfg_name](split)
    assert isinstance(kernel_for(xp, wp, out.dtype, epi, config=cfg), SplitKLaunch)  # K >= 2 k-tiles
    run_gemm(xp, wp, out, epi=epi, bias=bias, residual=res, alpha=0.5, beta=2.0, config=cfg)
    ref = ck.linear_ref(x.float(), w.float(), bias.float(), activation="gelu_tanh", residual=res.float(),
                        alpha=0.5, beta=2.0)
    _err_rule(out, _torch_linear(x, w, bias, "gelu_tanh", res, 0.5, 2.0), ref)


@pytest.mark.gpu
@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("shape", [(1, 1600, 6400), (8, 1600, 6400), (1, 768, 3072), (16, 4096, 4096)])
def test_split_k_auto_linear(monkeypatch, activation, shape):
    """ck.linear on shapes the heuristic splits: the split launch is really taken, and right
    (the skinny path, default for M <= 8, is off here)."""
    import importlib

    import cute_kernels as ck

    api = importlib.import_module("cute_kernels.matmul.api")
    monkeypatch.setenv("CUTE_KERNELS_GEMV", "0")
    monkeypatch.setattr(api, "_LINEAR_PLANS", {})
    M, N, K = shape
    assert api._pick_config(M, N, K, 2, True).split_k > 1
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K**0.5
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    res = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):  # slow path, then the recorded plan
        out = ck.linear(x, w, bias, activation=activation, residual=res)
        ref = ck.linear_ref(x.float(), w.float(), bias.float(), activation=activation, residual=res.float())
        _err_rule(out, _torch_linear(x, w, bias, activation, res, 1.0, 1.0), ref)
    assert any(isinstance(p[0], api.SplitKLaunch) for p in api._LINEAR_PLANS.values())
    g = ck.gemm(x, w.t())
    _err_rule(g, x @ w.t(), x.float() @ w.float().t())


@pytest.mark.gpu
def test_split_k_cuda_graph(monkeypatch):
    """The split launch (cached workspace, one kernel) captures into a CUDA graph and replays."""
    import importlib

    import cute_kernels as ck

    monkeypatch.setenv("CUTE_KERNELS_GEMV", "0")
    monkeypatch.setattr(importlib.import_module("cute_kernels.matmul.api"), "_LINEAR_PLANS", {})
    M, N, K = 4, 1600, 6400
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K**0.5
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            ck.linear(x, w, bias, activation="gelu_tanh")
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = ck.linear(x, w, bias, activation="gelu_tanh")
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        g.replay()
        torch.cuda.synchronize()
        ref = ck.linear_ref(x.float(), w.float(), bias.float(), activation="gelu_tanh")
        _err_rule(y, _torch_linear(x, w, bias, "gelu_tanh", None, 1.0, 1.0), ref)


SWIGLU_GPU_CASES = [
    # (M, N, K, config or None for swiglu_config's pick, dtype)
    (1000, 1408, 2048, None, torch.bfloat16),
    (4096, 14336, 4096, None, torch.bfloat16),  # Llama-3-8B's MLP at 4096 tokens
    (777, 2048, 1024, GemmConfig(128, 128, 2, 1, pingpong=True), torch.bfloat16),
    (300, 960, 512, GemmConfig(128, 192, 1, 2, pingpong=True), torch.float16),
    (129, 96, 200, GemmConfig(64, 64, 1, 1, pingpong=True), torch.bfloat16),
    (1000, 2048, 2048, GemmConfig(256, 128, 1, 2, raster_m=False), torch.bfloat16),
    (5, 1024, 2048, None, torch.bfloat16),  # up to 8 rows: the skinny GEMV's SwiGLU epilogue
]


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K,cfg,dtype", SWIGLU_GPU_CASES)
def test_swiglu_linear_matches_reference(M, N, K, cfg, dtype):
    """silu(x gate^T) * (x up^T) in one GEMM: within 2x the error of transformers' torch ops in
    the same dtype, against an fp64 reference; the [gate; up] rows of every tile pair up."""
    import cute_kernels as ck

    x = torch.randn(M, K, device="cuda", dtype=dtype)
    gu = torch.randn(2 * N, K, device="cuda", dtype=dtype) / K**0.5
    out = ck.swiglu_linear(x, gu, config=cfg)
    assert out.shape == (M, N) and out.dtype == dtype
    xd, gd = x.double(), gu.double()
    ref = torch.nn.functional.silu(xd @ gd[:N].t()) * (xd @ gd[N:].t())
    _err_rule(out, ck.swiglu_linear_ref(x, gu), ref)
    # a 3-D x keeps its leading dims
    out3 = ck.swiglu_linear(x.view(1, M, K), gu, config=cfg)
    assert out3.shape == (1, M, N) and torch.equal(out3[0], out)


@pytest.mark.gpu
def test_swiglu_linear_validates():
    import cute_kernels as ck

    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="multiple of 32"):
        ck.swiglu_linear(x, torch.randn(2 * 100, 256, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="must end in K"):
        ck.swiglu_linear(x, torch.randn(128, 255, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="same dtype"):
        ck.swiglu_linear(x, torch.randn(128, 256, device="cuda", dtype=torch.float16))
    with pytest.raises(ValueError, match="cannot run the swiglu epilogue"):
        ck.swiglu_linear(x, torch.randn(2 * 96, 256, device="cuda", dtype=torch.bfloat16), config=GemmConfig(128, 256))


@pytest.mark.gpu
@pytest.mark.parametrize("cfg_name", ["64x64pp", "128x256-c2"])
@pytest.mark.parametrize("M", [96, 1800])
def test_split_k_is_deterministic(cfg_name, M):
    """Whichever split finishes a tile, its partials add in split order: fp32 outputs are the
    same bits on every launch (arrival order varies from launch to launch). M = 1800 takes
    more than one wave, its last wave split."""
    from cute_kernels.matmul.api import run_gemm
    from cute_kernels.matmul.config import Epilogue

    a = torch.randn(M, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(512 if M < 1024 else 3584, 8192, device="cuda", dtype=torch.bfloat16)
    cfg = SPLIT_CFGS[cfg_name](5)
    first = torch.empty(M, b.shape[0], device="cuda", dtype=torch.float32)
    run_gemm(a, b, first, epi=Epilogue(), config=cfg)
    _err_rule(first, (a @ b.t()).float(), a.double() @ b.double().t())
    out = torch.empty_like(first)
    for _ in range(50):
        run_gemm(a, b, out, epi=Epilogue(), config=cfg)
        assert torch.equal(out, first)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [None, GemmConfig(128, 104, 2, 1, swap_ab=True), GemmConfig(128, 128, 2, 1, split_k=3)],
                         ids=["dispatch", "swap", "split"])
def test_chain_in_cuda_graph_reads_the_kernel_ahead(cfg):
    """Each GEMM launches as a programmatic dependent of the kernel ahead (PDL): in a CUDA
    graph a chain of linears, each reading the one before's output and overwriting the input
    the one before read, must see every write. Replayed on fresh inputs, so a kernel that
    touched memory before its griddepcontrol.wait would read the previous replay's values."""
    from cute_kernels.matmul.api import run_gemm
    from cute_kernels.matmul.config import Epilogue

    M, D = 260, 1024
    ws = [torch.randn(D, D, device="cuda", dtype=torch.bfloat16) / D ** 0.5 for _ in range(4)]
    x = torch.randn(M, D, device="cuda", dtype=torch.bfloat16)
    bufs = [torch.empty(M, D, device="cuda", dtype=torch.bfloat16) for _ in range(2)]

    def chain():
        src = x
        for i, w in enumerate(ws):
            dst = bufs[i % 2]
            run_gemm(src, w, dst, epi=Epilogue(), config=cfg)
            src = dst
        x.mul_(-1.0)  # a torch kernel behind the chain writes what the first GEMM read

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        chain()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        chain()
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        start = x.clone()
        g.replay()
        torch.cuda.synchronize()
        ref, ref64 = start, start.double()
        for w in ws:
            ref, ref64 = torch.nn.functional.linear(ref, w), ref64 @ w.double().t()
        _err_rule(bufs[1], ref, ref64)
        assert torch.equal(x, -start)


@pytest.mark.gpu
def test_split_k_nan_stays_in_its_row_and_fp32_out():
    from cute_kernels.matmul.api import run_gemm
    from cute_kernels.matmul.config import Epilogue

    a = torch.randn(16, 2048, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(256, 2048, device="cuda", dtype=torch.bfloat16)
    a[3, 1500] = float("nan")  # in the last split's K range
    out = torch.empty(16, 256, device="cuda", dtype=torch.float32)
    run_gemm(a, b, out, epi=Epilogue(), config=GemmConfig(64, 64, 1, 1, pingpong=True, split_k=4))
    assert torch.isnan(out[3]).all() and not torch.isnan(out[:3]).any() and not torch.isnan(out[4:]).any()
    ok = torch.ones(16, dtype=torch.bool)
    ok[3] = False
    _err_rule(out[ok], (a @ b.t()).float()[ok], (a.float() @ b.float().t())[ok])


@pytest.mark.gpu
@pytest.mark.parametrize("activation", [None, "gelu_tanh"])
@pytest.mark.parametrize("M", [1, 3, 8])
@pytest.mark.parametrize("NK", [(1600, 1600), (4800, 1600), (6400, 1600), (1600, 6400), (50257, 1600), (40, 300),
                                # the long-row picks (K >= 2048): Llama-3-8B q/k/v and down, Llama-3.2-1B gate/up and down
                                (6144, 4096), (4096, 14336), (16384, 2048), (2048, 8192)])
def test_gemv_path_matches_reference(monkeypatch, activation, M, NK):
    """The skinny path (the default for M <= 8) against the fp32 reference, fused epilogue included."""
    import cute_kernels as ck
    from cute_kernels.matmul import api

    monkeypatch.setenv("CUTE_KERNELS_GEMV", "1")
    monkeypatch.setattr(api, "_LINEAR_PLANS", {})
    N, K = NK
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K**0.5
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    res = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    out = ck.linear(x, w, bias, activation=activation, residual=res)
    ref = ck.linear_ref(x.float(), w.float(), bias.float(), activation=activation, residual=res.float())
    t = apply_activation((torch.nn.functional.linear(x, w) + bias).float(), activation).to(torch.bfloat16) + res
    _err_rule(out, t, ref)
    # Captured in a CUDA graph (how decode runs it): same answer.
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out_g = ck.linear(x, w, bias, activation=activation, residual=res)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out_g, out)


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 8, 17])
@pytest.mark.parametrize("NK,activation", [((4800, 1600), None), ((6400, 1600), "gelu_tanh"), ((50257, 1600), None)])
def test_layernorm_linear(M, NK, activation):
    """LN in the skinny GEMM's prologue (M <= 8) or LN + linear (M = 17) vs the fp32 reference,
    within 2x the error of torch's bf16 LayerNorm + F.linear; rows with GPT-2-like large means."""
    import torch.nn.functional as F

    import cute_kernels as ck

    N, K = NK
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16) * 4 + 30
    g = torch.randn(K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K**0.5
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16) if N != 50257 else None
    ref = ck.layernorm_linear_ref(x, g, b, w, bias, activation=activation)
    out = ck.layernorm_linear(x, g, b, w, bias, activation=activation)
    h = F.layer_norm(x, (K,), g, b)
    t = F.linear(h, w, bias)
    t = F.gelu(t, approximate="tanh") if activation else t
    e_torch = (t.float() - ref).abs().max().item()
    assert out.shape == (M, N) and (out.float() - ref).abs().max().item() <= 2 * e_torch + 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("N,K,opts", [
    (4800, 1600, dict(ln=True, kv=True)), (1600, 1600, dict(res=True)), (6400, 1600, dict(ln=True, act="gelu_tanh")),
    (50257, 1600, dict(ln=True)), (1000, 80, dict(act="relu", alpha=0.5)), (8, 16, {}), (129, 3072, dict(res=True, beta=0.25, act="gelu")),
    (960, 1024, dict(kv=True, dtype=torch.float16)), (333, 4096, dict(ln=True, res=True)),
])
def test_gemv_sm90(monkeypatch, N, K, opts):
    """The CuTe DSL one-row GEMV (bulk-copied weight rows, mma.sync, PDL) against the fp32
    reference within 2x the Triton skinny kernel's error; its KV append writes exactly its own
    k / v columns into cache row pos and nothing else; N not a multiple of the rows per CTA and multi-wave grids
    (50257) included; outputs poisoned first."""
    import torch.nn.functional as F

    from cute_kernels.matmul.gemv import gemv_sm90_applies, skinny_gemm

    dt = opts.get("dtype", torch.bfloat16)
    x = (torch.randn(1, K, device="cuda") * 3 + 1).to(dt)
    w = (torch.randn(N, K, device="cuda") / K**0.5).to(dt)
    b = torch.randn(N, device="cuda").to(dt)
    res = torch.randn(1, N, device="cuda").to(dt) if opts.get("res") else None
    ln = (1 + 0.1 * torch.randn(K, device="cuda").to(dt), 0.1 * torch.randn(K, device="cuda").to(dt), 1e-5) \
        if opts.get("ln") else None
    alpha, beta = opts.get("alpha", 1.0), opts.get("beta", 1.0)
    outs, caches = [], []
    for path in ("0", "1"):
        monkeypatch.setenv("CUTE_KERNELS_GEMV_SM90", path)
        kv = None
        if opts.get("kv"):
            g = torch.Generator(device="cuda").manual_seed(1)
            kc = torch.randn(1, N // 3 // 64, 32, 64, device="cuda", generator=g).to(dt)
            kv = (kc, torch.randn(kc.shape, device="cuda", generator=g).to(dt), torch.tensor([7], device="cuda"))
        out = torch.full((1, N), float("nan"), device="cuda", dtype=dt)
        if path == "1":
            assert gemv_sm90_applies(x, w, out, b, res, ln, None, None, kv)
        skinny_gemm(x, w, b, opts.get("act"), res, out=out, alpha=alpha, beta=beta, ln=ln, kv=kv)
        outs.append(out.float())
        caches.append(kv)
    xr = F.layer_norm(x.float(), (K,), ln[0].float(), ln[1].float(), 1e-5) if ln else x.float()
    ref = apply_activation(alpha * (xr @ w.float().t()) + b.float(), opts.get("act"))
    if res is not None:
        ref = ref + beta * res.float()
    e_triton = (outs[0] - ref).abs().max().item()
    assert torch.isfinite(outs[1]).all()
    assert (outs[1] - ref).abs().max().item() <= 2 * e_triton + 1e-6
    if opts.get("kv"):  # row 7 of each cache holds this call's k / v columns, nothing else moved
        g = torch.Generator(device="cuda").manual_seed(1)
        k0 = torch.randn(caches[1][0].shape, device="cuda", generator=g).to(dt)
        v0 = torch.randn(k0.shape, device="cuda", generator=g).to(dt)
        C, H = N // 3, k0.shape[1]
        y = outs[1].to(dt)
        k0[0, :, 7] = y[0, C:2 * C].view(H, 64)
        v0[0, :, 7] = y[0, 2 * C:].view(H, 64)
        assert torch.equal(caches[1][0], k0) and torch.equal(caches[1][1], v0)


@pytest.mark.gpu
@pytest.mark.parametrize("wdt", [torch.float8_e4m3fn, torch.int8], ids=["e4m3", "int8"])
@pytest.mark.parametrize("N,K,opts", [
    (4800, 1600, dict(ln=True, kv=True)), (6400, 1600, dict(ln=True, act="gelu_tanh")), (1600, 6400, dict(res=True)),
    (129, 3072, dict(res=True, beta=0.25, act="gelu")), (8, 16, {}), (100, 4128, dict(alpha=0.5)),
])
def test_gemv_sm90_8bit(monkeypatch, wdt, N, K, opts):
    """Weight-only 8-bit decode on the one-row kernel (weights converted to f16 in registers,
    per-channel scale in the epilogue) against the fp32 product of the dequantized weights,
    within 2x the Triton skinny kernel's error; the KV append copies its own k / v columns."""
    import torch.nn.functional as F

    from cute_kernels.matmul.gemv import gemv_sm90_applies, skinny_gemm

    dt = torch.bfloat16
    x = (torch.randn(1, K, device="cuda") * 3 + 1).to(dt)
    w = torch.randn(N, K, device="cuda") / K**0.5
    qmax = 127.0 if wdt == torch.int8 else 448.0
    scale = w.abs().amax(1).clamp(min=1e-8) / qmax
    wq = (w / scale[:, None]).round().clamp(-127, 127) if wdt == torch.int8 else w / scale[:, None]
    wq = wq.to(wdt)
    b = torch.randn(N, device="cuda").to(dt)
    res = torch.randn(1, N, device="cuda").to(dt) if opts.get("res") else None
    ln = (1 + 0.1 * torch.randn(K, device="cuda").to(dt), 0.1 * torch.randn(K, device="cuda").to(dt), 1e-5) \
        if opts.get("ln") else None
    alpha, beta = opts.get("alpha", 1.0), opts.get("beta", 1.0)
    outs = []
    for path in ("0", "1"):
        monkeypatch.setenv("CUTE_KERNELS_GEMV_SM90", path)
        kv = None
        if opts.get("kv"):
            kc = torch.randn(1, N // 3 // 64, 32, 64, device="cuda").to(dt)
            kv = (kc, torch.randn(kc.shape, device="cuda").to(dt), torch.tensor([7], device="cuda"))
        out = torch.full((1, N), float("nan"), device="cuda", dtype=dt)
        if path == "1":
            assert gemv_sm90_applies(x, wq, out, b, res, ln, scale, None, kv)
        skinny_gemm(x, wq, b, opts.get("act"), res, out=out, alpha=alpha, beta=beta, ln=ln, kv=kv, w_scale=scale)
        outs.append(out.float())
        if kv is not None and path == "1":
            C, H = N // 3, kv[0].shape[1]
            assert torch.equal(kv[0][0, :, 7], out[0, C:2 * C].view(H, 64))
            assert torch.equal(kv[1][0, :, 7], out[0, 2 * C:].view(H, 64))
    xr = F.layer_norm(x.float(), (K,), ln[0].float(), ln[1].float(), 1e-5).to(dt).float() if ln else x.float()
    ref = apply_activation(alpha * (xr @ (wq.float() * scale[:, None]).t()) + b.float(), opts.get("act"))
    if res is not None:
        ref = ref + beta * res.float()
    e_triton = (outs[0] - ref).abs().max().item()
    assert torch.isfinite(outs[1]).all()
    assert (outs[1] - ref).abs().max().item() <= 2 * e_triton + 1e-6


SWAP_CFGS = {
    "128x96c21": GemmConfig(128, 96, 2, 1, swap_ab=True),
    "128x160c12pp": GemmConfig(128, 160, 1, 2, pingpong=True, swap_ab=True),
    "128x64c11": GemmConfig(128, 64, 1, 1, swap_ab=True),
    "128x256c21": GemmConfig(128, 256, 2, 1, swap_ab=True),
    "128x96c21s3": GemmConfig(128, 96, 2, 1, split_k=3, swap_ab=True),
    "128x144c21": GemmConfig(128, 144, 2, 1, swap_ab=True),  # 16-column slabs
    "128x176c12": GemmConfig(128, 176, 1, 2, swap_ab=True),
    "128x88c21": GemmConfig(128, 88, 2, 1, swap_ab=True),  # 8-column slabs (stmatrix x2)
    "128x232c12": GemmConfig(128, 232, 1, 2, swap_ab=True),  # 8-column slabs
    "64x104c12": GemmConfig(64, 104, 1, 2, swap_ab=True),  # 8-column slabs
    "128x112c12pp": GemmConfig(128, 112, 1, 2, pingpong=True, swap_ab=True),
    # wide weights at short K (heuristics.vocab_pingpong_config): ping-pong, widths of 8 mod 16
    "128x184c12pp": GemmConfig(128, 184, 1, 2, pingpong=True, swap_ab=True),
    "128x168c21pp": GemmConfig(128, 168, 2, 1, pingpong=True, swap_ab=True),
    # one wave in 4 x 1 at short K (heuristics.wave_swap_c41_config)
    "128x112c41": GemmConfig(128, 112, 4, 1, swap_ab=True),
    "128x136c41": GemmConfig(128, 136, 4, 1, swap_ab=True),
    # 256-row tiles (heuristics.swap_256_config), 16-bit inputs only
    "256x160c21": GemmConfig(256, 160, 2, 1, swap_ab=True),
    "256x144c12": GemmConfig(256, 144, 1, 2, swap_ab=True),  # 16-column slabs
    "256x96c21s2": GemmConfig(256, 96, 2, 1, split_k=2, swap_ab=True),
    # 64-row tiles, few tokens (heuristics.narrow_swap_config)
    "64x16c11": GemmConfig(64, 16, 1, 1, swap_ab=True),
    "64x16c11s4": GemmConfig(64, 16, 1, 1, split_k=4, swap_ab=True),
    "64x48c12": GemmConfig(64, 48, 1, 2, swap_ab=True),
    "64x112c41": GemmConfig(64, 112, 4, 1, swap_ab=True),
    "64x208c12": GemmConfig(64, 208, 1, 2, swap_ab=True),
    # deep A/B rings (heuristics.deep_ring): 12 and 16 stages
    "64x32c12d12": GemmConfig(64, 32, 1, 2, swap_ab=True, stages=12),
    "64x16c11s3d16": GemmConfig(64, 16, 1, 1, split_k=3, swap_ab=True, stages=16),
    # 8-CTA clusters (the weight tile multicast to 2 token tiles, each token tile to 4 weight tiles)
    "64x56c42d12": GemmConfig(64, 56, 4, 2, swap_ab=True, stages=12),
    # the whole tile's slabs staged at once (whole_tile_epi)
    "128x104c41W": GemmConfig(128, 104, 4, 1, swap_ab=True, whole_tile_epi=True),
    "128x152c21s3W": GemmConfig(128, 152, 2, 1, split_k=3, swap_ab=True, whole_tile_epi=True),
    "64x112c12W": GemmConfig(64, 112, 1, 2, swap_ab=True, whole_tile_epi=True),
    "128x88c21R": GemmConfig(128, 88, 2, 1, swap_ab=True, whole_tile_epi=False),  # 8-column slabs through the ring
    "128x80c41": GemmConfig(128, 80, 4, 1, swap_ab=True),  # WAVE_SWAP_NARROW on 1024-row weights
    # one wave in 4 x 1 at long K (heuristics.long_k_c41_config): 256-row weight tiles too
    "256x88c41": GemmConfig(256, 88, 4, 1, swap_ab=True),  # 8-column slabs
    "256x136c41": GemmConfig(256, 136, 4, 1, swap_ab=True),
    # the least-padding swap_ab tile from 1400 tokens at long K (heuristics.long_k_wave_swap_config)
    "256x152c21": GemmConfig(256, 152, 2, 1, swap_ab=True),  # 8-column slabs
    "128x248c21": GemmConfig(128, 248, 2, 1, swap_ab=True),  # 8-column slabs
    "128x200c21": GemmConfig(128, 200, 2, 1, swap_ab=True),  # 25 8-column slabs in 13 store groups (the last of one)
    "192x88c12": GemmConfig(192, 88, 1, 2, swap_ab=True),  # mid_m_swap_config at 351x6144x4096
    "128x160c21s3": GemmConfig(128, 160, 2, 1, split_k=3, swap_ab=True),  # the one-token-tile split
    # the long-K split in steps of 8 (heuristics.long_k_split_swap_config): 8-column slabs, split
    "128x104c21s3": GemmConfig(128, 104, 2, 1, split_k=3, swap_ab=True),
    # a sparse last wave split (heuristics.tail_split_config) under a ping-pong swap_ab pick
    "128x168c12Ps2": GemmConfig(128, 168, 1, 2, pingpong=True, split_k=2, swap_ab=True),
}


@pytest.mark.compile
@pytest.mark.parametrize("cfg_name", ["128x96c21", "128x160c12pp", "128x96c21s3", "128x144c21", "128x112c12pp",
                                      "64x16c11", "64x48c12", "64x208c12", "256x160c21", "256x144c12",
                                      "64x32c12d12", "64x16c11s3d16", "128x88c21", "128x232c12", "64x104c12",
                                      "128x104c41W", "128x152c21s3W", "128x88c21R", "64x56c42d12", "128x80c41",
                                      "256x88c41", "256x152c21", "128x248c21", "128x200c21", "192x88c12", "128x176c12",
                                      "128x160c21s3", "128x104c21s3", "128x168c12Ps2"])
def test_swap_ab_compiles_for_sm90a(tmp_path, cfg_name):
    """swap_ab: D^T leaves through transposed stmatrix and an M-major TMA store, without spills."""
    from cute_kernels.matmul.api import _compile, _kernel_view
    from cute_kernels.matmul.config import Epilogue

    cfg = SWAP_CFGS[cfg_name]
    a_dt, b_dt, am, bm, epi = _kernel_view(torch.bfloat16, torch.bfloat16, "k", "k", cfg,
                                           Epilogue(activation="gelu_tanh", alpha=True))
    _compile(a_dt, b_dt, torch.bfloat16, am, bm, cfg, epi, "Float32", keep_dir=str(tmp_path))
    ptx = open(glob.glob(str(tmp_path / "*.ptx"))[0]).read()
    # 8-column slabs (widths of 8 mod 16) store with x2: x4's footprint is 16 columns
    assert f"stmatrix.sync.aligned.m8n8.{'x2' if cfg.tile_n % 16 else 'x4'}.trans" in ptx
    report = _ptxas_report(glob.glob(str(tmp_path / "*.ptx"))[0])
    if report:
        spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
        assert spills and all(s == ("0", "0") for s in spills), report


def test_wide_decode_tiles_rule(monkeypatch):
    """One row on a weight of more than 4096 rows runs the 64-row swap_ab tiles, not the skinny
    GEMV, and a norm before such a product its own launch; narrower weights, biases (the tiles'
    epilogue cannot take them) and short K keep the GEMV; WIDE_DECODE_TILES off restores both."""
    from cute_kernels.matmul import heuristics
    from cute_kernels.matmul.api import norm_prologue_fits
    from cute_kernels.matmul.heuristics import skinny_gemv

    assert not skinny_gemv(1, 8192, 2048, True) and not skinny_gemv(1, 50257, 768, True)
    assert skinny_gemv(1, 8192, 2048, False) and skinny_gemv(1, 4096, 14336, True) and skinny_gemv(1, 50257, 512, True)
    bf16 = torch.bfloat16
    for m in (1, 2, 8):
        assert not norm_prologue_fits(m, 128256, 4096, bf16) and not norm_prologue_fits(m, 50257, 1600, bf16)
        assert norm_prologue_fits(m, 4800, 1600, bf16, bias=True)  # GPT-2's c_attn: biased, fused
        assert norm_prologue_fits(m, 4096, 4096, bf16)
    assert norm_prologue_fits(1, 8192, 4096, torch.float32)  # fp32 outputs: no swap_ab tiles, the GEMV
    monkeypatch.setattr(heuristics, "WIDE_DECODE_TILES", False)
    assert skinny_gemv(1, 8192, 2048, True) and norm_prologue_fits(8, 128256, 4096, bf16)
    assert not skinny_gemv(2, 8192, 2048, True)  # 2-8 rows: the tiles either way


def test_swap_256_picks():
    """256-row swap_ab tiles where they fill whole waves that 128-row tiles leave sparse
    (16-bit, 640-4096 rows, N >= 1024), at least 1% under the pick they replace by the model;
    not at equal cost, not with more than four waves, never for 8-bit inputs."""
    from cute_kernels.matmul import api
    from cute_kernels.matmul.heuristics import pick_cost, swap_256_config

    def pick(m, n, k, in_bytes=2):
        c = api._pick_config(m, n, k, in_bytes, in_bytes == 2, None, True)
        return (c.tile_m, c.tile_n, c.cluster_m, c.cluster_n, c.swap_ab)

    # 14 x 9 tiles: one wave of 63 clusters (at long K the least-padding width, 152, then replaces 160)
    assert swap_256_config(1355, 3584, 3584, GemmConfig(128, 160, 1, 2, pingpong=True)) == \
        GemmConfig(256, 160, 2, 1, swap_ab=True)
    assert pick(1355, 3584, 3584) == (256, 152, 2, 1, True)
    assert pick(1065, 4096, 14336) == (256, 136, 2, 1, True)
    assert pick(1931, 3584, 3584)[0] == 128  # 256 x 112 costs what 128 x 224 swapped does
    # The rule ranks widths in steps of 16 (256 x 144 here); the pick then takes the width in
    # steps of 8 (swap_256_fine_config): 6 token tiles of 136, as 144 pads to.
    assert swap_256_config(781, 4800, 1600, GemmConfig(128, 128, 2, 1)).tile_n == 144
    assert pick(781, 4800, 1600)[:2] == (256, 136)
    assert pick(1291, 6144, 4096) == (256, 120, 2, 1, True)  # nvjet's 256x120 there
    assert pick(1809, 768, 3072)[0] != 256 and pick(300, 4096, 4096)[0] != 256 and pick(8192, 4096, 4096)[1] != 144
    assert pick(1355, 3584, 3584, in_bytes=1)[0] != 256
    assert swap_256_config(1211, 128256, 8192, api._pick_config(1211, 128256, 8192, 2, True, None, True)) is None
    cur = GemmConfig(128, 160, 1, 2, pingpong=True)
    new = swap_256_config(1355, 3584, 3584, cur)
    assert pick_cost(1355, 3584, 3584, new) < 0.99 * pick_cost(1355, 3584, 3584, cur)
    with pytest.raises(ValueError, match="256-row swap_ab"):
        GemmConfig(256, 160, 2, 1, swap_ab=True).validate(in_bytes=1)


def test_swap_256_fine_widths():
    """A 256-row swap_ab pick whose width came in steps of 16 takes the best width in steps of 8
    in the same cluster; 4 x 1, split, ping-pong and 128-row picks, widths already of 8 mod 16
    and tokens outside SWAP_256_M are left alone."""
    from cute_kernels.matmul.heuristics import swap_256_fine_config

    assert swap_256_fine_config(1291, 6144, GemmConfig(256, 128, 2, 1, swap_ab=True)) == \
        GemmConfig(256, 120, 2, 1, swap_ab=True)
    assert swap_256_fine_config(3509, 3840, GemmConfig(256, 144, 1, 2, swap_ab=True)) == \
        GemmConfig(256, 136, 1, 2, swap_ab=True)
    for cur in (GemmConfig(256, 168, 4, 1, swap_ab=True), GemmConfig(256, 128, 2, 1, split_k=2, swap_ab=True),
                GemmConfig(128, 128, 2, 1, swap_ab=True), GemmConfig(256, 152, 2, 1, swap_ab=True),
                GemmConfig(128, 256, 2, 1)):
        assert swap_256_fine_config(1291, 6144, cur) is None
    assert swap_256_fine_config(4472, 768, GemmConfig(256, 128, 1, 2, swap_ab=True)) is None
    # Already the best in steps of 8: nothing to change.
    assert swap_256_fine_config(1291, 6144, GemmConfig(256, 120, 2, 1, swap_ab=True)) is None


def test_long_k_split_swap_picks():
    """At 65-256 tokens and K >= 24576 one 128-row swap_ab token tile (the tokens in steps of 8)
    split over one wave of 2 x 1 clusters replaces an unsplit pick the model rates 1 / 0.9x as
    costly; not within that margin, at shorter K, outside the token range, over a split pick, or
    where split-K is not allowed (split=False)."""
    from cute_kernels.matmul import api
    from cute_kernels.matmul.heuristics import long_k_split_swap_config

    assert long_k_split_swap_config(221, 5120, 27648, GemmConfig(128, 112, 1, 2, swap_ab=True)) == \
        GemmConfig(128, 224, 2, 1, split_k=3, swap_ab=True)
    assert long_k_split_swap_config(159, 8192, 28672, GemmConfig(128, 96, 1, 2, swap_ab=True)) == \
        GemmConfig(128, 160, 2, 1, split_k=2, swap_ab=True)
    assert long_k_split_swap_config(98, 5120, 27648, GemmConfig(64, 112, 1, 1, swap_ab=True, stages=9)) == \
        GemmConfig(128, 104, 2, 1, split_k=3, swap_ab=True)
    # 128 x 184 over 2 splits against 128 x 96 unsplit: 0.96 of its work, inside the margin.
    assert long_k_split_swap_config(177, 8192, 28672, GemmConfig(128, 96, 1, 2, swap_ab=True)) is None
    assert long_k_split_swap_config(221, 5120, 18944, GemmConfig(128, 112, 1, 2, swap_ab=True)) is None
    assert long_k_split_swap_config(300, 5120, 27648, GemmConfig(128, 112, 1, 2, swap_ab=True)) is None
    assert long_k_split_swap_config(64, 5120, 27648, GemmConfig(64, 64, 1, 1, swap_ab=True)) is None
    assert long_k_split_swap_config(221, 5120, 27648, GemmConfig(128, 112, 2, 1, split_k=2, swap_ab=True)) is None

    def pick(m, n, k, split=True):
        return api._pick_config(m, n, k, 2, split, None, True)

    assert pick(221, 5120, 27648) == GemmConfig(128, 224, 2, 1, split_k=3, swap_ab=True)
    assert pick(221, 5120, 27648, split=False).split_k == 1
    assert pick(238, 4096, 14336).split_k == 1


def test_tail_split_picks():
    """A 128-row swap_ab pick of 1-6 waves whose last wave holds at most half the resident
    clusters splits that wave over K, min(4, clusters a wave / tail clusters) ways; not a
    64-row pick, a fuller or a lone wave, a split pick, nor where split-K is not allowed."""
    from cute_kernels.matmul import api
    from cute_kernels.matmul.heuristics import tail_split_config

    # 57344 / 128 = 448 tiles = 224 clusters of 2: 3 waves of 66 and 26 (0.39 of a wave).
    assert tail_split_config(149, 57344, 8192, GemmConfig(128, 160, 2, 1, swap_ab=True)) == \
        GemmConfig(128, 160, 2, 1, split_k=2, swap_ab=True)
    # 523 tokens in three 176-wide tiles: 224 x 3 tiles = 336 clusters, 5 waves and 6: 4 splits (the cap).
    assert tail_split_config(523, 28672, 4096, GemmConfig(128, 176, 2, 1, swap_ab=True)) == \
        GemmConfig(128, 176, 2, 1, split_k=4, swap_ab=True)
    assert tail_split_config(119, 28672, 4096, GemmConfig(64, 128, 1, 1, swap_ab=True)) is None
    assert tail_split_config(212, 28672, 4096, GemmConfig(128, 224, 2, 1, swap_ab=True)) is None  # 1.7 waves
    assert tail_split_config(158, 16384, 2048, GemmConfig(128, 160, 2, 1, swap_ab=True)) is None  # one wave
    assert tail_split_config(149, 57344, 8192, GemmConfig(128, 160, 2, 1, split_k=2, swap_ab=True)) is None
    assert tail_split_config(4400, 3072, 2048, GemmConfig(128, 192, 2, 1, pingpong=True)) is None  # unswapped

    def pick(m, n, k, split=True):
        return api._pick_config(m, n, k, 2, split, None, True)

    assert pick(149, 57344, 8192).split_k == 2
    assert pick(149, 57344, 8192, split=False).split_k == 1


def test_few_tokens_192_picks():
    """192-row swap_ab tiles at 129-512 tokens on a wide weight whose rows need not divide by 192
    (Qwen2.5-7B's 37888-row gate_up: 198 weight tiles, two token tiles in 1 x 2 = three whole
    waves), only where they fill their last wave, the pick leaves its own sparse and the model
    rates them under the margin; not past 384 tokens (two 192-wide token tiles), nor on weights
    whose picks already run whole waves (152064 rows) or whose 192-row grid leaves a sparse wave
    (57344 rows)."""
    from cute_kernels.matmul import api
    from cute_kernels.matmul.heuristics import few_tokens_192_config

    def pick(m, n, k, split=True):
        return api._pick_config(m, n, k, 2, split, None, True)

    assert pick(153, 37888, 3584) == GemmConfig(192, 80, 1, 2, swap_ab=True)
    assert pick(210, 37888, 3584) == GemmConfig(192, 112, 1, 2, swap_ab=True)
    assert pick(210, 37888, 3584, split=False) == GemmConfig(192, 112, 1, 2, swap_ab=True)
    assert pick(400, 37888, 3584).tile_m == 128
    assert pick(128, 37888, 3584).tile_m == 128
    assert few_tokens_192_config(150, 152064, 3584, GemmConfig(128, 160, 2, 1, swap_ab=True)) is None
    assert few_tokens_192_config(149, 57344, 8192, GemmConfig(128, 160, 2, 1, swap_ab=True)) is None
    assert few_tokens_192_config(153, 8192, 3584, GemmConfig(128, 160, 2, 1, swap_ab=True)) is None


def test_large_m_swap_256_picks():
    """Above 2048 tokens at K >= 3584 on weights of 4096+ rows: the 256-row swap_ab tile in 1 x 2
    of the fewest waves x width, where it pads at most as much as a cooperative pick (0.99x a
    ping-pong one); not at short K, 2048 tokens or fewer, narrow weights or split picks."""
    from cute_kernels.matmul import api
    from cute_kernels.matmul.heuristics import large_m_swap_256_config

    def pick(m, n, k):
        return api._pick_config(m, n, k, 2, True, None, True)

    assert pick(3712, 10240, 8192) == GemmConfig(256, 144, 1, 2, swap_ab=True)  # was 128 x 160 in 2 x 1
    assert pick(14707, 5120, 5120) == GemmConfig(256, 160, 1, 2, swap_ab=True)  # cuBLAS's nvjet 256x160 1x2
    # 128 x 256 in 2 x 1 and 256 x 128 in 1 x 2: the same padded area, the cooperative pick gives way.
    assert large_m_swap_256_config(5600, 6144, 4096, GemmConfig(128, 256, 2, 1)) == \
        GemmConfig(256, 128, 1, 2, swap_ab=True)
    # 128 x 192 ping-pong at the same area keeps its pick (it hides the epilogue).
    assert large_m_swap_256_config(4567, 4096, 4096, GemmConfig(128, 192, 2, 1, pingpong=True)) is None
    assert large_m_swap_256_config(4346, 5120, 1280, GemmConfig(128, 192, 2, 1, pingpong=True)) is None  # K
    assert large_m_swap_256_config(2048, 10240, 8192, GemmConfig(128, 160, 2, 1)) is None  # tokens
    assert large_m_swap_256_config(15606, 1280, 5120, GemmConfig(128, 240, 2, 1, swap_ab=True)) is None  # N
    assert large_m_swap_256_config(3712, 10240, 8192, GemmConfig(128, 160, 2, 1, split_k=2)) is None
    # 256 x 168 would pad 1.06x the 256 x 136 2 x 1 pick's area.
    assert large_m_swap_256_config(4481, 7168, 5120, GemmConfig(256, 136, 2, 1, swap_ab=True)) is None


def test_odd_narrow_pair_picks():
    """GPT-2 XL's 1600-row down projection (13 weight tiles) at 1400-4096 tokens, K >= 4096: 128-row
    swap_ab tiles in 1 x 2 of the least padded area over unswapped ping-pong picks in 1 x 1 / 2 x 1;
    not over 2 x 2 picks, even tile counts, short K or past 4096 tokens."""
    from cute_kernels.matmul import api
    from cute_kernels.matmul.heuristics import odd_narrow_pair_config

    pp = GemmConfig(128, 192, 2, 1, pingpong=True)
    assert api._pick_config(1718, 1600, 6400, 2, True, None, True) == GemmConfig(128, 176, 1, 2, swap_ab=True)
    assert odd_narrow_pair_config(3626, 1600, 6400, GemmConfig(128, 192, 1, 1, pingpong=True)) == \
        GemmConfig(128, 184, 1, 2, swap_ab=True)
    assert odd_narrow_pair_config(1475, 1600, 6400, GemmConfig(128, 160, 2, 2, pingpong=True)) is None
    assert odd_narrow_pair_config(1718, 1280, 5120, pp) is None  # 10 weight tiles
    assert odd_narrow_pair_config(1718, 1600, 1600, pp) is None  # K
    assert odd_narrow_pair_config(4988, 1600, 6400, pp) is None  # tokens
    assert odd_narrow_pair_config(1718, 1600, 6400, GemmConfig(128, 192, 2, 1)) is None  # cooperative


def test_wave_swap_picks():
    """One wave of 128-row swap_ab tiles in 2 x 1 clusters on a narrow weight (768 <= N < 2048)
    at 1400-4096 tokens, the narrowest width in steps of 32 that fits; with K >= 4096 under
    2000 tokens only where the pick it replaces takes two waves or more; 16-bit only. Below
    1400 tokens on weights of up to 1024 rows (4 x 1 clusters at 1024), and 256-row tiles in
    1 x 2 above 4096."""
    from cute_kernels.matmul import api
    from cute_kernels.matmul.heuristics import config_waves, wave_swap_config

    def pick(m, n, k, in_bytes=2):
        return api._pick_config(m, n, k, in_bytes, in_bytes == 2, None, True)

    assert pick(2081, 768, 768) == GemmConfig(128, 96, 2, 1, swap_ab=True)  # 6 x 22 tiles: 132 CTAs
    assert pick(2900, 1024, 4096) == GemmConfig(128, 192, 2, 1, swap_ab=True)
    assert pick(2081, 1600, 1600) == GemmConfig(128, 256, 2, 1, swap_ab=True)  # 14 x 9 (224: 14 x 10 = 140)
    for m, n, k in ((2081, 768, 768), (3444, 1024, 1024), (1500, 1600, 6400), (4096, 768, 3072)):
        cfg = pick(m, n, k)
        if cfg.swap_ab and cfg.tile_m == 128:
            assert config_waves(cfg, m, n) == 1 and cfg.tile_n % 32 == 0 and cfg.cluster_mn == (2, 1)
    assert wave_swap_config(1300, 1600, 1600, pick(1300, 1600, 1600)) is None  # under 1400 tokens
    assert wave_swap_config(2081, 2304, 768, pick(2081, 2304, 768)) is None  # N >= 2048: not a narrow weight
    one_wave = GemmConfig(128, 128, 2, 2, pingpong=True)
    assert wave_swap_config(1444, 1280, 5120, one_wave) is None  # long K, few tokens, a one-wave pick
    two_waves = GemmConfig(128, 96, 1, 1)
    assert config_waves(two_waves, 1831, 1600) == 2
    assert wave_swap_config(1831, 1600, 6400, two_waves) == GemmConfig(128, 224, 2, 1, swap_ab=True)
    assert pick(2081, 768, 768, in_bytes=1) != GemmConfig(128, 96, 2, 1, swap_ab=True)  # 16-bit only
    # Weights of up to 1024 rows from 700 tokens (WAVE_SWAP_NARROW): steps of 16 from 64, over
    # picks in clusters of at most 2 CTAs only; 1024 rows (weight tiles in fours): 4 x 1 clusters
    # where one wave holds them, over any 128-row pick.
    assert pick(1313, 768, 768) == GemmConfig(128, 64, 2, 1, swap_ab=True)  # over unswapped 128 x 96
    assert pick(1313, 1024, 1024) == GemmConfig(128, 96, 4, 1, swap_ab=True)
    assert pick(861, 1024, 4096) == GemmConfig(128, 64, 4, 1, swap_ab=True)  # over split-K
    assert wave_swap_config(1025, 1024, 1024, GemmConfig(128, 96, 1, 1)) == GemmConfig(128, 80, 4, 1, swap_ab=True)
    assert wave_swap_config(1163, 1024, 4096, GemmConfig(128, 96, 2, 2)) == GemmConfig(128, 80, 4, 1, swap_ab=True)
    assert wave_swap_config(1218, 1024, 1024, GemmConfig(128, 96, 2, 2)) == GemmConfig(128, 96, 4, 1, swap_ab=True)
    assert wave_swap_config(880, 1024, 1024, GemmConfig(64, 128, 4, 1)) is None  # a 64-row multicast pick stays
    assert wave_swap_config(1218, 768, 768, GemmConfig(128, 96, 2, 2)) is None  # a 2 x 2 pick stays (6 weight tiles)
    assert wave_swap_config(650, 1024, 1024, GemmConfig(128, 96, 1, 1)) is None  # under 700 tokens
    assert wave_swap_config(1025, 1280, 1280, GemmConfig(128, 96, 1, 1)) is None  # 1280 rows: not in the band
    # Above 4096 tokens, up to 7680: one wave of 256-row swap_ab tiles in 1 x 2 (widths up to 192).
    assert pick(5020, 1024, 4096) == GemmConfig(256, 160, 1, 2, swap_ab=True)
    assert pick(5938, 768, 3072) == GemmConfig(256, 144, 1, 2, swap_ab=True)
    assert wave_swap_config(4190, 768, 3072, GemmConfig(128, 192, 1, 2, pingpong=True)) is None  # a 1 x 2 pick stays
    assert wave_swap_config(6504, 1024, 1024, GemmConfig(128, 160, 2, 1)) is None  # would need 208 columns
    assert wave_swap_config(8192, 768, 3072, GemmConfig(128, 192, 2, 1)) is None  # past the range measured
    # The long-K guard (K >= 4096 under 2000 tokens: only over a pick of two or more waves) holds
    # only for an odd count of 128-row weight tiles (1600 rows: 13).
    assert wave_swap_config(1875, 1024, 4096, GemmConfig(128, 128, 2, 1, pingpong=True)) == \
        GemmConfig(128, 128, 2, 1, swap_ab=True)
    assert wave_swap_config(1573, 1600, 6400, GemmConfig(128, 160, 1, 2, pingpong=True)) is None


def test_vocab_pingpong_picks():
    """Ping-pong 128-row swap_ab tiles on weights of 16384+ rows at K <= 2048 from 256 tokens:
    1 x 2 clusters (an even token-tile count) up to 1150 tokens, 2 x 1 above; the width of fewest
    waves x width / efficiency in steps of 8 up to 192; and what dispatch runs there."""
    from cute_kernels.matmul import api
    from cute_kernels.matmul.heuristics import vocab_pingpong_config

    def pick(m, n, k):
        c = vocab_pingpong_config(m, n, k)
        return c and (c.tile_m, c.tile_n, c.cluster_m, c.cluster_n, c.pingpong, c.swap_ab)

    assert pick(378, 16384, 2048) == (128, 192, 1, 2, True, True)  # two token tiles, one wave
    assert pick(1099, 50257, 1600) == (128, 184, 1, 2, True, True)  # six token tiles
    assert pick(730, 128256, 2048) == (128, 184, 1, 2, True, True)
    assert pick(2699, 128256, 2048) == (128, 184, 2, 1, True, True)  # above 1150: weight tiles paired
    assert pick(5817, 16384, 2048) == (128, 168, 2, 1, True, True)
    for m in range(256, 1151, 7):
        c = vocab_pingpong_config(m, 50257, 768)
        assert c.cluster_mn == (1, 2) and math.ceil(m / c.tile_n) % 2 == 0
    # 129-255 tokens on 32000+ rows: two ping-pong token tiles of the covering width in 1 x 2
    assert pick(255, 50257, 1600) == (128, 128, 1, 2, True, True)
    assert pick(171, 50257, 768) == (128, 88, 1, 2, True, True)
    assert pick(129, 128256, 2048) == (128, 72, 1, 2, True, True)
    assert pick(240, 16384, 2048) is None  # narrower than 32000 rows below 256 tokens
    assert pick(128, 50257, 768) is None  # one token tile
    assert pick(8193, 16384, 2048) is None  # past the range measured
    assert pick(700, 14336, 2048) is None  # narrower weights
    assert pick(700, 128256, 4096) is None  # long K
    assert pick(700, 50257, 512) is None
    api.clear_dispatch_caches()
    assert api._pick_config(1099, 50257, 1600, 2, True, None, True, 2) == vocab_pingpong_config(1099, 50257, 1600)
    assert not api._pick_config(1099, 50257, 1600, 1, False, None, True, 2).pingpong or \
        not api._pick_config(1099, 50257, 1600, 1, False, None, True, 2).swap_ab  # 16-bit only


def test_narrow_tail_split_picks():
    """Few tokens on a weight of one to two waves of 64-row tiles whose second wave fills at most
    a quarter of the SMs: that wave's tiles split over K as many ways as the SMs hold."""
    from cute_kernels.matmul.heuristics import narrow_swap_config

    # Llama 3 70B's qkv: 160 weight tiles, 28 in the second wave -> 4 splits.
    for m in (2, 6, 30, 50, 120):
        c = narrow_swap_config(m, 10240, 8192)
        assert (c.tile_m, c.split_k, c.swap_ab) == (64, 4, True), m
    assert narrow_swap_config(15, 28672, 4096).split_k == 1  # a last wave of 52 tiles: no split
    assert narrow_swap_config(40, 128256, 4096).split_k == 1  # many waves: no split
    assert narrow_swap_config(6, 8192, 8192).split_k == 1  # one wave exactly


def test_wide_long_k_swap_replaces_swapped_picks():
    """The wide long-K rule replaces a swap_ab pick of more token tiles where its own tiles are
    ping-pong, or of as many tiles padding more tokens; not three 144-wide tiles with two
    cooperative 216-wide ones."""
    from cute_kernels.matmul.config import GemmConfig
    from cute_kernels.matmul.heuristics import wide_long_k_swap_config

    three = GemmConfig(128, 112, 2, 1, swap_ab=True)
    c = wide_long_k_swap_config(335, 152064, 3584, three)
    assert (c.tile_n, c.cluster_mn, c.pingpong, c.swap_ab) == (168, (1, 2), True, True)
    wider = GemmConfig(128, 160, 1, 2, swap_ab=True)  # two tiles, 320 tokens for 290
    assert wide_long_k_swap_config(290, 55296, 5120, wider).tile_n == 152
    assert wide_long_k_swap_config(290, 55296, 5120, GemmConfig(128, 152, 1, 2, swap_ab=True)) is None
    assert wide_long_k_swap_config(418, 128256, 4096, GemmConfig(128, 144, 2, 1, swap_ab=True)) is None


def test_int8_mid_m_fill_and_lm_head_picks():
    """int8: the mid-M fill rule in widths of 16 over 128-row picks (not over 64-row swap_ab ones),
    and 64-row swap_ab tiles for up to 32 tokens on a wide weight at K = 768."""
    from cute_kernels.matmul import api
    from cute_kernels.matmul.config import GemmConfig
    from cute_kernels.matmul.heuristics import mid_m_fill_config

    api.clear_dispatch_caches()
    pick = lambda m, n, k: api._pick_config(m, n, k, 1, False, None, True, 4, integer=True)  # noqa: E731
    c = pick(547, 3072, 2048)
    assert (c.tile_m, c.tile_n, c.cluster_mn, c.swap_ab) == (128, 112, (4, 1), True)
    assert c.tile_n % 16 == 0
    assert mid_m_fill_config(352, 3072, 2048, GemmConfig(64, 176, 1, 2, swap_ab=True), step=16) is None
    for m in (2, 13, 30):
        c = pick(m, 50257, 768)
        assert (c.tile_m, c.swap_ab) == (64, True), m
    assert not pick(57, 50257, 1024).swap_ab  # above 32 tokens the unswapped pick stays


def test_fp8_swap_picks():
    """fp8 per-row without a bias: a one-wave unswapped 128 x 128 1 x 2 ping-pong pick at
    257-1023 tokens gives way to as many 128-row swap_ab token tiles, and at long K the one wave
    of 4 x 1 clusters runs in its 128-row form only; unswapped 128 x 96 picks stay."""
    from cute_kernels.matmul import api

    api.clear_dispatch_caches()
    pick = lambda m, n, k: api._pick_config(m, n, k, 1, False, None, True, 2)  # noqa: E731
    assert pick(340, 4608, 3584) == GemmConfig(128, 120, 4, 1, swap_ab=True)
    assert pick(282, 4800, 1600) == GemmConfig(128, 96, 2, 1, swap_ab=True)
    assert pick(616, 3072, 1024) == GemmConfig(128, 128, 4, 1, swap_ab=True)
    assert pick(1309, 1024, 4096) == GemmConfig(128, 88, 4, 1, swap_ab=True)
    assert not pick(486, 3072, 2048).swap_ab  # a 128 x 96 cooperative pick
    assert pick(337, 10240, 8192).tile_m == 128  # no 256-row 4 x 1 form for fp8
    assert not api._pick_config(340, 4608, 3584, 1, False, None, False, 2).swap_ab  # a bias: no swap_ab


def test_qkv_192_row_picks():
    """On a weight whose rows divide by 192 at long K, 385-768 tokens run one wave of 192-row
    swap_ab tiles in 1 x 2 clusters (four token tiles of at most 192) where the 256-row 4 x 1
    tiles ran before; above 768 tokens the 256-row tiles stay."""
    from cute_kernels.matmul import api

    api.clear_dispatch_caches()
    for m, w in ((385, 104), (610, 160), (705, 184), (768, 192)):
        cfg = api._pick_config(m, 6144, 4096, 2, True, None, True, 2)
        assert cfg == GemmConfig(192, w, 1, 2, swap_ab=True), (m, cfg)
        cfg.validate()
    cfg = api._pick_config(833, 6144, 4096, 2, True, None, True, 2)
    assert (cfg.tile_m, cfg.cluster_mn) == (256, (4, 1))
    cfg = api._pick_config(435, 10240, 8192, 2, True, None, True, 2)  # 10240 rows: not 192-divisible
    assert cfg.tile_m != 192


def test_192_row_picks_stay_valid():
    """The one-wave 192-row form is taken only where its width fits a three-warpgroup tile: on
    192-divisible weights at 257-1399 tokens every 16-bit pick validates (a 192 x 208 pick at
    806x4416x4096 would not build)."""
    from cute_kernels.matmul import api

    for n in (4416, 6144, 9216, 12288, 24576):
        for m in range(257, 1400, 31):
            api.clear_dispatch_caches()
            api._pick_config(m, n, 4096, 2, True, None, True, 2).validate()


def test_vocab_few_tokens_picks():
    """65-128 tokens on a 32000+ row weight: one 128-row swap_ab token tile of the covering width in
    2 x 1 clusters, for 16-bit inputs and fp8 (swappable); not below 65 tokens or narrower weights."""
    from cute_kernels.matmul import api
    from cute_kernels.matmul.heuristics import vocab_few_tokens_config

    assert vocab_few_tokens_config(100, 128256, 2048) == GemmConfig(128, 104, 2, 1, swap_ab=True)
    assert vocab_few_tokens_config(128, 32000, 4096).tile_n == 128
    assert vocab_few_tokens_config(64, 128256, 2048) is None
    assert vocab_few_tokens_config(100, 28672, 4096) is None
    api.clear_dispatch_caches()
    for ib in (2, 1):
        assert api._pick_config(100, 128256, 2048, ib, ib == 2, None, True, 2) == GemmConfig(128, 104, 2, 1, swap_ab=True)


def test_wave_swap_c41_picks():
    """One full wave of 128-row swap_ab tiles in 4 x 1 clusters on 2048-8192-row weights whose
    128-row tiles come in fours, at K <= 2048, over 128-row picks other than unswapped
    cooperative 128 x 96: the most token tiles the wave holds, the narrowest width that covers M."""
    from cute_kernels.matmul import api
    from cute_kernels.matmul.heuristics import wave_swap_c41_config

    pp = GemmConfig(128, 128, 1, 2, pingpong=True, raster_m=False)

    def pick(m, n, k, current=pp):
        c = wave_swap_c41_config(m, n, k, current)
        return c and (c.tile_m, c.tile_n, c.cluster_m, c.cluster_n, c.swap_ab)

    assert pick(330, 5120, 1280) == (128, 112, 4, 1, True)  # 40 weight tiles x 3 token tiles: 30 clusters
    assert pick(260, 5120, 1280) == (128, 88, 4, 1, True)  # cuBLAS's nvjet 128x88 4x1
    assert pick(641, 3072, 1024) == (128, 136, 4, 1, True)  # 24 weight tiles x 5
    assert pick(1188, 2048, 2048) == (128, 176, 4, 1, True)  # 16 x 7: 28 clusters
    assert pick(620, 4096, 1024) is None  # 8 x 3 = 24 clusters: the wave not full
    assert pick(330, 5120, 4096) is None  # long K
    assert pick(330, 3840, 1280) is None  # 30 weight tiles: not in fours
    assert pick(900, 5120, 1280) is None  # 300 columns a token tile
    assert pick(330, 5120, 1280, GemmConfig(64, 112, 1, 2, swap_ab=True)) is None  # 64-row picks stay
    assert pick(508, 3072, 1024, GemmConfig(128, 96, 2, 1)) is None  # so does unswapped 128 x 96
    assert pick(574, 3072, 1024, GemmConfig(256, 112, 2, 1, swap_ab=True)) is None
    api.clear_dispatch_caches()
    assert api._pick_config(330, 5120, 1280, 2, True, None, True, 2) == GemmConfig(128, 112, 4, 1, swap_ab=True)


def test_swap_one_wave_picks():
    """Where the costed swap_ab width takes two or more waves (16-bit, K >= 2048, up to 1024
    tokens), the narrowest width that runs in one wave without padding M more than 128-row tiles."""
    from cute_kernels.matmul.heuristics import swap_config

    def pick(m, n, k, in_bytes=2):
        c = swap_config(m, n, k, in_bytes=in_bytes)
        return c and (c.tile_m, c.tile_n, c.cluster_m, c.cluster_n, c.split_k)

    assert pick(330, 8192, 28672) == (128, 176, 1, 2, 1)  # 112 wide: 3 x 64 tiles, 1.45 waves
    assert pick(649, 4096, 4096) == (128, 176, 1, 2, 1)  # 96 wide: 7 x 32 tiles; 176: 4 x 32
    assert pick(325, 6144, 4096) == (128, 176, 1, 2, 1)
    assert pick(330, 8192, 28672, in_bytes=1)[1] != 176  # 8-bit inputs keep the costed width
    assert pick(436, 10240, 8192) == (128, 112, 1, 2, 1)  # no width fits one wave: unchanged
    assert pick(330, 5120, 1280) != (128, 176, 1, 2, 1)  # short K: unchanged


def test_large_m_pp192_picks():
    """A 128 x 128 ping-pong pick on a 3072+ row weight widens to 128 x 192 ping-pong (cluster and
    raster kept): 16-bit from 4096 tokens, or from 2048 in 2 x 1 clusters; fp8 from 2048 tokens.
    Not below, not swapped, cooperative or promoted, not for int8."""
    import dataclasses

    from cute_kernels.matmul import api
    from cute_kernels.matmul.heuristics import large_m_pp192_config

    pp = GemmConfig(128, 128, 2, 1, pingpong=True)
    pp12 = GemmConfig(128, 128, 1, 2, pingpong=True)
    wide = GemmConfig(128, 192, 2, 1, pingpong=True)
    assert large_m_pp192_config(7249, 3584, pp) == wide
    assert large_m_pp192_config(3250, 8192, pp) == wide  # 2 x 1 from 2048 tokens
    assert large_m_pp192_config(3250, 8192, pp12) is None  # 1 x 2 below 4096 tokens: lost
    assert large_m_pp192_config(7249, 3584, pp12) == GemmConfig(128, 192, 1, 2, pingpong=True)
    assert large_m_pp192_config(2000, 3584, pp) is None
    assert large_m_pp192_config(7249, 2048, pp) is None
    assert large_m_pp192_config(7249, 3584, GemmConfig(128, 128, 2, 1)) is None  # cooperative
    assert large_m_pp192_config(7249, 3584, GemmConfig(128, 128, 2, 1, pingpong=True, swap_ab=True)) is None
    assert large_m_pp192_config(2850, 4800, pp, in_bytes=1) == wide
    assert large_m_pp192_config(2000, 4800, pp, in_bytes=1) is None
    assert large_m_pp192_config(2850, 4800, dataclasses.replace(pp, promote=True), in_bytes=1) is None
    with pytest.raises(ValueError, match="in_bytes"):
        large_m_pp192_config(2850, 4800, pp, in_bytes=4)
    api.clear_dispatch_caches()
    assert api._pick_config(7249, 3584, 2048, 2, True, None, True, 2) == wide
    # at long K the least-padding swap_ab tile replaces the widened pick (long_k_wave_swap_config)
    assert api._pick_config(7249, 3584, 18944, 2, True, None, True, 2) == GemmConfig(128, 224, 2, 1, swap_ab=True)
    for m, n, k in ((2850, 4800, 1600), (12417, 4096, 1024), (5148, 5120, 5120)):
        assert api._pick_config(m, n, k, 1, False, None, False, 2).tile_mn == (128, 192)  # fp8
        assert api._pick_config(m, n, k, 1, False, None, False, 4, integer=True).tile_mn != (128, 192)  # int8
    # fp8's 128 x 256 cooperative 2 x 1 pick turns 128 x 192 ping-pong at K <= 8192 (not past it, not 16-bit)
    coop = GemmConfig(128, 256, 2, 1)
    assert large_m_pp192_config(8669, 7168, coop, in_bytes=1, k=5120) == GemmConfig(128, 192, 2, 1, pingpong=True)
    assert large_m_pp192_config(5528, 8192, coop, in_bytes=1, k=28672) is None
    assert large_m_pp192_config(8669, 7168, coop, in_bytes=1) is None  # K unknown
    assert large_m_pp192_config(8669, 7168, coop, in_bytes=2, k=5120) is None
    assert large_m_pp192_config(1900, 7168, coop, in_bytes=1, k=5120) is None  # under 2048 tokens
    assert large_m_pp192_config(15553, 1280, coop, in_bytes=1, k=5120) is None  # narrow weight
    assert large_m_pp192_config(8669, 7168, GemmConfig(128, 256, 1, 2), in_bytes=1, k=5120) is None
    assert large_m_pp192_config(4096, 4096, coop, in_bytes=1, k=4096) is None  # pads 1.125x the work
    assert large_m_pp192_config(8192, 8192, coop, in_bytes=1, k=8192) == GemmConfig(128, 192, 2, 1, pingpong=True)


def test_wide_long_k_swap_picks():
    """A wide weight (N >= 16384) at long K from 288 to 704 tokens runs ceil(M / 256) token tiles
    of 128-row swap_ab tiles, ping-pong up to 192 wide, 1 x 2 for an even tile count, else 2 x 1;
    over a swapped pick only of more tiles or more padding (test below); not at short K, narrow
    weights or outside the token range."""
    from cute_kernels.matmul import api
    from cute_kernels.matmul.heuristics import wide_long_k_swap_config

    coop = GemmConfig(128, 256, 1, 2)
    assert wide_long_k_swap_config(347, 152064, 5120, coop) == GemmConfig(128, 176, 1, 2, pingpong=True, swap_ab=True)
    assert wide_long_k_swap_config(459, 37888, 3584, coop) == GemmConfig(128, 232, 1, 2, swap_ab=True)
    assert wide_long_k_swap_config(627, 152064, 5120, coop) == GemmConfig(128, 216, 2, 1, swap_ab=True)
    assert wide_long_k_swap_config(576, 37888, 3584, coop) == GemmConfig(128, 192, 2, 1, pingpong=True, swap_ab=True)
    # one token tile more where it pads fewer waves x width (from 385 tokens, K <= 4096): three
    # 216-wide tiles on 28672 rows run 5.1 waves, four 160-wide ones 6.8
    assert wide_long_k_swap_config(633, 28672, 4096, coop) == GemmConfig(128, 160, 1, 2, pingpong=True, swap_ab=True)
    assert wide_long_k_swap_config(471, 37888, 3584, coop) == GemmConfig(128, 160, 2, 1, pingpong=True, swap_ab=True)
    assert wide_long_k_swap_config(505, 28672, 4096, coop).tile_n == 256  # three tiles pad more
    assert wide_long_k_swap_config(633, 57344, 8192, coop).tile_n == 216  # K > 4096
    assert wide_long_k_swap_config(359, 37888, 3584, coop).tile_n == 184  # <= 384 tokens
    # over a swapped pick of as many tiles padding more tokens; not where it pads no more
    assert wide_long_k_swap_config(347, 152064, 5120, GemmConfig(128, 240, 1, 2, swap_ab=True)).tile_n == 176
    assert wide_long_k_swap_config(347, 152064, 5120, GemmConfig(128, 176, 1, 2, swap_ab=True)) is None
    assert wide_long_k_swap_config(347, 152064, 2048, coop) is None  # short K
    assert wide_long_k_swap_config(347, 8192, 5120, coop) is None  # narrow weight
    assert wide_long_k_swap_config(256, 152064, 5120, coop) is None
    assert wide_long_k_swap_config(800, 152064, 5120, coop) is None
    api.clear_dispatch_caches()
    for m in (300, 347, 382, 450, 512, 600, 704):
        cfg = api._pick_config(m, 152064, 5120, 2, True, None, True, 2)
        assert cfg.swap_ab and cfg.tile_m == 128, (m, cfg)
        cfg.validate()


def _assert_swapped_picks(cases, cluster):
    """16-bit dispatch (swappable, no table) picks a valid swap_ab tile of each case's (tile_m, tile_n)
    in `cluster`."""
    from cute_kernels.matmul import api

    api.clear_dispatch_caches()
    for m, n, k, want in cases:
        cfg = api._pick_config(m, n, k, 2, True, None, True, 2)
        assert (cfg.tile_mn, cfg.cluster_mn, cfg.swap_ab) == (want, cluster, True), (m, n, k, cfg)
        cfg.validate()


def test_long_k_c41_picks():
    """At K >= 3584 from 256 to 1400 tokens a 128+-row pick runs one wave of 4 x 1 swap_ab
    clusters: 128-row weight tiles where their fours fill 27+ clusters, else 256-row ones on 6144+
    row weights at least 80 wide; over whichever earlier rule won, before the 128 x 192 widening."""
    from cute_kernels.matmul.heuristics import long_k_c41_config

    pick = GemmConfig(128, 112, 2, 1, swap_ab=True)
    assert long_k_c41_config(295, 5120, 27648, pick) == GemmConfig(128, 104, 4, 1, swap_ab=True)
    assert long_k_c41_config(292, 4608, 3584, pick) == GemmConfig(128, 104, 4, 1, swap_ab=True)
    assert long_k_c41_config(393, 10240, 8192, pick) == GemmConfig(256, 136, 4, 1, swap_ab=True)
    assert long_k_c41_config(299, 6144, 4096, pick) is None  # 256 x 64: too narrow
    assert long_k_c41_config(655, 4096, 4096, pick) is None  # 256-row tiles on 4096 rows: 7 token tiles
    assert long_k_c41_config(1749, 2048, 8192, pick) is None  # past 1400 tokens
    assert long_k_c41_config(250, 5120, 27648, pick) is None
    assert long_k_c41_config(295, 5120, 2048, pick) is None  # short K: wave_swap_c41_config's range
    assert long_k_c41_config(295, 5120, 27648, GemmConfig(64, 176, 1, 2, swap_ab=True)) is None
    assert long_k_c41_config(347, 152064, 5120, pick) is None  # too many weight tiles for one wave
    _assert_swapped_picks(((274, 5120, 27648, (128, 96)), (637, 3584, 3584, (128, 160)), (258, 10240, 8192, (256, 88))),
                          (4, 1))


def test_long_k_wave_swap_picks():
    """From 400 tokens at K >= 3584 the swap_ab tile padding the fewest waves x tile area (256-row
    128-192 wide, 128-row 192-256 wide, steps of 8) replaces a pick padding 1 / 0.96x as much (1 / 0.95x
    over 7-12 waves, never more); never at shorter K, fewer tokens, over a split pick or at equal padding."""
    from cute_kernels.matmul.heuristics import long_k_wave_swap_config

    coop = GemmConfig(128, 256, 2, 1)
    assert long_k_wave_swap_config(8786, 1280, 5120, coop) == GemmConfig(128, 232, 2, 1, swap_ab=True)
    assert long_k_wave_swap_config(4888, 2048, 8192, GemmConfig(128, 160, 2, 1)) == GemmConfig(256, 152, 2, 1, swap_ab=True)
    assert long_k_wave_swap_config(1482, 6144, 4096, GemmConfig(256, 144, 2, 1, swap_ab=True)) == \
        GemmConfig(256, 136, 2, 1, swap_ab=True)
    assert long_k_wave_swap_config(8786, 1280, 2048, coop) is None  # K below 3584
    assert long_k_wave_swap_config(390, 6144, 4096, GemmConfig(256, 144, 2, 1, swap_ab=True)) is None
    assert long_k_wave_swap_config(761, 4096, 14336, GemmConfig(256, 112, 2, 1, swap_ab=True)) == \
        GemmConfig(128, 192, 2, 1, swap_ab=True)
    assert long_k_wave_swap_config(8786, 1280, 5120, GemmConfig(128, 256, 2, 1, split_k=2)) is None
    # the same padding: 128 x 256 vs 128 x 256 swapped at 2246x7168x5120
    assert long_k_wave_swap_config(2246, 7168, 5120, GemmConfig(128, 256, 2, 1)) is None
    assert long_k_wave_swap_config(30000, 8192, 8192, coop) is None  # more than 12 waves
    # 7-12 waves at <= 0.95x the pick's padding
    assert long_k_wave_swap_config(3665, 10240, 8192, GemmConfig(128, 160, 2, 1)) == GemmConfig(256, 160, 2, 1, swap_ab=True)
    _assert_swapped_picks(((6763, 2048, 8192, (128, 208)),), (2, 1))
    # above 2048 tokens on 4096+ rows its 256-row tiles then pair the token tiles (large_m_swap_256_config)
    _assert_swapped_picks(((4863, 4096, 4096, (256, 152)), (2432, 8192, 28672, (256, 152))), (1, 2))


def test_fp8_long_k_wave_swap_picks():
    """fp8 (in_bytes = 1) takes the least-padding rule from K = 6400 over 128-row swap_ab tiles
    128-256 wide only; int8 never (its swap widths step by 16)."""
    from cute_kernels.matmul import api
    from cute_kernels.matmul.heuristics import long_k_wave_swap_config

    coop = GemmConfig(128, 256, 2, 1)
    assert long_k_wave_swap_config(2305, 8192, 8192, coop, in_bytes=1) == GemmConfig(128, 232, 2, 1, swap_ab=True)
    assert long_k_wave_swap_config(3603, 1600, 6400, GemmConfig(128, 192, 1, 1, pingpong=True), in_bytes=1) == \
        GemmConfig(128, 184, 1, 2, swap_ab=True)
    assert long_k_wave_swap_config(4683, 3584, 3584, GemmConfig(128, 160, 2, 1, pingpong=True), in_bytes=1) is None
    assert long_k_wave_swap_config(7605, 4096, 4096, GemmConfig(128, 192, 2, 1, pingpong=True), in_bytes=1) is None
    assert long_k_wave_swap_config(380, 8192, 8192, coop, in_bytes=1) is None  # under 400 tokens
    picks = [long_k_wave_swap_config(m, 8192, 8192, coop, in_bytes=1) for m in range(400, 9000, 97)]
    assert {c.tile_m for c in picks if c is not None} == {128}  # 256-row swap_ab tiles are 16-bit only
    api.clear_dispatch_caches()
    fp8 = api._pick_config(2681, 5120, 27648, 1, False, None, True, 2)
    assert (fp8.tile_mn, fp8.cluster_mn, fp8.swap_ab) == ((128, 208), (2, 1), True)
    fp8.validate(in_bytes=1)
    int8 = api._pick_config(2681, 5120, 27648, 1, False, None, True, 4, integer=True)
    int8.validate(in_bytes=1, out_bytes=4, integer=True)
    assert int8 != fp8
    api.clear_dispatch_caches()


def test_equal_pad_narrow_picks():
    """Where 64-row swap_ab tiles pad M as much as 128-row ones, their clustered config up to 224
    wide replaces a 16-bit 128-row pick; not 256 wide, not unclustered, not over a 64-row pick."""
    from cute_kernels.matmul import api
    from cute_kernels.matmul.heuristics import equal_pad_narrow_config, narrow_swap_config

    split_pp = GemmConfig(128, 128, 2, 1, pingpong=True, split_k=2)
    assert equal_pad_narrow_config(251, 4096, 4096, split_pp) == narrow_swap_config(251, 4096, 4096)
    assert equal_pad_narrow_config(251, 4096, 4096, split_pp).tile_mn == (64, 128)
    assert equal_pad_narrow_config(384, 4096, 14336, GemmConfig(128, 96, 1, 2)).tile_mn == (64, 192)
    assert equal_pad_narrow_config(240, 4096, 4096, split_pp) is None  # 64-row tiles pad less: swap_config's
    assert equal_pad_narrow_config(498, 3072, 1024, GemmConfig(128, 96, 2, 1)) is None  # 256 wide
    assert equal_pad_narrow_config(252, 6400, 1600, GemmConfig(128, 128, 2, 2, pingpong=True)) is None  # 1 x 1
    assert equal_pad_narrow_config(489, 1024, 1024, GemmConfig(64, 64, 1, 1, pingpong=True)) is None
    assert equal_pad_narrow_config(100, 4096, 4096, split_pp) is None
    api.clear_dispatch_caches()
    for m, n, k in ((251, 4096, 4096), (372, 3072, 1024), (744, 2048, 2048)):
        cfg = api._pick_config(m, n, k, 2, True, None, True, 2)
        assert cfg.swap_ab and cfg.tile_m == 64 and cfg.cluster_mn == (1, 2), (m, n, k, cfg)
        cfg.validate()


def test_no_lone_128x96_over_many_waves():
    """128 x 96 without a cluster is not picked for three or more waves (3921x1600x1600: four exact
    waves of it ran 0.65x cuBLAS); fewer waves keep it available."""
    from cute_kernels.matmul.heuristics import default_config

    for m, n, k in ((3921, 1600, 1600), (3847, 1600, 6400), (3968, 1600, 6400)):
        for in_bytes in (1, 2):
            pick = default_config(m, n, k, in_bytes=in_bytes)
            assert (pick.tile_mn, pick.cluster_mn) != ((128, 96), (1, 1)), (m, n, k, in_bytes, pick)
    assert default_config(3921, 1600, 1600) == GemmConfig(128, 160, 2, 1, pingpong=True)


def test_bf16_picks_build():
    """Every 16-bit pick validates (swap_ab widths, 256-row tiles at most 192 wide), over the
    token counts each rule covers on the narrow and wide weights of the grid's models."""
    from cute_kernels.matmul.api import _pick_config

    for n, k in ((768, 3072), (1024, 1024), (1024, 4096), (1280, 5120), (1600, 6400), (2048, 8192), (4096, 14336),
                 (16384, 2048), (50257, 768), (128256, 2048), (5120, 1280), (3072, 768), (2048, 2048)):
        for m in [*range(1, 300, 3), *range(300, 16384, 97)]:
            _pick_config(m, n, k, 2, True, None, True, 2).validate()


def test_int8_picks_build():
    """Every int8 pick is one the s8 wgmma can run (tile_n a multiple of 16), for int8_mm's raw
    int32 outputs and for bf16 ones (Int8Linear's dequantized output), swapped or not."""
    from cute_kernels.matmul.api import _pick_config

    for n, k in ((1280, 5120), (1600, 1600), (2048, 8192), (4096, 4096), (4608, 3584), (28672, 4096)):
        for m in [*range(1, 300), *range(300, 2100, 7)]:
            for out_bytes in (2, 4):
                cfg = _pick_config(m, n, k, 1, False, None, True, out_bytes, True)
                cfg.validate(1, out_bytes, integer=True)


def test_narrow_swap_picks():
    """The 64-row swap_ab heuristic: at 17-128 tokens two half-width token tiles in a 1 x 2
    cluster (K split to fill the wave where long), except small short-K weights; above that the
    most token tiles one wave holds in 4 x 2, 1 x 2 (up to 4 tiles) or 4 x 1 clusters, widths in
    steps of 8 (16 for int8); deep A/B rings where each weight tile is read once per cluster, and
    in every multicast cluster above 128 tokens."""
    from cute_kernels.matmul.heuristics import swap_config

    def pick(m, n, k):
        c = swap_config(m, n, k)
        return c and (c.tile_m, c.tile_n, c.cluster_m, c.cluster_n, c.split_k)

    assert pick(15, 57344, 8192) == (64, 16, 1, 1, 1)
    assert pick(9, 1024, 4096) == (64, 16, 1, 1, 5)  # 16 tiles: splits fill the wave
    assert pick(26, 1600, 1600) == (64, 16, 1, 2, 1)  # 25 weight tiles: paired, 25 k-tiles: unsplit
    assert pick(37, 4096, 4096) == (64, 24, 1, 2, 1)  # 16-bit widths in steps of 8
    assert pick(56, 1280, 5120) == (64, 32, 1, 2, 3)  # 20 weight tiles x 2 x 3 splits: 120 CTAs
    assert pick(87, 768, 3072) == (64, 48, 1, 2, 1)  # 12 weight tiles, 48 k-tiles: paired, unsplit
    assert pick(71, 768, 768) == (64, 16, 1, 1, 1)  # 12 weight tiles, short K: five token tiles
    assert pick(36, 768, 768) == (64, 16, 1, 1, 1)
    # Under 20 weight tiles, token tiles at most 96 wide: wider ones leave it to 128-row tiles.
    assert pick(1043, 768, 768) == (64, 96, 1, 1, 1) and pick(1671, 768, 3072) is None
    assert swap_config(37, 4096, 4096).stages == 12 and swap_config(20, 57344, 8192).stages == 12
    assert swap_config(15, 57344, 8192).stages is None  # decode-sized: the default ring
    assert swap_config(71, 768, 768).stages is None  # unclustered token tiles re-read the weight
    assert swap_config(37, 4096, 4096, in_bytes=1) == swap_config(37, 4096, 2048)  # fp8: as 16-bit bytes
    # Every width in more than 4 waves: widths weighed by per-tile efficiency; else waves x width.
    assert pick(516, 57344, 8192) == (128, 176, 2, 1, 1)
    assert pick(192, 57344, 8192) == (128, 96, 1, 2, 1)
    assert pick(137, 4096, 4096) == (64, 72, 1, 2, 1)
    assert pick(257, 2048, 2048) == (64, 88, 4, 1, 1)  # not four tiles of 72 re-reading the weight
    assert pick(400, 3072, 3072) == (64, 200, 4, 2, 1)  # 12 clusters of 8: one wave
    assert pick(664, 1024, 1024) == (64, 88, 1, 2, 1)
    assert pick(312, 1280, 5120) == (64, 56, 4, 2, 1) and swap_config(312, 1280, 5120).stages == 12
    assert pick(670, 1024, 4096) == (64, 96, 4, 1, 1)  # 8 tiles fit no 4 x 2 wave: 7 in 4 x 1
    assert swap_config(228, 4096, 4096).stages == 9  # 1 x 2 above 128 tokens: deep too
    assert pick(147, 7168, 5120) == (64, 152, 4, 1, 1) and swap_config(231, 5120, 5120) is None  # one wide tile
    # fp8 takes the multicast rule at its bytes' K; one unclustered token tile keeps 8 stages
    assert swap_config(312, 1280, 5120, in_bytes=1) == swap_config(312, 1280, 2560)
    assert swap_config(75, 4096, 4096, in_bytes=1) == swap_config(75, 4096, 2048)
    assert swap_config(41, 6144, 4096, in_bytes=1).stages is None

    def int8(m, n, k):  # int8_mm's raw int32 outputs (NARROW_INT8)
        c = swap_config(m, n, k, in_bytes=1, out_bytes=4, integer=True)
        return c and (c.tile_m, c.tile_n, c.cluster_m, c.cluster_n, c.split_k, c.stages)

    assert int8(312, 1280, 5120) == (64, 64, 4, 1, 1, None)  # widths of 16; 4 x 1 keeps 8 stages
    assert int8(816, 1280, 5120) == (64, 144, 4, 2, 1, None)  # 64 x 144 fits 8 stages with int32 outputs
    assert int8(37, 4096, 4096) == (64, 32, 1, 2, 1, 12)  # paired, deep
    assert int8(78, 1600, 1600) == (64, 16, 1, 1, 1, None)  # 13 k-tiles of 128: unpaired
    assert int8(845, 2048, 8192)[:4] == (64, 224, 1, 2)  # 896 rows, as 128-row tiles pad: in a cluster, taken
    assert int8(254, 4608, 3584) is None  # ... unclustered, not
    from cute_kernels.matmul.api import _pick_config

    assert _pick_config(312, 1280, 5120, 1, False, None, True, 2).cluster_mn == (4, 2)  # fp8
    assert _pick_config(312, 1280, 5120, 1, False, None, True, 4, True).cluster_mn == (4, 1)  # int8
    assert pick(273, 5120, 5120) == (128, 96, 2, 1, 1)  # two waves of 64-row tiles: 128-row ones
    assert pick(500, 4096, 4096) is None  # 2 x 256 pads no less than 128-row tiles
    assert pick(845, 2048, 8192) == (64, 216, 1, 2, 1)  # three tiles cannot hold the tokens: four re-read it
    assert pick(20, 512, 768) is None
    from cute_kernels.matmul.heuristics import skinny_gemv

    assert not skinny_gemv(4, 8192, 2048, True) and skinny_gemv(4, 8192, 2048, False)  # a bias: the GEMV
    assert skinny_gemv(4, 4096, 4096, True) and not skinny_gemv(3, 1024, 4096, True)
    assert pick(203, 55296, 5120)[0] == 128  # 864 weight tiles: no one-wave token tiling
    assert pick(845, 4096, 1024) == (128, 224, 1, 2, 1)  # pads as 128 rows do, in one wave, not two
    assert pick(277, 28672, 4096)[:2] == (128, 144)  # 16-column steps from K = 2048
    assert pick(1186, 2048, 2048) == (128, 176, 2, 1, 1)  # above 1024 rows: 176+ wide, less padding
    assert pick(2048, 4096, 4096) is None  # 8 x 256 pads as 128-row tiles do, in as many waves
    assert swap_config(1186, 2048, 4096, in_bytes=1) is None  # fp8 above 1024 rows: not measured swapped
    assert swap_config(344, 4096, 8192, in_bytes=1) == swap_config(344, 4096, 4096)  # 8-bit K: as many bytes


def test_mid_m_swap_picks():
    """257-1023 tokens at K >= 4096 on a 4096+ row weight: an unswapped one-wave pick gives way to
    one wave of swap_ab tiles that pads the tokens less (192-row weight tiles where they divide
    N); equal padding, short K, partly filled waves and swapped picks are left."""
    from cute_kernels.matmul.api import _pick_config
    from cute_kernels.matmul.config import GemmConfig
    from cute_kernels.matmul.heuristics import mid_m_swap_config

    def pick(m, n, k):
        c = _pick_config(m, n, k, 2, True, None, True)
        return (c.tile_m, c.tile_n, c.cluster_m, c.cluster_n, c.swap_ab)

    assert pick(351, 6144, 4096) == (192, 88, 1, 2, True)  # 32 weight tiles x 4 token tiles
    assert pick(345, 8192, 8192) == (128, 176, 1, 2, True)  # 352 rows, not 384
    assert pick(690, 4096, 4096) == (128, 176, 1, 2, True)
    assert not pick(372, 8192, 28672)[4]  # 2 x 192 pads as 128-row tiles do
    assert not pick(600, 4096, 4096)[4]  # three 208-wide tiles: 96 CTAs, under 0.9 of a wave
    assert not pick(351, 6400, 1600)[4]  # short K
    one_wave = GemmConfig(128, 192, 1, 2, pingpong=True)
    assert mid_m_swap_config(351, 8192, 8192, GemmConfig(128, 96, 2, 1, swap_ab=True)) is None
    assert mid_m_swap_config(200, 8192, 8192, one_wave) is None and mid_m_swap_config(1100, 8192, 8192, one_wave) is None


def test_mid_m_fill_picks():
    """257-1023 tokens on a 3072+ row weight at any K: a one-wave pick under 0.8 of a wave gives
    way to one wave of 128-row swap_ab tiles over as many token tiles as it holds (1 x 2 for an
    even count, else 4 x 1 where the weight tiles divide by 4); token tiles under 80 wide, a grid
    that grows less than a tenth and narrower weights are left."""
    from cute_kernels.matmul.api import _pick_config
    from cute_kernels.matmul.config import GemmConfig
    from cute_kernels.matmul.heuristics import mid_m_fill_config

    def pick(m, n, k):
        c = _pick_config(m, n, k, 2, True, None, True)
        return (c.tile_m, c.tile_n, c.cluster_m, c.cluster_n, c.swap_ab)

    assert pick(523, 3840, 1280) == (128, 136, 1, 2, True)  # 30 x 4 tiles, was 30 x 3 of 192
    assert pick(474, 3072, 768) == (128, 96, 4, 1, True)  # 24 x 5 tiles
    assert pick(443, 4800, 1600) == (128, 152, 2, 1, True)  # 38 x 3: 38 does not divide by 4
    assert pick(300, 3072, 2048)[:2] != (128, 64)  # 64-wide token tiles lost
    assert pick(389, 6400, 1600) == (128, 224, 1, 2, True)  # 50 weight tiles: no fuller wave
    assert pick(526, 1600, 6400)[0] == 64  # a narrow weight keeps its 64-row pick
    full = GemmConfig(128, 192, 2, 1, swap_ab=True)
    assert mid_m_fill_config(523, 3840, 1280, full) is not None
    assert mid_m_fill_config(200, 3840, 1280, full) is None and mid_m_fill_config(1100, 3840, 1280, full) is None
    assert mid_m_fill_config(523, 3840, 1280, GemmConfig(128, 96, 2, 1, swap_ab=True)) is None  # 120 CTAs already
    # fp8 per-row without a bias (swap_ab allowed) takes the same rule; with one it cannot swap.
    fp8 = _pick_config(292, 4608, 3584, 1, False, None, True)
    assert (fp8.tile_m, fp8.tile_n, fp8.cluster_m, fp8.cluster_n, fp8.swap_ab) == (128, 104, 4, 1, True)
    assert not _pick_config(292, 4608, 3584, 1, False, None, False).swap_ab


def test_one_tile_long_k_split_picks():
    """Above 128 tokens, one token tile and K >= 24576: 128-row swap_ab tiles in 2 x 1 clusters
    split K to fill the wave (ONE_TILE_SPLIT_MIN_K); two token tiles, shorter K, 8-bit inputs
    and weights whose 128-row tiles fill over half a wave keep their picks."""
    from cute_kernels.matmul.heuristics import swap_config

    def pick(m, n, k, **kw):
        c = swap_config(m, n, k, **kw)
        return c and (c.tile_m, c.tile_n, c.cluster_m, c.cluster_n, c.split_k)

    assert pick(154, 5120, 27648) == (128, 160, 2, 1, 3)  # 20 clusters x 3 splits: 120 CTAs
    assert pick(140, 8192, 28672) == (128, 144, 2, 1, 2)
    assert pick(147, 5120, 27648) == (128, 160, 2, 1, 3)  # tokens in steps of 16
    assert pick(154, 5120, 13824)[:2] == (64, 160)  # shorter K: the 64-row tile
    assert pick(200, 4096, 14336)[:2] == (64, 104)  # two token tiles
    assert pick(154, 5120, 27648, in_bytes=1)[:2] == (64, 160)  # fp8: not measured
    assert pick(150, 16384, 28672) != (128, 160, 2, 1, 2)  # 64 clusters fill a wave: no split


@pytest.mark.gpu
@pytest.mark.parametrize("shape,swapped", [((4, 8192, 2048), True), ((7, 4800, 1600), True), ((2, 6144, 4096), True),
                                           ((3, 1024, 4096), True), ((4, 4096, 4096), False), ((8, 1600, 1600), False)])
def test_linear_few_rows_wide_weight(shape, swapped):
    """2-8 rows against a weight of more than SKINNY_MAX_N rows, or a narrow one with long K, run
    64 x 16 swap_ab tiles, not the skinny GEMV; otherwise, and with a bias, the GEMV."""
    import cute_kernels as ck
    from cute_kernels.matmul.api import SwapLaunch, kernel_for
    from cute_kernels.matmul.config import Epilogue
    from cute_kernels.matmul.gemv import GemvLaunch

    M, N, K = shape
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K**0.5
    plan = kernel_for(x, w, torch.bfloat16, Epilogue())
    assert isinstance(plan, SwapLaunch if swapped else GemvLaunch)
    assert isinstance(kernel_for(x, w, torch.bfloat16, Epilogue(bias=True)), GemvLaunch)
    ref = ck.linear_ref(x.float(), w.float(), None)
    _err_rule(ck.linear(x, w), _torch_linear(x, w, None, None, None, 1.0, 1.0), ref)


def test_swap_ab_refuses_epilogues_it_cannot_transpose():
    from cute_kernels.matmul.config import Epilogue, swap_supported

    assert swap_supported(Epilogue(activation="gelu", alpha=True, row_scale="vector", col_scale="scalar"), 2) is None
    for epi in (Epilogue(bias=True), Epilogue(residual=True), Epilogue(activation="swiglu")):
        assert "swap_ab takes epilogues without" in swap_supported(epi, 2)
    assert swap_supported(Epilogue(), 4) is None  # int8_mm's raw int32: M-major 32-bit boxes
    assert "16- or 32-bit outputs" in swap_supported(Epilogue(), 1)
    from cute_kernels.matmul.api import swappable

    assert swappable(torch.int8, torch.int8, torch.int32, Epilogue())
    assert not swappable(torch.bfloat16, torch.bfloat16, torch.float32, Epilogue())  # fp32 out: unswapped


@pytest.mark.gpu
@pytest.mark.parametrize("cfg_name", list(SWAP_CFGS))
@pytest.mark.parametrize("shape", [(273, 5120, 5120), (1186, 2048, 2048), (77, 1600, 1000), (3, 1598, 999),
                                   (4100, 2000, 700), (260, 4608, 3584)])
def test_swap_ab(cfg_name, shape):
    """swap_ab through run_gemm and a plan of linear(): D^T = W X^T written into D's
    transposed view; ragged M and N, a partial last k-tile, padded output rows, several
    tiles per CTA, split-K; a bias is refused with a ValueError, not computed wrong."""
    import cute_kernels as ck
    from cute_kernels.matmul.api import SwapLaunch, _alloc_out, _prepare_operand, kernel_for, run_gemm
    from cute_kernels.matmul.config import Epilogue

    M, N, K = shape
    cfg = SWAP_CFGS[cfg_name]
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K**0.5
    xp, wp = _prepare_operand(x, "m"), _prepare_operand(w, "n")
    epi = Epilogue(activation="gelu_tanh", alpha=True)
    assert isinstance(kernel_for(xp, wp, torch.bfloat16, epi, config=cfg), SwapLaunch)
    out = _alloc_out(M, N, torch.bfloat16, "cuda").fill_(float("nan"))
    run_gemm(xp, wp, out, epi=epi, alpha=0.5, config=cfg)
    ref = ck.linear_ref(x.float(), w.float(), None, activation="gelu_tanh", alpha=0.5)
    _err_rule(out, _torch_linear(x, w, None, "gelu_tanh", None, 0.5, 1.0), ref)
    with pytest.raises(ValueError, match="swap_ab takes epilogues without"):
        kernel_for(xp, wp, torch.bfloat16, Epilogue(bias=True), config=cfg)
