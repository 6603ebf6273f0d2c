"""FP8 / INT8 GEMM tests: compile tier (CPU) and gpu tier (against dequantized fp32 references)."""

from __future__ import annotations

import glob

import pytest
import torch

from cute_kernels.matmul.config import GemmConfig

E4M3 = torch.float8_e4m3fn
CASES = [
    (GemmConfig(128, 256, 2, 1), dict(row_scale="vector", col_scale="vector", bias=True), E4M3, torch.bfloat16, "Float32"),
    (GemmConfig(128, 128, 2, 1, pingpong=True), dict(row_scale="scalar", col_scale="scalar", activation="gelu_tanh"), torch.float8_e5m2, torch.float16, "Float32"),
    (GemmConfig(128, 256, 2, 1), {}, torch.int8, torch.int32, "Int32"),
    (GemmConfig(128, 96, 2, 1), dict(row_scale="vector", col_scale="vector", bias=True), torch.int8, torch.bfloat16, "Int32"),
    (GemmConfig(128, 128, 2, 1, promote=True), dict(row_scale="vector", col_scale="vector"), E4M3, torch.bfloat16, "Float32"),
    # GPT-2's fp8 c_fc (ping-pong, staged vectors per warpgroup) and c_proj (residual, 160 columns)
    (GemmConfig(128, 128, 2, 1, pingpong=True), dict(row_scale="vector", col_scale="vector", bias=True, activation="gelu_tanh"),
     E4M3, torch.bfloat16, "Float32"),
    (GemmConfig(128, 160, 2, 1), dict(row_scale="vector", col_scale="vector", bias=True, residual=True), E4M3,
     torch.bfloat16, "Float32"),
    # DeepSeek-V3-style block scales (TMA-staged with each A/B stage), small-M tile too
    (GemmConfig(128, 128, 2, 1, promote=True), dict(row_scale="block", col_scale="block", bias=True, residual=True,
                                                    activation="gelu_tanh"), E4M3, torch.bfloat16, "Float32"),
    (GemmConfig(64, 128, 1, 1, promote=True), dict(row_scale="block", col_scale="block"), torch.float8_e5m2,
     torch.float16, "Float32"),
    (GemmConfig(64, 128, 1, 1, promote=True, split_k=2), dict(row_scale="block", col_scale="block", bias=True), E4M3,
     torch.bfloat16, "Float32"),
]


@pytest.mark.compile
@pytest.mark.parametrize("cfg,epi,in_dt,out_dt,acc", CASES, ids=["fp8-e4m3-rowcol-bias", "fp8-e5m2-tensor-pp", "int8-raw", "int8-dequant", "fp8-promoted", "fp8-pp-rowcol-bias-gelu", "fp8-160-rowcol-bias-residual", "fp8-blockwise-bias-gelu-residual", "fp8-blockwise-64", "fp8-blockwise-64-split"])
def test_8bit_compiles_for_sm90a(tmp_path, cfg, epi, in_dt, out_dt, acc):
    from cute_kernels.matmul.api import _compile
    from cute_kernels.matmul.config import Epilogue

    _compile(in_dt, in_dt, out_dt, "k", "k", cfg, Epilogue(**epi), acc, keep_dir=str(tmp_path))
    ptx = open(glob.glob(str(tmp_path / "*.ptx"))[0]).read()
    form = {"Float32": ".f32.e", "Int32": ".s32.s8.s8"}[acc]
    assert any(form in line for line in ptx.splitlines() if "wgmma.mma_async" in line)
    assert "cp.async.bulk.tensor" in ptx and "setmaxnreg" in ptx
    from tests.test_gemm import _ptxas_report

    report = _ptxas_report(glob.glob(str(tmp_path / "*.ptx"))[0])
    assert not report or "0 bytes spill stores" in report


SPLIT_CASES = [
    (GemmConfig(128, 128, 2, 1, split_k=2), torch.int8, torch.int32, "Int32"),
    (GemmConfig(128, 128, 2, 1, promote=True, split_k=2), E4M3, torch.float32, "Float32"),
    (GemmConfig(64, 64, 1, 1, pingpong=True, split_k=2), E4M3, torch.float32, "Float32"),
]


