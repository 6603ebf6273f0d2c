"""flash_attn: FlashAttention forward on Hopper. EXPERIMENTAL.

The CuTe DSL kernel (kernel.py) compiles for sm_90a but has not yet been run on a GPU,
so it is off unless CUTE_KERNELS_EXPERIMENTAL_ATTENTION=1: a kernel nobody has checked
must not answer silently. Validation and the reference are complete.
"""

from __future__ import annotations

import os

import torch

from ..runtime import KERNELS, TARGET_ARCH, CompileKey, check_device
from ..runtime.dtypes import SIXTEEN_BIT, dtype_name
from .reference import flash_attn_ref  # noqa: F401

HEAD_DIMS = (64, 128)
ENV_FLAG = "CUTE_KERNELS_EXPERIMENTAL_ATTENTION"


def _validate(q, k, v):
    for t, n in ((q, "q"), (k, "k"), (v, "v")):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{n} must be a torch.Tensor")
        if t.dtype not in SIXTEEN_BIT:
            raise TypeError(f"{n} must be bfloat16 or float16, got {t.dtype}")
        if t.dim() != 4:
            raise ValueError(f"{n} must be 4-D [B, S, H, D], got shape {tuple(t.shape)}")
        if t.stride(-1) != 1:
            raise ValueError(f"{n} must have unit stride on the head dim (D), got strides {t.stride()}")
        check_device(t, n)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    B, Sq, Hq, D = q.shape
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"k and v must be [B={B}, Sk, Hkv, D={D}], got {tuple(k.shape)} and {tuple(v.shape)}")
    if Hq % k.shape[2]:
        raise ValueError(f"query heads ({Hq}) must be a multiple of key/value heads ({k.shape[2]})")
    if D not in HEAD_DIMS:
        raise ValueError(f"head dim {D} is not supported; supported: {HEAD_DIMS}")
    for t, n in ((q, "q"), (k, "k"), (v, "v")):
        if t.data_ptr() % 16 or any((s * t.element_size()) % 16 for s in t.stride()[:-1]):
            raise ValueError(f"{n} needs a 16-byte aligned base and 16-byte aligned strides (TMA)")


def _compile(dtype, head_dim: int, causal: bool, keep_dir: str | None = None, seqlens: bool = False):
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

    from ..runtime.dtypes import to_cutlass
    from .kernel import FlashAttnFwdSm90

    dt = to_cutlass(dtype)
    b, sq, sk, hq, hkv = (cute.sym_int32() for _ in range(5))

    def bshd(s, h):
        return make_fake_tensor(dt, (b, s, h, head_dim), (cute.sym_int64(divisibility=8),
                                cute.sym_int64(divisibility=8), cute.sym_int64(divisibility=8), 1), assumed_align=16)

    fq, fk, fv, fo = bshd(sq, hq), bshd(sk, hkv), bshd(sk, hkv), bshd(sq, hq)
    flse = make_fake_tensor(cutlass.Float32, (b, hq, sq), (cute.sym_int64(), cute.sym_int64(), 1), assumed_align=4)
    fseq = make_fake_tensor(cutlass.Int32, (b,), (1,), assumed_align=4) if seqlens else None
    kernel = FlashAttnFwdSm90(head_dim, causal)
    return cute.compile(kernel, fq, fk, fv, fo, flse, fseq, cutlass.Float32(1.0), cutlass.Int32(1),
                        make_fake_stream(use_tvm_ffi_env_stream=True), options=f"--enable-tvm-ffi --gpu-arch {TARGET_ARCH}"
                        + (f" --keep-ptx --keep-cubin --dump-dir {keep_dir}" if keep_dir else ""))


