"""Triton quantize kernels: amax, scale and cast fused into one pass over the input.

Quantizing activations sits on the critical path of every FP8/INT8 linear, and it
is pure bandwidth (read 2 bytes, write 1 per element), so the kernels read each
element once and keep the tile in registers between the amax and the cast:

- row / block granularity: one program owns BLOCK_M rows and one scale group
  (the whole row, or one 128-wide block). The group is loaded once, reduced to its
  amax, scaled and stored. Rows longer than MAX_SINGLE_K are processed in two
  loops (amax, then cast); the second read of a row mostly hits L2.
- tensor granularity needs a global amax before any element can be cast, so it
  is two launches: a grid-stride amax with one float atomic_max per program, then
  a flat cast.

Numerics follow `_reference.py` operation for operation. Two details matter for
bit-exactness: `/` on fp32 in Triton compiles to the approximate div.full.f32, so
the two per-group divisions use `tl.math.div_rn`; and `tl.max`/`tl.maximum` may
drop NaNs (PTX max.f32 returns the non-NaN operand), so NaN is mapped to +Inf
before the reduction and non-finite groups are patched explicitly after the clamp.

Only APIs present since Triton 3.0 are used (the GPU box runs 3.6).
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from cute_kernels.runtime.triton_launch import TritonLaunch

from ._reference import AMAX_FLOOR, BLOCK, empty_block_scales, qmax_of

_HW_RINT = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") != "1")
# A row of up to this many elements is held in registers by a single program.
MAX_SINGLE_K = 8192
# Elements per program for row/block tiles: 16-32 fp32 registers per thread.
TILE_ELEMS = 4096
ROW_TILE_ELEMS = 2048  # per-token quantization: rows per program (see quantize_triton)
TENSOR_BLOCK = 4096
TENSOR_MAX_PROGRAMS = 1024
TENSOR_CAST_REVERSE = True  # see _tensor_cast_kernel


@triton.jit
def _group_scale(amax, QMAX: tl.constexpr, FLOOR: tl.constexpr):
    """(scale, 1/scale, finite) from an amax in which NaN was already mapped to Inf."""
    ok = amax < float("inf")
    scale = tl.math.div_rn(tl.maximum(amax, FLOOR), QMAX)
    scale = tl.where(ok, scale, float("nan"))
    inv = tl.math.div_rn(tl.full(scale.shape, 1.0, tl.float32), scale)
    return scale, inv, ok


@triton.jit
def _abs_nan_to_inf(xf):
    a = tl.abs(xf)
    return tl.where(a == a, a, float("inf"))


@triton.jit
def _round_half_even(y):
    if _HW_RINT:
        # One cvt.rni.f32.f32 (round half to even); the floor form below costs ~6
        # instructions per element, which made the int8 kernels ALU-bound.
        r = libdevice.rint(y)
    else:
        # TRITON_INTERPRET has no libdevice: the same rounding from floor, exact in fp32.
        f = tl.floor(y)
        d = y - f
        odd = (f - 2.0 * tl.floor(f * 0.5)) != 0.0
        r = tl.where((d > 0.5) | ((d == 0.5) & odd), f + 1.0, f)
    return r


@triton.jit
def _cast(y, ok, QMAX: tl.constexpr, IS_INT8: tl.constexpr):
    """Clamp, round, patch non-finite groups; `ok` broadcasts against `y`."""
    y = tl.minimum(tl.maximum(y, -QMAX), QMAX)
    if IS_INT8:
        y = _round_half_even(y)  # like torch.round
        y = tl.where(ok, y, 0.0)
    else:
        y = tl.where(ok, y, float("nan"))
    return y


@triton.jit
def _load_f32(x_ptrs, cols, mask, mul_ptr, K, HAS_MUL: tl.constexpr):
    xf = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
    if HAS_MUL:
        m = tl.load(mul_ptr + cols, mask=cols < K, other=0.0)
        xf = xf * m[None, :]
    return xf


@triton.jit
def _quant_groups_kernel(
    x_ptr, q_ptr, s_ptr, mul_ptr,
    M, K, stride_xm, stride_qm, stride_sm, stride_sg,
    QMAX: tl.constexpr,
    FLOOR: tl.constexpr,
    IS_INT8: tl.constexpr,
    HAS_MUL: tl.constexpr,
    GROUP_K: tl.constexpr,  # 128 for "block"; 0 for "row" (one group, grid dim 1 is 1)
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SINGLE_TILE: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_g = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    rows64 = rows.to(tl.int64)
    x_rows = x_ptr + rows64[:, None] * stride_xm
    q_rows = q_ptr + rows64[:, None] * stride_qm
    offs = tl.arange(0, BLOCK_K)
    k0 = pid_g * GROUP_K
    if SINGLE_TILE:
        # The mask only tests `cols < K`, never a group end: in block mode
        # BLOCK_K == GROUP_K, so the tile is exactly one group. Keeping the mask
        # this simple lets Triton prove alignment and vectorize the accesses.
        cols = k0 + offs
        mask = row_ok[:, None] & (cols < K)[None, :]
        xf = _load_f32(x_rows + cols[None, :], cols, mask, mul_ptr, K, HAS_MUL)
        amax = tl.max(_abs_nan_to_inf(xf), axis=1)
        scale, inv, ok = _group_scale(amax, QMAX, FLOOR)
        y = _cast(xf * inv[:, None], ok[:, None], QMAX, IS_INT8)
        tl.store(q_rows + cols[None, :], y.to(q_ptr.dtype.element_ty), mask=mask)
    else:
        amax = tl.zeros([BLOCK_M], dtype=tl.float32)
        for start in range(0, K, BLOCK_K):
            cols = start + offs
            mask = row_ok[:, None] & (cols < K)[None, :]
            xf = _load_f32(x_rows + cols[None, :], cols, mask, mul_ptr, K, HAS_MUL)
            amax = tl.maximum(amax, tl.max(_abs_nan_to_inf(xf), axis=1))
        scale, inv, ok = _group_scale(amax, QMAX, FLOOR)
        for start in range(0, K, BLOCK_K):
            cols = start + offs
            mask = row_ok[:, None] & (cols < K)[None, :]
            xf = _load_f32(x_rows + cols[None, :], cols, mask, mul_ptr, K, HAS_MUL)
            y = _cast(xf * inv[:, None], ok[:, None], QMAX, IS_INT8)
            tl.store(q_rows + cols[None, :], y.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + rows64 * stride_sm + pid_g * stride_sg, scale, mask=row_ok)


@triton.jit
def _tensor_amax_kernel(x_ptr, mul_ptr, amax_ptr, n, K, HAS_MUL: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(pid * BLOCK, n, nprog * BLOCK):
        idx = offs.to(tl.int64) + start
        m = idx < n
        xf = tl.load(x_ptr + idx, mask=m, other=0.0).to(tl.float32)
        if HAS_MUL:
            xf = xf * tl.load(mul_ptr + idx % K, mask=m, other=0.0)
        acc = tl.maximum(acc, _abs_nan_to_inf(xf))
    # Values are >= 0 (or +Inf), for which Triton's float atomic_max is exact.
    tl.atomic_max(amax_ptr, tl.max(acc, axis=0))


@triton.jit
def _tensor_cast_kernel(
    x_ptr, q_ptr, s_ptr, mul_ptr, amax_ptr, n, K,
    QMAX: tl.constexpr, FLOOR: tl.constexpr, IS_INT8: tl.constexpr,
    HAS_MUL: tl.constexpr, BLOCK: tl.constexpr, REVERSE: tl.constexpr,
):
    # REVERSE: blocks in descending order, so the first CTAs (launched first) read the end
    # of x, which the amax pass read last and L2 may still hold.
    pid = tl.program_id(0)
    amax = tl.load(amax_ptr + tl.arange(0, 1))
    scale, inv, ok = _group_scale(amax, QMAX, FLOOR)
    if pid == 0:
        tl.store(s_ptr + tl.arange(0, 1), scale)
    if REVERSE:
        pid = tl.num_programs(0) - 1 - pid
    idx = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = idx < n
    xf = tl.load(x_ptr + idx, mask=m, other=0.0).to(tl.float32)
    if HAS_MUL:
        xf = xf * tl.load(mul_ptr + idx % K, mask=m, other=0.0)
    y = _cast(xf * inv, ok, QMAX, IS_INT8)
    tl.store(q_ptr + idx, y.to(q_ptr.dtype.element_ty), mask=m)


def _num_warps_for(elems: int) -> int:
    return max(4, min(16, elems // 512))


def quantize_triton(
    x: torch.Tensor,
    dtype: torch.dtype,
    granularity: str,
    multiplier: torch.Tensor | None = None,
    _store_dtype: torch.dtype | None = None,
    _key=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as `_reference.quantize_ref`; x [..., K] with K > 0.

    `_store_dtype=torch.float32` (tests only) stores the clamped, rounded values
    before the final narrowing cast, so the kernel logic can be checked exactly
    under TRITON_INTERPRET, whose fp32->fp8 conversion is not correctly rounded.
    `_key`: quantize()'s signature key for this call (it pins x's dtype, shape, strides and
    device, dtype, granularity and the multiplier's presence), reused as the plan key.
    """
    plan_key = _key or (x.shape, x.stride(), x.dtype, x.device, dtype, granularity, multiplier is not None,
                        _store_dtype)
    plan = _GROUP_PLANS.get(plan_key)
    if plan is not None:  # a 2-D row / block signature seen before: no reshapes, nothing recomputed
        M, K, n_groups, block, grid, scalars, cx, nw = plan
        q = x.new_empty((M, K), dtype=_store_dtype or dtype)
        scale = empty_block_scales(M, n_groups, x.device) if block else x.new_empty((M, 1), dtype=torch.float32)
        mul = x if multiplier is None else _mul_f32(multiplier)
        _GROUPS_LAUNCH(plan_key, grid, (x, q, scale, mul), scalars, cx, num_warps=nw)
        return q, scale
    K = x.shape[-1]
    flat = x.dim() == 2 and x.stride(1) == 1  # the common case: no reshape / view (~1-2 us each)
    x2 = x if flat else x.reshape(-1, K)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M = x2.shape[0]
    has_mul = multiplier is not None
    mul = _mul_f32(multiplier) if has_mul else x2  # dummy pointer
    q = x2.new_empty((M, K), dtype=_store_dtype or dtype)
    if granularity != "tensor":
        if granularity not in ("row", "block"):
            raise ValueError(f"granularity must be tensor, row or block, got {granularity!r}")
        n_groups, group_k, block_m, block_k, single, num_warps = _groups_launch(M, K, granularity)
        if granularity == "block":
            scale = empty_block_scales(M, n_groups, x.device)  # M-major: the GEMM reads it as it is
        else:
            scale = x2.new_empty((M, n_groups), dtype=torch.float32)
        if M > 0:
            grid = (triton.cdiv(M, block_m), n_groups, 1)
            scalars = (M, K, x2.stride(0), q.stride(0), scale.stride(0), scale.stride(1))
            cx = dict(QMAX=qmax_of(dtype), FLOOR=AMAX_FLOOR, IS_INT8=dtype == torch.int8, HAS_MUL=has_mul,
                      GROUP_K=group_k, BLOCK_M=block_m, BLOCK_K=block_k, SINGLE_TILE=single)
            # plan_key pins every scalar argument and the pointers' dtypes (TritonLaunch's contract).
            _GROUPS_LAUNCH(plan_key, grid, (x2, q, scale, mul), scalars, cx, num_warps=num_warps)
            if flat:
                _GROUP_PLANS[plan_key] = (M, K, n_groups, granularity == "block", grid, scalars, cx, num_warps)
        if flat:
            return q, scale
        return q.reshape(x.shape), scale.reshape(*x.shape[:-1], n_groups)
    # Per tensor: an amax pass, then the cast (the scale needs the whole tensor's amax).
    x2 = x2.contiguous()
    n = x2.numel()
    amax = torch.zeros(1, dtype=torch.float32, device=x.device)
    scale = torch.empty((), dtype=torch.float32, device=x.device)
    grid_a = (max(1, min(triton.cdiv(n, TENSOR_BLOCK), TENSOR_MAX_PROGRAMS)),)
    _tensor_amax_kernel[grid_a](x2, mul, amax, n, K, HAS_MUL=has_mul, BLOCK=TENSOR_BLOCK, num_warps=8)
    grid_c = (max(1, triton.cdiv(n, TENSOR_BLOCK)),)
    _tensor_cast_kernel[grid_c](
        x2, q, scale, mul, amax, n, K,
        QMAX=qmax_of(dtype), FLOOR=AMAX_FLOOR, IS_INT8=dtype == torch.int8, HAS_MUL=has_mul,
        BLOCK=TENSOR_BLOCK, REVERSE=TENSOR_CAST_REVERSE, num_warps=8,
    )
    return q.reshape(x.shape), scale