@pytest.mark.compile
@pytest.mark.parametrize("cfg,in_dt,ws_dt,acc", SPLIT_CASES, ids=["int8-split", "fp8-promoted-split", "fp8-pp64-split"])
def test_8bit_split_k_compiles_for_sm90a(tmp_path, cfg, in_dt, ws_dt, acc):
    """Split-K for 8-bit inputs (used when a config asks for it): int32 / fp32 partials and outputs."""
    from cute_kernels.matmul.api import _compile
    from cute_kernels.matmul.config import Epilogue

    _compile(in_dt, in_dt, ws_dt, "k", "k", cfg, Epilogue(), acc, keep_dir=str(tmp_path))
    with open(glob.glob(str(tmp_path / "*.ptx"))[0]) as f:
        ptx = f.read()
    form = {"Float32": ".f32.e", "Int32": ".s32.s8.s8"}[acc]
    assert any(form in line for line in ptx.splitlines() if "wgmma.mma_async" in line)
    assert "cp.async.bulk.tensor" in ptx and "setmaxnreg" in ptx and "atom.global.acq_rel.add" in ptx
    from tests.test_gemm import _ptxas_report

    report = _ptxas_report(glob.glob(str(tmp_path / "*.ptx"))[0])
    assert not report or "0 bytes spill stores" in report


@pytest.mark.compile
@pytest.mark.parametrize("cfg", [GemmConfig(64, 16, 1, 1, swap_ab=True), GemmConfig(64, 176, 4, 1, swap_ab=True),
                                 GemmConfig(128, 144, 1, 2, swap_ab=True), GemmConfig(128, 104, 4, 1, swap_ab=True)],
                         ids=["64x16", "64x176c41", "128x144c12", "128x104c41"])
def test_fp8_swap_ab_compiles_for_sm90a(tmp_path, cfg):
    """fp8 per-row scaled_mm under swap_ab: the kernel's A is the weight; row and column scales trade places."""
    from cute_kernels.matmul.api import _compile, _kernel_view
    from cute_kernels.matmul.config import Epilogue

    a_dt, b_dt, am, bm, epi = _kernel_view(E4M3, E4M3, "k", "k", cfg, Epilogue(row_scale="vector", col_scale="scalar"))
    assert (epi.row_scale, epi.col_scale) == ("scalar", "vector")
    _compile(a_dt, b_dt, torch.bfloat16, am, bm, cfg, epi, "Float32", keep_dir=str(tmp_path))
    ptx = open(glob.glob(str(tmp_path / "*.ptx"))[0]).read()
    # x4 for 16-column slabs, x2 for the 8-column slabs of widths that 16 does not divide (104)
    assert ("stmatrix.sync.aligned.m8n8.x4.trans" in ptx or "stmatrix.sync.aligned.m8n8.x2.trans" in ptx) and "e4m3" in ptx


@pytest.mark.compile
@pytest.mark.parametrize("cfg", [GemmConfig(64, 16, 1, 1, swap_ab=True), GemmConfig(64, 48, 1, 2, swap_ab=True),
                                 GemmConfig(64, 16, 1, 1, split_k=2, swap_ab=True), GemmConfig(128, 144, 1, 2, swap_ab=True),
                                 GemmConfig(64, 32, 1, 2, stages=12, swap_ab=True), GemmConfig(64, 144, 4, 2, swap_ab=True)],
                         ids=["64x16", "64x48c12", "64x16s2", "128x144c12", "64x32c12d12", "64x144c42"])
def test_int8_swap_ab_compiles_for_sm90a(tmp_path, cfg):
    """int8_mm's raw int32 under swap_ab: M-major 32-bit boxes (16 wide where 32 does not divide the
    tile), 4-byte smem stores, TMA stores; no spills."""
    from cute_kernels.matmul.api import _compile
    from cute_kernels.matmul.config import Epilogue
    from tests.test_gemm import _ptxas_report

    _compile(torch.int8, torch.int8, torch.int32, "k", "k", cfg, Epilogue(), "Int32", keep_dir=str(tmp_path))
    path = glob.glob(str(tmp_path / "*.ptx"))[0]
    ptx = open(path).read()
    assert "cp.async.bulk.tensor.2d.global.shared" in ptx and "stmatrix" not in ptx
    report = _ptxas_report(path)
    assert not report or "0 bytes spill stores" in report


