"""What the attention kernels are built with: one frozen config per kernel, its validity check,
and the choices per head dim and launch shape.

`PrefillConfig` specialises FlashAttnFwdSm90 (kernel.py), `DecodeConfig` the SIMT decode
kernel and `DecodeMmaConfig` the tensor-core decode kernel (decode.py). A config is plain,
hashable data: every field is compiled into the kernel and part of its compile key, so two
configs never share a compiled kernel. `prefill_config`, `decode_config` and
`decode_mma_config` are the tuned picks; any other valid config can be built and passed to
the compile functions directly. Kernels import this module, never the api module.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

from ..runtime import hardware

HEAD_DIMS = (64, 96, 128, 256)  # 96 and 256: correct, not tuned
# Hopper: 227 KiB of shared memory per block (the opt-in maximum on sm_90).
SM90_SMEM_BYTES = 232448
H100_SMS = hardware.H100_SXM.sms  # what the heuristics were tuned on (runtime/hardware.py)
# Splits per (batch, head group) at most: the decode kernels keep one merge weight per split
# and head in shared memory.
MAX_DECODE_SPLITS = 64
# Split counts up to this merge inside a thread-block cluster (8: the portable cluster size).
MAX_CLUSTER_SPLITS = 8
_IN_BYTES = 2  # bf16 / fp16: the only input types


def check_head_dim(head_dim: int) -> None:
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head dim {head_dim} is not supported; supported: {HEAD_DIMS}")


# ----------------------------------------------------------------------------- prefill


@dataclass(frozen=True)
class PrefillConfig:
    """Static shape and schedule of one FlashAttnFwdSm90 build.

    A tile is m_block = 64 x num_mma_wg query rows (64 per consumer warpgroup) by n_block
    keys per step; K and V each stream through a `stages`-deep ring (None: 4 stages at
    D = 64, 2 above, where two already fill ~160 KB of shared memory with Q at D = 128).
    exps_before_pv_wait: exp2s per thread issued before a consumer waits for the previous
    P V (None: all of them). wg_key_range: under a causal mask each consumer warpgroup
    computes only up to its own 64 rows' last key block and passes over the tile's later
    blocks (waits on and releases their stages, takes its ping-pong turns); without it
    every warpgroup runs the tile's block count. tma_o: each consumer warpgroup writes its
    64 x D block of O to its own shared-memory slot (stmatrix) and one thread stores it with
    TMA, instead of 4-byte global stores from the registers (full 64-row blocks only; split-KV
    partials are fp32 and keep the register stores). pack_gqa: query heads per KV head folded
    into a tile's rows (as FlashAttention-4's pack_gqa): tile row r is query position
    r // pack_gqa of head h_kv * pack_gqa + r % pack_gqa, so one tile's K/V blocks serve every
    query head of its KV head, a sequence's rows fill the tiles with one ragged tile per KV
    head instead of one per query head, and a causal tile spans m_block / pack_gqa positions.
    1: off (the host turns it off for per-sequence query lengths and split-KV).
    """

    head_dim: int
    num_mma_wg: int = 2
    n_block: int = 128
    stages: int | None = None
    pingpong: bool = True
    exps_before_pv_wait: int | None = None
    wg_key_range: bool = True
    tma_o: bool = False
    pack_gqa: int = 1

    ROWS_PER_WG = 64  # a consumer warpgroup's query rows (the wgmma M): not a field

    def __post_init__(self):
        if self.stages is None:
            object.__setattr__(self, "stages", 4 if self.head_dim <= 64 else 2)

    @property
    def m_block(self) -> int:
        return self.ROWS_PER_WG * self.num_mma_wg

    def smem_bytes(self, in_bytes: int = _IN_BYTES) -> int:
        """Q, the K and V rings, O's slots (tma_o, 16-bit O) and 1 KB for the pipeline barriers
        (each buffer is 1024-byte aligned)."""
        kv = self.stages * self.n_block * self.head_dim * in_bytes
        o = self.m_block * self.head_dim * 2 if self.tma_o else 0
        return 1024 + self.m_block * self.head_dim * in_bytes + 2 * kv + o

    def validate(self, in_bytes: int = _IN_BYTES) -> None:
        """The one validity check for a config on inputs of `in_bytes` (2: bf16 / fp16, 1:
        e4m3); raises ValueError with the reason."""
        check_head_dim(self.head_dim)
        if self.num_mma_wg not in (2, 3):
            raise ValueError(f"num_mma_wg must be 2 or 3 (128- or 192-row tiles), got {self.num_mma_wg}")
        # A 16-bit P V consumes 16 keys a wgmma, an e4m3 one 32.
        blocks = (64, 128, 160, 176, 192) if in_bytes == 2 else (64, 96, 128, 160, 192, 224)
        if self.n_block not in blocks:
            raise ValueError(f"n_block must be one of {blocks} for {in_bytes}-byte inputs, got {self.n_block}")
        if not isinstance(self.stages, int) or self.stages < 1:
            raise ValueError(f"stages must be an int >= 1, got {self.stages!r}")
        # ptxas compiles the whole kernel under the launch's register cap, before setmaxnreg:
        # 168 a thread at 384 threads, 128 at 512. A consumer's fp32 O (D / 2 registers a
        # thread) and S (n_block / 2) must leave room under it: D = 256 with 128-key blocks
        # (192) spilled, with 64-key blocks (160) it compiles clean. FP8 counts P's e4m3
        # fragment too (n_block / 8): D = 128 with 224-key blocks (204) compiles clean, with
        # 256 (224) it spilled; at 3 warpgroups D = 64 with 160-key blocks (132) spilled, FP8
        # D = 128 with 96-key blocks (124) compiles clean, with 128 (144) it spilled.
        acc = (self.head_dim + self.n_block) // 2 + (self.n_block // 8 if in_bytes == 1 else 0)
        limit = (160 if in_bytes == 2 else 208) if self.num_mma_wg == 2 else (120 if in_bytes == 2 else 124)
        if acc > limit:
            raise ValueError(f"{self}: the O and S accumulators take {acc} registers a thread, over the {limit} "
                             f"that {self.num_mma_wg} consumer warpgroups leave (D = 256 needs n_block = 64 and 2 of them)")
        # The TMA boxes of Q (m_block rows) and of each warpgroup's O slot (64 rows) take whole
        # query positions: pack_gqa heads per position.
        if self.pack_gqa not in (1, 2, 4, 8, 16):
            raise ValueError(f"pack_gqa must be 1, 2, 4, 8 or 16 (a divisor of a warpgroup's 64 rows), "
                             f"got {self.pack_gqa}")
        if self.exps_before_pv_wait is not None and not 0 <= self.exps_before_pv_wait <= self.n_block // 2:
            raise ValueError(f"exps_before_pv_wait must be None or 0..{self.n_block // 2} (a thread's scores per "
                             f"block), got {self.exps_before_pv_wait}")
        if self.smem_bytes(in_bytes) > SM90_SMEM_BYTES:
            raise ValueError(f"{self} needs {self.smem_bytes(in_bytes)} bytes of shared memory, over the "
                             f"{SM90_SMEM_BYTES} of an sm_90 CTA (fewer stages or a smaller n_block)")


# Consumer warpgroups per CTA (64 query rows each). At D = 64 the softmax's exp2s take as
# many cycles as the two GEMMs, and a third warpgroup (192-row tiles, as FlashAttention-3
# uses) keeps the tensor cores busier: same-run A/B on the H100, S = 4096: +8% (+4%
# causal). Below THREE_WG_MIN_SQ query rows, three only where the tiles still balance:
# causal, or GQA-packed rows (ab_attention_pack64_h100.md: S 512-1024, against two
# warpgroups, causal MHA +4-5%, packed GQA 8 +3-7%, causal +7-11%; non-causal MHA -5%,
# where 1024 rows make 5.3 tiles of 192). These short-query 3-warpgroup tiles run without
# ping-pong, as measured.
THREE_WG_MIN_SQ = 2048


def prefill_config(head_dim: int, seqlen_q: int, qheads_per_kvhead: int = 1, causal: bool = False) -> PrefillConfig:
    """The prefill kernel's config for a head dim, query length, GQA ratio and mask.

    GQA packing (pack_gqa) at D = 64 only: same-run A/B on the H100 over the widened suite's
    GQA 8 shapes (ab_attention_pack64_h100.md, ab_attention_pack128_h100.md): D = 64 packed
    1.014x geomean (S 2048-4096 +2-7%), D = 128 0.985x (causal S 512-1024 -5% to -7%)."""
    check_head_dim(head_dim)
    pack = gqa_pack(qheads_per_kvhead) if head_dim == 64 else 1
    return _prefill_config(head_dim, seqlen_q >= THREE_WG_MIN_SQ, pack, bool(causal))


def gqa_pack(qheads_per_kvhead: int) -> int:
    """pack_gqa for a GQA ratio: the ratio itself where a warpgroup's 64 rows hold whole query
    positions (2, 4, 8, 16), else 1."""
    return qheads_per_kvhead if qheads_per_kvhead in (2, 4, 8, 16) else 1


@functools.lru_cache(maxsize=None)
def _prefill_config(head_dim: int, long_q: bool, pack: int, causal: bool) -> PrefillConfig:
    # Three consumer warpgroups at D = 64: from THREE_WG_MIN_SQ rows, and below for causal or
    # packed tiles (see THREE_WG_MIN_SQ).
    num_mma_wg = 3 if head_dim == 64 and (long_q or causal or pack > 1) else 2
    cfg = PrefillConfig(
        head_dim,
        num_mma_wg=num_mma_wg,
        pack_gqa=pack,
        # 64-key blocks at D = 256: see validate (a warpgroup's O is 64 x 256 fp32).
        n_block=64 if head_dim == 256 else 128,
        # Ping-pong turns between the consumer warpgroups, except at D = 64 with two of them:
        # there the turn barriers cost more than the overlap buys (same-run A/B on the H100:
        # 16x12x1024x64 359 -> 369 TFLOP/s, causal 250 -> 257, 8x25x1024x64 348 -> 360,
        # causal 239 -> 249; D = 128 and three warpgroups were even or mixed, so they keep it).
        # The short-query 3-warpgroup tiles at D = 64 run without it too, as measured.
        pingpong=head_dim != 64 or long_q,
        # D = 64 with two consumer warpgroups issues 32 of its 64 exp2s a thread before the
        # P V wait and interleaves the rest with O's rescale and P's conversion. Same-run A/B
        # on the H100 (two runs, bit-identical outputs): +1.8% geomean over the suite's six
        # D = 64 shapes (causal S = 1024 +3%, 8x25x1024 non-causal -1%). With three, every
        # exp2 follows the wait, the order FlashAttention-4's compiled loop runs them in (its
        # SASS interleaves P's conversions with the MUFU work instead of queueing them after
        # the wait, although its source issues the exp2s before it; Nsight Compute,
        # 1 x 16384 x 32 x 64, `attention_ncu_h200.md`: F2FP stall samples ours 14.9k, FA4's
        # 7.2k). Same run, H200, against 32 (`ab_attention_e0_d64_h200.md`, S 2048-16384, 12
        # shapes): 1.018x geomean, 10 faster (8 x 2048 +4.3%), 1 x 16384 non-causal -0.8%; held out
        # (`ab_attention_e0_d64_held_h200.md`, S 512-4096): the 10 three-warpgroup shapes
        # 1.012x, 9 at 1.0x or faster; the two-warpgroup ones (512-1024 rows, MHA, no mask)
        # 0.975x-0.980x, so they keep 32. D = 128 moved +-2% with 4, 8 or 32 (H100) and 0.991x
        # geomean with 0 (H200, `ab_attention_e0_d128_h200.md`): it keeps the wait after all.
        exps_before_pv_wait=(0 if num_mma_wg == 3 else 32) if head_dim == 64 else None,
        # K/V stages: 4 at D = 64 below 2048 query rows, 2 elsewhere. One more (5 / 3)
        # measured 0.992x geomean over the suite's prefill cases on the H100
        # (docs/tried-and-not-kept.md). The 192-row tiles from 2048 rows take 2, as
        # FlashAttention-4's do: ab_attention_sched64_h100.md, 16 shapes S 2048-16384, each
        # +0.2% to +3.3% over 4 stages (3: -0.5% to +3.8%).
        stages=2 if head_dim == 64 and long_q else None,
    )
    # O through shared memory and TMA wherever its slots fit (all but D = 256, whose Q and
    # K/V ring leave no 64 KB): same-run A/B on the H100 over the widened suite's D = 128
    # shapes, 1.073x geomean, up to 1.20x at S = 512, where a tile sees only four key blocks
    # and the register stores of O held the consumers up (ab_attention_d128_h100.md).
    with_o = replace(cfg, tma_o=True)
    if with_o.smem_bytes() <= SM90_SMEM_BYTES:
        cfg = with_o
    cfg = replace(cfg, wg_key_range=key_range_pays(cfg))
    cfg.validate()
    return cfg


def key_range_pays(cfg: PrefillConfig) -> bool:
    """wg_key_range where a warpgroup's 64 rows can end a key block before the tile's last
    row does: n_block != m_block. With 128-row tiles of 128-key blocks (D = 96/128; the
    diagonal aligned, as in prefill) every warpgroup runs the tile's block count anyway, and
    the per-warpgroup count cost the main loop its uniform registers: ptxas built the wgmma
    descriptors in vector registers (32 R2UR a 128-key block at D = 128 causal, 720 -> 650
    SASS instructions in the loop without it)."""
    return cfg.n_block != cfg.m_block


def prefill_config_fp8(head_dim: int, seqlen_q: int, causal: bool = False) -> PrefillConfig:
    """The FP8 prefill kernel's config (flash_attn_fp8): the 16-bit pick, except at D = 128 from
    FP8_WIDE_BLOCK_MIN_SQ query rows on: 192-key blocks without ping-pong turns.

    Same-run A/Bs on the H100: wider blocks than the 16-bit 128 (224 against 128: 4x32x4096
    +5-7%, 2x32/4x8192 +6-10%, causal +1-3%; causal 16x32/8x1024 -9%, whose tiles see too few
    blocks to amortize the wider ones); then, over the 12 shapes of S 4096-16384
    (`ab_attention_fp8_tiles_h100.md`), this pick against 224 keys with the turns 1.015x
    geomean (causal 1.02x-1.075x, the two 16384-row non-causal shapes 0.95x-0.97x), against 192
    keys with the turns 1.005x, against 224 without them 1.000x; 160-key blocks and three K/V
    stages lost (`ab_attention_fp8_tiles2_h100.md`). Without the turns the two consumer
    warpgroups issue their products as soon as their softmax is done: the e4m3 products are
    short, and the MUFU exp2s, as many as in bf16, set the pace.

    Without a causal mask 80 of a thread's 96 exp2s a block run before the P V wait
    (`exps_before_pv_wait`), the rest after it: +1.4% to +5.8% on all 6 non-causal shapes of
    `ab_attention_fp8_tiles2_h100.md`, -1% to -4.6% on 5 of the 6 causal ones, whose blocks
    keep every exp2 before the wait; checked again on the split pick
    (`ab_attention_fp8_e80_h100.md`: 1.012x geomean over the 6 non-causal shapes against all
    exp2s after the wait, from -2.6% at 16384 rows to +4.9% at 2 x 8192)."""
    check_head_dim(head_dim)
    return _prefill_config_fp8(head_dim, seqlen_q >= THREE_WG_MIN_SQ, seqlen_q >= FP8_WIDE_BLOCK_MIN_SQ,
                               bool(causal))


@functools.lru_cache(maxsize=None)
def _prefill_config_fp8(head_dim: int, long_q: bool, wide_block: bool, causal: bool) -> PrefillConfig:
    cfg = _prefill_config(head_dim, long_q, 1, False)
    if head_dim == 64:  # 4 K/V stages and 32 exp2s before the P V wait (all after tied on e4m3, H200)
        cfg = replace(cfg, stages=4, exps_before_pv_wait=32)
    if head_dim == 128 and wide_block:
        cfg = replace(cfg, n_block=192, pingpong=False, exps_before_pv_wait=None if causal else 80)
    cfg = replace(cfg, wg_key_range=key_range_pays(cfg))
    cfg.validate(in_bytes=1)
    return cfg


FP8_WIDE_BLOCK_MIN_SQ = 4096


# ----------------------------------------------------------------------------- decode (S_q = 1)


@dataclass(frozen=True)
class DecodeConfig:
    """One build of the SIMT decode kernel (FlashDecodeSm90).

    Each of `threads` threads loads `vec` 16-byte chunks (8 x vec columns) of a K and a V row,
    so D / (8 vec) threads share a row and the CTA covers `rows` rows at once, `unroll` times
    per step (block_n keys), through a `stages`-deep cp.async ring. max_heads: the most query
    heads of one KV head that share a CTA (the host packs a divisor of the GQA ratio).
    kv_pack: adjacent KV heads per CTA for MHA (one query head each, unsplit): a key row's
    threads cover kv_pack heads' D columns, each thread the online softmax of its own head.
    """

    head_dim: int
    max_heads: int = 4
    vec: int = 1
    unroll: int = 2
    stages: int = 4
    threads: int = 256
    kv_pack: int = 1

    @property
    def threads_per_row(self) -> int:
        return self.head_dim // (8 * self.vec)

    @property
    def block_n(self) -> int:
        """Keys per CTA step (the split heuristic's unit)."""
        return self.threads // (self.threads_per_row * self.kv_pack) * self.unroll

    def smem_bytes(self, heads: int | None = None, cluster: int = MAX_CLUSTER_SPLITS, in_bytes: int = _IN_BYTES) -> int:
        """The cp.async ring, the row groups' (max, sum, O) for the merge and a cluster
        merge's landing buffers, for `heads` packed heads (default max_heads)."""
        h, d = heads or self.max_heads, self.head_dim
        rows = self.threads // (self.threads_per_row * self.kv_pack)
        h = h * self.kv_pack
        ring = 2 * self.stages * self.unroll * self.vec * self.threads * 8 * in_bytes
        merge = rows * h * (2 + d) * 4 + 16
        partials = cluster * h * (d + 1) * 4 if cluster > 1 else 0
        return ring + merge + partials + 1024  # + alignment slack

    def validate(self) -> None:
        """The one validity check for a config; raises ValueError with the reason."""
        check_head_dim(self.head_dim)
        for name in ("max_heads", "vec", "unroll"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.head_dim % (8 * self.vec) or 32 % self.threads_per_row:
            raise ValueError(f"vec = {self.vec} at D = {self.head_dim}: a row's threads (D / (8 vec)) must be a whole "
                             "number that divides a warp")
        if self.threads % 32 or not 32 <= self.threads <= 1024:
            raise ValueError(f"threads must be a multiple of 32 in 32..1024, got {self.threads}")
        if self.kv_pack not in (1, 2, 4) or (self.threads_per_row * self.kv_pack) > 32:
            raise ValueError(f"kv_pack must be 1, 2 or 4 with a key row's threads (D / (8 vec) x kv_pack) within a "
                             f"warp, got {self.kv_pack}")
        if self.threads // 32 < self.max_heads:
            raise ValueError(f"max_heads = {self.max_heads} needs {32 * self.max_heads} threads (the split merge "
                             f"gives each head one warp), got {self.threads}")
        if self.stages < 2:
            raise ValueError(f"stages must be >= 2 (the ring runs stages - 1 steps ahead), got {self.stages}")
        # Each thread keeps q and its output columns per packed head in fp32: 2 x heads x 8 vec
        # registers. At D = 96 (vec 3) 2 heads (96) fit, 4 heads (192) spilled.
        state = 2 * self.max_heads * 8 * self.vec
        if state > 128:
            raise ValueError(f"{self}: q and the accumulators take {state} registers a thread (max_heads x vec "
                             "too large; at most 128)")
        if self.smem_bytes() > SM90_SMEM_BYTES:
            raise ValueError(f"{self} needs {self.smem_bytes()} bytes of shared memory, over the "
                             f"{SM90_SMEM_BYTES} of an sm_90 CTA")


@dataclass(frozen=True)
class DecodeMmaConfig:
    """One build of the tensor-core decode kernel (FlashDecodeMmaSm90) for GQA: up to
    max_heads packed query heads (the M rows of the mma tile), `warps` warps of `bn` keys per
    step, each through its own `stages`-deep cp.async ring. GQA ratios of at least min_gqa
    run it (decode_uses_mma)."""

    head_dim: int
    min_gqa: int = 4
    max_heads: int = 16
    warps: int = 4
    bn: int = 16
    stages: int = 3

    # Its swizzled ring holds 64-wide rows, and at D = 256 the ring would not fit shared memory.
    HEAD_DIMS = (64, 128)

    @property
    def block_n(self) -> int:
        """Keys per CTA step (the split heuristic's unit)."""
        return self.warps * self.bn

    def ring_bytes(self, in_bytes: int = _IN_BYTES) -> int:
        return self.warps * self.stages * 2 * self.bn * self.head_dim * in_bytes

    def smem_bytes(self, heads: int | None = None, cluster: int = MAX_CLUSTER_SPLITS, in_bytes: int = _IN_BYTES) -> int:
        """Ring + Q tile + per-warp (max, sum) + a cluster merge's landing buffers + alignment
        slack, for `heads` packed heads (default max_heads)."""
        h = heads or self.max_heads
        merge = self.warps * h * 2 * 4 + cluster * h * (self.head_dim + 1) * 4
        return self.ring_bytes(in_bytes) + 16 * self.head_dim * in_bytes + merge + 1024

    def validate(self) -> None:
        """The one validity check for a config; raises ValueError with the reason."""
        check_head_dim(self.head_dim)
        if self.head_dim not in self.HEAD_DIMS:
            raise ValueError(f"the tensor-core decode kernel takes D in {self.HEAD_DIMS} (its swizzled ring holds "
                             f"64-wide rows; D = 256 would not fit shared memory), got {self.head_dim}")
        if not 1 <= self.max_heads <= 16:
            raise ValueError(f"max_heads must be 1..16 (the mma tile's M rows), got {self.max_heads}")
        if self.min_gqa < 1:
            raise ValueError(f"min_gqa must be >= 1, got {self.min_gqa}")
        if self.warps < 1 or self.bn < 16 or self.bn % 16:
            raise ValueError(f"warps must be >= 1 and bn a multiple of 16 (the mma's K), got {self.warps}, {self.bn}")
        if self.stages < 2:
            raise ValueError(f"stages must be >= 2 (the ring runs stages - 1 steps ahead), got {self.stages}")
        if self.warps * self.max_heads * self.head_dim * 4 > self.ring_bytes():
            raise ValueError(f"{self}: the warps' fp32 partial O (overlaid on the K/V ring) does not fit in it")
        if self.smem_bytes() > SM90_SMEM_BYTES:
            raise ValueError(f"{self} needs {self.smem_bytes()} bytes of shared memory, over the "
                             f"{SM90_SMEM_BYTES} of an sm_90 CTA")


# Many-wave launches (batch x head groups >= MANY_WAVES_PER_SM CTAs per SM, never split) of
# decode at D = 64 stream 4 rows per thread and step through 4 stages. Same-run H100 sweep, MHA
# batch 64 x 12 heads (us; 4 rows 4 stages / 8 rows 2 stages / the default config / cuDNN): 1k
# keys 70.2 / 73.6 / 72.0 / 70.1; 8k keys - / 521.5 / 552.3 / 536.6. On the H200 4 rows and 4
# stages beat 8 rows and 2 at every long-cache point swept, batch 48-128 x 8k / 32k keys
# (`ab_decode_manywave_long_h200.md`, x cuDNN: batch 48 1.119 vs 1.080 / 1.115 vs 1.100, 64
# 1.037 vs 1.009 / 1.066 vs 1.052, 96 1.025 vs 0.995 / 1.015 vs 1.003, 128 1.007 vs 0.979 /
# 1.008 vs 1.006). At batch 8 (96 CTAs) both lost to the default.
MANY_WAVES_PER_SM = 4
MANY_WAVES_LONG_CACHE = 4096  # a long cache for the MHA bands below
# MHA with a short cache, by CTAs per SM (before any packing): from SMALL_RING_PER_SM, 128
# threads a CTA (a half-size ring, so two or three CTAs share an SM and the last wave's tail
# is shorter); from KV_PACK_PER_SM, also two adjacent KV heads a CTA (`kv_pack`: half the CTAs,
# half the per-CTA prologue and merge). Same run, H200, 1k keys, 12 heads, D = 64, as x cuDNN
# (one head / two heads a CTA; 256 / 128 threads):
#   batch 32 (2.9 a SM):  1 head 1.017 / 1.051   2 heads 1.014 / 1.017
#   batch 48 (4.4):       1 head 1.018 / 1.089   2 heads 1.028 / 0.990
#   batch 64 (5.8):       1 head 0.931 / 1.014   2 heads 0.993 / 1.041
#   batch 128 (11.6):     1 head 0.960 / 0.993   2 heads 0.987 / 1.022
# (batch 32 with its default 2 rows a thread and step, the others with the many-wave 4.) Four
# heads a CTA ran as two at batch 64 (51.2 / 51.1 us). Long caches keep 256 threads and one
# head: at batch 64 two heads ran 1.6% / 0.8% faster (8k / 32k keys) but at batch 48 9% / 10%
# slower, and 128 threads 0.3-0.7% slower.
SMALL_RING_PER_SM = 2.5
KV_PACK_PER_SM = 5
# MHA with a long cache (MANY_WAVES_LONG_CACHE keys or more) under MANY_WAVES_PER_SM CTAs per
# SM: from LONG_SMALL_RING_PER_SM[0] to [1], 128 threads a CTA; from LONG_MANY_WAVES_PER_SM the
# many-wave config (4 rows a thread and step, 4 stages). With 256 threads and 2 rows the default
# config ran as low as 0.75x cuDNN there. Same-run A/Bs on the H200 (`python -m
# benchmarks.ab_decode`, 12 heads, D = 64; x cuDNN at 8k / 32k keys, default -> this pick; two
# runs where two figures are given):
#   batch 12 (1.1 a SM): default 1.11 / 1.11 (128 threads 0.99 / 0.98)
#   batch 16 (1.5):  0.98 / 0.96 -> 128 threads 1.00 / 0.97, 1.00 / 0.97
#   batch 24 (2.2):  0.80 / 0.79 -> 128 threads 1.01 / 1.00, 1.00 / 0.99
#   batch 32 (2.9):  0.96 / 0.95 -> 128 threads 1.00 / 0.99, 1.01 / 0.99
#   batch 40 (3.6):  0.86 / 0.86 -> 4 rows 4 stages 1.01 / 1.01, 1.01 / 1.01 (128 threads 0.78)
# Held out (8k / 16k keys, `ab_decode_longcache_bands_h200.md`): batch 20 0.76 / 0.75 -> 1.00 /
# 1.00 and batch 28 0.89 / 0.89 -> 1.01 / 1.01 with 128 threads; at batch 36 (3.3 a SM) 128
# threads collapsed (0.75 / 0.76), hence the band's end at 3. A second held-out run
# (`ab_decode_longcache_bands2_h200.md`): batch 30 0.93 / 0.93 -> 1.01 / 1.01 (128 threads),
# 34 / 36 / 38 / 44 (3.1-4 a SM) 0.91-0.83 -> 0.97-1.01 (4 rows, 4 stages; 0.97 at 34-36, the
# figure left open there), and at batch 14 (1.27 a SM) 128 threads lost (0.99 against the
# default's 1.05), hence the band's start at 1.4. Splitting the keys 2-6 ways (merged in
# global memory) in either config lost to these picks at every batch of 8-40
# (`ab_decode_longcache_splits_h200.md`).
LONG_SMALL_RING_PER_SM = (1.4, 3.0)
LONG_MANY_WAVES_PER_SM = 3.0


def decode_config(head_dim: int, ctas: int = 0, seqlen_k: int = 0, *, mha: bool = False,
                  num_sms: int = H100_SMS) -> DecodeConfig:
    """The SIMT decode kernel's config for a launch of `ctas` CTAs (batch x head groups,
    before any split) over seqlen_k keys, `mha` when each query head has its own KV head; the
    defaults give the per-head-dim config."""
    check_head_dim(head_dim)
    per_sm = ctas / num_sms
    many_waves = per_sm >= MANY_WAVES_PER_SM and head_dim == 64  # swept at D = 64 only
    short_mha = mha and head_dim == 64 and 0 < seqlen_k < MANY_WAVES_LONG_CACHE
    long_mha = mha and head_dim == 64 and seqlen_k >= MANY_WAVES_LONG_CACHE and not many_waves
    small_ring = (short_mha and per_sm >= SMALL_RING_PER_SM) or (
        long_mha and LONG_SMALL_RING_PER_SM[0] <= per_sm < LONG_SMALL_RING_PER_SM[1])
    many_waves = many_waves or (long_mha and per_sm >= LONG_MANY_WAVES_PER_SM)
    kv_pack = short_mha and per_sm >= KV_PACK_PER_SM
    return _decode_config(head_dim, many_waves, small_ring, kv_pack)


@functools.lru_cache(maxsize=None)
def _decode_config(head_dim: int, many_waves: bool = False, small_ring: bool = False,
                   kv_pack: bool = False) -> DecodeConfig:
    if head_dim == 96:
        # 96 = 4 threads x 3 chunks per row (threads per row must divide a warp); q and the
        # accumulator (heads x 24 fp32 each per thread): 2 heads fit.
        cfg = DecodeConfig(96, max_heads=2, vec=3, unroll=1)
    elif head_dim == 256:
        cfg = DecodeConfig(256, max_heads=2, vec=2, unroll=1)
    else:
        # 4 heads: more would push the per-thread softmax state past the register budget.
        cfg = DecodeConfig(head_dim, max_heads=4, vec=1, unroll=2)
    if many_waves:
        cfg = replace(cfg, unroll=4, stages=4)
    if small_ring:
        cfg = replace(cfg, threads=128)
    if kv_pack:
        cfg = replace(cfg, kv_pack=2)
    cfg.validate()
    return cfg


# An SM's shared memory (228 KiB), each resident CTA taking 1 KiB more than it asks for.
SM90_SMEM_PER_SM = hardware.H100_SXM.smem_per_sm_kb * 1024
SMEM_PER_CTA_RESERVED = 1024


def ctas_per_sm(smem_bytes: int) -> int:
    """CTAs of this much shared memory resident on one sm_90 SM (at least 1)."""
    return max(1, SM90_SMEM_PER_SM // (smem_bytes + SMEM_PER_CTA_RESERVED))


def _wave_fill(ctas: int, slots: int) -> float:
    """The share of its last wave's slots a grid of `ctas` keeps busy, over all waves."""
    waves = ctas / slots
    return waves / math.ceil(waves)


# Unsplit tensor-core launches of more than one CTA a SM take a 4-stage ring (one CTA a SM at
# D = 128, where 3 stages fit two) where its waves fill the SMs better by MMA_DEEP_RING_MARGIN:
# decode streams every CTA's keys at the same pace, so a last wave of few CTAs runs nearly as
# long as a full one. Same run, H200, h32/8 D = 128, x cuDNN, 3 -> 4 stages
# (`ab_decode_mma_warps_h200.md`, 8k / 32k keys): batch 48 (384 CTAs: 1.45 waves of two a SM,
# 2.9 of one) 1.001 -> 1.053 / 1.006 -> 1.085, and where the fill is equal: batch 32 1.000 ->
# 1.004 / 1.004 -> 1.008, 64 1.011 -> 1.008 / 1.006 -> 1.004, 96 1.005 -> 1.006 / 1.006 -> 1.004.
# Held out (`ab_decode_mma_stages_held*_h200.md`, 4k / 16k keys): batch 40 0.990 -> 1.054 /
# 0.989 -> 1.077 (h64/8: 0.965 -> 1.040 / 0.982 -> 1.076), 80 1.003 -> 1.052 / 1.001 -> 1.062
# (h64/8: 0.995 -> 1.043 / 1.003 -> 1.053), 128 0.996 -> 1.006 / 0.999 -> 1.006. Taken at
# equal fill it lost at short caches (batch 64, 1k keys: 1.017 -> 0.970) and at batch 16 (one
# partial wave: 1.007 -> 0.993); 2 stages lost 9-11% at batch 16. Short caches (under
# MANY_WAVES_LONG_CACHE keys) keep 3 stages: at 1k keys 4 lost at batch 40 / 48 / 80 (1.022 /
# 1.008 / 1.007 -> 0.996 / 0.994 / 0.997, `ab_decode_mma_stage_rule_h200.md`), where at 8k
# they won (1.017 / 0.991 / 0.968 -> 1.053 / 1.051 / 1.038).
MMA_DEEP_RING_MARGIN = 0.05

# Split launches over at most this many (batch, KV head) pairs of 8 packed query heads take 8
# warps and 2 stages: each split's CTA then streams 128 keys a step (twice the warps in flight
# on its slice of the cache) and the last CTA folds the partials with 256 threads. The splits
# stay as the 4-warp config plans them. Same run, H200, x the shipped config (4 warps, 3
# stages), 2k / 4k / 8k / 32k keys (`ab_decode_w8_*_h200.md`): h64/8 D = 128 batch 1
# 1.042 / 1.063 / 1.070 / 1.002 (again in another process: 1.038 / 1.064 / 1.081 at 2k-8k);
# 8 packed heads over 4 KV heads, batch 1 1.006 / 1.062 / 1.063 / 1.012, batch 2 1.040 /
# 1.059 / 1.078 / 0.999; D = 64 at 4k / 8k / 32k, batch 1 1.043 / 1.072 / 1.141, batch 2
# 1.053 / 1.081 / 0.999. Not taken: 16 pairs (h64/8 batch 2: 0.974-1.024), 4 packed heads
# (h28/7 batch 1-2: 0.964-1.088), 7 (h28/4 batch 1-2: 0.908-1.049), 16 (not measured).
MMA_WIDE_SPLIT_CTAS = 8
MMA_WIDE_HEADS = 8


def decode_mma_config(head_dim: int, ctas: int = 0, heads: int = 0, seqlen_k: int = 0,
                      num_sms: int = H100_SMS, *, split_ctas: int = 0) -> DecodeMmaConfig:
    """The tensor-core decode kernel's config for an unsplit launch of `ctas` CTAs of `heads`
    packed query heads each over `seqlen_k` keys (ctas 0: split or unknown), or a split launch
    over `split_ctas` (batch, head group) pairs: 4 warps x 16 keys x 3 stages (best at every
    split GQA point swept: docs/attention.md), 8 warps x 2 stages for split launches over few
    pairs of 8 packed heads, at D = 128 with a long cache 4 stages where their waves fill the
    SMs better (notes above; D = 64 not measured)."""
    if 0 < split_ctas <= MMA_WIDE_SPLIT_CTAS and heads == MMA_WIDE_HEADS:
        return _decode_mma_config(head_dim, wide=True)
    long_grid = head_dim == 128 and ctas > num_sms and seqlen_k >= MANY_WAVES_LONG_CACHE
    return _decode_mma_config(head_dim, long_grid and _deep_ring_fills_better(head_dim, ctas, heads, num_sms))


@functools.lru_cache(maxsize=1024)
def _deep_ring_fills_better(head_dim: int, ctas: int, heads: int, num_sms: int) -> bool:
    # Memoised: a decode step asks once per layer with the same grid.
    fill = {d: _wave_fill(ctas, num_sms * ctas_per_sm(_decode_mma_config(head_dim, d).smem_bytes(
        heads or None, cluster=1))) for d in (False, True)}
    return fill[True] > fill[False] + MMA_DEEP_RING_MARGIN


@functools.lru_cache(maxsize=None)
def _decode_mma_config(head_dim: int, deep_ring: bool = False, wide: bool = False) -> DecodeMmaConfig:
    if wide:
        cfg = DecodeMmaConfig(head_dim, warps=8, stages=2)
    else:
        cfg = DecodeMmaConfig(head_dim, stages=4 if deep_ring else DecodeMmaConfig.stages)
    cfg.validate()
    return cfg


_LOG2_E = 1.4426950408889634


def check_softmax_scale(softmax_scale) -> float | None:
    """None, or the scale as a float; the kernels take the running max on unscaled scores, so
    the scale must be positive (and finite)."""
    if softmax_scale is None:
        return None
    try:
        scale = float(softmax_scale)
    except (TypeError, ValueError):
        raise TypeError(f"softmax_scale must be a number or None, got {type(softmax_scale).__name__}") from None
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"softmax_scale must be positive and finite, got {softmax_scale!r}")
    return scale


def softmax_scale_log2(head_dim: int, softmax_scale: float | None) -> float:
    """The kernels' softmax runs in base 2: scores are scaled by softmax_scale * log2(e)."""
    softmax_scale = check_softmax_scale(softmax_scale)
    return (softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)) * _LOG2_E
