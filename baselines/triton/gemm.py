"""Autotuned Triton GEMM with a fused epilogue: gemm, linear, scaled_mm, int8_mm.

One kernel serves all four ops. It is the classic Triton recipe (the one the
Triton matmul tutorial and torch.inductor's mm template use): a 2-D tile per
program, programs ordered in groups of GROUP_M tile-rows so neighbouring
programs share A and B tiles in L2, a software-pipelined K loop (num_stages),
and everything after the accumulation -- scales, bias, activation, residual,
the output cast -- applied in registers before the single store.

Two autotuned instances exist: one with configs for 16-bit inputs and one for
8-bit inputs (FP8/INT8 want BLOCK_K = 128 to feed the tensor cores).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import (
    INTERPRET,
    activate,
    cast_to,
    check_activation,
    check_offsets,
    check_same_device,
    check_tensor,
    mma,
)

_FLOAT16 = (torch.bfloat16, torch.float16)
_OUT_FLOAT = (torch.bfloat16, torch.float16, torch.float32)


def _cfg(bm, bn, bk, warps, stages, group_m=8):
    return triton.Config(
        {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m},
        num_warps=warps,
        num_stages=stages,
    )


if INTERPRET:
    # The interpreter runs every config it is given; one small tile keeps the
    # CPU tests fast and still exercises multi-tile, ragged-edge problems.
    _CONFIGS_16BIT = [_cfg(32, 32, 32, 4, 1, group_m=2)]
    _CONFIGS_8BIT = [_cfg(32, 32, 32, 4, 1, group_m=2)]
else:
    # Large tiles with 8 warps (two warpgroups of wgmma) win on Hopper for big
    # problems; the smaller ones cover skinny and small shapes.
    _CONFIGS_16BIT = [
        _cfg(128, 256, 64, 8, 3),
        _cfg(256, 128, 64, 8, 3),
        _cfg(128, 256, 64, 8, 4),
        _cfg(128, 128, 64, 8, 4),
        _cfg(128, 128, 64, 4, 4),
        _cfg(128, 128, 32, 4, 4),
        _cfg(64, 256, 64, 4, 4),
        _cfg(64, 256, 32, 4, 4),
        _cfg(128, 64, 64, 4, 4),
        _cfg(64, 128, 64, 4, 4),
        _cfg(64, 64, 64, 4, 4),
        _cfg(64, 64, 128, 4, 3),
        _cfg(32, 64, 64, 4, 5),
    ]
    _CONFIGS_8BIT = [
        _cfg(128, 256, 128, 8, 3),
        _cfg(256, 128, 128, 8, 3),
        _cfg(128, 256, 128, 8, 4),
        _cfg(128, 128, 128, 8, 4),
        _cfg(128, 128, 128, 4, 4),
        _cfg(128, 128, 64, 4, 4),
        _cfg(64, 256, 128, 4, 4),
        _cfg(128, 64, 128, 4, 4),
        _cfg(64, 128, 128, 4, 4),
        _cfg(64, 64, 128, 4, 4),
        _cfg(32, 64, 128, 4, 5),
    ]


@triton.jit
def _matmul_kernel(
    a_ptr, b_ptr, c_ptr,
    bias_ptr, res_ptr, sa_ptr, sb_ptr,
    M, N, K,
    stride_am, stride_ak,
    stride_bk, stride_bn,
    stride_cm, stride_cn,
    stride_rm, stride_rn,
    stride_bias, stride_sa, stride_sb,
    alpha, beta,
    SCALE_A: tl.constexpr,  # 0: none, 1: one scalar, 2: one per row of A
    SCALE_B: tl.constexpr,  # 0: none, 1: one scalar, 2: one per column of B
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    HAS_ALPHA: tl.constexpr,
    INT_ACC: tl.constexpr,  # int8 inputs: accumulate in int32
    FAST_ACCUM: tl.constexpr,  # fp8 only: let wgmma accumulate all of K in its reduced precision
    FP8_BITS: tl.constexpr,  # fp8 operands arrive as uint8 (a masked fp8 load cannot take other=0)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    # Grouped ordering: walk GROUP_M tile-rows column by column, so the programs
    # resident at one time reuse a few A row-panels and B column-panels from L2.
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    group_size = GROUP_M * tiles_n
    first_m = (pid // group_size) * GROUP_M
    rows_in_group = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group_size) % rows_in_group
    pid_n = (pid % group_size) // rows_in_group

    # Rows/columns past the edge wrap around instead of being masked: the loads
    # stay in bounds and unmasked, and the wrapped rows are never stored. The
    # contiguity hints let Triton vectorise when M or N is the contiguous
    # dimension; a vector is only emitted when the pointer's alignment proves
    # it, which implies M (or N) is a multiple of the vector length, so no
    # vector straddles the wrap point.
    offs_am = tl.max_contiguous(tl.multiple_of((pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M, BLOCK_M), BLOCK_M)
    offs_bn = tl.max_contiguous(tl.multiple_of((pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N, BLOCK_N), BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn

    if INT_ACC:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k0
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0)
        if FP8_BITS:
            a = a.to(tl.float8e4nv, bitcast=True)
            b = b.to(tl.float8e4nv, bitcast=True)
        if FAST_ACCUM:
            acc = mma(a, b, acc)
        else:
            # FP8 wgmma accumulates in reduced precision; promote the partial
            # sums into the fp32 accumulator every BLOCK_K (<= 128) elements,
            # as cuBLAS does for FP8 without fast accumulation.
            acc = mma(a, b, acc, BLOCK_K)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    mask = mask_m[:, None] & mask_n[None, :]

    if INT_ACC and SCALE_A == 0 and SCALE_B == 0:
        out = acc  # exact int32, like torch._int_mm
    else:
        out = acc.to(tl.float32)
        if SCALE_A == 1:
            out = out * tl.load(sa_ptr)
        elif SCALE_A == 2:
            out = out * tl.load(sa_ptr + offs_m * stride_sa, mask=mask_m, other=0.0)[:, None]
        if SCALE_B == 1:
            out = out * tl.load(sb_ptr)
        elif SCALE_B == 2:
            out = out * tl.load(sb_ptr + offs_n * stride_sb, mask=mask_n, other=0.0)[None, :]
        if HAS_ALPHA:
            out = out * alpha
        if HAS_BIAS:
            out = out + tl.load(bias_ptr + offs_n * stride_bias, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        out = activate(out, ACTIVATION)
        if HAS_RESIDUAL:
            res = tl.load(res_ptr + offs_m[:, None] * stride_rm + offs_n[None, :] * stride_rn, mask=mask, other=0.0)
            out = out + beta * res.to(tl.float32)
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, cast_to(out, c_ptr.dtype.element_ty), mask=mask)


_HEURISTICS = {"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0}
_matmul_16bit = triton.autotune(configs=_CONFIGS_16BIT, key=["M", "N", "K"])(
    triton.heuristics(_HEURISTICS)(_matmul_kernel)
)
_matmul_8bit = triton.autotune(configs=_CONFIGS_8BIT, key=["M", "N", "K"])(
    triton.heuristics(_HEURISTICS)(_matmul_kernel)
)


def _launch(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    *,
    bias=None,
    residual=None,
    scale_a=None,
    scale_b=None,
    activation: str = "none",
    alpha: float = 1.0,
    beta: float = 1.0,
    fast_accum: bool = True,
) -> torch.Tensor:
    """Launch the autotuned kernel; fast_accum=False matters only for FP8 inputs."""
    M, K = a.shape
    N = b.shape[1]
    if M == 0 or N == 0:
        return out
    for t, n in ((a, "a"), (b, "b"), (out, "out"), (residual, "residual")):
        if t is not None:
            check_offsets(t, n)

    def scale_mode(s, axis):
        if s is None:
            return 0, 0
        if s.numel() == 1:
            return 1, 0
        return 2, s.stride(axis)  # [M, 1] steps along dim 0, [1, N] along dim 1

    sa_mode, stride_sa = scale_mode(scale_a, 0)
    sb_mode, stride_sb = scale_mode(scale_b, 1)
    kernel = _matmul_8bit if a.element_size() == 1 else _matmul_16bit
    is_fp8 = a.dtype == torch.float8_e4m3fn
    fp8_bits = is_fp8 and not INTERPRET
    if fp8_bits:  # the K tail's masked load needs an integer element type for its zero fill
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)
    kernel[grid](
        a, b, out,
        bias, residual, scale_a, scale_b,
        M, N, K,
        a.stride(0), a.stride(1),
        b.stride(0), b.stride(1),
        out.stride(0), out.stride(1),
        residual.stride(0) if residual is not None else 0,
        residual.stride(1) if residual is not None else 0,
        bias.stride(0) if bias is not None else 0,
        stride_sa, stride_sb,
        float(alpha), float(beta),
        SCALE_A=sa_mode,
        SCALE_B=sb_mode,
        HAS_BIAS=bias is not None,
        ACTIVATION=activation,
        HAS_RESIDUAL=residual is not None,
        HAS_ALPHA=float(alpha) != 1.0,
        INT_ACC=a.dtype == torch.int8,
        # only FP8 MMAs accumulate imprecisely; others keep the plain dot
        FAST_ACCUM=bool(fast_accum) or not is_fp8,
        FP8_BITS=fp8_bits,
    )
    return out


def _check_mm_operands(a, b, dtypes, names=("a", "b")) -> None:
    check_tensor(a, names[0], ndim=2, dtypes=dtypes)
    check_tensor(b, names[1], ndim=2, dtypes=dtypes)
    check_same_device((names[0], a), (names[1], b))
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"inner dimensions differ: {names[0]} is {tuple(a.shape)}, {names[1]} is {tuple(b.shape)} "
            f"(expected [M, K] @ [K, N])"
        )


def _check_bias(bias, n: int, device) -> None:
    if bias is None:
        return
    check_tensor(bias, "bias", ndim=1, dtypes=_OUT_FLOAT)
    if bias.shape[0] != n:
        raise ValueError(f"bias must have shape [{n}], got {tuple(bias.shape)}")
    if bias.device != device:
        raise ValueError(f"bias is on {bias.device} but the operands are on {device}")


def gemm(a: torch.Tensor, b: torch.Tensor, *, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """a [M, K] @ b [K, N] for bf16/fp16 with fp32 accumulation (torch.mm semantics).

    Any strides. The result is contiguous, in out_dtype (a.dtype, or float32).
    """
    _check_mm_operands(a, b, _FLOAT16)
    if a.dtype != b.dtype:
        raise TypeError(f"a and b must have the same dtype, got {a.dtype} and {b.dtype}")
    out_dtype = out_dtype or a.dtype
    if out_dtype not in (a.dtype, torch.float32):
        raise TypeError(f"out_dtype must be {a.dtype} or torch.float32, got {out_dtype}")
    out = torch.empty((a.shape[0], b.shape[1]), device=a.device, dtype=out_dtype)
    return _launch(a, b, out)


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
    alpha: float = 1.0,
    beta: float = 1.0,
) -> torch.Tensor:
    """act(alpha * x @ weight.T + bias) + beta * residual, computed in fp32, stored in x.dtype.

    x [..., K], weight [N, K] (F.linear layout), bias [N], residual [..., N].
    """
    act = check_activation(activation)
    check_tensor(x, "x", dtypes=_FLOAT16)
    check_tensor(weight, "weight", ndim=2, dtypes=_FLOAT16)
    check_same_device(("x", x), ("weight", weight))
    if x.dim() < 1:
        raise ValueError("x must have at least one dimension [..., K]")
    if weight.dtype != x.dtype:
        raise TypeError(f"weight must have x's dtype {x.dtype}, got {weight.dtype}")
    N, K = weight.shape
    if x.shape[-1] != K:
        raise ValueError(f"x's last dimension is {x.shape[-1]} but weight is {tuple(weight.shape)} ([N, K] with K={K})")
    _check_bias(bias, N, x.device)
    out_shape = (*x.shape[:-1], N)
    if residual is not None:
        check_tensor(residual, "residual", dtypes=_OUT_FLOAT)
        check_same_device(("x", x), ("residual", residual))
        if tuple(residual.shape) != out_shape:
            raise ValueError(f"residual must have the output's shape {out_shape}, got {tuple(residual.shape)}")
        residual = residual.reshape(-1, N)
    x2 = x.reshape(-1, K)
    out = torch.empty((x2.shape[0], N), device=x.device, dtype=x.dtype)
    _launch(x2, weight.t(), out, bias=bias, residual=residual, activation=act, alpha=alpha, beta=beta)
    return out.reshape(out_shape)


def _check_scale(s, name: str, along: int, axis: int) -> None:
    """Accept a single scale (shape () or all-ones) or one per row/column."""
    check_tensor(s, name, dtypes=(torch.float32,))
    want = (along, 1) if axis == 0 else (1, along)
    if s.numel() == 1 and s.dim() <= 2:
        return
    if tuple(s.shape) != want:
        raise ValueError(f"{name} must have shape () or {list(want)} (float32), got {tuple(s.shape)}")


def scaled_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    activation: str | None = None,
    use_fast_accum: bool = False,
) -> torch.Tensor:
    """FP8 GEMM with torch._scaled_mm semantics: act((a * scale_a) @ (b * scale_b) + bias).

    a [M, K] float8_e4m3fn row-major; b [K, N] float8_e4m3fn column-major (pass
    `w.t()` of a row-major [N, K] weight); scale_a () or [M, 1], scale_b () or
    [1, N], float32; bias [N].
    """
    act = check_activation(activation)
    fp8 = (torch.float8_e4m3fn,)
    _check_mm_operands(a, b, fp8)
    M, K = a.shape
    N = b.shape[1]
    if a.stride(1) != 1 and K > 1:
        raise ValueError(f"a must be row-major (stride (K, 1)), got strides {a.stride()}")
    if b.stride(0) != 1 and K > 1:
        raise ValueError(
            f"b must be column-major, i.e. w.t() of a row-major [N, K] weight; got strides {b.stride()}"
        )
    _check_scale(scale_a, "scale_a", M, 0)
    _check_scale(scale_b, "scale_b", N, 1)
    check_same_device(("a", a), ("scale_a", scale_a), ("scale_b", scale_b))
    _check_bias(bias, N, a.device)
    if out_dtype not in _OUT_FLOAT:
        raise TypeError(f"out_dtype must be one of bfloat16, float16, float32, got {out_dtype}")
    out = torch.empty((M, N), device=a.device, dtype=out_dtype)
    return _launch(
        a, b, out, bias=bias, scale_a=scale_a, scale_b=scale_b, activation=act, fast_accum=bool(use_fast_accum)
    )


def int8_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor | None = None,
    scale_b: torch.Tensor | None = None,
    *,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """INT8 GEMM, int32 accumulation.

    Without scales: the exact int32 product (torch._int_mm). With scale_a
    (() or [M, 1]) and/or scale_b (() or [1, N]), float32: the dequantized
    product plus bias, in out_dtype (default bfloat16).
    """
    _check_mm_operands(a, b, (torch.int8,))
    M, N = a.shape[0], b.shape[1]
    scaled = scale_a is not None or scale_b is not None
    if scale_a is not None:
        _check_scale(scale_a, "scale_a", M, 0)
        check_same_device(("a", a), ("scale_a", scale_a))
    if scale_b is not None:
        _check_scale(scale_b, "scale_b", N, 1)
        check_same_device(("a", a), ("scale_b", scale_b))
    if not scaled:
        if bias is not None:
            raise ValueError("bias needs scale_a/scale_b: the unscaled product is exact int32")
        if out_dtype not in (None, torch.int32):
            raise TypeError(f"without scales the output is int32, got out_dtype={out_dtype}")
        out_dtype = torch.int32
    else:
        out_dtype = out_dtype or torch.bfloat16
        if out_dtype not in _OUT_FLOAT:
            raise TypeError(f"out_dtype must be one of bfloat16, float16, float32, got {out_dtype}")
    _check_bias(bias, N, a.device)
    out = torch.empty((M, N), device=a.device, dtype=out_dtype)
    return _launch(a, b, out, bias=bias, scale_a=scale_a, scale_b=scale_b)