def test_8bit_api_rejects_bad_input_on_cpu():
    import cute_kernels as ck

    a = torch.randn(32, 64).to(E4M3)
    b = torch.randn(48, 64).to(E4M3).t()
    one = torch.ones((), dtype=torch.float32)
    with pytest.raises(ValueError, match="CUDA"):
        ck.scaled_mm(a, b, one, one)
    with pytest.raises(TypeError):
        ck.scaled_mm(a.float(), b, one, one)
    with pytest.raises(TypeError):
        ck.int8_mm(a, b)


def test_promoted_64_row_tiles_stop_where_they_spill():
    """One warpgroup holds both accumulators of a 64-row promoted tile: up to 192 wide it
    compiles without spills (the compile tier's 64 x 128), wider ptxas spills."""
    GemmConfig(64, 192, 1, 1, promote=True).validate(1, 2)
    GemmConfig(64, 192, 1, 1, promote=True, split_k=2, swap_ab=True).validate(1, 2)
    for cfg in (GemmConfig(64, 256, 1, 1, promote=True), GemmConfig(64, 224, 1, 1, promote=True, swap_ab=True)):
        with pytest.raises(ValueError, match="64-row tile"):
            cfg.validate(1, 2)


def test_block_scales_for_kernel_layouts():
    """Block scales reach the kernel M-major (scale_a) / K-major (scale_b) with 16-byte
    strides; ones already laid out so (the quantizer's output) are passed through."""
    import quant
    from cute_kernels.quantized.api import block_scales_for_kernel

    for M, kb in ((1, 1), (5, 3), (8, 13), (130, 50)):
        sa = torch.rand(M, kb)
        ka, _ = block_scales_for_kernel(sa, None)
        assert torch.equal(ka, sa) and ka.stride(0) == 1 and ka.stride(1) % 4 == 0 and ka.stride(1) >= M
        again, _ = block_scales_for_kernel(ka, None)
        assert again.data_ptr() == ka.data_ptr()  # already in the kernel's layout: no copy
        sb = torch.rand(kb + 2, kb)
        _, kb_ = block_scales_for_kernel(None, sb)
        assert torch.equal(kb_, sb) and kb_.stride(1) == 1 and kb_.stride(0) % 4 == 0
    _, s = quant.quantize_fp8(torch.randn(7, 300), "block")
    assert s.shape == (7, 3) and block_scales_for_kernel(s, None)[0].data_ptr() == s.data_ptr()


# ------------------------------------------------------------------------------ gpu tier


def _quant_fp8(x, dim=None):
    amax = x.abs().amax() if dim is None else x.abs().amax(dim=dim, keepdim=True)
    scale = (amax.float() / 448.0).clamp(min=1e-12)
    return (x / scale).clamp(-448, 448).to(E4M3), scale.float()


def _rule(ours, theirs, ref):
    assert torch.isfinite(ours).all()
    e_ours = (ours.float() - ref).abs().max().item()
    e_theirs = (theirs.float() - ref).abs().max().item()
    assert e_ours <= 2 * e_theirs + 1e-5 * ref.abs().max().item(), f"{e_ours} vs torch {e_theirs}"


