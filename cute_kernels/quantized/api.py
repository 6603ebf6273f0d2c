"""FP8 and INT8 GEMM ops on the Hopper GEMM kernel, with the scaling fused in the epilogue.

8-bit wgmma only reads K-major operands, so A must be [M, K] row-major and B must be
handed over as the [K, N] column-major view of a [N, K] weight (`w.t()`), exactly as
`torch._scaled_mm` / cuBLASLt require ("TN").
"""

from __future__ import annotations

import functools

import torch

from ..matmul.api import _alloc_out, _tma_ok, _tuned, kernel_for, residual_for_kernel, run_gemm, tuning_class
from ..matmul.reference import ACTIVATIONS
from ..runtime import check_device
from ..runtime.dtypes import FP8
from .reference import int8_mm_ref, scaled_mm_blockwise_ref, scaled_mm_ref  # noqa: F401

__all__ = ["scaled_mm", "scaled_mm_blockwise", "int8_mm", "scaled_mm_ref", "scaled_mm_blockwise_ref", "int8_mm_ref"]

_OUT_DTYPES = (torch.bfloat16, torch.float16)


def _check_8bit_operands(a, b, allowed, what: str) -> None:
    for t, name in ((a, "a"), (b, "b")):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in allowed:
            raise TypeError(f"{what}: {name} must be one of {allowed}, got {t.dtype}")
        check_device(t, name)
        if t.dim() != 2:
            raise ValueError(f"{what}: {name} must be 2-D, got shape {tuple(t.shape)}")
    if a.device != b.device:
        raise ValueError(f"a is on {a.device} but b is on {b.device}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"{what}: shape mismatch, a is {tuple(a.shape)} and b is {tuple(b.shape)} (need a [M, K], b [K, N])")
    K = a.shape[1]
    if K % 16:
        raise ValueError(f"{what}: K={K} must be a multiple of 16 (16-byte rows for TMA)")
    if not (a.stride(1) == 1 and _tma_ok(a, "k")):
        raise ValueError(f"{what}: a must be row-major [M, K] (K-major, stride(1) == 1) with a 16-byte aligned base; "
                         f"got strides {a.stride()}")
    if not (b.stride(0) == 1 and _tma_ok(b.t(), "k")):
        raise ValueError(f"{what}: b must be column-major [K, N] (the .t() of a row-major [N, K] weight, stride(0) == 1); "
                         f"got strides {b.stride()}. 8-bit tensor cores only read K-major operands.")


def _scale_mode(scale, length: int, name: str, shape_vec: tuple, device) -> tuple[str, torch.Tensor | None]:
    """() / one element -> 'scalar'; the per-row/column shape -> 'vector'."""
    if scale is None:
        return "none", None
    if not isinstance(scale, torch.Tensor) or scale.dtype != torch.float32:
        raise TypeError(f"{name} must be a float32 tensor")
    if scale.device != device:
        raise ValueError(f"{name} is on {scale.device}, expected {device}")
    if scale.numel() == 1:
        return "scalar", scale.reshape(1)
    if tuple(scale.shape) == shape_vec:
        return "vector", scale.reshape(length).contiguous()
    raise ValueError(f"{name} must have shape () or {shape_vec}, got {tuple(scale.shape)}")


def _check_bias(bias, N: int, dtype, device):
    if bias is None:
        return None
    if not isinstance(bias, torch.Tensor) or bias.shape != (N,) or bias.dtype != dtype or bias.device != device:
        raise ValueError(f"bias must be a {dtype} tensor of shape ({N},) on {device}")
    return bias.contiguous()


def _check_residual(residual, M: int, N: int, dtype, device):
    if residual is None:
        return None
    if not isinstance(residual, torch.Tensor) or residual.shape != (M, N) or residual.dtype != dtype:
        raise ValueError(f"residual must be a {dtype} tensor of shape ({M}, {N})")
    if residual.device != device:
        raise ValueError(f"residual is on {residual.device}, the operands on {device}")
    return residual if residual.stride(1) == 1 else residual.contiguous()


# --------------------------------------------------------------------------- hot path
#
# scaled_mm / int8_mm remember, per call signature (op, options, and every tensor's dtype,
# shape, strides and device), the launch that the validated first call made when it needed
# no copies; later calls with that signature re-check only the 16-byte alignment of the
# TMA operands and launch (full validation cost ~20 us of CPU per call on the lent
# machines, as much as the rest of the call).

_PLANS: dict = {}


def _sig(t):
    return None if t is None else (t.dtype, t.shape, t.stride(), t.device)


def _plan_lookup(op, a, b, sa, sb, bias, residual, *opts):
    """(key, plan or None); key None when an argument is not a tensor (the full path
    raises the right error)."""
    try:
        key = (op, a.dtype, a.shape, a.stride(), a.device, b.dtype, b.shape, b.stride(), b.device,
               _sig(sa), _sig(sb), _sig(bias), _sig(residual), *opts)
    except AttributeError:
        return None, None
    return key, _PLANS.get(key)


def _run_plan(plan, a, b, sa, sb, bias, residual):
    """Launch a recorded plan, or None when this call's pointers are not 16-byte aligned."""
    if (a.data_ptr() | b.data_ptr()) & 15 or (residual is not None and residual.data_ptr() & 15):
        return None
    fn, M, N, n_p, out_dtype = plan
    buf = a.new_empty((M, n_p), dtype=out_dtype)
    out = buf if n_p == N else buf[:, :N]
    fn(a, b, out, bias, residual, None if sa is None else sa.view(-1), None if sb is None else sb.view(-1), 1.0, 1.0)
    return out


def _launch_and_record(key, a, b, out, epi, bias_in, bias, residual_in, residual, scales_in, sa, sb, *,
                       config, kernel_name, acc_name="Float32"):
    """The full path's launch (b [K, N] handed over as it is, `GemmSm90.b_kn`); records
    the plan when nothing was copied on the way (bias, residual, vector scales)."""
    residual_k = residual_for_kernel(residual)
    fn = kernel_for(a, b.t(), out.dtype, epi, config=config, kernel_name=kernel_name, acc_name=acc_name, b_kn=True)
    fn(a, b, out, bias, residual_k, sa, sb, 1.0, 1.0)
    copied = bias is not bias_in or residual_k is not residual_in or any(
        t is not None and t.numel() > 1 and not t.is_contiguous() for t in scales_in)
    if key is not None and not copied:
        _PLANS[key] = (fn, out.shape[0], out.shape[1], out.stride(0), out.dtype)
    return out


def scaled_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
    use_fast_accum: bool = False,
) -> torch.Tensor:
    """FP8 GEMM with torch._scaled_mm semantics: act((a * scale_a) @ (b * scale_b) + bias) + residual.

    a [M, K] e4m3/e5m2 row-major; b [K, N] e4m3/e5m2 column-major; scale_a () or [M, 1];
    scale_b () or [1, N] (float32); bias [N] and residual [M, N] in out_dtype (bf16 or fp16).

    use_fast_accum=False (the default, as in torch) promotes the tensor-core partial
    sums into an fp32 accumulator every 128 of K ("2xAcc"); True keeps one wgmma
    accumulator, which is faster and loses precision as K grows.
    """
    key, plan = _plan_lookup("scaled_mm", a, b, scale_a, scale_b, bias, residual, out_dtype, activation,
                             use_fast_accum)
    if plan is not None:
        out = _run_plan(plan, a, b, scale_a, scale_b, bias, residual)
        if out is not None:
            return out
    return _scaled_mm_slow(key, a, b, scale_a, scale_b, bias, out_dtype, activation, residual, use_fast_accum)


