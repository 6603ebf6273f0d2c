"""Split-K reduce: sum the S partial-sum slices of the GEMM and apply the fused epilogue.

    out[m, n] = act(alpha * row_scale[m] * col_scale[n] * sum_s ws[s, m, n] + bias[n])
                + beta * residual[m, n]

with the operations, in the order, of `GemmSm90._epilogue_value` (the non-split
path), in fp32, cast once to out's dtype (gelu_tanh is computed as the equivalent
x * sigmoid(2u), a little more exact than the GEMM's tanh.approx). int32 partials (int8 GEMM) are
summed in int32, which is exact, and either stored raw (int32 output) or converted
to fp32 before the epilogue, as the GEMM kernel does.

Why Triton and not a CuTe DSL kernel: this is a plain bandwidth-bound elementwise
pass. Triton gives coalesced 16-byte loads of the fp32 partials from a few lines,
handles any output/residual row stride and dtype without a compile per combination
of our own cache keys, launches on torch's current stream (so it is captured by CUDA
graphs; nothing here syncs the host), and its kernel logic can be checked on a CPU
under TRITON_INTERPRET=1 (tests/test_gemm_host.py), which a CuTe DSL kernel cannot.
Its per-launch host cost (~several us eagerly) is irrelevant under CUDA graphs, which
is how the small decode-time GEMMs that split are run.

On CPU tensors (host-layer tests) `splitk_reduce` runs `splitk_reduce_ref`, the
same function in torch.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

_SQRT_2_OVER_PI = 0.7978845608028654
_INV_SQRT_2 = 0.7071067811865476
_ACT_CODE = {"none": 0, "relu": 1, "gelu": 2, "gelu_tanh": 3}
_SCALE_CODE = {"none": 0, "scalar": 1, "vector": 2}


def splitk_reduce_ref(ws, out, epi, bias=None, residual=None, row_scale=None, col_scale=None, alpha=1.0, beta=1.0):
    """Torch version of the reduce (same math, same order); writes into `out` and returns it.

    ws [S, M, >=N] float32 or int32, out [M, N] (rows may be strided).
    """
    M, N = out.shape
    acc = ws[:, :, :N].sum(dim=0, dtype=ws.dtype)  # int32 sums stay exact in int32
    if out.dtype == torch.int32:
        out.copy_(acc)
        return out
    x = acc.float()
    if epi.alpha:
        x = x * float(alpha)
    if epi.row_scale == "vector":
        x = x * row_scale.float().reshape(M, 1)
    elif epi.row_scale == "scalar":
        x = x * row_scale.float().reshape(())
    if epi.col_scale == "vector":
        x = x * col_scale.float().reshape(1, N)
    elif epi.col_scale == "scalar":
        x = x * col_scale.float().reshape(())
    if epi.bias:
        x = x + bias.float()
    if epi.activation == "relu":
        x = torch.where(x < 0, torch.zeros_like(x), x)  # keeps NaN, like torch.relu
    elif epi.activation == "gelu":
        x = 0.5 * x * (1.0 + torch.erf(x * _INV_SQRT_2))
    elif epi.activation == "gelu_tanh":
        # 0.5 x (1 + tanh(u)) == x * sigmoid(2u) == x / (1 + exp(-2u))
        x = x / (1.0 + torch.exp(-2.0 * (_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x))))
    if epi.residual:
        r = residual.float()
        if epi.beta:
            r = r * float(beta)
        x = x + r
    out.copy_(x.to(out.dtype))
    return out


def splitk_reduce(ws, out, epi, bias=None, residual=None, row_scale=None, col_scale=None, alpha=1.0, beta=1.0):
    """out <- epilogue(sum over ws's first mode); ws [S, M, >=N] with unit column stride."""
    if ws.device.type != "cuda":
        return splitk_reduce_ref(ws, out, epi, bias, residual, row_scale, col_scale, alpha, beta)
    return _launch(ws, out, epi, bias, residual, row_scale, col_scale, alpha, beta)


# --------------------------------------------------------------------------- Triton


@triton.jit
def epilogue_math(x, rows, cols, rmask, cmask, bias_ptr, res_ptr, row_ptr, col_ptr, alpha, beta, stride_res_m,
                  ACT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, ROW_SCALE: tl.constexpr,
                  COL_SCALE: tl.constexpr, USE_ALPHA: tl.constexpr, USE_BETA: tl.constexpr):
    """The GEMM epilogue on an fp32 [rows, cols] tile, in the kernel's order (also used by gemv.py)."""
    if USE_ALPHA:
        x = x * alpha
    if ROW_SCALE == 1:
        x = x * tl.load(row_ptr)
    if ROW_SCALE == 2:
        x = x * tl.load(row_ptr + rows, mask=rmask, other=0.0)[:, None]
    if COL_SCALE == 1:
        x = x * tl.load(col_ptr)
    if COL_SCALE == 2:
        x = x * tl.load(col_ptr + cols, mask=cmask, other=0.0)[None, :]
    if HAS_BIAS:
        x = x + tl.load(bias_ptr + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    if ACT == 1:
        x = tl.where(x < 0.0, 0.0, x)  # relu that keeps NaN (torch.relu does)
    if ACT == 2:
        x = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    if ACT == 3:
        u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        x = x / (1.0 + tl.exp(-2.0 * u))  # == 0.5 x (1 + tanh(u))
    if HAS_RES:
        mask = rmask[:, None] & cmask[None, :]
        r = tl.load(res_ptr + rows[:, None] * stride_res_m + cols[None, :], mask=mask, other=0.0)
        r = r.to(tl.float32)
        if USE_BETA:
            r = r * beta
        x = x + r
    return x


@triton.jit
def _splitk_reduce_kernel(
    ws_ptr, out_ptr, bias_ptr, res_ptr, row_ptr, col_ptr, alpha, beta,
    M, N, S, stride_ws_s, stride_ws_m, stride_out_m, stride_res_m,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
    ROW_SCALE: tl.constexpr, COL_SCALE: tl.constexpr, USE_ALPHA: tl.constexpr, USE_BETA: tl.constexpr,
    INT_ACC: tl.constexpr, RAW_OUT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid_m = tl.program_id(0)  # M on axis 0: grid axes 1 and 2 are limited to 65535
    pid_n = tl.program_id(1)
    rows = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < M
    cmask = cols < N
    mask = rmask[:, None] & cmask[None, :]
    ptrs = ws_ptr + rows[:, None] * stride_ws_m + cols[None, :]
    if INT_ACC:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _s in range(S):  # fixed order: deterministic
        acc += tl.load(ptrs, mask=mask, other=0)
        ptrs += stride_ws_s
    if RAW_OUT:
        y = acc
    else:
        y = epilogue_math(acc.to(tl.float32), rows, cols, rmask, cmask, bias_ptr, res_ptr, row_ptr, col_ptr,
                          alpha, beta, stride_res_m, ACT, HAS_BIAS, HAS_RES, ROW_SCALE, COL_SCALE, USE_ALPHA, USE_BETA)
    out_ptrs = out_ptr + rows[:, None] * stride_out_m + cols[None, :]
    tl.store(out_ptrs, y.to(out_ptr.dtype.element_ty), mask=mask)


def _block_shape(M: int, N: int) -> tuple[int, int]:
    # 128 fp32 columns per row segment: one warp reads them as 16-byte vectors.
    # Up to 16 rows per program (2048 elements, 16 per thread with 4 warps).
    block_n = 128 if N > 64 else max(16, 1 << max(0, (N - 1).bit_length()))
    block_m = max(1, min(16, 1 << max(0, (M - 1).bit_length())))
    return block_m, block_n


def _launch(ws, out, epi, bias, residual, row_scale, col_scale, alpha, beta):
    S, M, _ = ws.shape
    N = out.shape[1]
    assert ws.stride(2) == 1 and out.stride(1) == 1, "split-K reduce needs unit column strides"
    assert residual is None or residual.stride(1) == 1
    block_m, block_n = _block_shape(M, N)
    grid = (math.ceil(M / block_m), math.ceil(N / block_n))
    dummy = ws  # pointer for absent operands (never read: their flags are constexpr)
    _splitk_reduce_kernel[grid](
        ws, out,
        bias if bias is not None else dummy,
        residual if residual is not None else dummy,
        row_scale if row_scale is not None else dummy,
        col_scale if col_scale is not None else dummy,
        float(alpha), float(beta),
        M, N, S, ws.stride(0), ws.stride(1), out.stride(0),
        residual.stride(0) if residual is not None else 0,
        ACT=_ACT_CODE[epi.activation], HAS_BIAS=bool(epi.bias), HAS_RES=bool(epi.residual),
        ROW_SCALE=_SCALE_CODE[epi.row_scale], COL_SCALE=_SCALE_CODE[epi.col_scale],
        USE_ALPHA=bool(epi.alpha), USE_BETA=bool(epi.beta),
        INT_ACC=ws.dtype == torch.int32, RAW_OUT=out.dtype == torch.int32,
        BLOCK_M=block_m, BLOCK_N=block_n, num_warps=4,
    )
    return out