@pytest.mark.gpu
@pytest.mark.parametrize("granularity", ["tensor", "row"])
@pytest.mark.parametrize("shape", [(1, 768, 768), (17, 2304, 768), (300, 520, 208), (4096, 3072, 768), (512, 50256, 1600)])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("fast", [False, True])
def test_scaled_mm_matches_dequantized_reference(granularity, shape, with_bias, fast):
    import cute_kernels as ck

    M, N, K = shape
    x = torch.randn(M, K, device="cuda")
    w = torch.randn(N, K, device="cuda")
    a, sa = _quant_fp8(x, None if granularity == "tensor" else 1)
    wq, sw = _quant_fp8(w, None if granularity == "tensor" else 1)
    b, sb = wq.t(), sw.reshape(1, -1) if granularity == "row" else sw
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16) if with_bias else None
    out = ck.scaled_mm(a, b, sa, sb, bias=bias, out_dtype=torch.bfloat16, use_fast_accum=fast)
    ref = ck.scaled_mm_ref(a, b, sa, sb, bias=bias, out_dtype=torch.float32)
    try:
        theirs = torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=torch.bfloat16, use_fast_accum=fast)
    except RuntimeError:  # shapes cuBLASLt refuses: hold ours to bf16 output rounding
        theirs = ref.to(torch.bfloat16)
    _rule(out, theirs, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("granularity", ["tensor", "row"])
@pytest.mark.parametrize("shape", [(15, 8192, 4096), (175, 6144, 4096), (344, 4096, 4096), (77, 3000, 2000),
                                   (5, 1600, 6400)])
def test_scaled_mm_swap_ab(granularity, shape):
    """Without a bias, few-token fp8 GEMMs run swap_ab (D^T = W X^T through B's [K, N] view, the
    scales traded); with a bias, unswapped. Ragged N, split-K at 5 rows."""
    import cute_kernels as ck
    from cute_kernels.matmul.api import SwapLaunch, kernel_for
    from cute_kernels.matmul.config import Epilogue

    M, N, K = shape
    a, sa = _quant_fp8(torch.randn(M, K, device="cuda"), None if granularity == "tensor" else 1)
    wq, sw = _quant_fp8(torch.randn(N, K, device="cuda"), None if granularity == "tensor" else 1)
    b, sb = wq.t(), sw.reshape(1, -1) if granularity == "row" else sw
    mode = "vector" if granularity == "row" else "scalar"
    plan = kernel_for(a, b.t(), torch.bfloat16, Epilogue(row_scale=mode, col_scale=mode), kernel_name="scaled_mm_sm90",
                      b_kn=True)
    assert isinstance(plan, SwapLaunch)
    assert not isinstance(kernel_for(a, b.t(), torch.bfloat16, Epilogue(row_scale=mode, col_scale=mode, bias=True),
                                     kernel_name="scaled_mm_sm90", b_kn=True), SwapLaunch)
    out = ck.scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=True)
    ref = ck.scaled_mm_ref(a, b, sa, sb, out_dtype=torch.float32)
    try:
        theirs = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=True)
    except RuntimeError:  # shapes cuBLASLt refuses: hold ours to bf16 output rounding
        theirs = ref.to(torch.bfloat16)
    _rule(out, theirs, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(17, 768, 768), (300, 520, 208), (4096, 3072, 768), (1, 64, 4096), (129, 50264, 1600)])
def test_int8_mm_bit_exact(shape):
    import cute_kernels as ck

    M, N, K = shape
    a = torch.randint(-128, 128, (M, K), device="cuda", dtype=torch.int8)
    b = torch.randint(-128, 128, (N, K), device="cuda", dtype=torch.int8).t()
    out = ck.int8_mm(a, b)
    ref = torch._int_mm(a, b) if M > 16 else ck.int8_mm_ref(a, b)
    assert out.dtype == torch.int32 and torch.equal(out, ref)


@pytest.mark.gpu
def test_int8_mm_dequantized():
    import cute_kernels as ck

    M, N, K = 333, 1000, 768
    a = torch.randint(-128, 128, (M, K), device="cuda", dtype=torch.int8)
    b = torch.randint(-128, 128, (N, K), device="cuda", dtype=torch.int8).t()
    sa = torch.rand(M, 1, device="cuda") / 100
    sb = torch.rand(1, N, device="cuda") / 100
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    out = ck.int8_mm(a, b, sa, sb, bias=bias)
    ref = ck.int8_mm_ref(a, b, sa, sb, bias=bias, out_dtype=torch.float32)
    rel = ((out.float() - ref).abs().max() / ref.abs().max()).item()
    assert rel < 1e-2, rel  # one bf16 rounding of the output


