"""PyTorch reference for quantization: the numerics contract the Triton kernels match.

Everything here is plain torch, runs on any device, and is what CPU tensors use.
The Triton kernels in `_triton.py` reproduce these exact operations in the same
order, so for finite inputs the two agree bit for bit (tests check this):

    amax  = max |x * multiplier| over the group               (fp32)
    scale = max(amax, AMAX_FLOOR) / QMAX                      (IEEE division)
    inv   = 1 / scale                                         (IEEE division)
    q     = cast(clamp(x * multiplier * inv, -QMAX, QMAX))    (fp8: RNE cast; int8: round half to even)

Multiplying by `inv` instead of dividing by `scale` is deliberate: a per-element
multiply is what a bandwidth-bound kernel can afford, and the reference does the
same so the rounding is identical.

Non-finite input: a group (tensor, row or block) that holds a NaN or +-Inf gets
scale = NaN and its q values are NaN (fp8) or 0 (int8, which has no NaN). Anything
computed from that group (dequantize, the scaled GEMM) is NaN, which keeps the
failure visible and confined to the rows the group touches; other groups are
quantized normally. Nothing raises.

An all-zero group gets scale = AMAX_FLOOR / QMAX (tiny but finite) and q = 0, so
it dequantizes to exact zeros instead of 0/0 = NaN.
"""

from __future__ import annotations

import math

import torch

BLOCK = 128  # group width of "block" granularity, and the side of a weight block
AMAX_FLOOR = 1e-12

QMAX = {
    torch.float8_e4m3fn: 448.0,
    torch.float8_e5m2: 57344.0,
    torch.int8: 127.0,
}

GRANULARITIES = ("tensor", "row", "block")


def qmax_of(dtype: torch.dtype) -> float:
    try:
        return QMAX[dtype]
    except KeyError:
        raise ValueError(
            f"unsupported quantized dtype {dtype}; expected one of {list(QMAX)}"
        ) from None


def scale_from_amax(amax: torch.Tensor, qmax: float) -> torch.Tensor:
    """fp32 scale from an fp32 amax; NaN where amax is not finite."""
    # Tensor / tensor: CUDA turns division by a Python scalar into a multiply by
    # its reciprocal, which would make the reference's rounding device-dependent.
    scale = torch.clamp(amax, min=AMAX_FLOOR) / torch.full_like(amax, qmax)
    return torch.where(torch.isfinite(amax), scale, torch.full_like(scale, math.nan))


def cast_with_scale(xf: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """q = cast(clamp(xf * (1/scale))), with `scale` broadcastable to `xf` (fp32 both)."""
    qmax = qmax_of(dtype)
    y = torch.clamp(xf * (1.0 / scale), -qmax, qmax)
    if dtype == torch.int8:
        # torch.round is round-half-to-even; NaN only appears in a non-finite group.
        y = torch.round(y)
        y = torch.where(torch.isnan(y), torch.zeros_like(y), y)
    return y.to(dtype)


def _as_float(x: torch.Tensor, multiplier: torch.Tensor | None) -> torch.Tensor:
    xf = x.float()
    if multiplier is not None:
        xf = xf * multiplier.float()
    return xf


def _pad_last(x: torch.Tensor, multiple: int) -> torch.Tensor:
    pad = (-x.shape[-1]) % multiple
    return torch.nn.functional.pad(x, (0, pad)) if pad else x


def quantize_ref(
    x: torch.Tensor,
    dtype: torch.dtype,
    granularity: str = "row",
    multiplier: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize x [..., K] to `dtype`; returns (q like x, fp32 scale).

    Scale shapes: "tensor" -> (); "row" -> [..., 1]; "block" -> [..., ceil(K/128)]
    (one scale per 1x128 group along the last dim). `multiplier` [K] scales the
    columns before quantizing (SmoothQuant's 1/s), fused so no extra pass is needed.
    """
    qmax = qmax_of(dtype)
    xf = _as_float(x, multiplier)
    if granularity == "tensor":
        scale = scale_from_amax(xf.abs().amax() if xf.numel() else xf.new_zeros(()), qmax)
        return cast_with_scale(xf, scale, dtype), scale
    if granularity == "row":
        scale = scale_from_amax(xf.abs().amax(dim=-1, keepdim=True), qmax)
        return cast_with_scale(xf, scale, dtype), scale
    if granularity == "block":
        K = xf.shape[-1]
        xp = _pad_last(xf, BLOCK)  # zero padding cannot raise a group's amax
        groups = xp.unflatten(-1, (-1, BLOCK))
        scale = scale_from_amax(groups.abs().amax(dim=-1), qmax)
        q = cast_with_scale(groups, scale.unsqueeze(-1), dtype).flatten(-2)[..., :K].contiguous()
        s2 = scale.reshape(-1, scale.shape[-1])
        out = empty_block_scales(s2.shape[0], s2.shape[1], scale.device)
        out.copy_(s2)
        return q, out.reshape(scale.shape)
    raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")


def empty_block_scales(M: int, n_groups: int, device) -> torch.Tensor:
    """An fp32 [M, n_groups] tensor for 1 x 128 activation scales, stored M-major with the
    rows padded to 16 bytes: the layout the block-scaled GEMM TMA-loads as it is (and
    cuBLASLt's "outer-dim-major" 1 x 128 scales)."""
    m_pad = -(-max(M, 1) // 4) * 4
    return torch.empty((n_groups, m_pad), dtype=torch.float32, device=device)[:, :M].t()


def quantize_weight_block_ref(w: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (q [N, K], scale [ceil(N/128), ceil(K/128)]), one scale per 128x128 block."""
    N, K = w.shape
    qmax = qmax_of(dtype)
    wf = _pad_last(_pad_last(w.float(), BLOCK).t(), BLOCK).t()  # pad both dims to 128
    blocks = wf.unflatten(0, (-1, BLOCK)).unflatten(-1, (-1, BLOCK))  # [Nb, 128, Kb, 128]
    scale = scale_from_amax(blocks.abs().amax(dim=(1, 3)), qmax)  # [Nb, Kb]
    q = cast_with_scale(blocks, scale[:, None, :, None], dtype).flatten(2).flatten(0, 1)
    return q[:N, :K].contiguous(), scale


def dequantize_ref(
    q: torch.Tensor,
    scale: torch.Tensor,
    granularity: str = "row",
    out_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Inverse of quantize: q * scale, broadcasting scale by granularity.

    "tensor" / "row" (also per-output-channel weights [N, 1]): plain broadcast.
    "block": 1x128 groups, scale [..., ceil(K/128)].
    "block2d": 128x128 weight blocks, q [N, K], scale [ceil(N/128), ceil(K/128)].
    """
    qf = q.float()
    K = q.shape[-1]
    s = scale.float()
    if granularity in ("tensor", "row"):
        y = qf * s
    elif granularity == "block":
        y = qf * s.repeat_interleave(BLOCK, dim=-1)[..., :K]
    elif granularity == "block2d":
        N = q.shape[0]
        y = qf * s.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:N, :K]
    else:
        raise ValueError(
            f"granularity must be one of {GRANULARITIES + ('block2d',)}, got {granularity!r}"
        )
    return y.to(out_dtype)
