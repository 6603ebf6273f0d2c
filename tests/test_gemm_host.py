"""Host-layer tests on the CPU: the cached launch plans of gemm()/linear() must hand the
kernel exactly what the validated path does. The compiled kernel is replaced by a
recorder that computes the reference, so this runs without a GPU."""

from __future__ import annotations

import importlib
import itertools
import re

import pytest
import torch

from cute_kernels.matmul.config import (
    H100_SMS,
    MAX_ACTIVE_CLUSTERS,
    Epilogue,
    GemmConfig,
    split_tail_tiles,
    splitk_k_tiles,
)
from cute_kernels.matmul.heuristics import CANDIDATES, MIN_SPLIT_K_TILES, default_config, split_config
from cute_kernels.matmul.reference import linear_ref
from tests.ptx_check import assert_ptxas_no_spills

api = importlib.import_module("cute_kernels.matmul.api")


def _check_split_launch(a, out, cfg, ws, sem, split, acc_name):
    """What the split-K launch must hand the kernel: a workspace for every split's partial
    of every tile it splits (accumulator dtype), zeroed counters for those tiles, 2 <= split
    <= k-tiles."""
    assert cfg.split_k == 2  # one compiled kernel for every split count
    M, N = out.shape
    k_tiles = -(-a.shape[1] // cfg.tile_k(a.element_size()))
    assert 2 <= split <= k_tiles
    clusters = -(-(-(-M // cfg.tile_m)) // cfg.cluster_m) * -(-(-(-N // cfg.tile_n)) // cfg.cluster_n)
    tiles = clusters % MAX_ACTIVE_CLUSTERS[cfg.cluster_m * cfg.cluster_n] * cfg.cluster_m * cfg.cluster_n
    assert ws.dtype == (torch.int32 if acc_name == "Int32" else torch.float32)
    assert ws.numel() >= split * tiles * cfg.tile_m * cfg.tile_n
    assert sem.dtype == torch.int32 and sem.numel() >= tiles and not sem.any()


@pytest.fixture
def fake_kernels(monkeypatch):
    calls = []

    def get_kernel(kernel_name, a_dt, b_dt, c_dt, a_major, b_major, cfg, epi, acc_name="Float32", b_kn=False):
        def fn(a, b_nk, out, bias, residual, row_scale, col_scale, alpha, beta, *split_args):
            if b_kn:  # compiled for torch.mm's b [K, N]: the [N, K] view is the kernel's B
                assert b_nk.shape[0] == a.shape[1]
                b_nk = b_nk.t()
            calls.append({"a": a, "b": b_nk, "out": out, "bias": bias, "residual": residual, "alpha": alpha,
                          "beta": beta, "epi": epi, "cfg": cfg, "c_dt": c_dt, "b_kn": b_kn,
                          "row_scale": row_scale, "col_scale": col_scale,
                          "split": split_args[2] if split_args else 1})
            assert out.dtype == c_dt and bool(split_args) == (cfg.split_k > 1)
            if split_args:
                _check_split_launch(a, out, cfg, *split_args, acc_name)
            if c_dt == torch.int32:
                out.copy_((a.long() @ b_nk.long().t()).int())
                return
            y = linear_ref(a.float(), b_nk.float(), None if bias is None else bias.float(),
                           activation=None if epi.activation == "none" else epi.activation,
                           residual=None if residual is None else residual.float(),
                           alpha=alpha if epi.alpha else 1.0, beta=beta if epi.beta else 1.0)
            out.copy_(y.to(out.dtype))
        return fn

    monkeypatch.setattr(api, "get_kernel", get_kernel)
    monkeypatch.setattr(api, "check_device", lambda t, what="tensor": 132)
    # Small-M calls here exercise the wgmma plans, not the (Triton, GPU-only) skinny path.
    monkeypatch.setenv("CUTE_KERNELS_GEMV", "0")
    api._LINEAR_PLANS.clear()
    api._GEMM_PLANS.clear()
    api._SPLIT_LAUNCHES.clear()  # they hold the kernel get_kernel returned
    yield calls
    api._SPLIT_LAUNCHES.clear()
    api._LINEAR_PLANS.clear()
    api._GEMM_PLANS.clear()


@pytest.mark.parametrize("N", [768, 50257])
@pytest.mark.parametrize("with_residual", [False, True])
def test_linear_hot_path_matches_first_call(fake_kernels, N, with_residual):
    torch.manual_seed(0)
    x = torch.randn(2, 5, 64, dtype=torch.bfloat16)
    w = torch.randn(N, 64, dtype=torch.bfloat16)
    b = torch.randn(N, dtype=torch.bfloat16)
    res = torch.randn(2, 5, N, dtype=torch.bfloat16) if with_residual else None
    outs = [api.linear(x, w, b, activation="gelu_tanh", residual=res, alpha=0.5, beta=2.0) for _ in range(3)]
    # A row stride that is not 16 bytes is copied for the kernel's residual loads: no plan then.
    copied = with_residual and N % 8 != 0
    assert len(api._LINEAR_PLANS) == (0 if copied else 1), "plan recorded iff nothing was copied"
    assert len(fake_kernels) == 3
    first, later = fake_kernels[0], fake_kernels[2]
    for k in ("a", "b", "bias", "residual"):
        if k == "residual" and copied:
            assert first[k].stride(0) % 8 == 0 and torch.equal(first[k], res.view(-1, N))
        elif first[k] is None:
            assert later[k] is None
        else:
            assert later[k].shape == first[k].shape and later[k].stride() == first[k].stride()
            assert later[k].data_ptr() == first[k].data_ptr()
    assert later["out"].shape == first["out"].shape and later["out"].stride() == first["out"].stride()
    assert (later["alpha"], later["beta"]) == (0.5, 2.0)
    ref = linear_ref(x, w, b, activation="gelu_tanh", residual=res, alpha=0.5, beta=2.0)
    for o in outs:
        assert o.shape == (2, 5, N)
        torch.testing.assert_close(o.float(), ref.float(), atol=0.1, rtol=0.02)


@pytest.mark.parametrize("with_residual", [False, True])
def test_linear_hot_path_2d(fake_kernels, with_residual):
    """2-D x: the hot path hands x, the residual and the output over without views, and the
    result is the same tensor shape as the first (validated) call's."""
    x = torch.randn(6, 64, dtype=torch.bfloat16)
    w, b = torch.randn(40, 64, dtype=torch.bfloat16), torch.randn(40, dtype=torch.bfloat16)
    res = torch.randn(6, 40, dtype=torch.bfloat16) if with_residual else None
    o1, o2 = (api.linear(x, w, b, residual=res) for _ in range(2))
    assert len(api._LINEAR_PLANS) == 1 and o1.shape == o2.shape == (6, 40)
    assert fake_kernels[1]["a"] is x and (fake_kernels[1]["residual"] is res or not with_residual)
    torch.testing.assert_close(o2.float(), linear_ref(x, w, b, residual=res).float(), atol=0.1, rtol=0.02)


def test_linear_no_plan_when_a_copy_was_needed(fake_kernels):
    x = torch.randn(4, 130, dtype=torch.bfloat16)[:, 1:129]  # misaligned base -> padded copy
    w = torch.randn(32, 128, dtype=torch.bfloat16)
    api.linear(x, w)
    assert not api._LINEAR_PLANS
    api.linear(x.contiguous(), w)
    assert len(api._LINEAR_PLANS) == 1


def test_linear_hot_path_rechecks_alignment(fake_kernels):
    w = torch.randn(32, 128, dtype=torch.bfloat16)
    x = torch.randn(3, 128, dtype=torch.bfloat16)
    api.linear(x, w)
    buf = torch.randn(3 * 128 + 8, dtype=torch.bfloat16)
    x_mis = buf[1:1 + 3 * 128].view(3, 128)  # same signature, 2-byte-misaligned data
    out = api.linear(x_mis, w)
    assert fake_kernels[-1]["a"].data_ptr() % 16 == 0  # went through the copying path
    torch.testing.assert_close(out.float(), (x_mis.float() @ w.float().t()), atol=0.1, rtol=0.02)


def test_residual_for_kernel_pairs():
    """16-bit residuals reach the kernel with a 16-byte aligned base and 16-byte row strides."""
    ok = torch.randn(5, 40, dtype=torch.bfloat16)
    assert api.residual_for_kernel(ok) is ok
    padded = torch.randn(5, 48, dtype=torch.bfloat16)[:, :41]  # odd N in even-stride rows: no copy
    assert api.residual_for_kernel(padded) is padded
    for bad in (torch.randn(5 * 41, dtype=torch.bfloat16).view(5, 41),  # odd row stride
                torch.randn(5 * 40 + 1, dtype=torch.bfloat16)[1:].view(5, 40),  # 2-byte aligned base
                torch.randn(40, 5, dtype=torch.bfloat16).t()):  # column-major
        got = api.residual_for_kernel(bad)
        assert got is not bad and torch.equal(got, bad)
        assert got.stride(1) == 1 and got.stride(0) % 8 == 0 and got.data_ptr() % 16 == 0
    f32 = torch.randn(5 * 41, dtype=torch.float32).view(5, 41)  # fp32 output's residual: element reads
    assert api.residual_for_kernel(f32) is f32 and api.residual_for_kernel(None) is None


def test_gemm_hot_path(fake_kernels):
    a = torch.randn(33, 64, dtype=torch.bfloat16)
    b = torch.randn(50, 64, dtype=torch.bfloat16).t()
    o1, o2 = api.gemm(a, b), api.gemm(a, b)
    assert len(api._GEMM_PLANS) == 1 and len(fake_kernels) == 2
    # The launch is compiled for b [K, N] as given: no transposed view per call.
    assert all(c["b_kn"] for c in fake_kernels)
    torch.testing.assert_close(o1, o2)
    assert o2.shape == (33, 50) and o2.stride(0) == 56  # N padded to a multiple of 8


def test_gemm_hot_path_with_out(fake_kernels):
    """gemm(out=) records its own plan (keyed on out's layout too) and then writes into out
    without allocating; a misaligned out on the same signature goes back through validation."""
    a = torch.randn(33, 64, dtype=torch.bfloat16)
    b = torch.randn(64, 48, dtype=torch.bfloat16)
    out = torch.full((33, 48), float("nan"), dtype=torch.bfloat16)
    r1 = api.gemm(a, b, out=out)
    r2 = api.gemm(a, b, out=out)
    assert r1 is out and r2 is out and len(api._GEMM_PLANS) == 1 and len(fake_kernels) == 2
    assert fake_kernels[1]["out"].data_ptr() == out.data_ptr()
    torch.testing.assert_close(out.float(), a.float() @ b.float(), atol=0.1, rtol=0.02)
    api.gemm(a, b)  # no out: a plan of its own
    assert len(api._GEMM_PLANS) == 2
    buf = torch.empty(33 * 48 + 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="16-byte aligned"):
        api.gemm(a, b, out=buf[1:1 + 33 * 48].view(33, 48))


def test_quantized_hot_path(fake_kernels, monkeypatch):
    """int8_mm / scaled_mm record a plan per signature when the first call copied nothing,
    then launch with b [K, N] as given and the [M, 1] / [1, N] scales as vectors; a copied
    (non-contiguous) scale records nothing; a misaligned operand on a planned signature goes
    back through validation and gets its error."""
    from cute_kernels.quantized import api as qapi

    monkeypatch.setattr(qapi, "check_device", lambda t, what="tensor": 132)
    qapi._PLANS.clear()
    a = torch.randint(-128, 128, (33, 64), dtype=torch.int8)
    w = torch.randint(-128, 128, (48, 64), dtype=torch.int8)
    r1, r2 = qapi.int8_mm(a, w.t()), qapi.int8_mm(a, w.t())
    assert len(qapi._PLANS) == 1 and len(fake_kernels) == 2 and all(c["b_kn"] for c in fake_kernels)
    assert torch.equal(r1, r2) and torch.equal(r2, (a.long() @ w.long().t()).int())
    sa, sb = torch.rand(33, 1) + 0.5, torch.rand(1, 48) + 0.5
    bias = torch.randn(48, dtype=torch.bfloat16)
    for _ in range(2):
        qapi.int8_mm(a, w.t(), sa, sb, bias=bias)
    assert len(qapi._PLANS) == 2
    last = fake_kernels[-1]
    assert last["row_scale"].shape == (33,) and last["row_scale"].data_ptr() == sa.data_ptr()
    assert last["col_scale"].shape == (48,) and last["bias"] is bias
    strided = (torch.rand(33, 2) + 0.5)[:, :1]  # copied to a vector: no plan
    qapi.int8_mm(a, w.t(), strided, sb, bias=bias)
    assert len(qapi._PLANS) == 2
    buf = torch.randint(-128, 128, (33 * 64 + 16,), dtype=torch.int8)
    with pytest.raises(ValueError, match="16-byte aligned"):
        qapi.int8_mm(buf[1:1 + 33 * 64].view(33, 64), w.t())
    fa, fw = a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    for _ in range(2):
        qapi.scaled_mm(fa, fw.t(), torch.tensor(0.5), torch.tensor(2.0), use_fast_accum=True)
    assert len(qapi._PLANS) == 3 and fake_kernels[-1]["row_scale"].shape == (1,)
    qapi._PLANS.clear()


def test_swap_ab_host(fake_kernels, monkeypatch):
    """Few tokens launch swap_ab: the kernel gets the weight as its A, the activations as its B and
    D's transposed view; fp8 scaled_mm hands over B as [K, N] (transposed back) with the row and
    column scales traded, and with a bias it runs unswapped; int8_mm's int32 output swaps."""
    from cute_kernels.quantized import api as qapi

    monkeypatch.setattr(qapi, "check_device", lambda t, what="tensor": 132)
    qapi._PLANS.clear()
    M, N, K = 15, 8192, 2048
    x = torch.randn(M, K, dtype=torch.bfloat16)
    w = torch.randn(N, K, dtype=torch.bfloat16) / K**0.5
    y = api.linear(x, w)
    call = fake_kernels[-1]
    assert call["cfg"].swap_ab and call["cfg"].tile_m == 64 and call["cfg"].tile_n == 16
    assert call["a"].shape == (N, K) and call["b"].shape == (M, K) and call["out"].shape == (N, M)
    torch.testing.assert_close(y.float(), x.float() @ w.float().t(), rtol=1e-2, atol=1e-2)
    a8, w8 = (torch.randn(M, K) / 4).to(torch.float8_e4m3fn), (torch.randn(N, K) / 4).to(torch.float8_e4m3fn)
    sa, sb = torch.rand(M, 1) + 0.5, torch.rand(1, N) + 0.5
    out = qapi.scaled_mm(a8, w8.t(), sa, sb, out_dtype=torch.bfloat16, use_fast_accum=True)
    call = fake_kernels[-1]
    assert call["cfg"].swap_ab and not call["b_kn"] and call["a"].shape == (N, K) and call["out"].stride(0) == 1
    assert call["row_scale"].shape == (N,) and call["col_scale"].shape == (M,)  # traded
    # the fake kernel leaves the scales out: the unscaled product
    torch.testing.assert_close(out.float(), a8.float() @ w8.float().t(), rtol=1e-2, atol=1e-1)
    qapi.scaled_mm(a8, w8.t(), sa, sb, bias=torch.randn(N, dtype=torch.bfloat16), use_fast_accum=True)
    assert not fake_kernels[-1]["cfg"].swap_ab and fake_kernels[-1]["b_kn"]
    # int8_mm's raw int32 output swaps too (M-major 32-bit boxes in the kernel)
    ai, wi = torch.randint(-128, 128, (M, K), dtype=torch.int8), torch.randint(-128, 128, (N, K), dtype=torch.int8)
    out = qapi.int8_mm(ai, wi.t())
    call = fake_kernels[-1]
    assert call["cfg"].swap_ab and call["a"].shape == (N, K) and call["out"].shape == (N, M) and call["out"].stride(0) == 1
    assert out.dtype == torch.int32 and torch.equal(out, (ai.long() @ wi.long().t()).int())
    qapi._PLANS.clear()


# --------------------------------------------------------------------------- split-K

# The heuristic's decisions on the shapes split-K is for (and some it must leave alone).
SPLIT_DECISIONS = {
    (1, 1600, 6400): ((64, 64), 5),
    (8, 1600, 6400): ((64, 64), 5),
    (1, 768, 3072): ((64, 64), 4),
    (512, 1600, 6400): ((64, 128), 1),  # one wave of 4 x 2 clusters (default_config)
    (1024, 1024, 16384): ((128, 128), 2),
    (1, 1600, 1600): ((64, 64), 1),
    (1, 4800, 1600): ((64, 64), 1),
    (1, 6400, 1600): ((64, 64), 1),
    (512, 768, 768): ((64, 64), 1),
    (512, 768, 3072): ((64, 64), 1),
    (512, 3072, 768): ((128, 96), 1),
    (512, 2304, 768): ((128, 96), 1),
    (4096, 4096, 4096): ((128, 256), 1),
}


@pytest.mark.parametrize("shape", list(SPLIT_DECISIONS))
def test_split_heuristic_decisions(shape):
    tile, split = SPLIT_DECISIONS[shape]
    cfg = split_config(*shape)
    assert (cfg.tile_mn, cfg.split_k) == (tile, split), cfg
    M, N, K = shape
    if split == 1:
        assert cfg == default_config(M, N, K)  # not split: exactly the old pick
    else:
        tiles = -(-M // cfg.tile_m) * -(-N // cfg.tile_n)
        assert tiles * split <= H100_SMS  # one wave
        assert -(-K // 64) >= split * MIN_SPLIT_K_TILES  # >= 4 k-tiles per split
        assert cfg.cluster_mn == (1, 1) or cfg.tile_mn != (64, 64)
        cfg.validate()


def test_split_heuristic_leaves_full_problems_alone():
    sizes = [1, 7, 64, 128, 512, 1024, 2048, 4096, 8192, 16384]
    ks = [64, 768, 3072, 6400, 16384]
    for M in sizes:
        for N in [768, 1600, 2304, 3072, 4096, 6400, 50257]:
            for K in ks:
                base = default_config(M, N, K)
                cfg = split_config(M, N, K)
                tiles = -(-M // base.tile_m) * -(-N // base.tile_n)
                if tiles >= H100_SMS or K < 2 * MIN_SPLIT_K_TILES * 64:
                    assert cfg == base, (M, N, K)
                if cfg.split_k > 1:
                    t = -(-M // cfg.tile_m) * -(-N // cfg.tile_n)
                    assert t * cfg.split_k <= H100_SMS and cfg.split_k * MIN_SPLIT_K_TILES <= -(-K // 64)
    # 8-bit inputs: the heuristic is only used for 16-bit ones, but must stay sane.
    assert split_config(4096, 4096, 4096, in_bytes=1) == default_config(4096, 4096, 4096, in_bytes=1)


def test_every_pick_for_the_models_validates():
    """Dispatch's pick (no tuning table) validates at every M up to 4096 for every (N, K) of
    the supported models' linears, 16- and 8-bit: 769x2048x8192 (Llama-3.2-1B's down_proj)
    once got a 272-wide 64-row swap_ab tile, past the 256 columns a tile holds."""
    from cute_kernels.tuning import models

    pairs = sorted({(lin.n, lin.k) for name in models.MODELS for lin in models.linears(name)})
    for n, k in pairs:
        for m in [*range(1, 300), *range(300, 4097, 3)]:
            for in_bytes, split in ((2, True), (1, False)):
                cfg = api._pick_config(m, n, k, in_bytes, split, None, True)
                cfg.validate(in_bytes)


def test_heuristic_counts_waves_of_whole_clusters():
    """A grid padded to whole clusters costs its padding: an odd tile count along M moves a
    one-wave grid to 1 x 2 clusters instead of two waves of 2 x 1; large M keeps 2 x 1 unless
    1 x 2 saves a whole wave in five; split-K never takes 2 x 2 (its model was not fitted on it);
    raster along N only for one-wave grids of one-tile-tall clusters that are wider than tall."""
    from cute_kernels.matmul.heuristics import _per_wave, _waves

    assert _waves(5, 26, 2, 1) == 2 and _waves(5, 26, 1, 2) == 1
    assert _waves(12, 11, 1, 1) == 1 and _waves(12, 11, 2, 2) == 2  # 2 x 2: 30 clusters resident, not 33
    assert default_config(627, 4096, 14336).cluster_mn == (1, 2)  # 128 x 160: 5 x 26 tiles
    assert default_config(9079, 4096, 14336).cluster_mn == (2, 1)  # 15 waves of 2 x 1 vs 14 of 1 x 2
    assert default_config(4209, 4096, 4096).cluster_mn == (1, 2)  # 5 waves vs 4
    assert default_config(8192, 8192, 8192) == GemmConfig(256, 160, 1, 2)  # 13 waves of 256 x 160, not 16 of 128 x 256
    assert default_config(138, 28672, 4096).cluster_mn == (2, 2)
    sizes = [1, 9, 17, 100, 131, 300, 627, 1000, 1908, 2048, 4209, 9079]
    for M in sizes:
        for N in [768, 1600, 4096, 6144, 28672, 50257]:
            for K in [768, 4096, 14336]:
                cfg = split_config(M, N, K)
                cfg.validate()
                tiles_m, tiles_n = -(-M // cfg.tile_m), -(-N // cfg.tile_n)
                clusters = -(-tiles_m // cfg.cluster_m) * -(-tiles_n // cfg.cluster_n)
                if cfg.split_k > 1:
                    assert cfg.cluster_mn != (2, 2) or cfg.tile_mn == (64, 64)
                    assert clusters * cfg.split_k <= _per_wave(cfg.cluster_m * cfg.cluster_n, H100_SMS)
                if not cfg.raster_m:
                    assert cfg.tile_m == 128 and cfg.cluster_m == 1 and tiles_m < tiles_n
                    assert clusters <= _per_wave(cfg.cluster_n, H100_SMS)
                if cfg.tile_mn == (64, 128):  # only as one wave of its clusters
                    assert clusters <= _per_wave(cfg.cluster_m * cfg.cluster_n, H100_SMS)


@pytest.mark.parametrize("k_tiles", [1, 2, 7, 16, 25, 100, 101])
def test_split_ranges_partition_k(k_tiles):
    for split in range(1, k_tiles + 1):
        ranges = [splitk_k_tiles(k_tiles, split, i) for i in range(split)]
        assert ranges[0][0] == 0 and ranges[-1][1] == k_tiles
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
        sizes = {e - b for b, e in ranges}
        assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1


def test_split_tail_tiles():
    """Split-K splits the tiles of the grid's last, partial wave of clusters: every tile of a
    grid within one wave, none of whole waves (the kernel's `_split_head`)."""
    c21 = GemmConfig(128, 256, 2, 1, split_k=3)
    assert split_tail_tiles(c21, 512, 768) == 4 * 3  # 12 tiles, one wave: all split
    assert split_tail_tiles(c21, 1355, 3584) == 18 * 2  # 84 clusters: 66 whole, 18 split
    assert split_tail_tiles(c21, 128 * 2 * 66, 256) == 0  # exactly one wave of clusters
    assert split_tail_tiles(c21, 128 * 2 * 67, 256) == 2
    c11 = GemmConfig(64, 64, 1, 1, pingpong=True, split_k=2)
    assert split_tail_tiles(c11, 64 * 140, 64) == 8
    swapped = GemmConfig(128, 96, 2, 1, split_k=3, swap_ab=True)  # the kernel's view: N x M
    assert split_tail_tiles(swapped, 1024, 273) == 4 * 3 * 2
    # Waves count the whole waves once and the tail's splits as work items.
    from cute_kernels.matmul.heuristics import config_waves

    assert config_waves(c21, 1355, 3584) == 2  # 66 whole + 18 x 3 splits
    assert config_waves(GemmConfig(128, 256, 2, 1, split_k=4), 1355, 3584) == 3  # 66 + 72
    assert config_waves(c21, 512, 768) == 1  # 6 clusters x 3


def test_split_k_config_validation():
    GemmConfig(64, 64, 1, 1, pingpong=True, split_k=7).validate()
    for bad in (0, -1, 2.0):
        with pytest.raises(ValueError, match="split_k"):
            GemmConfig(split_k=bad).validate()
    assert all(c.split_k == 1 for c in CANDIDATES)


def _linear_case(M, N, K, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).to(dtype)
    w = (torch.randn(N, K, generator=g) / K**0.5).to(dtype)
    b = torch.randn(N, generator=g).to(dtype)
    res = torch.randn(M, N, generator=g).to(dtype)
    return x, w, b, res


@pytest.mark.parametrize("shape,split", [((3, 40, 1000), 3), ((5, 50, 200), 9), ((2, 24, 64), 4), ((1, 16, 520), 2)])
def test_forced_split_through_run_gemm(fake_kernels, shape, split):
    """run_gemm(config=...split_k) -> the split kernel with its workspace; K=1000 ends in a
    partial k-tile, split 9 at K=200 (4 k-tiles) is clamped to 4, K=64 (one k-tile) does
    not split at all."""
    M, N, K = shape
    x, w, b, res = _linear_case(M, N, K)
    epi = Epilogue(activation="gelu_tanh", bias=True, residual=True, alpha=True, beta=True)
    out = torch.empty(M, N, dtype=torch.bfloat16)
    cfg = GemmConfig(64, 64, 1, 1, pingpong=True, split_k=split)
    api.run_gemm(x, w, out, epi=epi, bias=b, residual=res, alpha=0.5, beta=2.0, config=cfg)
    call = fake_kernels[-1]
    k_tiles = -(-K // 64)
    assert call["out"] is out and call["epi"] == epi  # the epilogue is fused: no second pass
    assert call["split"] == min(split, k_tiles) and (call["cfg"].split_k > 1) == (k_tiles > 1)
    ref = linear_ref(x.float(), w.float(), b.float(), activation="gelu_tanh", residual=res.float(), alpha=0.5, beta=2.0)
    torch.testing.assert_close(out.float(), ref, atol=0.05, rtol=0.02)


def test_linear_auto_split_plan(fake_kernels):
    """A decode-time linear splits by the heuristic; the recorded plan replays the split launch."""
    M, N, K = 1, 1600, 6400
    x, w, b, res = _linear_case(M, N, K)
    outs = [api.linear(x, w, b, activation="gelu_tanh", residual=res) for _ in range(2)]
    assert len(api._LINEAR_PLANS) == 1
    gemm_calls = [c for c in fake_kernels]
    assert len(gemm_calls) == 2 and all(c["split"] == 5 for c in gemm_calls)
    fn = next(iter(api._LINEAR_PLANS.values()))[0]
    assert isinstance(fn, api.SplitKLaunch) and fn.split == 5
    ref = linear_ref(x.float(), w.float(), b.float(), activation="gelu_tanh", residual=res.float())
    for o in outs:
        torch.testing.assert_close(o.float(), ref, atol=0.05, rtol=0.02)


def test_gemm_auto_split_padded_n(fake_kernels):
    """gemm() with N not a multiple of 4/8 splits straight into the padded output view."""
    a = torch.randn(2, 6400, dtype=torch.bfloat16)
    b = torch.randn(1598, 6400, dtype=torch.bfloat16).t()
    out = api.gemm(a, b, out_dtype=torch.float32)
    call = fake_kernels[-1]
    assert call["split"] > 1 and call["out"].stride(0) == 1600  # output rows padded to 16 bytes
    assert out.shape == (2, 1598)
    torch.testing.assert_close(out, a.float() @ b.float(), atol=1e-2, rtol=1e-3)


def test_split_workspace_grows_and_is_reused():
    """One workspace per (device, dtype, stream): reused while big enough, grown (never
    shrunk) otherwise, with fresh zeroed counters."""
    api._WORKSPACES.clear()
    dev = torch.device("cpu")
    ws, sem = api.split_workspace(dev, torch.float32, 1000, 10)
    assert ws.numel() == 1000 and sem.numel() == 10 and not sem.any() and sem.dtype == torch.int32
    ws2, sem2 = api.split_workspace(dev, torch.float32, 500, 4)
    assert ws2 is ws and sem2 is sem
    ws3, sem3 = api.split_workspace(dev, torch.float32, 2000, 4)
    assert ws3.numel() == 2000 and sem3.numel() == 10 and not sem3.any()
    wsi, _ = api.split_workspace(dev, torch.int32, 10, 1)  # int8 partials: their own buffer
    assert wsi.dtype == torch.int32
    api._WORKSPACES.clear()


def test_8bit_paths_do_not_auto_split(fake_kernels):
    a = torch.randint(-128, 128, (1, 6400), dtype=torch.int8)
    b = torch.randint(-128, 128, (1600, 6400), dtype=torch.int8)
    fn = api.kernel_for(a, b, torch.int32, Epilogue(), kernel_name="int8_mm_sm90", acc_name="Int32")
    assert not isinstance(fn, api.SplitKLaunch)


def test_int8_forced_split_is_exact(fake_kernels):
    torch.manual_seed(3)
    a = torch.randint(-128, 128, (3, 1024), dtype=torch.int8)
    b = torch.randint(-128, 128, (40, 1024), dtype=torch.int8)
    out = torch.empty(3, 40, dtype=torch.int32)
    api.run_gemm(a, b, out, epi=Epilogue(), config=GemmConfig(128, 128, 1, 1, split_k=4),
                 kernel_name="int8_mm_sm90", acc_name="Int32")
    assert fake_kernels[-1]["out"] is out and fake_kernels[-1]["split"] == 4  # 8 k-tiles of 128
    assert torch.equal(out, (a.long() @ b.long().t()).int())


def _run_interpreted(script: str) -> None:
    """Run a script in a fresh process under Triton's CPU interpreter; it must print OK."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("triton")
    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(repo) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", script], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    if proc.returncode:
        from tests.conftest import skip_if_interpreter_numpy_error

        skip_if_interpreter_numpy_error(proc.stderr)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]


def _triton_ptx_sm90(kernel, sig: dict, const: dict, **options) -> str:
    """Compile a Triton kernel for sm_90 on the CPU (no GPU needed) and return its PTX."""
    import os

    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        pytest.skip("TRITON_INTERPRET is set in this process")
    triton = pytest.importorskip("triton")
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError as e:
        pytest.skip(f"this Triton has no ASTSource/GPUTarget: {e}")
    try:
        src = ASTSource(fn=kernel, signature={**sig, **{k: "constexpr" for k in const}},
                        constexprs={(kernel.arg_names.index(k),): v for k, v in const.items()})
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options or None)
    except (TypeError, KeyError, AttributeError) as e:  # the ASTSource signature format changed
        pytest.skip(f"compile harness does not fit this Triton version: {e}")
    return compiled.asm["ptx"]


# --------------------------------------------------------------------------- skinny (GEMV) path

_GEMV_SCRIPT = r"""
import torch
from cute_kernels.matmul.config import Epilogue
from cute_kernels.matmul.gemv import GemvLaunch
from cute_kernels.matmul.reference import linear_ref

torch.manual_seed(0)
n = 0
epis = [Epilogue(), Epilogue(activation="gelu_tanh", bias=True, residual=True, alpha=True, beta=True),
        Epilogue(activation="relu", bias=True), Epilogue(activation="gelu", residual=True)]
for (M, N, K) in [(1, 40, 300), (3, 17, 64), (8, 33, 513), (5, 16, 1)]:
    for epi in epis:
        # fp16 operands: Triton's CPU interpreter gets tl.dot on bf16 wrong (it reads the
        # bits as garbage); the kernel itself is dtype-generic and bf16 is covered on the GPU.
        for odt in (torch.float16, torch.float32):
            a = torch.randn(M, K + 5).half()[:, :K]  # strided rows
            w = torch.randn(N, K).half()
            a[0, 0] = float("nan") if M > 1 else a[0, 0]
            bias = torch.randn(N).to(odt) if epi.bias else None
            res = torch.randn(M, N + 3).to(odt)[:, :N] if epi.residual else None
            out = torch.full((M, N + 8), -7.0).to(odt)[:, :N]
            GemvLaunch(epi)(a, w, out, bias, res, None, None, 0.5, 2.0)
            ref = linear_ref(a.float(), w.float(), None if bias is None else bias.float(),
                             activation=None if epi.activation == "none" else epi.activation,
                             residual=None if res is None else res.float(),
                             alpha=0.5 if epi.alpha else 1.0, beta=2.0 if epi.beta else 1.0)
            tol = 1e-4 if odt == torch.float32 else 2e-2
            assert torch.allclose(out.float(), ref.float(), rtol=tol, atol=tol, equal_nan=True), (M, N, K, epi, odt)
            if M > 1:
                assert torch.isnan(out[0]).all() and not torch.isnan(out[1:]).any()
            n += 1
# LayerNorm prologue (layernorm_gemv): large-mean rows (GPT-2's residual stream), K not a
# multiple of the tile, fp32 reference of LN -> linear.
from cute_kernels.matmul.gemv import layernorm_gemv
from cute_kernels.matmul.api import layernorm_linear_ref
for (M, N, K, act) in [(1, 40, 300, "gelu_tanh"), (8, 17, 513, None)]:
    x = (torch.randn(M, K) * 3 + 50).half()
    g, bb = torch.randn(K).half(), torch.randn(K).half()
    w, bias = (torch.randn(N, K) / K ** 0.5).half(), torch.randn(N).half()
    out = layernorm_gemv(x, g, bb, 1e-5, w, bias, act)
    ref = layernorm_linear_ref(x, g, bb, w, bias, activation=act)
    assert torch.allclose(out.float(), ref, rtol=2e-2, atol=2e-2), (M, N, K, (out.float() - ref).abs().max())
    n += 1
# The first FIRST_STEPS K steps' weights are loaded up front, the loop does the rest.
import sys
gv = sys.modules["cute_kernels.matmul.gemv"]
for steps in (1, 2):
    gv.FIRST_STEPS = steps
    x = torch.randn(1, 1300).half()
    w = (torch.randn(24, 1300) / 30).half()
    bias = torch.randn(24).half()
    out = gv.skinny_gemm(x, w, bias, "gelu_tanh")
    ref = linear_ref(x.float(), w.float(), bias.float(), activation="gelu_tanh")
    assert torch.allclose(out.float(), ref, rtol=2e-2, atol=2e-2), (steps, (out.float() - ref).abs().max())
    n += 1
gv.FIRST_STEPS = 1
# KV-cache append fused into the epilogue (c_attn at decode): caches [B, H, Smax, D] as a
# transposed view of [B, Smax, H, D]; one position for every row, or one per row.
from cute_kernels.matmul.gemv import skinny_gemm
for M, per_row in ((1, False), (3, True)):
    H, D, B, S = 2, 64, 4, 9
    C = H * D
    x = torch.randn(M, 96).half()
    w = (torch.randn(3 * C, 96) / 10).half()
    kc = torch.randn(B, S, H, D).half().transpose(1, 2)
    vc = torch.randn(B, S, H, D).half().transpose(1, 2)
    k0, v0 = kc.clone(), vc.clone()
    pos = torch.tensor([5, 0, 8][:M]) if per_row else torch.tensor([7], dtype=torch.int32)
    y = skinny_gemm(x, w, kv=(kc, vc, pos))
    ref = (x.float() @ w.float().t()).half()
    assert torch.allclose(y.float(), ref.float(), rtol=2e-2, atol=2e-2)
    for m in range(M):
        p = int(pos[m if per_row else 0])
        k0[m, :, p] = y[m, C:2 * C].view(H, D)
        v0[m, :, p] = y[m, 2 * C:].view(H, D)
    assert torch.equal(kc, k0) and torch.equal(vc, v0), "kv append wrote the wrong cache rows"
    n += 1
print("OK", n)
"""


_WEIGHT_ONLY_SCRIPT = r"""
import torch
from cute_kernels.matmul.gemv import weight_only_gemv
from cute_kernels.matmul.reference import linear_ref
torch.manual_seed(0)
for wdt in (torch.int8, torch.float8_e4m3fn):
    for (M, N, K) in [(1, 40, 300), (5, 17, 513)]:
        x = torch.randn(M, K).half()
        wf = torch.randn(N, K)
        if wdt == torch.int8:
            wq = torch.randint(-127, 128, (N, K), dtype=torch.int8)
        else:
            wq = wf.to(wdt)
        s = torch.rand(N) + 0.5
        xs = torch.rand(K) + 0.5
        bias = torch.randn(N).half()
        res = torch.randn(M, N).half()
        out = weight_only_gemv(x, wq, s, bias, "gelu_tanh", res, xs)
        ref = linear_ref((x.float() * xs), wq.float() * s[:, None], bias.float(), activation="gelu_tanh", residual=res.float())
        err = (out.float() - ref).abs().max().item() / ref.abs().max().item()
        assert err < 2e-2
print("OK")
"""


def test_weight_only_gemv_interpreted():
    """8-bit weights (int8 and fp8) widened in the skinny GEMM, per-channel scale, SmoothQuant
    activation scale, bias, gelu and residual, under TRITON_INTERPRET=1."""
    _run_interpreted(_WEIGHT_ONLY_SCRIPT)


def test_gemv_triton_interpreted():
    """The skinny kernel's logic (tiling, masks, fused epilogue, NaN rows) under TRITON_INTERPRET=1."""
    _run_interpreted(_GEMV_SCRIPT)


def test_gemv_launch_arguments_by_name(monkeypatch):
    """The skinny kernel is launched with every parameter in order (TritonLaunch.all_args):
    matched against the kernel's own parameter names, each value lands where it belongs,
    with and without the LayerNorm / 8-bit scale / KV-append parameters."""
    from cute_kernels.matmul import gemv

    seen = []
    monkeypatch.setattr(gemv._GEMV_LAUNCH, "all_args", lambda grid, args, **opt: seen.append((grid, args, opt)))
    names = gemv._gemv_kernel.arg_names
    M, N, K = 3, 96, 64
    x = torch.randn(M, K, dtype=torch.bfloat16)
    w = torch.randn(N, K, dtype=torch.bfloat16)
    bias, res = torch.randn(N, dtype=torch.bfloat16), torch.randn(M, N, dtype=torch.bfloat16)
    out = gemv.skinny_gemm(x, w, bias, "gelu_tanh", res, alpha=0.5, beta=2.0)
    p = dict(zip(names, seen[-1][1]))
    assert len(seen[-1][1]) == len(names)
    assert p["x_ptr"] is x and p["w_ptr"] is w and p["out_ptr"] is out and p["bias_ptr"] is bias and p["res_ptr"] is res
    assert (p["alpha"], p["beta"], p["M"], p["N"], p["K"]) == (0.5, 2.0, M, N, K)
    assert (p["stride_xm"], p["stride_wn"], p["stride_om"], p["stride_rm"]) == (K, K, N, N)
    assert (p["ACT"], p["HAS_BIAS"], p["HAS_RES"], p["USE_ALPHA"], p["USE_BETA"]) == (3, True, True, True, True)
    assert p["ln_w_ptr"] is None and p["LN"] is False and p["col_scale_ptr"] is None and p["KV"] is False
    assert (p["kv_c"], p["KV_D"], p["K_PAD"]) == (1, 64, 16)
    lw, lb = torch.randn(K, dtype=torch.bfloat16), torch.randn(K, dtype=torch.bfloat16)
    wq, ws = w.to(torch.int8), torch.rand(N)
    kc = torch.zeros(M, 2, 8, 16, dtype=torch.bfloat16)
    vc, pos = torch.zeros_like(kc), torch.tensor([1, 2, 3], dtype=torch.int32)
    gemv.skinny_gemm(x, wq, ln=(lw, lb, 1e-6), w_scale=ws, kv=(kc, vc, pos))
    p = dict(zip(names, seen[-1][1]))
    assert p["ln_w_ptr"] is lw and p["ln_b_ptr"] is lb and p["eps"] == 1e-6 and p["LN"] is True and p["K_PAD"] == 64
    assert p["col_scale_ptr"] is ws and p["COL_SCALE"] == 2 and p["xs_ptr"] is None
    assert p["KV"] is True and p["k_cache_ptr"] is kc and p["v_cache_ptr"] is vc and p["pos_ptr"] is pos
    assert (p["pos_stride"], p["kv_c"], p["kv_sb"], p["kv_sh"], p["kv_ss"], p["KV_D"]) == (1, 32, 256, 128, 16, 16)


def test_gemv_routing(monkeypatch):
    """On by default (CUTE_KERNELS_GEMV=0 turns it off): 16-bit, <= 8 rows, K-major operands,
    no 8-bit scales; a forced config wins."""
    from cute_kernels.matmul.gemv import GEMV_ENV, GemvLaunch

    a = torch.randn(4, 64, dtype=torch.bfloat16)
    w = torch.randn(32, 64, dtype=torch.bfloat16)
    monkeypatch.setenv(GEMV_ENV, "0")
    monkeypatch.setattr(api, "get_kernel", lambda *args, **kw: "wgmma")
    assert api.kernel_for(a, w, torch.bfloat16, Epilogue()) == "wgmma"
    monkeypatch.delenv(GEMV_ENV, raising=False)
    assert isinstance(api.kernel_for(a, w, torch.bfloat16, Epilogue(bias=True)), GemvLaunch)
    assert api.kernel_for(torch.randn(9, 64, dtype=torch.bfloat16), w, torch.bfloat16, Epilogue()) == "wgmma"
    assert api.kernel_for(a.t().contiguous().t(), w, torch.bfloat16, Epilogue()) == "wgmma"  # M-major a
    assert api.kernel_for(a, w, torch.bfloat16, Epilogue(), config=GemmConfig(64, 64, 1, 1, pingpong=True)) == "wgmma"
    assert api.kernel_for(a, w, torch.bfloat16, Epilogue(row_scale="vector")) == "wgmma"


GEMV_SIGNATURE = {  # the skinny kernel's non-constexpr parameters, for sm_90 compiles
"x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "bias_ptr": "*bf16", "res_ptr": "*bf16",
    "alpha": "fp32", "beta": "fp32", "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32",
    "stride_wn": "i32", "stride_om": "i32", "stride_rm": "i32", "ln_w_ptr": "*bf16", "ln_b_ptr": "*bf16",
    "eps": "fp32", "col_scale_ptr": "*fp32", "xs_ptr": "*fp32",
    "k_cache_ptr": "*bf16", "v_cache_ptr": "*bf16", "pos_ptr": "*i32", "pos_stride": "i32", "kv_c": "i32",
    "kv_sb": "i32", "kv_sh": "i32", "kv_ss": "i32", "cos_ptr": "*bf16", "sin_ptr": "*bf16", "q_ptr": "*bf16",
    "stride_q": "i32", "QD": "i32", "KD": "i32"}


def _gemv_constexprs(block_m: int, block_n: int, **on) -> dict:
    """The skinny kernel's constexprs for an sm_90 compile: every option off but those in `on`."""
    return {**dict(ACT=0, HAS_BIAS=False, HAS_RES=False, USE_ALPHA=False, USE_BETA=False, BLOCK_M=block_m,
                   BLOCK_N=block_n, BLOCK_K=256, LN=False, K_PAD=4096, COL_SCALE=0, XSCALE=False, PDL=True,
                   KV=False, KV_D=64, FIRST_STEPS=2, RMS=False, SWIGLU=False, DOT_F16=False, ROPE=False,
                   ROPE_EXACT=True), **on}


@pytest.mark.parametrize("block_m,block_n", [(16, 16), (1, 8)])
def test_gemv_triton_compiles_for_sm90(block_m, block_n):
    """The skinny kernel through Triton's GPU pipeline (PTX for sm_90) on the CPU: the
    tl.dot form and the one-row FMA form."""
    from cute_kernels.matmul.gemv import _gemv_kernel as K

    const = _gemv_constexprs(block_m, block_n, ACT=3, HAS_BIAS=True, HAS_RES=True, USE_ALPHA=True, LN=True,
                             K_PAD=2048, COL_SCALE=2, XSCALE=True, KV=True)  # every option
    ptx = _triton_ptx_sm90(K, GEMV_SIGNATURE, const, num_warps=4, num_stages=4)
    assert ".target sm_90" in ptx and ("mma.sync" in ptx) == (block_m == 16) and "st.global" in ptx
    # PDL: the first weight tile is loaded before the wait,
    # nothing is stored before it, and the next kernel may launch before it too (the decode
    # chain runs ahead).
    i_wait = ptx.index("griddepcontrol.wait")
    assert ptx.index("griddepcontrol.launch_dependents") < i_wait
    assert "ld.global" in ptx[:i_wait] and "st.global" not in ptx[:i_wait]


@pytest.mark.parametrize("block_m,block_n", [(16, 16), (1, 16)])
def test_gemv_llama_prologue_compiles_for_sm90(block_m, block_n):
    """The skinny kernel's Llama options (RMSNorm prologue, SwiGLU epilogue) through Triton's
    sm_90 pipeline: gate and up weights both load before the PDL wait, nothing is stored
    before it."""
    from cute_kernels.matmul.gemv import _gemv_kernel as K

    const = _gemv_constexprs(block_m, block_n, RMS=True, SWIGLU=True)
    ptx = _triton_ptx_sm90(K, GEMV_SIGNATURE, const, num_warps=8, num_stages=4)
    i_wait = ptx.index("griddepcontrol.wait")
    assert ".target sm_90" in ptx and ptx.index("griddepcontrol.launch_dependents") < i_wait
    assert ptx[:i_wait].count("ld.global") >= 2 and "st.global" not in ptx[:i_wait]


@pytest.mark.parametrize("block_m,block_n", [(16, 16), (1, 8)])
def test_gemv_rope_epilogue_compiles_for_sm90(block_m, block_n):
    """The q/k/v GEMV with RoPE + append in its epilogue (the Llama decode step) through Triton's
    sm_90 pipeline: the RoPE products are mul.rn (never contracted into an FMA), nothing is
    stored before the PDL wait."""
    from cute_kernels.matmul.gemv import _gemv_kernel as K

    const = _gemv_constexprs(block_m, block_n, HAS_BIAS=True, BLOCK_K=512, KV_D=128, RMS=True, ROPE=True)
    ptx = _triton_ptx_sm90(K, GEMV_SIGNATURE, const, num_warps=4, num_stages=3)
    i_wait = ptx.index("griddepcontrol.wait")
    assert ".target sm_90" in ptx and re.search(r"mul\.rn(\.ftz)?\.f32", ptx) and "st.global" not in ptx[:i_wait]


def test_layernorm_linear_validates():
    import cute_kernels as ck

    x = torch.randn(2, 64, dtype=torch.bfloat16)
    w = torch.randn(32, 64, dtype=torch.bfloat16)
    g = torch.ones(64, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="bfloat16 or float16"):
        ck.layernorm_linear(x.float(), g, g, w.float())
    with pytest.raises(ValueError, match="CUDA|cuda|GPU"):
        ck.layernorm_linear(x, g, g, w)


# --------------------------------------------------------------------------- CuTe DSL one-row GEMV

GEMV_SM90_CASES = [
    # (epilogue, LayerNorm prologue, kv append): GPT-2's four decode linears and every option
    (dict(bias=True), True, True),  # c_attn: LN + bias + KV append
    (dict(bias=True, residual=True), False, False),  # attn / mlp c_proj
    (dict(bias=True, activation="gelu_tanh"), True, False),  # c_fc
    (dict(residual=True, alpha=True, beta=True, activation="gelu"), False, False),
]


@pytest.mark.compile
@pytest.mark.parametrize("epi,ln,kv", GEMV_SM90_CASES, ids=["c_attn", "c_proj", "c_fc", "alpha-beta-gelu"])
def test_gemv_sm90_compiles(tmp_path, epi, ln, kv):
    """The one-row GEMV for sm_90a on the CPU: bulk copies (cp.async.bulk), the bf16
    mma.sync, ldmatrix, programmatic dependent launch, no spills."""
    import glob

    from cute_kernels.matmul.config import Epilogue
    from cute_kernels.matmul.gemv import _compile_gemv_sm90, gemv_sm90_config

    cfg = gemv_sm90_config(4800, 1600, ln)
    _compile_gemv_sm90(torch.bfloat16, torch.bfloat16, Epilogue(**epi), ln, (torch.bfloat16, torch.int64) if kv else None,
                       cfg, keep_dir=str(tmp_path))
    ptx = open(glob.glob(str(tmp_path / "*.ptx"))[0]).read()
    assert ".target sm_90a" in ptx
    assert "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes" in ptx
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx and "ldmatrix" in ptx
    assert "griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx
    assert_ptxas_no_spills(glob.glob(str(tmp_path / "*.ptx"))[0])


@pytest.mark.compile
@pytest.mark.parametrize("wdt", [torch.float8_e4m3fn, torch.int8], ids=["e4m3", "int8"])
def test_gemv_sm90_8bit_compiles(tmp_path, wdt):
    """The 8-bit weight-only one-row GEMV (c_attn with LayerNorm and KV append): bulk copies,
    the f16 mma.sync, the e4m3 hardware conversion or the int8 byte-permute conversion, no spills."""
    import glob

    from cute_kernels.matmul.config import Epilogue
    from cute_kernels.matmul.gemv import _compile_gemv_sm90, gemv_sm90_config

    cfg = gemv_sm90_config(4800, 1600, True, wbytes=1)
    _compile_gemv_sm90(torch.bfloat16, torch.bfloat16, Epilogue(bias=True, col_scale="vector"), True,
                       (torch.bfloat16, torch.int64), cfg, keep_dir=str(tmp_path), w_dt=wdt)
    path = glob.glob(str(tmp_path / "*.ptx"))[0]
    ptx = open(path).read()
    assert "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes" in ptx
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx
    assert ("cvt.rn.f16x2.e4m3x2" in ptx) if wdt == torch.float8_e4m3fn else ("prmt.b32" in ptx)
    assert_ptxas_no_spills(path)


def test_ab_gemv_shapes_and_gpu_check():
    """benchmarks.ab_gemv: NxK shapes the one-row kernel runs only, refused before any GPU work;
    one stderr line without a Hopper GPU."""
    import argparse
    import subprocess
    import sys

    from benchmarks.ab_gemv import parse_shapes

    assert parse_shapes("50257x768, 4800x1600") == [(50257, 768), (4800, 1600)]
    for bad in ("50257", "0x768", "50257x770", "50257x8192", "axb"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_shapes(bad)
    if not torch.cuda.is_available():
        out = subprocess.run([sys.executable, "-m", "benchmarks.ab_gemv", "--shapes", "4800x1600"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and "Hopper" in out.stderr, out.stderr


def test_gemv_sm90_config_and_routing():
    """Rows per CTA in multiples of 8 sized to ~96 KB of weights, at least one CTA per SM where
    N allows; what the one-row kernel takes (everything else stays on the Triton kernel)."""
    from cute_kernels.matmul.gemv import gemv_sm90_applies, gemv_sm90_config

    assert gemv_sm90_config(4800, 1600, True).rows == 32  # 150 CTAs, two per SM fit
    assert gemv_sm90_config(1600, 1600, False).rows == 8  # 200 CTAs (16 rows would leave SMs idle)
    assert gemv_sm90_config(50257, 1600, True).rows == 8  # vocabulary-sized: 28 KB slices
    assert gemv_sm90_config(50257, 768, False).rows == 16 and gemv_sm90_config(50257, 768, False, wbytes=1).rows == 64
    assert gemv_sm90_config(16, 16, False).rows == 8
    for N, K, ln in ((4800, 1600, True), (1600, 6400, False), (50257, 4096, True)):
        cfg = gemv_sm90_config(N, K, ln)
        assert cfg.rows % 8 == 0 and cfg.k_max >= K and cfg.k_max % 64 == 0
        assert cfg.smem_bytes(ln) <= 227 * 1024

    class Fake:  # a CUDA-looking tensor for the routing rules (no GPU here)
        def __init__(self, shape, dtype=torch.bfloat16, stride=None, ptr=0):
            self.shape, self.dtype, self.is_cuda = shape, dtype, True
            self._stride = stride or (shape[1], 1) if len(shape) == 2 else (1,)
            self._ptr = ptr

        def stride(self, i=None):
            return self._stride if i is None else self._stride[i]

        def element_size(self):
            return torch.empty((), dtype=self.dtype).element_size()

        def data_ptr(self):
            return self._ptr

        def numel(self):
            return self.shape[0] * (self.shape[1] if len(self.shape) == 2 else 1)

        def is_contiguous(self):
            return True

    x, w, out = Fake((1, 1600)), Fake((4800, 1600)), Fake((1, 4800))
    # 8-bit weight-only: e4m3 / int8 with an fp32 per-channel scale; K counts in bytes (6400 fits)
    sc = Fake((4800,), torch.float32)
    assert gemv_sm90_applies(x, Fake((4800, 1600), torch.float8_e4m3fn), out, None, None, None, sc, None, None)
    assert gemv_sm90_applies(Fake((1, 6400)), Fake((1600, 6400), torch.int8), Fake((1, 1600)), None, None, None,
                             Fake((1600,), torch.float32), None, None)
    assert not gemv_sm90_applies(x, Fake((4800, 1600), torch.float8_e5m2), out, None, None, None, sc, None, None)
    assert not gemv_sm90_applies(x, Fake((4800, 1600), torch.int8), out, None, None, None, sc, Fake((1600,)), None)
    assert gemv_sm90_config(6400, 1600, True, wbytes=1).rows == 48
    assert gemv_sm90_applies(x, w, out, None, None, None, None, None, None)
    assert not gemv_sm90_applies(Fake((2, 1600)), w, Fake((2, 4800)), None, None, None, None, None, None)  # M > 1
    assert not gemv_sm90_applies(Fake((1, 1608)), Fake((4800, 1608)), out, None, None, None, None, None, None)  # K % 16
    assert not gemv_sm90_applies(x, Fake((4800, 1600), torch.float8_e4m3fn), out, None, None, None, None, None, None)
    assert not gemv_sm90_applies(Fake((1, 1600), ptr=2), w, out, None, None, None, None, None, None)  # unaligned x
    assert not gemv_sm90_applies(Fake((1, 6400)), Fake((1600, 6400)), Fake((1, 1600)), None, None, None, None, None,
                                 None)  # K above GEMV_K_MAX: its rows would not fit two CTAs per SM


def test_tune_gemm_config_labels_round_trip():
    """benchmarks.tune_gemm --configs takes the labels its sweep prints."""
    import dataclasses

    from benchmarks.tune_gemm import _label, parse_label
    from cute_kernels.matmul.config import GemmConfig
    from cute_kernels.matmul.heuristics import CANDIDATES

    cfgs = list(CANDIDATES) + [GemmConfig(128, 256, 1, 2, raster_m=False), GemmConfig(128, 256, 2, 1, group=16),
                               dataclasses.replace(CANDIDATES[0], split_k=3), GemmConfig(128, 128, promote=True),
                               GemmConfig(64, 32, 1, 2, split_k=2, swap_ab=True, stages=12),
                               GemmConfig(256, 136, 2, 1, swap_ab=True, whole_tile_epi=True),
                               GemmConfig(128, 168, 2, 1, swap_ab=True, whole_tile_epi=False)]
    for c in cfgs:
        assert parse_label(_label(c)) == c
    with pytest.raises(ValueError, match="not a config label"):
        parse_label("128x256")


def test_grid_rounds_are_checked_before_any_timing():
    """benchmarks.gemm's grid takes rounds >= 1 (timings per provider, alternating order, median)."""
    from benchmarks.gemm import GRID_ROUNDS, main, run_grid

    assert GRID_ROUNDS >= 1
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="rounds must be an int >= 1"):
            run_grid(seed=1, count=1, rounds=bad)
    with pytest.raises(SystemExit):  # --rounds parses as an int
        main(["--grid", "--rounds", "x"])


def test_gemm_profile_summarizes_an_ncu_source_page(tmp_path):
    """benchmarks.gemm_profile reads Nsight Compute's SASS source page: stall reasons, opcodes
    (predicates dropped), the wgmma share and the span of the output stores."""
    from benchmarks.gemm_profile import _opcode, format_summary, main, summarize

    hdr = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed", "stall_barrier",
           "stall_barrier (Not Issued)", "stall_long_sb"]
    body = [["0x10", "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR16], R9", "6", "8", "0", "0", "6"],
            ["0x20", "HGMMA.64x176x16.F32.BF16 R24, gdesc[UR20], R24", "3", "64", "0", "0", "0"],
            ["0x30", "WARPGROUP.DEPBAR.LE gsb0, 0x1", "5", "8", "5", "5", "0"],
            ["0x40", "STSM.16.MT88.4 [R7], R116", "2", "8", "0", "0", "0"],
            ["0x50", "@!P0  BAR.SYNC.DEFER_BLOCKING 0x4, 0x80", "4", "8", "4", "4", "0"],
            ["0x60", "UTMASTG.2D desc[URZ], [UR16], [UR20]", "0", "2", "0", "0", "0"]]
    path = tmp_path / "k_sass.csv"
    with open(path, "w") as f:
        f.write('"Kernel Name","nvjet_sm90_tst_128x176_64x5_2x1_v_bz_TNT",\n')
        for r in [hdr] + body:
            f.write(",".join(f'"{c}"' for c in r) + "\n")
    s = summarize(str(path), top=2)
    assert s["kernel"].startswith("nvjet_sm90") and s["samples"] == 20 and s["instructions_executed"] == 98
    assert s["by_reason"] == {"barrier": 9, "long_sb": 6}
    assert s["mma_share"] == 8 / 20 and s["epilogue_share"] == 6 / 20  # STSM .. UTMASTG
    assert s["top"] == [("SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR16], R9", 6),
                        ("WARPGROUP.DEPBAR.LE gsb0, 0x1", 5)]
    assert _opcode("@!P0  BAR.SYNC.DEFER_BLOCKING 0x4, 0x80") == "BAR.SYNC.DEFER_BLOCKING"
    assert "| barrier | 9 | 45.0% |" in format_summary("k", s)
    assert main(["summarize", str(path), "--top", "3"]) == 0
    with pytest.raises(ValueError, match="not an ncu source page"):
        (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
        summarize(str(tmp_path / "bad.csv"))
    with pytest.raises(SystemExit):
        main(["run", "--shape", "12x34"])  # a shape is MxNxK


def test_gemm_profile_reads_speed_of_light_from_an_ncu_details_page(tmp_path):
    """The first kernel's elapsed and SM-active cycles, duration and clock from ncu's details page;
    other sections and kernels are ignored, and they head that kernel's summary."""
    from benchmarks.gemm_profile import format_summary, speed_of_light

    # Rows leave out the rule columns that end the header.
    hdr = ["ID", "Kernel Name", "Section Name", "Metric Name", "Metric Unit", "Metric Value", "Rule Name", "Rule Type"]
    body = [["0", "kernel_cutlass_x", "GPU Speed Of Light Throughput", "Elapsed Cycles", "cycle", "34,368"],
            ["0", "kernel_cutlass_x", "GPU Speed Of Light Throughput", "Duration", "us", "19.46"],
            ["0", "kernel_cutlass_x", "GPU Speed Of Light Throughput", "SM Active Cycles", "cycle", "27,073.34"],
            ["0", "kernel_cutlass_x", "GPU Speed Of Light Throughput", "DRAM Throughput", "%", "23.80"],
            ["0", "kernel_cutlass_x", "Occupancy", "Elapsed Cycles", "cycle", "1"],
            ["1", "nvjet_sm90_y", "GPU Speed Of Light Throughput", "Elapsed Cycles", "cycle", "29,338"]]
    path = tmp_path / "k_details.csv"
    path.write_text("\n".join(",".join(f'"{c}"' for c in r) for r in [hdr] + body) + "\n")
    sol = speed_of_light(str(path))
    assert sol == {"Elapsed Cycles": (34368.0, "cycle"), "Duration": (19.46, "us"),
                   "SM Active Cycles": (27073.34, "cycle")}
    s = {"kernel": "k", "samples": 0, "mma_share": None, "epilogue_share": None, "by_reason": {}, "by_opcode": {}}
    assert "Elapsed Cycles 34,368 cycle, Duration 19.46 us, SM Active Cycles 27,073.34 cycle" in format_summary("k", s, sol=sol)
    with pytest.raises(ValueError, match="not an ncu details page"):
        (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
        speed_of_light(str(tmp_path / "bad.csv"))