@pytest.mark.gpu
@pytest.mark.parametrize("M", [75, 137, 845])
def test_int8_mm_dequantized_swap_dispatch(M):
    """Scaled int8_mm without a bias (Int8Linear's call) runs the swap_ab picks, in widths the s8
    wgmma has (steps of 16), within one bf16 rounding."""
    import cute_kernels as ck

    N, K = 2048, 4096
    a = torch.randint(-128, 128, (M, K), device="cuda", dtype=torch.int8)
    b = torch.randint(-128, 128, (N, K), device="cuda", dtype=torch.int8).t()
    sa, sb = torch.rand(M, 1, device="cuda") / 100, torch.rand(1, N, device="cuda") / 100
    out = ck.int8_mm(a, b, sa, sb)
    ref = ck.int8_mm_ref(a, b, sa, sb, out_dtype=torch.float32)
    assert ((out.float() - ref).abs().max() / ref.abs().max()).item() < 1e-2


@pytest.mark.gpu
def test_8bit_fused_activation_and_residual():
    """gelu_tanh after the bias and a residual add, in the 8-bit epilogue (GPT-2's MLP / c_proj)."""
    import cute_kernels as ck
    from cute_kernels.quantized.reference import int8_mm_ref, scaled_mm_ref

    torch.manual_seed(0)
    M, N, K = 300, 1600, 768
    res = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    a8 = (torch.randn(M, K, device="cuda") / 4).to(torch.float8_e4m3fn)
    b8 = (torch.randn(N, K, device="cuda") / 4).to(torch.float8_e4m3fn).t()
    sa, sb = torch.rand(M, 1, device="cuda") + 0.5, torch.rand(1, N, device="cuda") / 10
    for act in ("gelu_tanh", None):
        out = ck.scaled_mm(a8, b8, sa, sb, bias=bias, activation=act, residual=res)
        ref = scaled_mm_ref(a8, b8, sa, sb, bias=bias, activation=act, residual=res, out_dtype=torch.float32)
        assert (out.float() - ref).abs().max().item() < 2e-2 * ref.abs().max().item()
    ai = torch.randint(-128, 128, (M, K), device="cuda", dtype=torch.int8)
    bi = torch.randint(-128, 128, (N, K), device="cuda", dtype=torch.int8).t()
    si = torch.rand(1, N, device="cuda") / 1e4
    out = ck.int8_mm(ai, bi, sa, si, bias=bias, activation="gelu_tanh", residual=res)
    ref = int8_mm_ref(ai, bi, sa, si, bias=bias, activation="gelu_tanh", residual=res, out_dtype=torch.float32)
    assert (out.float() - ref).abs().max().item() < 2e-2 * ref.abs().max().item()
    with pytest.raises(ValueError, match="residual"):
        ck.scaled_mm(a8, b8, sa, sb, residual=res[:, :10])


@pytest.mark.gpu
def test_8bit_non_finite_stays_in_its_rows():
    import cute_kernels as ck

    x = torch.randn(256, 512, device="cuda")
    a, sa = _quant_fp8(x, 1)
    a[5, 3] = float("nan")
    w, sw = _quant_fp8(torch.randn(384, 512, device="cuda"), 1)
    out = ck.scaled_mm(a, w.t(), sa, sw.reshape(1, -1))
    assert torch.isnan(out[5]).all() and not torch.isnan(out[:5]).any() and not torch.isnan(out[6:]).any()


@pytest.mark.gpu
def test_8bit_bad_input():
    import cute_kernels as ck

    a = torch.randn(64, 64, device="cuda").to(E4M3)
    one = torch.ones((), device="cuda")
    with pytest.raises(ValueError, match="column-major"):
        ck.scaled_mm(a, a.contiguous(), one, one)  # b row-major
    with pytest.raises(ValueError, match="multiple of 16"):
        ck.scaled_mm(a[:, :40], torch.randn(8, 40, device="cuda").to(E4M3).t(), one, one)
    with pytest.raises(ValueError, match="scale_a"):
        ck.scaled_mm(a, a.t(), torch.ones(3, device="cuda"), one)
    with pytest.raises(TypeError):
        ck.int8_mm(a, a.t())


