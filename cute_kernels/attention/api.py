"""flash_attn: FlashAttention forward on Hopper (prefill, KV-cache decode, varlen).

Thin host layer over kernel.py and decode.py: validate, pick the kernel's config
(config.py) and the compiled variant (causal, per-sequence key/query lengths, splits) from
the compile cache, launch on the current stream.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..matmul.config import MAX_ACTIVE_CLUSTERS
from ..runtime import KERNELS, TARGET_ARCH, check_device, env, num_sms
from ..runtime.dtypes import SIXTEEN_BIT
from .config import (  # noqa: F401  (HEAD_DIMS: public here)
    H100_SMS,
    HEAD_DIMS,
    MAX_CLUSTER_SPLITS,
    MAX_DECODE_SPLITS,
    DecodeConfig,
    DecodeMmaConfig,
    PrefillConfig,
    check_head_dim,
    check_softmax_scale,
    ctas_per_sm,
    decode_config,
    decode_mma_config,
    prefill_config,
    prefill_config_fp8,
    softmax_scale_log2,
)
from .reference import (  # noqa: F401
    append_kv,
    flash_attn_fp8_emulated,
    flash_attn_fp8_ref,
    flash_attn_ref,
    quantize_qkv_fp8_ref,
)

MAX_SPLITS = 16


def _tma_aligned(t: torch.Tensor) -> bool:
    """Unit stride on D, 16-byte aligned base and strides (TMA, 16-byte copies)."""
    return t.stride(-1) == 1 and not t.data_ptr() % 16 and not any((s * t.element_size()) % 16 for s in t.stride()[:-1])


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
    check_head_dim(D)
    for t, n in ((q, "q"), (k, "k"), (v, "v")):
        if not _tma_aligned(t):
            raise ValueError(f"{n} needs a 16-byte aligned base and 16-byte aligned strides (TMA)")


def _compile(dtype, cfg: PrefillConfig, causal: bool, seqlens_k: bool, seqlens_q: bool, split_kv: bool,
             keep_dir: str | None = None):
    cfg.validate()
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

    from ..runtime.dtypes import to_cutlass
    from .kernel import FlashAttnFwdSm90

    dt = to_cutlass(dtype)
    head_dim = cfg.head_dim
    b, sq, sk, hq, hkv = (cute.sym_int32() for _ in range(5))

    def bshd(s, h):
        return make_fake_tensor(dt, (b, s, h, head_dim), (cute.sym_int64(divisibility=8),
                                cute.sym_int64(divisibility=8), cute.sym_int64(divisibility=8), 1), assumed_align=16)

    fq, fk, fv, fo = bshd(sq, hq), bshd(sk, hkv), bshd(sk, hkv), bshd(sq, hq)
    flse = make_fake_tensor(cutlass.Float32, (b, hq, sq), (cute.sym_int64(), cute.sym_int64(), 1), assumed_align=4)
    if split_kv:  # fp32 partials with a leading split mode, contiguous (allocated by _run)
        ns = cute.sym_int32()
        fo = make_fake_tensor(cutlass.Float32, (ns, b, sq, hq, head_dim),
                              tuple(cute.sym_int64() for _ in range(4)) + (1,), assumed_align=16)
        flse = make_fake_tensor(cutlass.Float32, (ns, b, hq, sq), tuple(cute.sym_int64() for _ in range(3)) + (1,),
                                assumed_align=4)
    fseq = make_fake_tensor(cutlass.Int32, (b,), (1,), assumed_align=4) if seqlens_k else None
    fseq_q = make_fake_tensor(cutlass.Int32, (b,), (1,), assumed_align=4) if seqlens_q else None
    kernel = FlashAttnFwdSm90(cfg, causal, split_kv=split_kv)
    return cute.compile(kernel, fq, fk, fv, fo, flse, fseq, fseq_q, None, cutlass.Float32(1.0), cutlass.Int32(1),
                        cutlass.Int32(H100_SMS), cutlass.Int32(1), make_fake_stream(use_tvm_ffi_env_stream=True), options=f"--enable-tvm-ffi --gpu-arch {TARGET_ARCH}"
                        + (f" --keep-ptx --keep-cubin --dump-dir {keep_dir}" if keep_dir else ""))


def num_splits_heuristic(batch: int, heads: int, seqlen_q: int, seqlen_k: int, *, num_sms: int = H100_SMS) -> int:
    """Split the keys when the (query block, head, batch) grid leaves SMs idle.

    Each split keeps at least 4 key blocks of 128 (the pipeline needs a few to reach
    bandwidth), and splits x CTAs stays within one wave.
    """
    ctas = -(-seqlen_q // 128) * heads * batch
    if ctas >= num_sms:
        return 1
    n_blocks = -(-seqlen_k // 128)
    return max(1, min(MAX_SPLITS, num_sms // ctas, n_blocks // 4))


def combine_splits(o_parts: torch.Tensor, lse_parts: torch.Tensor, out_dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge split-KV partials: o_parts [S, B, Sq, H, D] (each normalised by its own sum),
    lse_parts [S, B, H, Sq] -> O [B, Sq, H, D], LSE [B, H, Sq].

    O = sum_s exp(lse_s - lse) O_s with lse = logsumexp_s(lse_s). Splits with no keys carry
    lse_s = -inf (weight 0); rows with no keys at all get O = 0 and LSE = -inf.
    """
    lse = torch.logsumexp(lse_parts, dim=0)
    w = torch.exp(lse_parts - lse).nan_to_num(0.0)  # -inf - -inf: rows with no keys
    out = (o_parts * w.permute(0, 1, 3, 2).unsqueeze(-1)).sum(0)
    return out.to(out_dtype), lse


def _check_splits(num_splits):
    if num_splits is not None and (not isinstance(num_splits, int) or isinstance(num_splits, bool) or num_splits < 1):
        raise ValueError(f"num_splits must be an int >= 1 or None (heuristic), got {num_splits!r}")