_GROUPS_LAUNCH = TritonLaunch(_quant_groups_kernel)
_GROUP_PLANS: dict = {}  # 2-D row / block signature -> its launch (see quantize_triton)


def _mul_f32(multiplier: torch.Tensor) -> torch.Tensor:
    return multiplier if multiplier.dtype == torch.float32 and multiplier.is_contiguous() else multiplier.float().contiguous()


@functools.lru_cache(maxsize=4096)
def _groups_launch(M: int, K: int, granularity: str):
    """(n_groups, group_k, block_m, block_k, single, num_warps) of the row / block kernel."""
    if granularity == "row":
        n_groups, group_k = 1, 0
        block_k = min(triton.next_power_of_2(K), MAX_SINGLE_K)
        single = K <= block_k
        if not single:
            block_k = TILE_ELEMS
    else:
        n_groups, group_k = triton.cdiv(K, BLOCK), BLOCK
        block_k, single = BLOCK, True
    if granularity == "row" and single:
        # Whole rows at 32 elements per thread: 8192 x 1600 14.8 us (2 warps, one row) vs
        # 16.8 us (8 warps, two rows); 8192 x 6400 54.1 vs 59.4 us (8 vs 16 warps), same-run
        # sweep on the H100 (GPT-2 XL's attention and MLP outputs).
        block_m = max(1, min(triton.next_power_of_2(max(M, 1)), ROW_TILE_ELEMS // block_k))
        num_warps = max(1, min(16, block_m * block_k // 1024))
    else:
        block_m = max(1, min(triton.next_power_of_2(max(M, 1)), TILE_ELEMS // block_k))
        num_warps = _num_warps_for(block_m * block_k)
    return n_groups, group_k, block_m, block_k, single, num_warps


GROUP = tl.constexpr(BLOCK)  # the 1 x 128 scale group, inside kernels


@triton.jit
def _layernorm_quant_kernel(
    x_ptr, w_ptr, b_ptr, q_ptr, s_ptr, mul_ptr,
    M, K, stride_xm, stride_qm, stride_sm, stride_sg, eps,
    QMAX: tl.constexpr,
    FLOOR: tl.constexpr,
    IS_INT8: tl.constexpr,
    HAS_MUL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    QUANT: tl.constexpr = True,
    GROUPED: tl.constexpr = False,
):
    """Per-token quantization of LayerNorm(x): the rows are normalized in registers and
    quantized without the LayerNorm output ever reaching memory; GROUPED: one scale per
    128-wide group of each row (1 x 128 blocks) instead of per row. QUANT=False: the
    plain LayerNorm into q (x's dtype), no scales."""
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    rows64 = rows.to(tl.int64)
    cols = tl.arange(0, BLOCK_K)
    col_ok = cols < K
    mask = row_ok[:, None] & col_ok[None, :]
    x = tl.load(x_ptr + rows64[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=1) / K
    d = tl.where(mask, x - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt_rn(tl.sum(d * d, axis=1) / K + eps)
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    # Rounded to the activation dtype, as the unfused LayerNorm's output would be.
    y = (d * rstd[:, None] * w[None, :] + b[None, :]).to(x_ptr.dtype.element_ty).to(tl.float32)
    if HAS_MUL:
        y = y * tl.load(mul_ptr + cols, mask=col_ok, other=0.0)[None, :]
    if QUANT and GROUPED:
        # [BLOCK_M, BLOCK_K] -> [BLOCK_M, groups, 128]: zero padding past K cannot raise an amax.
        y = tl.reshape(tl.where(mask, y, 0.0), (BLOCK_M, BLOCK_K // GROUP, GROUP))
        amax = tl.max(_abs_nan_to_inf(y), axis=2)
        scale, inv, ok = _group_scale(amax, QMAX, FLOOR)
        out = tl.reshape(_cast(y * inv[:, :, None], ok[:, :, None], QMAX, IS_INT8), (BLOCK_M, BLOCK_K))
        tl.store(q_ptr + rows64[:, None] * stride_qm + cols[None, :], out.to(q_ptr.dtype.element_ty), mask=mask)
        groups = tl.arange(0, BLOCK_K // GROUP)
        tl.store(s_ptr + rows64[:, None] * stride_sm + groups[None, :] * stride_sg, scale,
                 mask=row_ok[:, None] & (groups * GROUP < K)[None, :])
    elif QUANT:
        y = tl.where(mask, y, 0.0)
        amax = tl.max(_abs_nan_to_inf(y), axis=1)
        scale, inv, ok = _group_scale(amax, QMAX, FLOOR)
        out = _cast(y * inv[:, None], ok[:, None], QMAX, IS_INT8)
        tl.store(q_ptr + rows64[:, None] * stride_qm + cols[None, :], out.to(q_ptr.dtype.element_ty), mask=mask)
        tl.store(s_ptr + rows64 * stride_sm, scale, mask=row_ok)
    else:
        tl.store(q_ptr + rows64[:, None] * stride_qm + cols[None, :], y.to(q_ptr.dtype.element_ty), mask=mask)


def layernorm_quantize_triton(x, weight, bias, eps: float, dtype, multiplier=None, _block_m=None, _num_warps=None,
                              _quant=True, granularity: str = "row", _store_dtype=None):
    """(q [M, K], scale) = quantization of layer_norm(x); x [M, K], K <= MAX_SINGLE_K. scale is
    [M, 1] per token ("row") or [M, ceil(K/128)] per 1 x 128 group ("block", M-major as
    `quantize` writes it).

    _block_m / _num_warps override the tile (tuning sweeps only). _quant=False: see layernorm_triton.
    _store_dtype: as in `quantize_triton` (tests under TRITON_INTERPRET)."""
    M, K = x.shape
    q = torch.empty((M, K), dtype=_store_dtype or dtype, device=x.device)
    grouped = granularity == "block"
    if not _quant:
        scale = q  # unused
    elif grouped:
        scale = empty_block_scales(M, triton.cdiv(K, BLOCK), x.device)
    else:
        scale = torch.empty((M, 1), dtype=torch.float32, device=x.device)
    block_k = max(triton.next_power_of_2(K), BLOCK if grouped else 1)
    # 4 warps over 2 rows of 2048 (GPT-2 XL's 1600): 22.9 us at 8192 x 1600 vs 29.0 us with the
    # quantize kernel's 8 warps (same-run sweep, L2-rotated inputs).
    block_m = _block_m or max(1, min(triton.next_power_of_2(max(M, 1)), TILE_ELEMS // block_k))
    mul = multiplier.float().contiguous() if multiplier is not None else weight  # dummy pointer
    if M > 0:
        _layernorm_quant_kernel[(triton.cdiv(M, block_m),)](
            x, weight, bias, q, scale, mul, M, K, x.stride(0), q.stride(0), scale.stride(0), scale.stride(-1),
            float(eps), QMAX=qmax_of(dtype) if _quant else 1.0, FLOOR=AMAX_FLOOR, IS_INT8=dtype == torch.int8,
            HAS_MUL=multiplier is not None,
            BLOCK_M=block_m, BLOCK_K=block_k, num_warps=_num_warps or 4, QUANT=_quant, GROUPED=grouped,
        )
    return q, scale


def layernorm_triton(x, weight, bias, eps: float):
    """layer_norm(x) in x's dtype (fp32 math, rounded once, as torch's) for x [M, K <= 8192]
    with unit stride on K: the LayerNorm-quantize kernel without its quantization. On the
    H100 it replaces torch's kernel in our 16-bit prefill (GPT-2 XL: 8192 x 1600)."""
    return layernorm_quantize_triton(x, weight, bias, eps, x.dtype, _quant=False)[0]