def _block_inputs(M, N, K, dtype=E4M3, m_major=True):
    """DeepSeek-V3-style operands from the package's own quantizers (1 x 128 activation
    groups, 128 x 128 weight blocks), with a spread of magnitudes so the scales differ."""
    import quant

    x = torch.randn(M, K, device="cuda") * torch.logspace(-2, 2, K, device="cuda")[torch.randperm(K, device="cuda")]
    w = torch.randn(N, K, device="cuda") * (torch.rand(N, 1, device="cuda") * 4 + 0.1)
    a, sa = quant.quantize_fp8(x, "block", dtype)
    b, sb = quant.quantize_weight_fp8_block(w, dtype)
    if not m_major:
        sa = sa.contiguous()  # row-major [M, K/128]: the op copies it into the TMA layout
    return a, b, sa, sb


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 256, 512), (17, 384, 992), (200, 520, 1600), (1000, 1600, 6400),
                                   (64, 1600, 6400), (300, 50257, 768), (4096, 4096, 2048)])
@pytest.mark.parametrize("m_major", [True, False])
def test_scaled_mm_blockwise_matches_reference(shape, m_major):
    """Block scales applied per k-tile in the main loop: partial last k-block (K = 992),
    odd k-tile counts (1600), 64-row tiles (M < 1024) and split-K (64 x 1600 x 6400), the
    vocabulary's odd N, M-major and row-major scale_a."""
    import cute_kernels as ck

    M, N, K = shape
    a, b, sa, sb = _block_inputs(M, N, K, m_major=m_major)
    out = ck.scaled_mm_blockwise(a, b, sa, sb)
    ref = ck.scaled_mm_blockwise_ref(a, b, sa, sb, out_dtype=torch.float32)
    assert out.shape == (M, N) and out.dtype == torch.bfloat16
    # fp32 accumulation of exactly the dequantized products: the output's bf16 rounding is
    # the error torch's own bf16 GEMM on these inputs would at least have.
    _rule(out, ref.to(torch.bfloat16), ref)


@pytest.mark.gpu
@pytest.mark.parametrize("act", [None, "gelu_tanh"])
def test_scaled_mm_blockwise_fused_epilogue(act):
    import cute_kernels as ck

    M, N, K = 300, 768, 1600
    for dtype, out_dtype in ((E4M3, torch.bfloat16), (torch.float8_e5m2, torch.float16)):
        a, b, sa, sb = _block_inputs(M, N, K, dtype)
        bias = torch.randn(N, device="cuda", dtype=out_dtype)
        res = torch.randn(M, N, device="cuda", dtype=out_dtype)
        out = ck.scaled_mm_blockwise(a, b, sa, sb, bias=bias, activation=act, residual=res, out_dtype=out_dtype)
        ref = ck.scaled_mm_blockwise_ref(a, b, sa, sb, bias=bias, activation=act, residual=res,
                                         out_dtype=torch.float32)
        assert out.dtype == out_dtype
        _rule(out, ref.to(out_dtype), ref)


@pytest.mark.gpu
def test_scaled_mm_blockwise_edge_cases():
    import cute_kernels as ck

    a, b, sa, sb = _block_inputs(256, 384, 512)
    # a non-finite scale or input poisons only what it touches
    sa2 = sa.clone()
    sa2[7, 1] = float("inf")
    a2 = a.clone()
    a2[9, 300] = float("nan")
    out = ck.scaled_mm_blockwise(a2, b, sa2, sb)
    bad = ~torch.isfinite(out.float())
    assert bad[7].all() and bad[9].all() and bad.sum(1).ne(0).sum() == 2
    # empty dims
    assert ck.scaled_mm_blockwise(a[:0], b, sa[:0], sb).shape == (0, 384)
    # bad input: one line that says what was expected
    with pytest.raises(ValueError, match="scale_a must be"):
        ck.scaled_mm_blockwise(a, b, sa[:, :1], sb)
    with pytest.raises(TypeError, match="float32"):
        ck.scaled_mm_blockwise(a, b, sa.half(), sb)
    with pytest.raises(ValueError, match="multiple of 16"):
        ck.scaled_mm_blockwise(a[:, :40], b[:, :40], sa[:, :1], sb[:, :1])
    with pytest.raises(ValueError, match="row-major"):
        ck.scaled_mm_blockwise(a.t().contiguous().t(), b, sa, sb)


