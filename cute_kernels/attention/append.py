"""KV-cache append in one launch: the k_new/v_new half of `flash_attn_with_kvcache`.

Appending with torch indexing (api.append_kv, the reference) takes six small launches plus
two more for the new lengths; at decode sizes those cost more GPU time than the attention
itself. This kernel does the whole thing in one launch:

    k_cache[b, lens[b] + s, h] = k_new[b, s, h];  v_cache likewise;  lens_out[b] = lens[b] + S_new

Grid (Hkv, S_new, B); per CTA 2 * D / 8 threads, each moving one 16-byte chunk of K or V.
Rows at or past the cache capacity are not written, and lens_out is clamped to it (the
caller's contract is lens[b] + S_new <= Smax; see `flash_attn_with_kvcache`).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute


class AppendKVSm90:
    """Warp roles: none (a copy kernel). Pipelines: none."""

    def __init__(self, head_dim: int):
        assert head_dim % 8 == 0
        self.head_dim = head_dim
        self.chunks = head_dim // 8  # 16-byte chunks per row of K (or V)

    @cute.jit
    def __call__(self, mKc: cute.Tensor, mVc: cute.Tensor, mKn: cute.Tensor, mVn: cute.Tensor,
                 mLens: cute.Tensor, mLensOut: cute.Tensor, stream):
        B, S_new, Hkv = mKn.shape[0], mKn.shape[1], mKn.shape[2]
        self.kernel(mKc, mVc, mKn, mVn, mLens, mLensOut).launch(
            grid=(Hkv, S_new, B), block=(2 * self.chunks, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, mKc, mVc, mKn, mVn, mLens, mLensOut):
        tid, _, _ = cute.arch.thread_idx()
        h, s, b = cute.arch.block_idx()
        s_max = mKc.shape[1]
        s_new = mKn.shape[1]
        row = mLens[b] + s
        c = tid % self.chunks
        buf = cute.make_rmem_tensor((8,), mKn.element_type)
        if row < s_max:
            if tid < self.chunks:
                cute.autovec_copy(cute.local_tile(mKn[b, s, h, None], (8,), (c,)), buf)
                cute.autovec_copy(buf, cute.local_tile(mKc[b, row, h, None], (8,), (c,)))
            else:
                cute.autovec_copy(cute.local_tile(mVn[b, s, h, None], (8,), (c,)), buf)
                cute.autovec_copy(buf, cute.local_tile(mVc[b, row, h, None], (8,), (c,)))
        if h == 0 and s == 0 and tid == 0:
            mLensOut[b] = cutlass.min(mLens[b] + s_new, s_max)