def _scaled_mm_slow(key, a, b, scale_a, scale_b, bias_in, out_dtype, activation, residual_in, use_fast_accum):
    from ..matmul.config import Epilogue

    _check_8bit_operands(a, b, FP8, "scaled_mm")
    if out_dtype not in _OUT_DTYPES:
        raise TypeError(f"scaled_mm: out_dtype must be bfloat16 or float16, got {out_dtype}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    if scale_a is None or scale_b is None:
        raise ValueError("scaled_mm needs scale_a and scale_b (use a tensor of 1.0 for unscaled inputs)")
    M, K = a.shape
    N = b.shape[1]
    row_mode, sa = _scale_mode(scale_a, M, "scale_a", (M, 1), a.device)
    col_mode, sb = _scale_mode(scale_b, N, "scale_b", (1, N), a.device)
    bias = _check_bias(bias_in, N, out_dtype, a.device)
    residual = _check_residual(residual_in, M, N, out_dtype, a.device)
    out = _alloc_out(M, N, out_dtype, a.device)
    if M == 0 or N == 0:
        return out
    epi = Epilogue(activation=activation or "none", row_scale=row_mode, col_scale=col_mode, bias=bias is not None,
                   residual=residual is not None)
    cfg = None if use_fast_accum else _promoted_config(M, N, K, tuning_class(a.dtype, out_dtype, ("k", "k"), epi, True))
    return _launch_and_record(key, a, b, out, epi, bias_in, bias, residual_in, residual, (scale_a, scale_b), sa, sb,
                              config=cfg, kernel_name="scaled_mm_sm90")


@functools.lru_cache(maxsize=4096)  # per-call hot path: no dataclass built per launch
def _promoted_config(M: int, N: int, K: int, tuning_class: tuple | None = None):
    """Tile for the promoted ("2xAcc") and block-scaled loops, which keep two accumulators
    in registers: the tuning cache's winner for `tuning_class` (matmul.api.tuning_class)
    when it has one, else 64 x 128 per warpgroup, cooperative.

    With fewer 128 x 128 tiles than SMs, 64-row tiles (one consumer warpgroup each) put
    twice as many CTAs to work; with very few tiles and a long K, split K in four as well
    (each split keeps >= 8 k-tiles). Same-run sweeps on the H100 (block scales):
    512x1600x6400 476 -> 607 TFLOP/s, 128x7168x2048 310 -> 364, 64x1600x6400 63 -> 97
    (split in two); from 1024 rows up 128 x 128 stayed best (1024x7168x2048 880 vs 743).
    Decode sizes (1 and 8 rows): K = 6400 16.7 us unsplit, 14.3 split in two, 12.9 in
    four, 13.5 in eight; at K = 1600 any split was slower (1x4800x1600: 8.1 -> 10.1 us)."""
    from ..matmul.config import H100_SMS, GemmConfig

    if tuning_class is not None:
        hit = _tuned(tuning_class, M, N, K)
        if hit is not None:
            return hit
    tiles_n = -(-N // 128)
    if -(-M // 128) * tiles_n >= H100_SMS:
        return GemmConfig(128, 128, 2 if M > 128 else 1, 1, promote=True)
    tiles_m = -(-M // 64)
    if tiles_m * tiles_n <= 32 and -(-K // 128) >= 32:
        return GemmConfig(64, 128, 1, 1, promote=True, split_k=4)
    return GemmConfig(64, 128, 2 if tiles_m >= 2 else 1, 1, promote=True)


def clear_dispatch_caches() -> None:
    """Forget memoised config picks and recorded launches (after the tuning cache changed)."""
    _promoted_config.cache_clear()
    _PLANS.clear()


def _tma_f32(t: torch.Tensor, unit_dim: int) -> bool:
    """A float32 matrix TMA can read: unit stride on `unit_dim`, 16-byte base and other stride."""
    return (t.stride(unit_dim) == 1 and not t.stride(1 - unit_dim) % 4 and not t.data_ptr() % 16
            and t.stride(1 - unit_dim) >= t.shape[unit_dim])


def block_scales_for_kernel(scale_a: torch.Tensor | None, scale_b: torch.Tensor | None):
    """The block scales as the kernel TMA-loads them, copied only when they must be:
    scale_a [M, K/128] M-major ("outer-dim-major", as `quant.quantize_fp8(x, "block")`
    writes it) and scale_b [N/128, K/128] K-major, each with 16-byte aligned base and
    padded stride. Either may be None (left alone)."""
    if scale_a is not None and not _tma_f32(scale_a, 0):
        M, kb = scale_a.shape
        buf = torch.empty((kb, -(-max(M, 1) // 4) * 4), dtype=torch.float32, device=scale_a.device)
        buf[:, :M] = scale_a.t()
        scale_a = buf[:, :M].t()
    if scale_b is not None and not _tma_f32(scale_b, 1):
        nb, kb = scale_b.shape
        buf = torch.empty((nb, -(-max(kb, 1) // 4) * 4), dtype=torch.float32, device=scale_b.device)
        buf[:, :kb] = scale_b
        scale_b = buf[:, :kb]
    return scale_a, scale_b


def scaled_mm_blockwise(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """DeepSeek-V3-style block-scaled FP8 GEMM: act(sum over 128-deep k-blocks of
    (a_kb @ b_kb^T) * scale_a[m, kb] * scale_b[n // 128, kb] + bias) + residual.

    a [M, K] row-major fp8 with scale_a [M, ceil(K/128)] (1 x 128 groups); b [N, K]
    row-major fp8 (the weight itself, not its .t()) with scale_b [ceil(N/128), ceil(K/128)]
    (128 x 128 blocks); float32 scales of any strides (M-major scale_a with 16-byte
    aligned strides, as `quant.quantize_fp8(x, "block")` returns it, is used in place;
    other layouts are copied, see `block_scales_for_kernel`). Each k-tile of the kernel is
    one scale block: the producer TMA-loads its scales with A and B, and its wgmma partial
    sums are scaled and added into an fp32 accumulator in the main loop (the promoted
    "2xAcc" loop with scales).
    """
    from ..matmul.config import Epilogue

    if not isinstance(b, torch.Tensor):
        raise TypeError(f"b must be a torch.Tensor, got {type(b).__name__}")
    if b.dim() != 2:
        raise ValueError(f"scaled_mm_blockwise: b must be a 2-D [N, K] weight, got shape {tuple(b.shape)}")
    _check_8bit_operands(a, b.t(), FP8, "scaled_mm_blockwise")
    if out_dtype not in _OUT_DTYPES:
        raise TypeError(f"scaled_mm_blockwise: out_dtype must be bfloat16 or float16, got {out_dtype}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    M, K = a.shape
    N = b.shape[0]
    kb, nb = -(-K // 128), -(-N // 128)
    for t, name, shape in ((scale_a, "scale_a", (M, kb)), (scale_b, "scale_b", (nb, kb))):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
            raise TypeError(f"scaled_mm_blockwise: {name} must be a float32 tensor")
        if tuple(t.shape) != shape:
            raise ValueError(f"scaled_mm_blockwise: scale_a must be [{M}, {kb}] and scale_b [{nb}, {kb}], "
                             f"got {tuple(scale_a.shape)} and {tuple(scale_b.shape)}")
        if t.device != a.device:
            raise ValueError(f"scaled_mm_blockwise: {name} is on {t.device}, the operands on {a.device}")
    bias = _check_bias(bias, N, out_dtype, a.device)
    residual = _check_residual(residual, M, N, out_dtype, a.device)
    out = _alloc_out(M, N, out_dtype, a.device)
    if M == 0 or N == 0:
        return out
    if K == 0:  # no k-blocks: the product is zero
        out.copy_(scaled_mm_blockwise_ref(a, b, scale_a, scale_b, bias=bias, out_dtype=out_dtype,
                                          activation=activation, residual=residual))
        return out
    scale_a, scale_b = block_scales_for_kernel(scale_a, scale_b)
    epi = Epilogue(activation=activation or "none", row_scale="block", col_scale="block", bias=bias is not None,
                   residual=residual is not None)
    return run_gemm(a, b, out, epi=epi, bias=bias, residual=residual, row_scale=scale_a, col_scale=scale_b,
                    config=_promoted_config(M, N, K, tuning_class(a.dtype, out_dtype, ("k", "k"), epi, True)),
                    kernel_name="scaled_mm_blockwise_sm90")


def int8_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor | None = None,
    scale_b: torch.Tensor | None = None,
    *,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """INT8 GEMM on the integer tensor cores (s8 x s8 -> s32).

    Without scales it equals torch._int_mm(a, b) exactly (int32). With scales
    (scale_a () or [M, 1], scale_b () or [1, N], float32) it returns the dequantized
    act(a @ b * scale_a * scale_b + bias) + residual in out_dtype (default bfloat16).
    a [M, K] row-major, b [K, N] column-major (w.t() of an int8 [N, K] weight).
    """
    key, plan = _plan_lookup("int8_mm", a, b, scale_a, scale_b, bias, residual, out_dtype, activation)
    if plan is not None:
        out = _run_plan(plan, a, b, scale_a, scale_b, bias, residual)
        if out is not None:
            return out
    return _int8_mm_slow(key, a, b, scale_a, scale_b, bias, out_dtype, activation, residual)


def _int8_mm_slow(key, a, b, scale_a, scale_b, bias_in, out_dtype, activation, residual_in):
    from ..matmul.config import Epilogue

    _check_8bit_operands(a, b, (torch.int8,), "int8_mm")
    M, K = a.shape
    N = b.shape[1]
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    scaled = scale_a is not None or scale_b is not None or bias_in is not None or activation or residual_in is not None
    if not scaled:
        if out_dtype not in (None, torch.int32):
            raise TypeError("int8_mm without scales returns int32; pass scales to get a dequantized output")
        out = _alloc_out(M, N, torch.int32, a.device)
        if M and N:
            _launch_and_record(key, a, b, out, Epilogue(), None, None, None, None, (), None, None, config=None,
                               kernel_name="int8_mm_sm90", acc_name="Int32")
        return out
    out_dtype = out_dtype or torch.bfloat16
    if out_dtype not in _OUT_DTYPES:
        raise TypeError(f"int8_mm: dequantized out_dtype must be bfloat16 or float16, got {out_dtype}")
    row_mode, sa = _scale_mode(scale_a, M, "scale_a", (M, 1), a.device)
    col_mode, sb = _scale_mode(scale_b, N, "scale_b", (1, N), a.device)
    bias = _check_bias(bias_in, N, out_dtype, a.device)
    residual = _check_residual(residual_in, M, N, out_dtype, a.device)
    out = _alloc_out(M, N, out_dtype, a.device)
    if M and N:
        epi = Epilogue(activation=activation or "none", row_scale=row_mode, col_scale=col_mode,
                       bias=bias is not None, residual=residual is not None)
        _launch_and_record(key, a, b, out, epi, bias_in, bias, residual_in, residual, (scale_a, scale_b), sa, sb,
                           config=None, kernel_name="int8_mm_sm90", acc_name="Int32")
    return out