@pytest.mark.gpu
@pytest.mark.parametrize("split", [2, 3, 7])
@pytest.mark.parametrize("shape", [(1, 1600, 6400), (17, 768, 768), (300, 520, 1024)])
def test_int8_forced_split_k_bit_exact(split, shape):
    from cute_kernels.matmul.api import run_gemm
    from cute_kernels.matmul.config import Epilogue

    M, N, K = shape
    a = torch.randint(-128, 128, (M, K), device="cuda", dtype=torch.int8)
    w = torch.randint(-128, 128, (N, K), device="cuda", dtype=torch.int8)
    out = torch.empty(M, N, device="cuda", dtype=torch.int32)
    run_gemm(a, w, out, epi=Epilogue(), config=GemmConfig(128, 128, 1, 1, split_k=split),
             kernel_name="int8_mm_sm90", acc_name="Int32")
    import cute_kernels as ck

    assert torch.equal(out, ck.int8_mm_ref(a, w.t()))


@pytest.mark.gpu
@pytest.mark.parametrize("promote", [False, True])
@pytest.mark.parametrize("shape", [(16, 1600, 6400), (304, 528, 1024)])  # cuBLASLt-friendly sizes
def test_fp8_forced_split_k(promote, shape):
    import cute_kernels as ck
    from cute_kernels.matmul.api import _alloc_out, run_gemm
    from cute_kernels.matmul.config import Epilogue

    M, N, K = shape
    a, sa = _quant_fp8(torch.randn(M, K, device="cuda"), 1)
    wq, sw = _quant_fp8(torch.randn(N, K, device="cuda"), 1)
    sb = sw.reshape(1, -1)
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    out = _alloc_out(M, N, torch.bfloat16, "cuda")
    epi = Epilogue(row_scale="vector", col_scale="vector", bias=True)
    cfg = GemmConfig(128, 128, 1, 1, promote=promote, split_k=4)
    run_gemm(a, wq, out, epi=epi, bias=bias, row_scale=sa.reshape(M), col_scale=sb.reshape(N), config=cfg,
             kernel_name="scaled_mm_sm90")
    ref = ck.scaled_mm_ref(a, wq.t(), sa, sb, bias=bias, out_dtype=torch.float32)
    try:
        theirs = torch._scaled_mm(a, wq.t(), sa, sb, bias=bias, out_dtype=torch.bfloat16, use_fast_accum=not promote)
    except RuntimeError:  # shapes cuBLASLt refuses: hold ours to bf16 output rounding
        theirs = ref.to(torch.bfloat16)
    _rule(out, theirs, ref)


INT8_SWAP_CFGS = [GemmConfig(64, 16, 1, 1, swap_ab=True), GemmConfig(64, 48, 1, 2, swap_ab=True),
                  GemmConfig(64, 16, 1, 1, split_k=3, swap_ab=True), GemmConfig(64, 112, 4, 1, swap_ab=True),
                  GemmConfig(128, 144, 1, 2, swap_ab=True), GemmConfig(128, 96, 2, 1, swap_ab=True),
                  GemmConfig(128, 160, 1, 2, pingpong=True, swap_ab=True), GemmConfig(64, 32, 1, 2, stages=12, swap_ab=True),
                  GemmConfig(64, 144, 4, 2, swap_ab=True), GemmConfig(64, 224, 1, 2, swap_ab=True)]


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", INT8_SWAP_CFGS, ids=lambda c: f"{c.tile_m}x{c.tile_n}c{c.cluster_m}{c.cluster_n}"
                         f"{'pp' if c.pingpong else ''}s{c.split_k}")