def _resolve_splits(num_splits, B, Hq, Sq, Sk) -> int:
    _check_splits(num_splits)
    if num_splits is None:
        return num_splits_heuristic(B, Hq, Sq, Sk)
    return min(num_splits, MAX_SPLITS)


# ----------------------------------------------------------------------------- decode (S_q = 1)

def _decode_cfg(head_dim: int, mma: bool) -> DecodeConfig | DecodeMmaConfig:
    """The per-head-dim config of either decode kernel (what the split heuristics plan with)."""
    return decode_mma_config(head_dim) if mma else decode_config(head_dim)


def _heads_per_cta(qheads_per_kvhead: int, cfg: DecodeConfig | DecodeMmaConfig) -> int:
    return max(h for h in range(1, cfg.max_heads + 1) if qheads_per_kvhead % h == 0)


def decode_heads_per_cta(qheads_per_kvhead: int, head_dim: int = 64, mma: bool = False) -> int:
    """The largest divisor of the GQA ratio within the kernel's max_heads."""
    return _heads_per_cta(qheads_per_kvhead, _decode_cfg(head_dim, mma))


def decode_uses_mma(batch: int, q_heads: int, kv_heads: int, seqlen_k: int, head_dim: int, *,
                    num_sms: int = H100_SMS) -> bool:
    """The tensor-core decode kernel for GQA ratios >= min_gqa, when its (bigger) key blocks
    still give every SM a CTA: at batch 1 with 8 KV heads and 1k keys it makes 64 one-step
    CTAs and lost to the SIMT kernel's 128 (8.9 vs 7.4 us, H100, same run)."""
    G = q_heads // kv_heads
    if head_dim not in DecodeMmaConfig.HEAD_DIMS or G < decode_mma_config(head_dim).min_gqa:
        return False
    ctas = batch * (q_heads // decode_heads_per_cta(G, head_dim, mma=True))
    return ctas * -(-seqlen_k // decode_mma_config(head_dim).block_n) >= num_sms


def _decode_kernel_obj(cfg: DecodeConfig | DecodeMmaConfig, heads: int, split: bool, seqlens: bool,
                       masked: bool = False, cluster: int = 1, early_trigger: bool = False):
    from .decode import FlashDecodeMmaSm90, FlashDecodeSm90

    kernel = FlashDecodeMmaSm90 if isinstance(cfg, DecodeMmaConfig) else FlashDecodeSm90
    return kernel(cfg, heads, split, seqlens, masked=masked, cluster=cluster, early_trigger=early_trigger)


def decode_splits_heuristic(batch: int, q_heads: int, heads_per_cta: int, seqlen_k: int, head_dim: int, *,
                            num_sms: int = H100_SMS, mma: bool = False) -> int:
    """Key splits for decode.py.

    Merged through global memory (partials out, a fence, the counter, the last CTA reading
    them back in one pass: dependent L2 round trips, a few microseconds of a batch-1
    launch): at most one wave of CTAs (in an H100 sweep
    over batch 1-64 x 8k-32k keys the best split counts filled the SMs once: 12 CTAs -> 8-11
    splits, 64 -> 2, 96 -> 1), no split shorter than one key block, and none with less work
    than MIN_SPLIT_WORK (bytes of K and V to read times the query heads sharing them). A CTA
    with 4 GQA heads does 4x the math per byte and splits sooner.

    Merged inside a cluster (SIMT kernel, 2-8 splits, decode_cluster_merge()): the merge costs
    little, so the largest cluster that keeps one wave and at least MIN_CLUSTER_SPLIT_WORK
    per split. Same-run H100 sweep, B = 1 (us; cluster / best global merge / cuDNN): 12
    heads D = 64 1k keys 4.1 (8) / 6.0 / 6.3, 8k 8.2 (8) / 9.5 / 10.8, 32k 37.4 (8) / 38.8 /
    39.6; h32/8 D = 128 1k 6.9 (8) / 7.8 / 7.2; GPT-2 XL's 25 heads at 448 keys 4.1 (4) /
    4.6 (unsplit); at 192 keys unsplit stays best (3.4 vs 3.6-3.8 clustered). The global
    merge is kept where a cluster of 8 would leave most SMs idle (fewer than 8 CTAs).
    See MIN_CLUSTER_SPLIT_TOTAL for the in-model case.

    The tensor-core kernel keeps the global merge's split count, and its splits merge in a
    cluster where decode_merges_in_cluster allows (same split count, same run, us; cluster /
    global / cuDNN): B = 8 h32/8 1k keys 9.3 / 11.3 / 11.6, 8k 89.8 / 91.8 / 95.2; B = 1 at 8k
    keys a cluster of 8 (64 CTAs) lost to 16 global splits (15.0 vs 11.5)."""
    ctas = batch * (q_heads // heads_per_cta)
    block_n = _decode_cfg(head_dim, mma).block_n
    n_blocks = -(-seqlen_k // block_n)
    work = seqlen_k * 4 * head_dim * heads_per_cta  # K + V, 2 bytes each
    splits = min(MAX_DECODE_SPLITS, num_sms // ctas, n_blocks, work // MIN_SPLIT_WORK)
    if mma:  # the last CTA reads every split's fp32 partial back: keep that tail short
        splits = min(splits, MAX_MERGE_BYTES // (heads_per_cta * head_dim * 4))
    if not mma and decode_cluster_merge() and (ctas >= MAX_CLUSTER_SPLITS or splits <= MAX_CLUSTER_SPLITS):
        for c in (8, 4, 2):
            if decode_merges_in_cluster(ctas, c) and work >= MIN_CLUSTER_SPLIT_TOTAL \
                    and work // c >= MIN_CLUSTER_SPLIT_WORK and n_blocks >= c:
                return c
        return 1
    return max(1, splits)


def decode_merges_in_cluster(ctas: int, splits: int, smem_bytes: int = 0) -> bool:
    """Whether `splits` splits of each of `ctas` (batch, head group) pairs merge inside a
    thread-block cluster (decode.py) rather than through global memory: 2-8 splits, and few
    enough CTAs that every cluster is resident at once. A cluster's CTAs must share a GPC;
    an H100 fits 12 clusters of 8 (96 CTAs) in one wave, but 16 (128 CTAs) took 1.6x as long
    as the same split count merged globally (B = 2, 4k keys, h32/8, D = 128: 17.4 vs 11.2 us).
    smem_bytes (a CTA's, 0: unknown): where only one such CTA fits an SM, at most as many
    clusters as the GPCs hold at one CTA a SM (MAX_ACTIVE_CLUSTERS: 30 of 4). The tensor-core
    kernel with 7-8 packed heads in clusters of 4 takes 122 KB; 32 clusters of it ran a second
    wave. Same run, H200, D = 128, 4k / 16k keys, x cuDNN, cluster -> global merge
    (`ab_decode_cl_g*_h200.md`): h64/8 batch 4 0.710 -> 0.982 / 0.674 -> 0.992, h28/4 batch 8
    0.733 -> 0.994 / 0.685 -> 0.998 (3 splits in clusters of 3: 1.068 / 0.981, 1.023 / 0.944)."""
    if not decode_cluster_merge() or not 2 <= splits <= MAX_CLUSTER_SPLITS:
        return False
    if smem_bytes and ctas_per_sm(smem_bytes) == 1 and ctas > MAX_ACTIVE_CLUSTERS.get(splits, ctas):
        return False
    return ctas * splits <= (MAX_CLUSTER_CTAS_WIDE if splits > 4 else MAX_CLUSTER_CTAS)


# CTAs per launch at most for the cluster merge: clusters of 2-4, of 5-8.
MAX_CLUSTER_CTAS = 128
MAX_CLUSTER_CTAS_WIDE = 96
# Decode launches with 2-8 splits merge them inside a thread-block cluster where
# decode_merges_in_cluster allows (decode.py); CUTE_KERNELS_DECODE_CLUSTER=0 keeps every split
# merge in global memory (A/B runs).
def decode_cluster_merge() -> bool:
    """Whether split decode attention may merge inside a cluster (CUTE_KERNELS_DECODE_CLUSTER)."""
    return env.enabled("CUTE_KERNELS_DECODE_CLUSTER")


# Cluster-merged splits: each reads at least MIN_CLUSTER_SPLIT_WORK, and a CTA splits only
# when its whole range is at least MIN_CLUSTER_SPLIT_TOTAL. Standalone (H100), 25 heads at
# 448 keys (112 KB) in 4 splits won (4.1 vs 4.6 us), 192 keys (48 KB) lost in 2, 3 or 4; in
# GPT-2 XL's decode step (a 256-key cache, 64 KB, where the early copies already overlap the
# kernel ahead) 2 splits lost 15 us per token (1.682 vs 1.667 ms, two runs each).
MIN_CLUSTER_SPLIT_WORK = 24 << 10
MIN_CLUSTER_SPLIT_TOTAL = 96 << 10
# Below this much work per split (K+V bytes of one KV head x query heads per CTA), splitting
# costs more than it saves (see above).
MIN_SPLIT_WORK = 128 << 10
# At most this many bytes of fp32 split partials per (batch, head group) for the tensor-core
# kernel, whose CTAs pack up to 16 heads (B = 1, h32/2, 8k keys: 64 splits x 16 heads read
# back by one CTA took longer than the keys).
MAX_MERGE_BYTES = 128 << 10


def _compile_decode(dtype, cfg: DecodeConfig | DecodeMmaConfig, heads: int, split: bool, seqlens: bool,
                    masked: bool, cluster: int, early_trigger: bool, keep_dir: str | None = None):
    cfg.validate()
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

    from ..runtime.dtypes import to_cutlass

    dt = to_cutlass(dtype)
    head_dim = cfg.head_dim
    b, sk, hq, hkv, ns = (cute.sym_int32() for _ in range(5))

    def bshd(s, h):
        return make_fake_tensor(dt, (b, s, h, head_dim), (cute.sym_int64(divisibility=8),
                                cute.sym_int64(divisibility=8), cute.sym_int64(divisibility=8), 1), assumed_align=16)

    f32 = cutlass.Float32
    fq, fk, fv, fo = bshd(1, hq), bshd(sk, hkv), bshd(sk, hkv), bshd(1, hq)
    flse = make_fake_tensor(f32, (b, hq, 1), (cute.sym_int64(), cute.sym_int64(), 1), assumed_align=4)
    fop = flp = fsem = None
    if split and cluster == 1:
        # Contiguous fp32 rows of head_dim (allocated by _run_decode): 16-byte aligned strides.
        fop = make_fake_tensor(f32, (b, hq, ns, head_dim), tuple(cute.sym_int64(divisibility=4) for _ in range(3))
                               + (1,), assumed_align=16)
        flp = make_fake_tensor(f32, (b, hq, ns), (cute.sym_int64(), cute.sym_int64(), 1), assumed_align=4)
        fsem = make_fake_tensor(cutlass.Int32, (cute.sym_int32(),), (1,), assumed_align=4)
    fseq = make_fake_tensor(cutlass.Int32, (b,), (1,), assumed_align=4) if seqlens else None
    fmask = make_fake_tensor(cutlass.Uint8, (b, sk), (cute.sym_int64(), 1), assumed_align=1) if masked else None
    kernel = _decode_kernel_obj(cfg, heads, split, seqlens, masked, cluster, early_trigger)
    return cute.compile(kernel, fq, fk, fv, fo, flse, fop, flp, fsem, fseq, fmask, f32(1.0), cutlass.Int32(1),
                        cutlass.Int32(1), make_fake_stream(use_tvm_ffi_env_stream=True),
                        options=f"--enable-tvm-ffi --gpu-arch {TARGET_ARCH}"
                        + (f" --keep-ptx --keep-cubin --dump-dir {keep_dir}" if keep_dir else ""))


def _decode_kernel(dtype, cfg: DecodeConfig | DecodeMmaConfig, heads: int, split: bool, seqlens: bool,
                   masked: bool, cluster: int, early_trigger: bool):
    name = "flash_decode_mma_sm90" if isinstance(cfg, DecodeMmaConfig) else "flash_decode_sm90"
    return KERNELS.compiled(name, _compile_decode, dtype, cfg, heads, split, seqlens, masked, cluster, early_trigger)


# Split-merge arrival counters, one per (batch, head group), zero between launches (the last
# CTA of each group resets its own). Grown on demand, one buffer per device, never inside a
# CUDA-graph capture (its memory would belong to that graph). Limitation: split decode
# launches running concurrently on two streams of one device share these counters and must
# not overlap.
_SEMAPHORES: dict = {}


def _semaphores(n: int, device) -> torch.Tensor:
    buf = _SEMAPHORES.get(device)
    if buf is None or buf.numel() < n:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("flash_attn decode: run one call of this size eagerly before capturing a CUDA graph "
                               "(its split-merge counters are allocated on first use)")
        buf = _SEMAPHORES[device] = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)
    return buf


def _run_decode(q, k, v, softmax_scale, seqlens_k=None, num_splits=None, key_mask=None, early_trigger=False,
                config: DecodeConfig | DecodeMmaConfig | None = None, cluster_merge: bool = True):
    """q [B, 1, Hq, D] against k/v [B, Sk, Hkv, D] (the first seqlens_k[b] keys, those of them
    where key_mask [B, Sk] (uint8) is nonzero) -> O, LSE. config: build this kernel config
    instead of the tuned pick (the split heuristics still plan with the tuned one).
    cluster_merge=False merges splits through global memory where a cluster would (A/B runs)."""

    B, _, Hq, D = q.shape
    G = Hq // k.shape[2]
    if config is None:
        mma = decode_uses_mma(B, Hq, k.shape[2], k.shape[1], D)
    else:
        mma = isinstance(config, DecodeMmaConfig)
    heads = _heads_per_cta(G, config or _decode_cfg(D, mma))
    splits = num_splits if num_splits is not None else decode_splits_heuristic(B, Hq, heads, k.shape[1], D, mma=mma)
    splits = min(splits, MAX_DECODE_SPLITS)
    out = torch.empty((B, 1, Hq, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, Hq, 1), dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out, lse
    split = splits > 1
    ctas = B * (Hq // heads)
    if config is None:
        config = (decode_mma_config(D, 0 if split else ctas, heads, k.shape[1], split_ctas=ctas if split else 0) if mma
                  else decode_config(D, ctas, k.shape[1], mha=G == 1 and not split))
    if getattr(config, "kv_pack", 1) > 1 and (G != 1 or split or Hq % config.kv_pack):
        config = replace(config, kv_pack=1)  # KV heads share a CTA only for unsplit MHA
    cluster = 1
    if split and cluster_merge and decode_merges_in_cluster(ctas, splits, config.smem_bytes(heads, splits)):
        cluster = splits
    fn = _decode_kernel(q.dtype, config, heads, split, seqlens_k is not None, key_mask is not None, cluster,
                        early_trigger)
    scale = softmax_scale_log2(D, softmax_scale)
    if cluster > 1:  # partials merge in rank 0's shared memory: no buffers, no counters
        fn(q, k, v, out, lse, None, None, None, seqlens_k, key_mask, scale, G, splits)
    elif split:
        o_parts = torch.empty((B, Hq, splits, D), dtype=torch.float32, device=q.device)
        l_parts = torch.empty((B, Hq, splits), dtype=torch.float32, device=q.device)
        sem = _semaphores(B * (Hq // heads), q.device)
        fn(q, k, v, out, lse, o_parts, l_parts, sem, seqlens_k, key_mask, scale, G, splits)
    else:
        fn(q, k, v, out, lse, None, None, None, seqlens_k, key_mask, scale, G, 1)
    return out, lse


def _kernel(dtype, cfg: PrefillConfig, causal: bool, seqlens_k: bool, seqlens_q: bool, split_kv: bool):
    return KERNELS.compiled("flash_fwd_sm90", _compile, dtype, cfg, causal, seqlens_k, seqlens_q, split_kv)


# K and V of the (batch, head) pairs that the tiles in flight share should stay in L2
# (50 MB on an H100): the persistent schedule walks the query blocks of this many bytes'
# worth of pairs before moving on.
L2_GROUP_BYTES = 24 << 20
PERSISTENT_CAUSAL_MAX_SK = 1024


# Persistent causal tiles (Sk <= PERSISTENT_CAUSAL_MAX_SK) of three consumer warpgroups walk
# smaller groups: their K/V is re-read by the head's later (shorter) tiles, and with 24 MB
# groups those came too late for L2 (32 x 32 x 512 x 64 causal on the H100, ncu: 247 MB read
# from DRAM where Q, K and V are 201 MB; 8 MB groups: 205 MB, 158 -> 147 us).
CAUSAL_GROUP_BYTES = 8 << 20


def heads_per_group(seqlen_k: int, head_dim: int, qheads_per_kvhead: int, itemsize: int = 2,
                    group_bytes: int | None = None) -> int:
    """(batch, query head) pairs per tile-order group: their K/V fit in group_bytes
    (default L2_GROUP_BYTES)."""
    kv_bytes = 2 * max(seqlen_k, 1) * head_dim * itemsize
    return max(1, (group_bytes or L2_GROUP_BYTES) * qheads_per_kvhead // kv_bytes)


def prefill_tile_group(cfg: PrefillConfig, causal: bool, persistent: bool, seqlen_k: int, qheads_per_kvhead: int) -> int:
    """The tile-order group (heads_per_group) of a 16-bit prefill launch.

    Persistent causal: the static schedule deals round k's tiles forwards and round k + 1's
    backwards, so with the longest tiles first a CTA's two rounds add up to about the same
    work when the tile lengths in a pair of rounds descend evenly. 128-row tiles (two
    warpgroups) take one head's query blocks back to back (group 1): their lengths fall one
    key block per tile, every pair of rounds balances while 2 x SMs is a multiple of the
    blocks per head, and the head's K/V is shared by tiles in flight together. 192-row tiles
    (three warpgroups) are not linear in work (the last one of a 512-row sequence has one idle
    warpgroup) and take CAUSAL_GROUP_BYTES groups. Same-run A/B on the H100 over 16 causal
    shapes with S <= 1024 (docs/attention.md): D = 128, group 1 against 24 MB groups 1.00x to
    1.11x (32 x 512 MHA 0.889x -> 0.954x cuDNN); D = 64, 8 MB 0.97x to 1.09x (GPT-2 XL's
    8 x 25 x 1024 0.902x -> 0.982x)."""
    ratio = qheads_per_kvhead // cfg.pack_gqa
    if causal and persistent:
        if cfg.num_mma_wg == 2:
            return 1
        return heads_per_group(seqlen_k, cfg.head_dim, ratio, group_bytes=CAUSAL_GROUP_BYTES)
    return heads_per_group(seqlen_k, cfg.head_dim, ratio)


def _run(q, k, v, causal, softmax_scale, seqlens_k=None, seqlens_q=None, num_splits=1,
         config: PrefillConfig | None = None, tile_group: int | None = None):
    """config: build this kernel config instead of prefill_config's pick; tile_group: heads
    per tile-order group instead of prefill_tile_group's (benchmarks.ab_attention)."""

    B, Sq, Hq, D = q.shape
    splits = num_splits
    out = torch.empty((B, Sq, Hq, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, Hq, Sq), dtype=torch.float32, device=q.device)
    if out.numel():
        lens_k, lens_q = seqlens_k is not None, seqlens_q is not None
        split_kv = splits > 1
        ratio = Hq // k.shape[2]
        # GQA packing needs one row per (position, head) of a single query length, unsplit.
        packable = not (lens_q or split_kv)
        cfg = config or prefill_config(D, Sq, ratio if packable else 1, bool(causal))
        if cfg.pack_gqa > 1 and (not packable or cfg.pack_gqa != ratio):
            cfg = replace(cfg, pack_gqa=1)
        fn = _kernel(q.dtype, cfg, bool(causal), lens_k, lens_q, split_kv)
        scale = softmax_scale_log2(D, softmax_scale)
        # Persistent CTAs remove the per-tile launch/prologue/epilogue bubbles, which
        # dominate short tiles; long causal tiles balance better under the hardware's
        # dynamic CTA scheduler (one CTA per tile, longest first). Same-run A/B on the
        # H100 (docs/attention.md): persistent wins every non-causal shape and causal S <= 1024.
        persistent = not causal or k.shape[1] <= PERSISTENT_CAUSAL_MAX_SK
        sms = num_sms(q.device.index or 0) if persistent else 1 << 30
        group = tile_group or prefill_tile_group(cfg, bool(causal), persistent, k.shape[1], ratio)
        if split_kv:
            o_parts = torch.empty((splits, B, Sq, Hq, D), dtype=torch.float32, device=q.device)
            lse_parts = torch.empty((splits, B, Hq, Sq), dtype=torch.float32, device=q.device)
            fn(q, k, v, o_parts, lse_parts, seqlens_k, seqlens_q, None, scale, ratio, sms, group)
            out, lse = combine_splits(o_parts, lse_parts, q.dtype)
        else:
            fn(q, k, v, out, lse, seqlens_k, seqlens_q, None, scale, ratio, sms, group)
    return out, lse


def _compile_fp8(cfg: PrefillConfig, causal: bool, keep_dir: str | None = None):
    """The prefill kernel on e4m3 Q, K and V^T (keys permuted per 32, fp8_vt.py) with
    per-(batch, KV head) descales, bf16 O."""
    cfg.validate(in_bytes=1)
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

    from .kernel import FlashAttnFwdSm90

    f8, head_dim = cutlass.Float8E4M3FN, cfg.head_dim
    b, sq, sk, sk_pad, hq, hkv = (cute.sym_int32() for _ in range(6))

    def bshd(dt, s, h):
        return make_fake_tensor(dt, (b, s, h, head_dim), (cute.sym_int64(divisibility=16),
                                cute.sym_int64(divisibility=16), cute.sym_int64(divisibility=16), 1), assumed_align=16)

    fq, fk, fo = bshd(f8, sq, hq), bshd(f8, sk, hkv), bshd(cutlass.BFloat16, sq, hq)
    # V^T: (b, h_kv, d, s_k padded to 32), keys contiguous (fp8_vt.vt_fp8).
    fvt = make_fake_tensor(f8, (b, hkv, head_dim, sk_pad), (cute.sym_int64(divisibility=16),
                           cute.sym_int64(divisibility=16), cute.sym_int64(divisibility=16), 1), assumed_align=16)
    flse = make_fake_tensor(cutlass.Float32, (b, hq, sq), (cute.sym_int64(), cute.sym_int64(), 1), assumed_align=4)
    fscales = make_fake_tensor(cutlass.Float32, (b, hkv, 2), (cute.sym_int64(), 2, 1), assumed_align=4)
    kernel = FlashAttnFwdSm90(cfg, causal)
    return cute.compile(kernel, fq, fk, fvt, fo, flse, None, None, fscales, cutlass.Float32(1.0), cutlass.Int32(1),
                        cutlass.Int32(H100_SMS), cutlass.Int32(1), make_fake_stream(use_tvm_ffi_env_stream=True),
                        options=f"--enable-tvm-ffi --gpu-arch {TARGET_ARCH}"
                        + (f" --keep-ptx --keep-cubin --dump-dir {keep_dir}" if keep_dir else ""))


def _descale(t, name: str, B: int, Hkv: int, device) -> torch.Tensor:
    if t is None:
        return torch.ones((B, Hkv), dtype=torch.float32, device=device)
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape (batch, kv_heads) or None")
    if t.shape != (B, Hkv) or t.dtype != torch.float32:
        raise ValueError(f"{name} must be float32 of shape ({B}, {Hkv}) (batch, kv_heads), got {t.dtype} "
                         f"{tuple(t.shape)}")
    return t


def flash_attn_fp8(q, k, v, *, q_descale=None, k_descale=None, v_descale=None, causal: bool = False,
                   softmax_scale: float | None = None, return_lse: bool = False):
    """Attention forward on FP8 (e4m3) inputs, FlashAttention-3's arguments: q [B, Sq, Hq, D],
    k/v [B, Sk, Hkv, D] in torch.float8_e4m3fn, each dequantized by its descale, a float32
    [B, Hkv] tensor (None: 1), as q_descale[b, h // (Hq / Hkv)] for query head h. Returns
    bf16 O [B, Sq, Hq, D] (and the fp32 log-sum-exp [B, Hq, Sq]).

    Q K^T and P V run on the FP8 tensor cores (fp32 accumulation); P is quantized to e4m3
    as exp2(s - max + 8), in [0, 256], and stays in registers. V is transposed for the P V
    product (wgmma reads 8-bit operands K-major only) by one pass per call (fp8_vt.vt_fp8,
    its keys permuted per 32 to match P's register order).
    """
    softmax_scale = check_softmax_scale(softmax_scale)
    e4m3 = torch.float8_e4m3fn
    for t, n in ((q, "q"), (k, "k"), (v, "v")):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{n} must be a torch.Tensor")
        if t.dtype != e4m3:
            raise TypeError(f"{n} must be torch.float8_e4m3fn, got {t.dtype}")
        if t.dim() != 4:
            raise ValueError(f"{n} must be 4-D [B, S, H, D], got shape {tuple(t.shape)}")
    B, Sq, Hq, D = q.shape
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"k and v must be [B={B}, Sk, Hkv, D={D}], got {tuple(k.shape)} and {tuple(v.shape)}")
    Hkv = k.shape[2]
    if Hq % Hkv:
        raise ValueError(f"query heads ({Hq}) must be a multiple of key/value heads ({Hkv})")
    if D not in (64, 128):
        raise ValueError(f"FP8 attention supports head dims 64 and 128, got {D}")
    if v.stride(3) != 1:
        raise ValueError("v needs unit stride on D")
    qd, kd, vd = (_descale(t, n, B, Hkv, q.device) for t, n in
                  ((q_descale, "q_descale"), (k_descale, "k_descale"), (v_descale, "v_descale")))
    for t, n in ((q, "q"), (k, "k"), (v, "v"), (qd, "q_descale"), (kd, "k_descale"), (vd, "v_descale")):
        check_device(t, n)
    for t, n in ((q, "q"), (k, "k")):
        if not _tma_aligned(t):
            raise ValueError(f"{n} needs unit stride on D and a 16-byte aligned base and strides (TMA)")
    out, lse = _run_fp8(q, k, v, qd, kd, vd, causal, softmax_scale)
    return (out, lse) if return_lse else out


def quantize_qkv_fp8(q, k, v):
    """16- or 32-bit q [B, Sq, Hq, D], k/v [B, Sk, Hkv, D] -> (q8, k8, v8, q_descale, k_descale,
    v_descale), flash_attn_fp8's arguments: each (batch, KV head) of k and v, and each (batch,
    KV head) group of query heads of q, scaled so that its largest magnitude maps to e4m3's 448
    (the descales, float32 [B, Hkv], undo it). On a GPU with 16-bit inputs and a power-of-two
    head dim, two Triton passes a tensor (fp8_quant.py); otherwise torch ops
    (reference.quantize_qkv_fp8_ref)."""
    for t, n in ((q, "q"), (k, "k"), (v, "v")):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{n} must be a torch.Tensor")
        if t.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise TypeError(f"{n} must be bfloat16, float16 or float32, got {t.dtype}")
        if t.dim() != 4:
            raise ValueError(f"{n} must be 4-D [B, S, H, D], got shape {tuple(t.shape)}")
    B, Sq, Hq, D = q.shape
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D or Hq % k.shape[2]:
        raise ValueError(f"k and v must be [B={B}, Sk, Hkv, D={D}] with Hkv dividing {Hq}, got {tuple(k.shape)} "
                         f"and {tuple(v.shape)}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k and v must be on one device, got {q.device}, {k.device}, {v.device}")
    if (q.is_cuda and q.dtype == k.dtype == v.dtype and q.dtype in SIXTEEN_BIT and D & (D - 1) == 0
            and all(t.stride(3) == 1 for t in (q, k, v))):
        from .fp8_quant import quantize_qkv

        return quantize_qkv(q, k, v)
    return quantize_qkv_fp8_ref(q, k, v)


def _run_fp8(q, k, v, qd, kd, vd, causal: bool, softmax_scale: float | None, config: PrefillConfig | None = None):
    """flash_attn_fp8 past its checks (descales as [B, Hkv] float32 tensors): (O, LSE).
    config: build this kernel config instead of prefill_config_fp8's pick."""
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    out = torch.empty((B, Sq, Hq, D), dtype=torch.bfloat16, device=q.device)
    lse = torch.empty((B, Hq, Sq), dtype=torch.float32, device=q.device)
    if out.numel():
        from .fp8_vt import vt_fp8

        vt = vt_fp8(v)
        scales = torch.stack([qd * kd, vd], dim=-1)
        cfg = config or prefill_config_fp8(D, Sq, causal)
        fn = KERNELS.compiled("flash_fwd_fp8_sm90", _compile_fp8, cfg, bool(causal))
        ratio = Hq // Hkv
        sms = num_sms(q.device.index or 0) if (not causal or Sk <= PERSISTENT_CAUSAL_MAX_SK) else 1 << 30
        fn(q, k, vt, out, lse, None, None, scales, softmax_scale_log2(D, softmax_scale), ratio, sms,
           heads_per_group(Sk, D, ratio, itemsize=1))
    return out, lse


def flash_attn(q, k, v, *, causal: bool = False, softmax_scale: float | None = None, return_lse: bool = False,
               num_splits: int | None = None, invariant: bool = False):
    """Attention forward: q [B, Sq, Hq, D], k/v [B, Sk, Hkv, D] (GQA: Hq a multiple of Hkv),
    any strides with unit stride on D. Causal masks are aligned bottom-right.

    Sq = 1 runs the decode kernel (decode.py: SIMT, GQA heads packed per CTA, split-KV
    merged in the same launch); longer queries run the wgmma kernel (kernel.py).
    num_splits: how many CTAs share one query block's keys (split-KV, for grids that
    leave SMs idle); None picks by `num_splits_heuristic` / `decode_splits_heuristic`.
    invariant: each (sequence, head)'s output independent of the batch size and the head
    count (`_invariant_plan`; num_splits must be None or 1).
    Returns O [B, Sq, Hq, D] (and the fp32 log-sum-exp [B, Hq, Sq] with return_lse).
    """
    softmax_scale = check_softmax_scale(softmax_scale)
    _validate(q, k, v)
    num_splits, config = _invariant_plan(invariant, num_splits, q.shape[1], q.shape[3])
    if q.shape[1] == 1:  # one query row sees every key, causal or not (bottom-right alignment)
        _check_splits(num_splits)
        out, lse = _run_decode(q, k, v, softmax_scale, num_splits=num_splits, config=config)
    else:
        splits = _resolve_splits(num_splits, q.shape[0], q.shape[2], q.shape[1], k.shape[1])
        out, lse = _run(q, k, v, causal, softmax_scale, num_splits=splits)
    return (out, lse) if return_lse else out


def _compile_append(dtype, head_dim: int, keep_dir: str | None = None):
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

    from ..runtime.dtypes import to_cutlass
    from .append import AppendKVSm90

    dt = to_cutlass(dtype)
    b = cute.sym_int32()

    def bshd():
        return make_fake_tensor(dt, (b, cute.sym_int32(), cute.sym_int32(), head_dim),
                                tuple(cute.sym_int64(divisibility=8) for _ in range(3)) + (1,), assumed_align=16)

    lens = make_fake_tensor(cutlass.Int32, (b,), (1,), assumed_align=4)
    lens_out = make_fake_tensor(cutlass.Int32, (b,), (1,), assumed_align=4)
    return cute.compile(AppendKVSm90(head_dim), bshd(), bshd(), bshd(), bshd(), lens, lens_out,
                        make_fake_stream(use_tvm_ffi_env_stream=True),
                        options=f"--enable-tvm-ffi --gpu-arch {TARGET_ARCH}"
                        + (f" --keep-ptx --dump-dir {keep_dir}" if keep_dir else ""))


def append_kv_fused(k_cache, v_cache, cache_seqlens, k_new, v_new) -> torch.Tensor:
    """append_kv in one launch (append.py); returns the new lengths min(cache_seqlens + S_new,
    Smax) as a fresh int32 tensor. Needs 16-byte aligned rows in k_new/v_new."""
    D = k_new.shape[3]
    fn = KERNELS.compiled("append_kv_sm90", _compile_append, k_new.dtype, D)
    lens_out = torch.empty_like(cache_seqlens)
    fn(k_cache, v_cache, k_new, v_new, cache_seqlens.contiguous(), lens_out)
    return lens_out


def _invariant_plan(invariant: bool, num_splits, seqlen_q: int, head_dim: int):
    """(num_splits, decode config) for an `invariant` call: a head's keys in one pass (no
    split-KV: where splits go, and whether they merge in a cluster, follows the batch and head
    counts) and, for one query row, the SIMT decode kernel's per-head-dim config (the
    tensor-core kernel and the many-wave configs are picked by the CTA count). The prefill
    kernel's config already depends on the head dim, the query length, the GQA ratio and the
    mask only (GQA packing changes which rows share a tile, not what any row computes)."""
    if not invariant:
        return num_splits, None
    if num_splits not in (None, 1):
        raise ValueError(f"invariant=True runs unsplit: num_splits must be None or 1, got {num_splits!r}")
    return 1, (decode_config(head_dim) if seqlen_q == 1 else None)


def flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens, *, k_new=None, v_new=None,
                            causal: bool = True, softmax_scale: float | None = None, num_splits: int | None = None,
                            key_mask=None, early_trigger: bool = False, invariant: bool = False):
    """Decode / chunked prefill against a preallocated cache [B, Smax, Hkv, D].

    cache_seqlens [B] (int32) holds each sequence's filled length. k_new/v_new
    [B, S_new, Hkv, D] are appended in place first; the query [B, S_new, Hq, D] then
    attends to the first cache_seqlens[b] + S_new keys (causal: bottom-right aligned).
    Returns O [B, S_new, Hq, D]; cache_seqlens itself is not advanced.

    The append is one launch (append.py) when k_new/v_new rows are 16-byte aligned, torch
    indexing otherwise. cache_seqlens[b] + S_new must not exceed Smax: that is not checked
    (it would cost a host sync); the fused append drops rows past Smax and attends to Smax keys.

    Cache rows past the filled length must hold finite values (a zero-initialised cache,
    as Hugging Face's StaticCache is): the last key block is read whole and its masked
    rows still meet P = 0 in the P V product, where 0 * NaN = NaN (the decode kernel,
    S_new = 1, never reads them). num_splits: as in `flash_attn` (the heuristic sizes by
    the cache capacity Smax). key_mask [B, Smax] (bool or uint8, True/nonzero = attend),
    single-token decode only: keys where it is False are skipped too (padding holes, the
    prefix mask Hugging Face builds for a static cache); a row with no key left gives 0.
    early_trigger (single-token decode): the next kernel, when launched as a programmatic
    dependent, may start before this one waits for its inputs; right when that kernel reads
    only constants before its own wait (inference/'s GEMVs prefetch their weights), slower
    otherwise (decode.py's docstring has the figures). invariant: as in `flash_attn`.
    """
    softmax_scale = check_softmax_scale(softmax_scale)
    _validate(q, k_cache, v_cache)
    num_splits, config = _invariant_plan(invariant, num_splits, q.shape[1], q.shape[3])
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
        if k_new.numel() and _tma_aligned(k_new) and _tma_aligned(v_new):
            lens = append_kv_fused(k_cache, v_cache, cache_seqlens, k_new, v_new)
        else:
            append_kv(k_cache, v_cache, cache_seqlens, k_new, v_new)
            lens = cache_seqlens + k_new.shape[1]
    lens = lens.to(torch.int32).contiguous()
    if key_mask is not None:
        if q.shape[1] != 1:
            raise ValueError(f"key_mask is supported for single-token decode only (S_new = 1), got {q.shape[1]}")
        if not isinstance(key_mask, torch.Tensor) or key_mask.dtype not in (torch.bool, torch.uint8) \
                or key_mask.shape != (B, Smax) or key_mask.device != q.device or key_mask.stride(1) != 1:
            raise ValueError(f"key_mask must be a bool/uint8 tensor of shape ({B}, {Smax}) with unit stride on "
                             f"keys, on {q.device}")
        key_mask = key_mask.view(torch.uint8) if key_mask.dtype == torch.bool else key_mask
    if q.shape[1] == 1:
        _check_splits(num_splits)
        return _run_decode(q, k_cache, v_cache, softmax_scale, seqlens_k=lens, num_splits=num_splits,
                           key_mask=key_mask, early_trigger=bool(early_trigger), config=config)[0]
    splits = _resolve_splits(num_splits, B, q.shape[2], q.shape[1], Smax)
    out, _ = _run(q, k_cache, v_cache, causal, softmax_scale, seqlens_k=lens, num_splits=splits)
    return out


def _lengths(cu: torch.Tensor, name: str) -> torch.Tensor:
    if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.dtype != torch.int32 or cu.numel() < 2:
        raise ValueError(f"{name} must be a 1-D int32 tensor [B + 1] of cumulative lengths starting at 0")
    return (cu[1:] - cu[:-1]).to(torch.int32)


def _pad(x: torch.Tensor, cu: torch.Tensor, max_len: int) -> torch.Tensor:
    """Packed [total, H, D] -> zero-padded [B, max_len, H, D] (device indexing, no host sync)."""
    B = cu.numel() - 1
    pos = torch.arange(max_len, device=x.device)[None, :]
    idx = (cu[:-1].long()[:, None] + pos).clamp(max=max(x.shape[0] - 1, 0))
    valid = pos < (cu[1:] - cu[:-1]).long()[:, None]
    out = x[idx.reshape(-1)].reshape(B, max_len, *x.shape[1:])
    # where, not multiply: a NaN in a neighbouring sequence must not become padding
    # (P = 0 times NaN is still NaN in the P V product).
    return torch.where(valid[..., None, None], out, torch.zeros((), dtype=x.dtype, device=x.device))


def flash_attn_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, *,
                      causal: bool = False, softmax_scale: float | None = None):
    """Packed sequences: q [total_q, Hq, D], k/v [total_k, Hkv, D]; sequence b spans rows
    cu_seqlens_*[b]:cu_seqlens_*[b+1]. Empty sequences are allowed. Returns [total_q, Hq, D].

    Runs as pad -> batched kernel with per-sequence lengths -> unpack (O(total) copies); a
    kernel that walks the packed layout directly is future work.
    """
    for t, n in ((q, "q"), (k, "k"), (v, "v")):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise ValueError(f"{n} must be a 3-D packed tensor [total, H, D]")
    softmax_scale = check_softmax_scale(softmax_scale)
    lq, lk = _lengths(cu_seqlens_q, "cu_seqlens_q"), _lengths(cu_seqlens_k, "cu_seqlens_k")
    if lq.numel() != lk.numel():
        raise ValueError("cu_seqlens_q and cu_seqlens_k must describe the same number of sequences")
    if max_seqlen_q < 1 or max_seqlen_k < 1:
        raise ValueError("max_seqlen_q and max_seqlen_k must be >= 1")
    qp, kp, vp = _pad(q, cu_seqlens_q, max_seqlen_q), _pad(k, cu_seqlens_k, max_seqlen_k), _pad(v, cu_seqlens_k, max_seqlen_k)
    _validate(qp, kp, vp)
    out, _ = _run(qp, kp, vp, causal, softmax_scale, seqlens_k=lk.contiguous(), seqlens_q=lq.contiguous())
    pos = torch.arange(max_seqlen_q, device=q.device)[None, :]
    keep = (pos < lq.long()[:, None]).reshape(-1)
    return out.reshape(-1, *out.shape[2:])[keep]