def _run(q, k, v, causal, softmax_scale, seqlens_k=None):
    from .kernel import softmax_scale_log2

    if os.environ.get(ENV_FLAG) != "1":
        raise NotImplementedError(
            "cute_kernels.flash_attn's CuTe DSL kernel compiles but has not been verified on a GPU yet; "
            f"set {ENV_FLAG}=1 to run it anyway, or use cute_kernels.attention.reference.flash_attn_ref / SDPA")
    B, Sq, Hq, D = q.shape
    out = torch.empty((B, Sq, Hq, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, Hq, Sq), dtype=torch.float32, device=q.device)
    if out.numel():
        with_lens = seqlens_k is not None
        key = CompileKey("flash_fwd_sm90", (dtype_name(q.dtype),), ("bshd",), (128, 128), (1, 1),
                         epilogue=(("causal", bool(causal)), ("seqlens_k", with_lens)), extra=(D,))
        fn = KERNELS.get(key, lambda: _compile(q.dtype, D, bool(causal), seqlens=with_lens))
        fn(q, k, v, out, lse, seqlens_k, softmax_scale_log2(D, softmax_scale), Hq // k.shape[2])
    return out, lse


def flash_attn(q, k, v, *, causal: bool = False, softmax_scale: float | None = None, return_lse: bool = False):
    """Attention forward: q [B, Sq, Hq, D], k/v [B, Sk, Hkv, D] (GQA: Hq a multiple of Hkv),
    any strides with unit stride on D. Causal masks are aligned bottom-right.

    Returns O [B, Sq, Hq, D] (and the fp32 log-sum-exp [B, Hq, Sq] with return_lse).
    """
    _validate(q, k, v)
    out, lse = _run(q, k, v, causal, softmax_scale)
    return (out, lse) if return_lse else out


def append_kv(k_cache, v_cache, cache_seqlens, k_new, v_new) -> None:
    """Write k_new/v_new [B, S_new, Hkv, D] into the caches at rows cache_seqlens[b] + (0..S_new-1).

    Pure device indexing (no host sync), so it can sit inside a captured CUDA graph.
    """
    B, S_new = k_new.shape[:2]
    rows = cache_seqlens.long()[:, None] + torch.arange(S_new, device=k_new.device)[None, :]
    bidx = torch.arange(B, device=k_new.device)[:, None].expand(B, S_new)
    k_cache[bidx, rows] = k_new
    v_cache[bidx, rows] = v_new


def flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens, *, k_new=None, v_new=None,
                            causal: bool = True, softmax_scale: float | None = None):
    """Decode / chunked prefill against a preallocated cache [B, Smax, Hkv, D].

    cache_seqlens [B] (int32) holds each sequence's filled length. k_new/v_new
    [B, S_new, Hkv, D] are appended in place first; the query [B, S_new, Hq, D] then
    attends to the first cache_seqlens[b] + S_new keys (causal: bottom-right aligned).
    Returns O [B, S_new, Hq, D]; cache_seqlens itself is not advanced.
    """
    _validate(q, k_cache, v_cache)
    B, Smax = k_cache.shape[:2]
    if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.shape != (B,) or cache_seqlens.dtype != torch.int32:
        raise ValueError(f"cache_seqlens must be an int32 tensor of shape ({B},)")
    if cache_seqlens.device != q.device:
        raise ValueError(f"cache_seqlens is on {cache_seqlens.device}, expected {q.device}")
    if (k_new is None) != (v_new is None):
        raise ValueError("pass both k_new and v_new, or neither")
    lens = cache_seqlens
    if k_new is not None:
        if k_new.shape != v_new.shape or k_new.shape[0] != B or k_new.shape[2:] != k_cache.shape[2:]:
            raise ValueError(f"k_new/v_new must be [B={B}, S_new, Hkv, D] matching the cache, got {tuple(k_new.shape)}")
        if k_new.dtype != k_cache.dtype or v_new.dtype != v_cache.dtype:
            raise TypeError("k_new/v_new must have the cache dtype")
        append_kv(k_cache, v_cache, cache_seqlens, k_new, v_new)
        lens = cache_seqlens + k_new.shape[1]
    out, _ = _run(q, k_cache, v_cache, causal, softmax_scale, seqlens_k=lens.to(torch.int32).contiguous())
    return out