@pytest.mark.parametrize("shape", [(35, 1000, 4096), (273, 2052, 1024), (3, 771, 8192)])
def test_int8_swap_ab_bit_exact(cfg, shape):
    """int8_mm under swap_ab (D^T = W X^T into D's transposed view, int32 through M-major boxes):
    ragged tokens and weight rows, odd N (padded output rows), split-K; equal to the integer product."""
    import cute_kernels as ck
    from cute_kernels.matmul.api import SwapLaunch, _alloc_out, kernel_for, run_gemm
    from cute_kernels.matmul.config import Epilogue

    M, N, K = shape
    a = torch.randint(-128, 128, (M, K), device="cuda", dtype=torch.int8)
    w = torch.randint(-128, 128, (N, K), device="cuda", dtype=torch.int8)
    assert isinstance(kernel_for(a, w, torch.int32, Epilogue(), config=cfg, kernel_name="int8_mm_sm90",
                                 acc_name="Int32"), SwapLaunch)
    out = _alloc_out(M, N, torch.int32, "cuda").fill_(-7)
    run_gemm(a, w, out, epi=Epilogue(), config=cfg, kernel_name="int8_mm_sm90", acc_name="Int32")
    assert torch.equal(out, ck.int8_mm_ref(a, w.t()))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(35, 28672, 4096), (17, 4096, 4096), (167, 16384, 2048), (440, 4608, 3584)])
def test_int8_mm_swap_dispatch(shape):
    """Few-token int8_mm picks swap_ab by itself and matches torch._int_mm bit for bit."""
    import cute_kernels as ck
    from cute_kernels.matmul.api import SwapLaunch, kernel_for
    from cute_kernels.matmul.config import Epilogue

    M, N, K = shape
    a = torch.randint(-128, 128, (M, K), device="cuda", dtype=torch.int8)
    w = torch.randint(-128, 128, (N, K), device="cuda", dtype=torch.int8)
    assert isinstance(kernel_for(a, w, torch.int32, Epilogue(), kernel_name="int8_mm_sm90",
                                 acc_name="Int32", b_kn=True), SwapLaunch)
    assert torch.equal(ck.int8_mm(a, w.t()), torch._int_mm(a, w.t()))


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", __import__("cute_kernels.matmul.heuristics", fromlist=["CANDIDATES"]).CANDIDATES,
                         ids=lambda c: f"{c.tile_m}x{c.tile_n}-c{c.cluster_m}x{c.cluster_n}{'-pp' if c.pingpong else ''}")
def test_int8_raw_every_config_bit_exact(cfg):
    """The per-warp 32-bit TMA epilogue under every tile shape (ragged M and N edges)."""
    import cute_kernels as ck
    from cute_kernels.matmul.api import run_gemm
    from cute_kernels.matmul.config import Epilogue

    M, N, K = 333, 1000, 384
    a = torch.randint(-128, 128, (M, K), device="cuda", dtype=torch.int8)
    w = torch.randint(-128, 128, (N, K), device="cuda", dtype=torch.int8)
    out = torch.full((M, N), -7, device="cuda", dtype=torch.int32)
    run_gemm(a, w, out, epi=Epilogue(), config=cfg, kernel_name="int8_mm_sm90", acc_name="Int32")
    assert torch.equal(out, ck.int8_mm_ref(a, w.t()))


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", __import__("cute_kernels.matmul.heuristics", fromlist=["CANDIDATES"]).CANDIDATES,
                         ids=lambda c: f"{c.tile_m}x{c.tile_n}-c{c.cluster_m}x{c.cluster_n}{'-pp' if c.pingpong else ''}")
def test_fp32_output_fused_epilogue_every_config(cfg):
    """fp32 output with bias, gelu_tanh and a residual, under every tile shape."""
    from cute_kernels.matmul.api import run_gemm
    from cute_kernels.matmul.config import Epilogue

    M, N, K = 333, 1000, 384
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(N, device="cuda", dtype=torch.float32)
    res = torch.randn(M, N, device="cuda", dtype=torch.float32)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float32)
    run_gemm(a, w, out, epi=Epilogue(activation="gelu_tanh", bias=True, residual=True), bias=bias, residual=res,
             config=cfg)
    ref = torch.nn.functional.gelu(a.double() @ w.double().t() + bias.double(), approximate="tanh") + res.double()
    torch.testing.assert_close(out.double(), ref, atol=2e-3, rtol=1e-4)
