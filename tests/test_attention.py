"""flash_attn tests: compile tier (CPU), validation and references (CPU), and the gpu tier."""

from __future__ import annotations

import dataclasses
import glob
import itertools
import math
import re

import pytest
import torch

from cute_kernels.attention.reference import flash_attn_ref


@pytest.mark.compile
@pytest.mark.parametrize("head_dim,wg", [(64, 2), (64, 3), (96, 2), (128, 2), (256, 2)])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_compiles_for_sm90a(tmp_path, head_dim, wg, causal):
    from cute_kernels.attention.api import _compile
    from cute_kernels.attention.config import prefill_config

    cfg = prefill_config(head_dim, 4096 if wg == 3 else 1024)
    assert cfg.num_mma_wg == wg
    _compile(torch.bfloat16, cfg, causal, False, False, False, keep_dir=str(tmp_path))
    ptx_path = glob.glob(str(tmp_path / "*.ptx"))[0]
    ptx = open(ptx_path).read()
    wgmma = [line for line in ptx.splitlines() if "wgmma.mma_async" in line]
    # S = Q K^T from shared memory; O += P V with P from registers: "{4 regs}, desc" operands.
    assert any(re.search(r"\}, \{%r\d+, %r\d+, %r\d+, %r\d+\}, %rd\d+", line) for line in wgmma)
    assert "cp.async.bulk.tensor" in ptx and "setmaxnreg" in ptx and "ex2.approx" in ptx
    from tests.test_gemm import _ptxas_report

    report = _ptxas_report(ptx_path)
    assert not report or "0 bytes spill stores" in report
    # C7514-C7518: ptxas serialized the wgmmas (e.g. a path leaves one in flight into code that
    # writes its accumulator), which silently costs the softmax / GEMM overlap.
    assert not re.search(r"\(C751\d\)", report or ""), report


@pytest.mark.compile
@pytest.mark.parametrize("head_dim,seqlen_q,ratio", [(64, 4096, 8), (64, 1024, 4), (128, 1024, 8)])
def test_gqa_packed_attention_compiles_for_sm90a(tmp_path, head_dim, seqlen_q, ratio):
    """GQA packing: Q and O move as 5-D TMA boxes ((heads, positions), D, KV head, batch),
    no spills, no serialized wgmmas."""
    from cute_kernels.attention.api import _compile
    from cute_kernels.attention.config import prefill_config
    from tests.test_gemm import _ptxas_report

    cfg = dataclasses.replace(prefill_config(head_dim, seqlen_q, ratio, True), pack_gqa=ratio)
    assert cfg.tma_o
    _compile(torch.bfloat16, cfg, True, False, False, False, keep_dir=str(tmp_path))
    ptx_path = glob.glob(str(tmp_path / "*.ptx"))[0]
    ptx = open(ptx_path).read()
    assert "cp.async.bulk.tensor.5d.shared::cta.global" in ptx and "cp.async.bulk.tensor.5d.global.shared::cta" in ptx
    report = _ptxas_report(ptx_path)
    assert not report or ("0 bytes spill stores" in report and not re.search(r"\(C751\d\)", report)), report


@pytest.mark.compile
def test_causal_key_range_per_warpgroup_compiles_both_ways(tmp_path):
    """wg_key_range (on by default) and off: both build clean for the 192-row causal tile."""
    from cute_kernels.attention.api import _compile
    from cute_kernels.attention.config import prefill_config
    from tests.test_gemm import _ptxas_report

    cfg = prefill_config(64, 4096)
    assert cfg.wg_key_range and cfg.num_mma_wg == 3
    for i, c in enumerate((cfg, dataclasses.replace(cfg, wg_key_range=False))):
        d = tmp_path / str(i)
        d.mkdir()
        _compile(torch.bfloat16, c, True, False, False, False, keep_dir=str(d))
        report = _ptxas_report(glob.glob(str(d / "*.ptx"))[0])
        assert not report or ("0 bytes spill stores" in report and not re.search(r"\(C751\d\)", report)), report


def test_ab_attention_needs_a_gpu_and_says_so_in_one_line():
    import subprocess
    import sys

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    out = subprocess.run([sys.executable, "-m", "benchmarks.ab_attention"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "Hopper" in out.stderr, out.stderr


def test_ncu_attention_cases_and_gpu_check():
    import subprocess
    import sys

    from benchmarks.ncu_attention import parse_case

    assert parse_case("1x16384x32x8x128") == ((1, 16384, 32, 8, 128), False)
    assert parse_case("2x4096x32x32x64:causal") == ((2, 4096, 32, 32, 64), True)
    for bad in ("1x16384x32x128", "1x16384x32x8x128:noncausal"):
        with pytest.raises(ValueError):
            parse_case(bad)
    if torch.cuda.is_available():
        return
    out = subprocess.run([sys.executable, "-m", "benchmarks.ncu_attention", "1x1024x8x8x64"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "Hopper" in out.stderr, out.stderr


def test_reference_matches_sdpa_and_handles_empty_rows():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 5, 4, 64) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)
    torch.testing.assert_close(flash_attn_ref(q, k, v, causal=True), ref, atol=1e-5, rtol=1e-5)
    # Sq > Sk, causal bottom-right: the first Sq - Sk rows see nothing -> zeros, LSE -inf.
    o, lse = flash_attn_ref(torch.randn(1, 6, 2, 64), k[:1, :3, :2], v[:1, :3, :2], causal=True, return_lse=True)
    assert torch.equal(o[:, :3], torch.zeros_like(o[:, :3])) and torch.isinf(lse[..., :3]).all()
    assert torch.isfinite(o).all()


def test_validation_on_cpu():
    import cute_kernels as ck

    q = torch.randn(1, 8, 4, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="CUDA"):
        ck.flash_attn(q, q, q)
    with pytest.raises(TypeError):
        ck.flash_attn(q.float(), q.float(), q.float())
    with pytest.raises(ValueError, match="unit stride"):
        ck.flash_attn(q.transpose(1, 3), q, q)


# ------------------------------------------------------------------------------ gpu tier


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", [(12, 12), (32, 8), (16, 2), (12, 1)])
@pytest.mark.parametrize("seqlens", [(1, 1), (17, 17), (128, 128), (1000, 1000), (4097, 4097), (64, 1000), (1000, 64)])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
def test_flash_attn_matches_reference(causal, heads, seqlens, head_dim):
    _check_flash_attn(causal, heads, seqlens, head_dim)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim,overrides", [
    # One more K/V stage than the default (at D = 128 only without the O slots).
    (64, dict(stages=5)), (128, dict(stages=3, tma_o=False)), (64, dict(tma_o=False)), (128, dict(tma_o=False)),
    (128, dict(n_block=160)), (128, dict(n_block=176, tma_o=False)), (128, dict(n_block=192, tma_o=False)),
    (64, dict(n_block=176)),
    # GQA packing off at D = 64 (the pick packs (32, 8)'s 4 heads), on at D = 128; 2 warpgroups.
    (64, dict(pack_gqa=1)), (128, dict(pack_gqa=4)), (64, dict(num_mma_wg=2, pingpong=False)),
])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_other_configs(head_dim, overrides, causal):
    """Config fields other than the picks: same reference bound on ragged, GQA and causal
    shapes (key blocks that do not divide the keys, 64-row blocks past the last query)."""
    for seqlens in [(17, 17), (1000, 1000), (4097, 4097), (64, 1000), (1000, 64)]:
        _check_flash_attn(causal, (32, 8), seqlens, head_dim, overrides=overrides)


def _check_flash_attn(causal, heads, seqlens, head_dim, overrides=None):
    """overrides: PrefillConfig fields set on top of the tuned config (through api._run)."""
    import cute_kernels as ck
    from cute_kernels.attention import api

    (hq, hkv), (sq, sk) = heads, seqlens
    q = torch.randn(2, sq, hq, head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, sk, hkv, head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, sk, hkv, head_dim, device="cuda", dtype=torch.bfloat16)
    if overrides is None:
        out, lse = ck.flash_attn(q, k, v, causal=causal, return_lse=True)
    else:
        cfg = dataclasses.replace(api.prefill_config(head_dim, sq, hq // hkv, causal), **overrides)
        splits = api._resolve_splits(None, 2, hq, sq, sk)
        out, lse = api._run(q, k, v, causal, None, num_splits=splits, config=cfg)
    ref, ref_lse = flash_attn_ref(q.float(), k.float(), v.float(), causal=causal, return_lse=True)
    # torch's bf16 SDPA on the same inputs (bottom-right causal via an explicit mask).
    rep = hq // hkv
    mask = None
    if causal:
        i, j = torch.arange(sq, device="cuda")[:, None], torch.arange(sk, device="cuda")[None, :]
        mask = j <= i + sk - sq
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2).repeat_interleave(rep, 1), v.transpose(1, 2).repeat_interleave(rep, 1),
        attn_mask=mask).transpose(1, 2).nan_to_num(0.0)
    e_ours = (out.float() - ref.float()).abs().max().item()
    e_torch = (sdpa.float() - ref.float()).abs().max().item()
    assert torch.isfinite(out).all()
    assert e_ours <= 2 * e_torch + 1e-3, (e_ours, e_torch)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(finite, torch.isfinite(lse))
    assert (lse[finite] - ref_lse[finite]).abs().max().item() < 1e-2


@pytest.mark.gpu
def test_flash_attn_strided_hf_layout():
    import cute_kernels as ck

    # Hugging Face builds [B, H, S, D] and hands over .transpose(1, 2) views: no copies.
    q, k, v = (torch.randn(2, 12, 300, 64, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
    out = ck.flash_attn(q, k, v, causal=True, softmax_scale=1 / math.sqrt(64))
    torch.testing.assert_close(out.float(), flash_attn_ref(q.float(), k.float(), v.float(), causal=True).float(), atol=2e-2, rtol=2e-2)


def test_append_kv_and_kvcache_reference_on_cpu():
    from cute_kernels.attention.api import append_kv
    from cute_kernels.attention.reference import flash_attn_with_kvcache_ref

    torch.manual_seed(1)
    B, Smax, H, D = 3, 32, 2, 64
    kc, vc = torch.randn(B, Smax, H, D), torch.randn(B, Smax, H, D)
    lens = torch.tensor([0, 5, 17], dtype=torch.int32)
    kn, vn = torch.randn(B, 2, H, D), torch.randn(B, 2, H, D)
    kc2, vc2 = kc.clone(), vc.clone()
    append_kv(kc2, vc2, lens, kn, vn)
    for b in range(B):
        n = int(lens[b])
        assert torch.equal(kc2[b, n:n + 2], kn[b]) and torch.equal(vc2[b, n:n + 2], vn[b])
        assert torch.equal(kc2[b, :n], kc[b, :n]) and torch.equal(kc2[b, n + 2:], kc[b, n + 2:])
    q = torch.randn(B, 2, H, D)
    out = flash_attn_with_kvcache_ref(q, kc.clone(), vc.clone(), lens, k_new=kn, v_new=vn)
    for b in range(B):
        n = int(lens[b]) + 2
        torch.testing.assert_close(out[b:b + 1], flash_attn_ref(q[b:b + 1], kc2[b:b + 1, :n], vc2[b:b + 1, :n], causal=True))


def test_kvcache_validation_on_cpu():
    import cute_kernels as ck

    q = torch.randn(2, 1, 4, 64, dtype=torch.bfloat16)
    kc = torch.randn(2, 16, 4, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="CUDA"):
        ck.flash_attn_with_kvcache(q, kc, kc, torch.zeros(2, dtype=torch.int32))


@pytest.mark.gpu
@pytest.mark.parametrize("s_new", [1, 7])
@pytest.mark.parametrize("heads,D", [((12, 12), 64), ((32, 8), 128), ((32, 8), 96), ((8, 2), 256)])
def test_flash_attn_with_kvcache_ragged(s_new, heads, D):
    import cute_kernels as ck
    from cute_kernels.attention.reference import flash_attn_with_kvcache_ref

    hq, hkv = heads
    B, Smax = 4, 1200
    kc = torch.randn(B, Smax, hkv, D, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn(B, Smax, hkv, D, device="cuda", dtype=torch.bfloat16)
    lens = torch.tensor([0, 1, 130, 1000], dtype=torch.int32, device="cuda")
    q = torch.randn(B, s_new, hq, D, device="cuda", dtype=torch.bfloat16)
    kn = torch.randn(B, s_new, hkv, D, device="cuda", dtype=torch.bfloat16)
    vn = torch.randn(B, s_new, hkv, D, device="cuda", dtype=torch.bfloat16)
    ref = flash_attn_with_kvcache_ref(q.float(), kc.float().clone(), vc.float().clone(), lens, k_new=kn.float(), v_new=vn.float())
    out = ck.flash_attn_with_kvcache(q, kc, vc, lens, k_new=kn, v_new=vn)
    assert (out.float() - ref).abs().max().item() < 3e-2


def test_varlen_padding_and_reference_on_cpu():
    from cute_kernels.attention.api import _pad
    from cute_kernels.attention.reference import flash_attn_varlen_ref

    x = torch.randn(10, 2, 64)
    x[3] = float("nan")  # belongs to sequence 2 only
    cu = torch.tensor([0, 3, 3, 10], dtype=torch.int32)
    padded = _pad(x, cu, 7)
    assert torch.isfinite(padded[0]).all() and torch.isfinite(padded[1]).all()
    assert torch.equal(padded[2, :7].isnan(), x[3:10].isnan())
    q, k, v = (torch.randn(10, 2, 64) for _ in range(3))
    out = flash_attn_varlen_ref(q, k, v, cu, cu, causal=True)
    assert out.shape == (10, 2, 64)
    torch.testing.assert_close(out[3:], flash_attn_ref(q[None, 3:], k[None, 3:], v[None, 3:], causal=True)[0])


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_varlen(causal):
    import cute_kernels as ck
    from cute_kernels.attention.reference import flash_attn_varlen_ref

    lq = [5, 0, 300, 129, 1]
    lk = [5, 17, 300, 1000, 64]
    cu_q = torch.tensor([0, *torch.tensor(lq).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, *torch.tensor(lk).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q = torch.randn(sum(lq), 8, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(sum(lk), 2, 64, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(sum(lk), 2, 64, device="cuda", dtype=torch.bfloat16)
    out = ck.flash_attn_varlen(q, k, v, cu_q, cu_k, max(lq), max(lk), causal=causal)
    ref = flash_attn_varlen_ref(q.float(), k.float(), v.float(), cu_q, cu_k, causal=causal)
    assert out.shape == q.shape and (out.float() - ref).abs().max().item() < 3e-2


# ------------------------------------------------------------------------------ split-KV


def test_combine_splits_matches_unsplit_reference_on_cpu():
    """Partials normalised per key range + their LSE merge into the full softmax, including
    an empty range (LSE -inf) and rows that see no key at all."""
    from cute_kernels.attention.api import combine_splits

    torch.manual_seed(3)
    B, Sq, Sk, H, D = 2, 5, 40, 3, 64
    q, k, v = torch.randn(B, Sq, H, D), torch.randn(B, Sk, H, D), torch.randn(B, Sk, H, D)
    full, full_lse = flash_attn_ref(q, k, v, return_lse=True)
    bounds = [0, 7, 7, 30, 40]  # the second range is empty
    o_parts, lse_parts = [], []
    for lo, hi in itertools.pairwise(bounds):
        if hi == lo:
            o_parts.append(torch.zeros(B, Sq, H, D))
            lse_parts.append(torch.full((B, H, Sq), -math.inf))
            continue
        o, lse = flash_attn_ref(q, k[:, lo:hi], v[:, lo:hi], return_lse=True)
        o_parts.append(o.float())
        lse_parts.append(lse)
    out, lse = combine_splits(torch.stack(o_parts), torch.stack(lse_parts), torch.float32)
    torch.testing.assert_close(out, full.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, full_lse, atol=1e-5, rtol=1e-5)
    # A row with no keys in any split: O = 0, LSE = -inf, nothing NaN.
    o, lse = combine_splits(torch.zeros(3, 1, 1, 1, D), torch.full((3, 1, 1, 1), -math.inf), torch.float32)
    assert torch.equal(o, torch.zeros_like(o)) and torch.isneginf(lse).all()


def test_num_splits_heuristic_and_validation(monkeypatch):
    from cute_kernels.attention.api import (
        _resolve_splits,
        decode_heads_per_cta,
        decode_splits_heuristic,
        num_splits_heuristic,
    )

    assert num_splits_heuristic(1, 25, 1, 8192) == 5  # 25 CTAs -> 5 splits fill 125 SMs
    assert num_splits_heuristic(1, 25, 1, 1024) == 2  # 8 key blocks: at least 4 per split
    assert num_splits_heuristic(1, 25, 1, 256) == 1
    assert num_splits_heuristic(64, 32, 1, 32768) == 1  # the grid already fills the GPU
    assert num_splits_heuristic(1, 1, 1, 1 << 20) == 16  # capped
    assert _resolve_splits(None, 1, 25, 1, 8192) == 5
    assert _resolve_splits(3, 64, 32, 1, 8192) == 3
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="num_splits"):
            _resolve_splits(bad, 1, 1, 1, 1)
    # Decode: GQA heads per CTA divide the ratio and stay <= 4; splits aim at 2 CTAs per SM.
    assert [decode_heads_per_cta(g) for g in (1, 2, 3, 4, 6, 8, 12, 7)] == [1, 2, 3, 4, 3, 4, 4, 1]
    # Cluster merge (SIMT kernel, 2-8 splits): the largest cluster within one wave.
    assert decode_splits_heuristic(1, 12, 1, 8192, 64) == 8  # 12 clusters of 8: 96 CTAs
    assert decode_splits_heuristic(8, 32, 4, 8192, 128) == 2  # 64 CTAs x 2
    assert decode_splits_heuristic(8, 12, 1, 8192, 64) == 1  # 96 CTAs: a second split would make 2 waves
    assert decode_splits_heuristic(1, 12, 1, 64, 64) == 1  # one key block (64 keys): one split
    assert decode_splits_heuristic(1, 1, 1, 1 << 20, 128) == 64  # one CTA: the global merge, capped
    assert decode_splits_heuristic(1, 25, 1, 448, 64) == 4  # GPT-2 XL: 28 KB per split
    assert decode_splits_heuristic(1, 25, 1, 192, 64) == 1  # too little K/V to split
    assert decode_splits_heuristic(1, 25, 1, 256, 64) == 1  # GPT-2 XL's 256-key decode cache
    assert decode_splits_heuristic(1, 25, 1, 1024, 64) == 4  # 25 x 8 would be two waves
    assert decode_splits_heuristic(1, 32, 4, 1024, 128) == 8
    from cute_kernels.attention import api as attn_api

    monkeypatch.setenv("CUTE_KERNELS_DECODE_CLUSTER", "0")  # the global merge's own rule
    assert decode_splits_heuristic(1, 12, 1, 8192, 64) == 11  # 12 CTAs x 11 = 132: one wave
    assert decode_splits_heuristic(1, 25, 1, 448, 64) == 1
    assert decode_splits_heuristic(1, 25, 1, 1024, 64) == 2
    assert decode_splits_heuristic(1, 32, 4, 1024, 128) == 16  # 4 heads per CTA: more work per key
    monkeypatch.setenv("CUTE_KERNELS_DECODE_CLUSTER", "1")
    from cute_kernels.attention.api import HEAD_DIMS, _decode_kernel_obj
    from cute_kernels.attention.config import DecodeMmaConfig, decode_config, decode_mma_config

    monkeypatch.setattr(attn_api, "MIN_SPLIT_WORK", 1)
    for D in HEAD_DIMS:  # the configs' block_n (the heuristic's unit) is the kernel's
        n = _decode_kernel_obj(decode_config(D), 1, True, True).block_n
        assert n == decode_config(D).block_n
        assert decode_splits_heuristic(1, 1, 1, 64 * n, D) == 64 and decode_splits_heuristic(1, 1, 1, n, D) == 1
        if D in DecodeMmaConfig.HEAD_DIMS:
            assert _decode_kernel_obj(decode_mma_config(D), 4, True, True).block_n == decode_mma_config(D).block_n


def test_prefill_config_choices():
    from cute_kernels.attention.config import prefill_config, prefill_config_fp8

    assert [prefill_config(D, 1024).pingpong for D in (64, 96, 128, 256)] == [False, True, True, True]
    assert prefill_config(64, 4096).num_mma_wg == 3 and prefill_config(64, 4096).pingpong
    assert prefill_config(64, 2047).num_mma_wg == 2 and prefill_config(128, 4096).num_mma_wg == 2
    assert prefill_config(256, 1024).n_block == 64 and prefill_config(128, 1024).n_block == 128
    assert prefill_config(64, 1024).exps_before_pv_wait == 32 and prefill_config(128, 1024).exps_before_pv_wait is None
    # Three warpgroups at D = 64 run every exp2 after the P V wait; FP8 keeps 32 before it.
    assert prefill_config(64, 4096).exps_before_pv_wait == 0 and prefill_config(64, 1024, 1, True).exps_before_pv_wait == 0
    assert prefill_config_fp8(64, 4096).exps_before_pv_wait == 32
    assert prefill_config(64, 1024).stages == 4 and prefill_config(128, 1024).stages == 2
    # O through shared memory and TMA where its slots fit: not at D = 256.
    assert [prefill_config(D, 1024).tma_o for D in (64, 96, 128, 256)] == [True, True, True, False]
    assert prefill_config(64, 4096).tma_o
    # GQA packing at D = 64: the ratio where a warpgroup's 64 rows hold whole positions.
    assert [prefill_config(64, 1024, r).pack_gqa for r in (1, 2, 3, 4, 8, 16, 32)] == [1, 2, 1, 4, 8, 16, 1]
    assert prefill_config(128, 1024, 8).pack_gqa == 1
    # Three warpgroups at D = 64 below 2048 rows only for causal or packed tiles, without ping-pong.
    assert [prefill_config(64, 1024, r, c).num_mma_wg for r, c in ((1, False), (1, True), (8, False))] == [2, 3, 3]
    assert not prefill_config(64, 1024, 8).pingpong and prefill_config(64, 2048, 8).pingpong
    # A warpgroup's own key range only where its 64 rows can end a block early (192-row
    # tiles, 64-key blocks at D = 256, FP8's 224-key blocks).
    assert [prefill_config(D, 1024, 1, True).wg_key_range for D in (64, 96, 128, 256)] == [True, False, False, True]
    assert prefill_config(128, 4096, 8, True).wg_key_range is False
    assert prefill_config_fp8(128, 4096).wg_key_range and not prefill_config_fp8(128, 1024).wg_key_range


def test_prefill_tile_group():
    """Persistent causal: one head's query blocks back to back for 128-row tiles, 8 MB groups
    for 192-row tiles; otherwise 24 MB of K/V a group."""
    from cute_kernels.attention.api import CAUSAL_GROUP_BYTES, L2_GROUP_BYTES, heads_per_group, prefill_tile_group
    from cute_kernels.attention.config import prefill_config

    d128, d64 = prefill_config(128, 512, 1, True), prefill_config(64, 512, 1, True)
    assert prefill_tile_group(d128, True, True, 512, 1) == 1
    assert prefill_tile_group(d64, True, True, 512, 1) == CAUSAL_GROUP_BYTES // (2 * 512 * 64 * 2) == 64
    assert prefill_tile_group(d128, True, False, 4096, 1) == L2_GROUP_BYTES // (2 * 4096 * 128 * 2)
    assert prefill_tile_group(d128, False, True, 512, 1) == heads_per_group(512, 128, 1) == 96
    packed = prefill_config(64, 512, 8, True)  # a packed tile's head is a KV head
    assert packed.pack_gqa == 8 and prefill_tile_group(packed, True, True, 512, 8) == 64
    assert heads_per_group(512, 64, 1, group_bytes=1) == 1


def test_softmax_scale_must_be_positive():
    """The kernels take the running max on unscaled scores: a scale <= 0 would be a silent
    wrong answer, so it is refused up front."""
    from cute_kernels.attention.config import softmax_scale_log2

    assert softmax_scale_log2(64, None) == pytest.approx(math.log2(math.e) / 8)
    assert softmax_scale_log2(64, 0.5) == pytest.approx(0.5 * math.log2(math.e))
    for bad in (0.0, -0.125, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="softmax_scale"):
            softmax_scale_log2(64, bad)
    with pytest.raises(TypeError, match="softmax_scale"):
        softmax_scale_log2(64, "0.1x")
    import cute_kernels as ck

    # The public ops refuse it up front (before any device work: these are CPU tensors).
    q = torch.randn(1, 4, 2, 64)
    for call in (lambda: ck.flash_attn(q, q, q, softmax_scale=-1.0),
                 lambda: ck.flash_attn_varlen(q[0], q[0], q[0], torch.tensor([0, 4]), torch.tensor([0, 4]), 4, 4,
                                              softmax_scale=0.0)):
        with pytest.raises(ValueError, match="softmax_scale"):
            call()


def test_ab_attention_group_specs():
    from benchmarks.ab_attention import parse_group

    assert parse_group("8MB") == ("bytes", 8 << 20) and parse_group("1") == ("heads", 1)
    for bad in ("0", "x", "-2MB", "MB"):
        with pytest.raises(ValueError, match="--group"):
            parse_group(bad)


def test_ab_attention_fp8_refuses_tile_groups_before_any_gpu_work():
    """--fp8 times the FP8 kernel's configs; --group is the 16-bit kernel's tile order."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "benchmarks.ab_attention", "--fp8", "--group", "1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--group is for the 16-bit kernel" in out.stderr, out.stderr


def test_ab_decode_specs_and_gpu_check():
    """benchmarks.ab_decode: DecodeConfig / DecodeMmaConfig fields, `splits` and `merge` only, literal
    values, bad input refused before any GPU work, and one stderr line without a Hopper GPU."""
    import subprocess
    import sys

    from benchmarks.ab_decode import parse_kernel, parse_set

    assert parse_set("threads=128,kv_pack=1") == ({"threads": 128, "kv_pack": 1}, None, True)
    assert parse_set("unroll=4,splits=3") == ({"unroll": 4}, 3, True)
    assert parse_set("splits=2") == ({}, 2, True)
    assert parse_set("merge=global") == ({}, None, False)
    assert parse_set("warps=8,stages=2,merge=cluster") == ({"warps": 8, "stages": 2}, None, True)  # tensor-core fields
    assert parse_set("kernel=mma,splits=8") == ({}, 8, True) and parse_kernel("kernel=mma,splits=8") == "mma"
    assert parse_kernel("splits=8") is None
    for bad in ("head_dim=64", "n_block=64", "threads", "threads=x", "splits=0", "splits=x", "splits=2,splits=3",
                "merge=x", "merge=global,merge=cluster", "kernel=x", "kernel=mma,kernel=simt"):
        with pytest.raises(ValueError, match="--set"):
            parse_set(bad)
    out = subprocess.run([sys.executable, "-m", "benchmarks.ab_decode", "--batches", "0"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--batches" in out.stderr, out.stderr
    out = subprocess.run([sys.executable, "-m", "benchmarks.ab_decode", "--gqa", "5"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--gqa" in out.stderr, out.stderr
    if not torch.cuda.is_available():
        out = subprocess.run([sys.executable, "-m", "benchmarks.ab_decode", "--set", "threads=128"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and "Hopper" in out.stderr, out.stderr


def test_unsupported_head_dim_is_a_value_error():
    from cute_kernels.attention.config import decode_config, decode_mma_config, prefill_config

    for fn in (lambda: prefill_config(80, 1024), lambda: decode_config(80), lambda: decode_mma_config(96)):
        with pytest.raises(ValueError, match="64"):
            fn()
    with pytest.raises(ValueError, match=r"supported: \(64, 96, 128, 256\)"):
        prefill_config(512, 1024)


def test_validate_rejects_configs_that_cannot_work():
    from cute_kernels.attention.config import DecodeConfig, DecodeMmaConfig, PrefillConfig

    for cfg, why in [
        (PrefillConfig(128, stages=4), "shared memory"),  # 32 KB of Q + 4 x 64 KB of K and V
        (PrefillConfig(64, stages=8, num_mma_wg=3), "shared memory"),
        (PrefillConfig(256), "registers"),  # D = 256 needs 64-key blocks
        (PrefillConfig(128, num_mma_wg=3), "registers"),
        (PrefillConfig(64, num_mma_wg=4), "num_mma_wg"),
        (PrefillConfig(64, n_block=96), "n_block"),
        (PrefillConfig(64, exps_before_pv_wait=65), "exps_before_pv_wait"),
        (PrefillConfig(64, stages=0), "stages"),
        (PrefillConfig(64, pack_gqa=3), "pack_gqa"),
        (DecodeConfig(96, vec=1), "divides a warp"),  # 12 threads a row
        (DecodeConfig(64, vec=3), "divides a warp"),
        (DecodeConfig(64, threads=100), "multiple of 32"),
        (DecodeConfig(64, threads=64, max_heads=4), "one warp"),
        (DecodeConfig(64, stages=1), "stages"),
        (DecodeConfig(96, vec=3, max_heads=4, unroll=1), "registers"),  # spilled at D = 96
        (DecodeConfig(64, unroll=16, stages=8), "shared memory"),
        (DecodeMmaConfig(256), "D in"),
        (DecodeMmaConfig(128, max_heads=32), "max_heads"),
        (DecodeMmaConfig(128, bn=24), "bn"),
        (DecodeMmaConfig(128, stages=8), "shared memory"),
    ]:
        with pytest.raises(ValueError, match=why):
            cfg.validate()
    # One more K/V stage than the default still fits at D = 128.
    PrefillConfig(128, stages=3).validate()


def test_configs_are_frozen_and_hashable():
    from cute_kernels.attention.config import DecodeConfig, DecodeMmaConfig, PrefillConfig

    for cfg in (PrefillConfig(64), DecodeConfig(64), DecodeMmaConfig(64)):
        with pytest.raises(dataclasses.FrozenInstanceError):
            cfg.head_dim = 128
        assert hash(cfg) == hash(dataclasses.replace(cfg)) and cfg == dataclasses.replace(cfg)
        assert all(isinstance(getattr(cfg, f.name), (int, bool, type(None))) for f in dataclasses.fields(cfg))
    assert PrefillConfig(64) == PrefillConfig(64, stages=4)  # None resolves to the head dim's default
    assert len({PrefillConfig(64), PrefillConfig(64, pingpong=False), PrefillConfig(128)}) == 3


def test_decode_mma_configs_fit():
    """Every head packing of the tensor-core decode kernel fits shared memory, with the
    partial O overlaying the K/V ring."""
    from cute_kernels.attention.api import _decode_kernel_obj
    from cute_kernels.attention.config import decode_mma_config

    for D in (64, 128):
        for heads in (1, 4, 8, 12, 16):
            k = _decode_kernel_obj(decode_mma_config(D), heads, True, True)
            assert k.smem_bytes() <= 227 * 1024 and k.num_warps * heads * D * 4 <= k.ring_bytes()


def test_decode_merge_shape():
    """The global split merge's thread layout: every 4-column output group is owned, the
    lanes sharing a group are a power of two within a warp, and each thread keeps at most
    _MERGE_LOADS partial loads in flight (at least one split each)."""
    from cute_kernels.attention.decode import _MERGE_LOADS, _merge_shape

    for heads, D, threads in itertools.product((1, 2, 4, 7, 8, 16), (64, 96, 128, 256), (128, 256)):
        groups = heads * D // 4
        lanes, per_thread, chunk = _merge_shape(groups, threads)
        assert lanes in (1, 2, 4, 8, 16, 32) and lanes * groups <= max(threads, groups)
        assert per_thread * (threads // lanes) >= groups
        assert chunk >= 1 and (per_thread * chunk <= _MERGE_LOADS or chunk == 1)


def test_decode_mma_choice():
    """The tensor-core kernel takes GQA >= 4 when its key blocks still fill the SMs; its
    split count is capped by the partials the last CTA must read back."""
    from cute_kernels.attention.api import decode_heads_per_cta, decode_splits_heuristic, decode_uses_mma

    assert decode_uses_mma(1, 32, 8, 8192, 128) and decode_uses_mma(8, 32, 8, 1024, 128)
    assert not decode_uses_mma(1, 32, 8, 1024, 128)  # 64 one-step CTAs: the SIMT kernel is faster
    assert not decode_uses_mma(1, 12, 12, 8192, 64) and not decode_uses_mma(64, 32, 16, 8192, 128)  # G < 4
    assert not decode_uses_mma(8, 32, 8, 8192, 96)  # its ring is 64 columns wide: D = 96 stays SIMT
    assert not decode_uses_mma(8, 32, 8, 8192, 256)  # and would not fit shared memory at D = 256
    assert [decode_heads_per_cta(g, 128, mma=True) for g in (4, 8, 12, 16, 32, 24)] == [4, 8, 12, 16, 16, 12]
    assert decode_splits_heuristic(1, 32, 16, 8192, 128, mma=True) == 16  # 128 KB of partials
    assert decode_splits_heuristic(1, 32, 4, 8192, 128, mma=True) == 16  # one wave of 8 x 16 CTAs


def test_decode_many_wave_config():
    """Launches of many waves (never split) stream 4 rows a thread and step through 4 stages; MHA
    with a short cache runs 128 threads a CTA from 2.5 CTAs a SM and packs two KV heads a CTA
    from 5; with a long one, 128 threads from 1.4 CTAs a SM and the many-wave config from 3."""
    from cute_kernels.attention.config import decode_config

    assert (decode_config(64, 64 * 12, 8192).unroll, decode_config(64, 64 * 12, 8192).stages) == (4, 4)
    assert (decode_config(64, 64 * 12, 1024).unroll, decode_config(64, 64 * 12, 1024).stages) == (4, 4)
    assert decode_config(64, 8 * 12, 8192) is decode_config(64)
    assert decode_config(128, 64 * 12, 8192) is decode_config(128)  # swept at D = 64 only
    shape = {b: (lambda c: (c.unroll, c.threads, c.kv_pack))(decode_config(64, b * 12, 1024, mha=True))
             for b in (16, 32, 48, 64, 128)}
    assert shape == {16: (2, 256, 1), 32: (2, 128, 1), 48: (4, 128, 1), 64: (4, 128, 2), 128: (4, 128, 2)}
    assert decode_config(64, 64 * 12, 1024).threads == 256 and decode_config(64, 64 * 12, 1024).kv_pack == 1
    long_mha = {b: (lambda c: (c.unroll, c.stages, c.threads, c.kv_pack))(decode_config(64, b * 12, 8192, mha=True))
                for b in (12, 14, 16, 32, 40, 48, 64)}
    assert long_mha == {12: (2, 4, 256, 1), 14: (2, 4, 256, 1), 16: (2, 4, 128, 1), 32: (2, 4, 128, 1), 40: (4, 4, 256, 1),
                        48: (4, 4, 256, 1), 64: (4, 4, 256, 1)}
    assert decode_config(64, 32 * 12, 8192) is decode_config(64)  # the long-cache bands are MHA's
    assert decode_config(128, 64 * 12, 1024, mha=True) is decode_config(128)


@pytest.mark.compile
@pytest.mark.parametrize("kv_pack", [2, 4])
def test_decode_kv_pack_compiles(tmp_path, kv_pack):
    """The SIMT kernel with kv_pack KV heads a CTA, with and without cache lengths, no spills."""
    from dataclasses import replace

    from cute_kernels.attention.api import _compile_decode
    from cute_kernels.attention.config import decode_config
    from tests.test_gemm import _ptxas_report

    cfg = replace(decode_config(64, 64 * 12, 1024), kv_pack=kv_pack)
    for seqlens in (False, True):
        out = tmp_path / str(seqlens)
        out.mkdir()
        _compile_decode(torch.bfloat16, cfg, 1, False, seqlens, False, 1, False, keep_dir=str(out))
        report = _ptxas_report(glob.glob(str(out / "*.ptx"))[0])
        assert not report or "0 bytes spill stores" in report
    with pytest.raises(ValueError, match="kv_pack"):
        replace(cfg, kv_pack=3).validate()


@pytest.mark.compile
@pytest.mark.parametrize("batch,seqlen_k", [(64, 8192), (64, 1024), (32, 1024), (40, 8192)])
def test_decode_many_wave_config_compiles(tmp_path, batch, seqlen_k):
    """The MHA picks by launch size (1k keys: 128 threads; at batch 64 two KV heads a CTA; 8k keys
    at batch 40: 4 rows x 4 stages)."""
    from cute_kernels.attention.api import _compile_decode
    from cute_kernels.attention.config import decode_config
    from tests.test_gemm import _ptxas_report

    cfg = decode_config(64, batch * 12, seqlen_k, mha=True)
    assert cfg != decode_config(64)
    _compile_decode(torch.bfloat16, cfg, 1, False, True, False, 1, False, keep_dir=str(tmp_path))
    ptx_path = glob.glob(str(tmp_path / "*.ptx"))[0]
    assert "cp.async.cg.shared.global" in open(ptx_path).read()
    report = _ptxas_report(ptx_path)
    assert not report or "0 bytes spill stores" in report


def test_decode_cluster_merge_choice(monkeypatch):
    """2-8 splits merge in a cluster when every cluster is resident at once (clusters of more
    than 4 CTAs: at most 96 CTAs); the tensor-core kernel's B = 8 GQA splits qualify."""
    from cute_kernels.attention.api import decode_merges_in_cluster, decode_splits_heuristic

    assert decode_merges_in_cluster(12, 8) and decode_merges_in_cluster(25, 4) and decode_merges_in_cluster(64, 2)
    assert not decode_merges_in_cluster(16, 8)  # 128 CTAs in clusters of 8: not all resident
    assert not decode_merges_in_cluster(1, 1) and not decode_merges_in_cluster(1, 16)
    assert not decode_merges_in_cluster(96, 2)  # 192 CTAs
    assert decode_splits_heuristic(8, 32, 4, 1024, 128, mma=True) == 2 and decode_merges_in_cluster(64, 2)
    assert decode_splits_heuristic(1, 16, 1, 8192, 64) == 4  # 16 clusters of 8 would not fit
    # One 122 KB tensor-core CTA a SM (8 packed heads, clusters of 4): 32 clusters are more than
    # the 30 the GPCs hold at once, so they merge globally; two CTAs a SM (112 KB) still fit.
    assert not decode_merges_in_cluster(32, 4, 122240) and decode_merges_in_cluster(30, 4, 122240)
    assert decode_merges_in_cluster(32, 4, 112832) and decode_merges_in_cluster(32, 4)
    assert decode_merges_in_cluster(64, 2, 122240)  # 66 clusters of 2 fit
    monkeypatch.setenv("CUTE_KERNELS_DECODE_CLUSTER", "0")
    assert not decode_merges_in_cluster(12, 8)


def test_decode_mma_stage_pick():
    """The tensor-core kernel takes 4 stages (one CTA a SM) over 3 (two) only for unsplit
    launches over long caches whose waves then fill the SMs better; split launches, short
    caches, one partial wave, equal fill and D = 64 keep 3."""
    from cute_kernels.attention.config import decode_mma_config

    def stages(ctas, seqlen_k=8192, head_dim=128, heads=4):
        return decode_mma_config(head_dim, ctas, heads, seqlen_k).stages

    assert stages(320) == stages(384) == stages(640) == 4  # 1.2 / 1.45 / 2.4 waves of two a SM
    assert stages(256) == stages(512) == stages(768) == 3  # as full either way
    assert stages(128) == stages(0) == 3  # one partial wave; split (ctas unknown)
    assert stages(384, seqlen_k=1024) == 3 and stages(384, seqlen_k=4096) == 4
    assert stages(384, head_dim=64) == 3 and stages(384, heads=8) == 4
    assert decode_mma_config(128) == decode_mma_config(128, 0, 0, 0)


def test_decode_mma_wide_pick():
    """Split launches over at most 8 (batch, KV head) pairs of 8 packed heads take 8 warps and
    2 stages; more pairs, other packings and unsplit launches keep their picks, and the split
    count is planned with the 4-warp config either way."""
    import cute_kernels.attention.api as api
    from cute_kernels.attention.config import decode_mma_config

    wide = decode_mma_config(128, split_ctas=8, heads=8)
    assert (wide.warps, wide.stages) == (8, 2) and decode_mma_config(64, split_ctas=4, heads=8).warps == 8
    assert decode_mma_config(128, split_ctas=16, heads=8) == decode_mma_config(128)
    assert decode_mma_config(128, split_ctas=8, heads=4) == decode_mma_config(128)
    assert decode_mma_config(128, split_ctas=2, heads=16) == decode_mma_config(128)
    assert decode_mma_config(128, 8, 8, 8192) == decode_mma_config(128)  # unsplit
    assert api._decode_cfg(128, True).warps == 4  # what decode_splits_heuristic plans with


@pytest.mark.compile
@pytest.mark.parametrize("head_dim", [64, 128])
def test_decode_mma_wide_compiles_for_sm90a(tmp_path, head_dim):
    """The 8-warp, 2-stage tensor-core build (8 packed heads, split, global merge): 256 threads,
    a 2-deep ring (stages - 2 = 0 groups left in flight at a wait), no spills."""
    from cute_kernels.attention.api import _compile_decode
    from cute_kernels.attention.config import decode_mma_config
    from tests.test_gemm import _ptxas_report

    cfg = decode_mma_config(head_dim, split_ctas=8, heads=8)
    assert cfg.warps == 8
    _compile_decode(torch.bfloat16, cfg, 8, True, True, False, 1, True, keep_dir=str(tmp_path))
    ptx_path = glob.glob(str(tmp_path / "*.ptx"))[0]
    ptx = open(ptx_path).read()
    assert re.search(r"cp\.async\.wait_group\s+0;", ptx) and "mma.sync.aligned.m16n8k16" in ptx
    assert re.search(r"\.reqntid\s+256\b", ptx)
    report = _ptxas_report(ptx_path)
    assert not report or "0 bytes spill stores" in report


@pytest.mark.compile
def test_decode_mma_deep_ring_compiles_for_sm90a(tmp_path):
    """The tensor-core kernel's 4-stage ring (decode_mma_config's many-wave pick at D = 128):
    one CTA a SM's shared memory, 3 groups in flight, no spills."""
    from cute_kernels.attention.api import _compile_decode
    from cute_kernels.attention.config import decode_mma_config
    from tests.test_gemm import _ptxas_report

    cfg = decode_mma_config(128, 384, 4, 8192)
    assert cfg.stages == 4
    _compile_decode(torch.bfloat16, cfg, 4, False, True, False, 1, True, keep_dir=str(tmp_path))
    ptx_path = glob.glob(str(tmp_path / "*.ptx"))[0]
    ptx = open(ptx_path).read()
    assert re.search(r"cp\.async\.wait_group\s+2;", ptx) and "mma.sync.aligned.m16n8k16" in ptx
    report = _ptxas_report(ptx_path)
    assert not report or "0 bytes spill stores" in report


@pytest.mark.compile
@pytest.mark.parametrize("head_dim,heads,split,masked,mma,cluster", [
    (64, 1, False, False, False, 1), (64, 1, True, False, False, 1), (128, 4, True, False, False, 1),
    (64, 3, True, False, False, 1), (64, 1, True, True, False, 1), (64, 1, True, False, False, 8),
    (128, 4, True, True, False, 3), (96, 2, True, False, False, 1), (96, 1, False, True, False, 1), (256, 2, True, False, False, 1),
    (128, 4, True, False, True, 1), (128, 16, False, True, True, 1), (64, 8, True, False, True, 1)])
def test_decode_compiles_for_sm90a(tmp_path, head_dim, heads, split, masked, mma, cluster):
    from cute_kernels.attention.api import _compile_decode
    from cute_kernels.attention.config import decode_config, decode_mma_config
    from tests.test_gemm import _ptxas_report

    early_trigger = heads > 1  # both orders are compiled across the parameter set
    cfg = decode_mma_config(head_dim) if mma else decode_config(head_dim)
    _compile_decode(torch.bfloat16, cfg, heads, split, True, masked, cluster, early_trigger, keep_dir=str(tmp_path))
    ptx_path = glob.glob(str(tmp_path / "*.ptx"))[0]
    ptx = open(ptx_path).read()
    # The GQA kernel runs Q K^T and P V as warp MMAs on ldmatrix'd K and V^T tiles.
    assert ("mma.sync.aligned.m16n8k16" in ptx and "ldmatrix.sync.aligned" in ptx and ".trans" in ptx) == mma
    # K and V rows arrive by 16-byte cp.async into the ring; the global split merge counts
    # arrivals with an atomic, the cluster merge stores into rank 0's shared memory instead.
    assert "cp.async.cg.shared.global" in ptx and "cp.async.wait_group" in ptx
    assert "shfl.sync.bfly" in ptx and "ex2.approx" in ptx
    assert ("atom." in ptx) == (split and cluster == 1)
    assert ("st.shared::cluster.f32" in ptx and "barrier.cluster.wait" in ptx) == (cluster > 1)
    # Launched as a programmatic dependent launch; with early_trigger it lets the next kernel
    # launch before its own wait (the decode chain runs ahead). The GQA kernel waits before any global read;
    # the SIMT kernel (with cache_seqlens) copies its first K/V steps before the wait (older
    # cache rows do not depend on the kernel ahead), rechecks them against the lengths read
    # after it and reads q only then.
    i_wait = ptx.index("griddepcontrol.wait")
    assert (ptx.index("griddepcontrol.launch_dependents") < i_wait) == early_trigger
    if mma:
        assert "ld.global" not in ptx[:i_wait]
    else:
        assert "cp.async.cg.shared.global" in ptx[:i_wait]
        assert "ld.global" in ptx[i_wait:ptx.index("cp.async.cg.shared.global", i_wait)]  # fresh lengths
    report = _ptxas_report(ptx_path)
    assert not report or "0 bytes spill stores" in report


@pytest.mark.compile
@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
def test_split_kv_compiles_for_sm90a(tmp_path, head_dim):
    from cute_kernels.attention.api import _compile
    from cute_kernels.attention.config import prefill_config
    from tests.test_gemm import _ptxas_report

    _compile(torch.bfloat16, prefill_config(head_dim, 1024), True, True, False, True, keep_dir=str(tmp_path))
    ptx_path = glob.glob(str(tmp_path / "*.ptx"))[0]
    ptx = open(ptx_path).read()
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx
    report = _ptxas_report(ptx_path)
    assert not report or "0 bytes spill stores" in report


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("num_splits", [2, 3, 7])
@pytest.mark.parametrize("seqlens", [(1, 1), (1, 300), (1, 4097), (7, 1000), (300, 300)])
def test_flash_attn_split_kv(causal, num_splits, seqlens):
    import cute_kernels as ck

    sq, sk = seqlens
    q = torch.randn(2, sq, 8, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, sk, 2, 64, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, sk, 2, 64, device="cuda", dtype=torch.bfloat16)
    out, lse = ck.flash_attn(q, k, v, causal=causal, return_lse=True, num_splits=num_splits)
    ref, ref_lse = flash_attn_ref(q.float(), k.float(), v.float(), causal=causal, return_lse=True)
    one = ck.flash_attn(q, k, v, causal=causal)
    e_split = (out.float() - ref).abs().max().item()
    e_one = (one.float() - ref).abs().max().item()
    assert torch.isfinite(out).all() and e_split <= 2 * e_one + 1e-3, (e_split, e_one)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(finite, torch.isfinite(lse)) and (lse[finite] - ref_lse[finite]).abs().max().item() < 1e-2


@pytest.mark.gpu
def test_flash_attn_with_kvcache_split_kv():
    import cute_kernels as ck
    from cute_kernels.attention.reference import flash_attn_with_kvcache_ref

    B, Smax, hq, hkv, D = 4, 3000, 25, 25, 64
    kc = torch.randn(B, Smax, hkv, D, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn(B, Smax, hkv, D, device="cuda", dtype=torch.bfloat16)
    lens = torch.tensor([0, 1, 700, 2999], dtype=torch.int32, device="cuda")
    q = torch.randn(B, 1, hq, D, device="cuda", dtype=torch.bfloat16)
    kn, vn = (torch.randn(B, 1, hkv, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    ref = flash_attn_with_kvcache_ref(q.float(), kc.float().clone(), vc.float().clone(), lens, k_new=kn.float(), v_new=vn.float())
    out = ck.flash_attn_with_kvcache(q, kc, vc, lens, k_new=kn, v_new=vn, num_splits=5)
    assert (out.float() - ref).abs().max().item() < 3e-2


@pytest.mark.gpu
@pytest.mark.parametrize("hq,hkv,D", [(25, 25, 64), (32, 8, 128)])
@pytest.mark.parametrize("num_splits", [1, 4])
def test_decode_key_mask(hq, hkv, D, num_splits):
    """key_mask (HF's static-cache decode mask, padding holes): masked keys are skipped exactly
    like keys past the length; a row with every key masked gives zeros."""
    import cute_kernels as ck

    B, Smax = 3, 1500
    kc, vc = (torch.randn(B, Smax, hkv, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    lens = torch.tensor([1400, 900, 1500], dtype=torch.int32, device="cuda")
    q = torch.randn(B, 1, hq, D, device="cuda", dtype=torch.bfloat16)
    mask = torch.rand(B, Smax, device="cuda") > 0.3
    mask[:, :5] = False  # left padding
    mask[2] = False  # nothing to attend to
    out = ck.flash_attn_with_kvcache(q, kc, vc, lens, key_mask=mask, num_splits=num_splits)
    keep = mask & (torch.arange(Smax, device="cuda")[None, :] < lens[:, None])
    rep = hq // hkv
    kr, vr = kc.float().repeat_interleave(rep, 2), vc.float().repeat_interleave(rep, 2)
    s = torch.einsum("bhd,bkhd->bhk", q[:, 0].float(), kr) * D ** -0.5
    s = s.masked_fill(~keep[:, None, :], float("-inf"))
    ref = torch.einsum("bhk,bkhd->bhd", torch.softmax(s, -1).nan_to_num(0.0), vr)
    assert torch.equal(out[2], torch.zeros_like(out[2]))
    assert (out[:2, 0].float() - ref[:2]).abs().max().item() < 2e-2
    with pytest.raises(ValueError, match="key_mask"):
        ck.flash_attn_with_kvcache(q, kc, vc, lens, key_mask=mask[:, :10])


def _kvcache_sdpa_err(q, kc, vc, lens, ref) -> float:
    """Max error of bf16 SDPA against the fp32 reference, per sequence (the 2x rule's bar)."""
    err = 0.0
    for b, n in enumerate(lens.tolist()):
        if n:
            sd = torch.nn.functional.scaled_dot_product_attention(
                q[b:b + 1].transpose(1, 2), kc[b:b + 1, :n].transpose(1, 2), vc[b:b + 1, :n].transpose(1, 2),
                enable_gqa=q.shape[2] != kc.shape[2]).transpose(1, 2)
            err = max(err, (sd.float() - ref[b:b + 1]).abs().max().item())
    return err


def _check_ragged_decode(D, hq, hkv, Smax, longest, num_splits):
    """Three sequences of 0, 1 and `longest` cached keys through flash_attn_with_kvcache vs the
    fp32 reference: zeros (not NaN) with no keys, error within 2x SDPA's. Returns q, kc, vc
    and SDPA's error."""
    import cute_kernels as ck
    from cute_kernels.attention.reference import flash_attn_with_kvcache_ref

    B = 3
    kc, vc = (torch.randn(B, Smax, hkv, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    lens = torch.tensor([0, 1, longest], dtype=torch.int32, device="cuda")
    q = torch.randn(B, 1, hq, D, device="cuda", dtype=torch.bfloat16)
    ref = flash_attn_with_kvcache_ref(q.float(), kc.float(), vc.float(), lens)
    out = ck.flash_attn_with_kvcache(q, kc, vc, lens, num_splits=num_splits)
    sdpa_err = _kvcache_sdpa_err(q, kc, vc, lens, ref)
    assert torch.equal(out[0], torch.zeros_like(out[0]))  # no keys: zeros, not NaN
    assert (out.float() - ref).abs().max().item() <= 2 * sdpa_err + 1e-3
    return q, kc, vc, sdpa_err


@pytest.mark.gpu
@pytest.mark.parametrize("longest", [1000, 4500])
@pytest.mark.parametrize("batch", [24, 32, 40, 48, 64])
def test_decode_many_waves(longest, batch):
    """Batch 24-64 x 12 heads (288-768 CTAs): the MHA launch-size picks (decode_config's bands:
    128 threads a CTA, 4 rows per thread and step from 3 CTAs a SM, at batch 64 with the short
    cache two KV heads a CTA) on ragged and empty caches, against the fp32 reference."""
    import cute_kernels as ck
    from cute_kernels.attention.config import decode_config
    from cute_kernels.attention.reference import flash_attn_with_kvcache_ref

    B, hq, D, Smax = batch, 12, 64, longest + 3
    cfg = decode_config(D, B * hq, Smax, mha=True)
    short = {24: (2, 256), 32: (2, 128), 40: (2, 128), 48: (4, 128), 64: (4, 128)}  # (unroll, threads)
    long = {24: (2, 128), 32: (2, 128), 40: (4, 256), 48: (4, 256), 64: (4, 256)}
    assert (cfg.unroll, cfg.threads) == (short if longest < 4096 else long)[B]
    kc, vc = (torch.randn(B, Smax, hq, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    lens = torch.randint(0, longest + 1, (B,), dtype=torch.int32, device="cuda")
    lens[0], lens[1], lens[2] = 0, 1, longest
    q = torch.randn(B, 1, hq, D, device="cuda", dtype=torch.bfloat16)
    ref = flash_attn_with_kvcache_ref(q.float(), kc.float(), vc.float(), lens)
    out = ck.flash_attn_with_kvcache(q, kc, vc, lens)
    sdpa_err = _kvcache_sdpa_err(q, kc, vc, lens, ref)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert (out.float() - ref).abs().max().item() <= 2 * sdpa_err + 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("kv_pack", [2, 4])
@pytest.mark.parametrize("seqlens", [False, True])
def test_decode_kv_pack(kv_pack, seqlens):
    """MHA with kv_pack adjacent KV heads a CTA (each thread its own head's softmax), ragged and
    empty caches with seqlens, against the fp32 reference; GQA falls back to one head a CTA."""
    from dataclasses import replace

    from cute_kernels.attention import api
    from cute_kernels.attention.config import decode_config
    from cute_kernels.attention.reference import flash_attn_ref, flash_attn_with_kvcache_ref

    B, hq, D, S = 40, 12, 64, 1000
    cfg = replace(decode_config(D, B * hq, S), kv_pack=kv_pack)
    q = torch.randn(B, 1, hq, D, device="cuda", dtype=torch.bfloat16)
    kc, vc = (torch.randn(B, S, hq, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    lens = None
    if seqlens:
        lens = torch.randint(0, S + 1, (B,), dtype=torch.int32, device="cuda")
        lens[0], lens[1] = 0, S
        ref = flash_attn_with_kvcache_ref(q.float(), kc.float(), vc.float(), lens)
    else:
        ref = flash_attn_ref(q.float(), kc.float(), vc.float())
    out, lse = api._run_decode(q, kc, vc, None, seqlens_k=lens, num_splits=1, config=cfg)
    plain, _ = api._run_decode(q, kc, vc, None, seqlens_k=lens, num_splits=1, config=replace(cfg, kv_pack=1))
    assert (out.float() - ref).abs().max().item() <= 2 * (plain.float() - ref).abs().max().item() + 1e-3
    if seqlens:
        assert torch.equal(out[0], torch.zeros_like(out[0]))
    kg, vg = kc[:, :, :4], vc[:, :, :4]  # GQA 3: one KV head a CTA
    gq, _ = api._run_decode(q, kg, vg, None, num_splits=1, config=cfg)
    assert (gq.float() - flash_attn_ref(q.float(), kg.float(), vg.float())).abs().max().item() < 2e-2


def _check_full_cache_decode(q, kc, vc, num_splits, sdpa_err):
    """flash_attn at S_q = 1 over every cached key, with its LSE, against the fp32 reference."""
    import cute_kernels as ck

    o, lse = ck.flash_attn(q, kc, vc, return_lse=True, num_splits=num_splits)
    ref, ref_lse = flash_attn_ref(q.float(), kc.float(), vc.float(), return_lse=True)
    assert (o.float() - ref).abs().max().item() <= 2 * sdpa_err + 1e-3
    assert (lse - ref_lse).abs().max().item() < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 96, 128, 256])
@pytest.mark.parametrize("hq,hkv", [(12, 12), (32, 8), (8, 1), (12, 4), (48, 4)])
@pytest.mark.parametrize("num_splits", [1, 3, None, 64])
def test_decode_kernel(D, hq, hkv, num_splits):
    """S_q = 1 through decode.py: GQA packing, split merge, ragged and empty caches, LSE."""
    import cute_kernels as ck

    q, kc, vc, _ = _check_ragged_decode(D, hq, hkv, 2100, 2047, num_splits)
    # Plain flash_attn at S_q = 1 (all Sk keys), with its log-sum-exp.
    k, v = kc[:, :1500], vc[:, :1500]
    o2, lse = ck.flash_attn(q, k, v, causal=True, return_lse=True, num_splits=num_splits)
    r2, rlse = flash_attn_ref(q.float(), k.float(), v.float(), causal=True, return_lse=True)
    assert (o2.float() - r2).abs().max().item() < 2e-2
    assert (lse - rlse).abs().max().item() < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("hq,hkv", [(32, 8), (16, 2), (32, 2), (64, 2), (48, 4)])
@pytest.mark.parametrize("num_splits", [1, 5, None])
def test_decode_mma_kernel(monkeypatch, D, hq, hkv, num_splits):
    """The tensor-core decode kernel on every GQA packing (4, 8, 16 heads per CTA; 32 -> two
    CTAs of 16; 12), forced on whatever the shape heuristic would pick: ragged lengths
    (0, 1, a partial last block), splits, LSE through flash_attn."""
    from cute_kernels.attention import api as attn_api

    monkeypatch.setattr(attn_api, "decode_uses_mma", lambda *a, **k: True)
    q, kc, vc, sdpa_err = _check_ragged_decode(D, hq, hkv, 1100, 1037, num_splits)
    _check_full_cache_decode(q, kc, vc, num_splits, sdpa_err)


@pytest.mark.gpu
@pytest.mark.parametrize("cluster_merge", [True, False])
@pytest.mark.parametrize("D,hq,hkv", [(64, 12, 12), (128, 32, 8), (64, 25, 25)])
@pytest.mark.parametrize("num_splits", [2, 5, 8])
def test_decode_split_merges(monkeypatch, cluster_merge, D, hq, hkv, num_splits):
    """Both split merges of the SIMT kernel (inside a thread-block cluster through
    distributed shared memory, or through global memory and a counter) agree with the
    reference: ragged and empty caches, LSE, a NaN key poisoning only its own heads."""
    import cute_kernels as ck
    from cute_kernels.attention import api as attn_api

    monkeypatch.setenv("CUTE_KERNELS_DECODE_CLUSTER", {True: "1", False: "0"}[cluster_merge])
    monkeypatch.setattr(attn_api, "decode_uses_mma", lambda *a, **k: False)
    q, kc, vc, sdpa_err = _check_ragged_decode(D, hq, hkv, 1300, 1237, num_splits)
    _check_full_cache_decode(q, kc, vc, num_splits, sdpa_err)
    kc[1, 700, hkv - 1, 3] = float("nan")
    bad = torch.isnan(ck.flash_attn(q, kc, vc, num_splits=num_splits)).any(-1)[:, 0]
    expect = torch.zeros_like(bad)
    expect[1, (hkv - 1) * (hq // hkv):] = True
    assert torch.equal(bad, expect)


@pytest.mark.compile
def test_append_kv_compiles_for_sm90a(tmp_path):
    from cute_kernels.attention.api import _compile_append

    _compile_append(torch.bfloat16, 128, keep_dir=str(tmp_path))
    ptx = open(glob.glob(str(tmp_path / "*.ptx"))[0]).read()
    assert "ld.global.v4" in ptx and "st.global.v4" in ptx  # 16-byte chunks


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 96, 128, 256])
@pytest.mark.parametrize("s_new", [1, 5])
def test_append_kv_fused_matches_torch(D, s_new):
    """The one-launch append writes exactly what torch indexing writes (strided k_new too),
    returns lens + S_new, drops rows past the capacity, and replays in a CUDA graph."""
    from cute_kernels.attention.api import append_kv, append_kv_fused

    B, Smax, H = 3, 300, 4
    kc, vc = (torch.randn(B, Smax, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k0, v0 = kc.clone(), vc.clone()
    big = torch.randn(B, s_new, 2 * H, D, device="cuda", dtype=torch.bfloat16)
    kn, vn = big[:, :, :H], big[:, :, H:]  # strided views, rows still 16-byte aligned
    lens = torch.tensor([0, 17, Smax - 2], dtype=torch.int32, device="cuda")
    kr, vr = kc.clone(), vc.clone()
    keep = Smax - 2 + s_new <= Smax  # the last sequence overflows when s_new > 2
    if keep:
        append_kv(kr, vr, lens, kn, vn)
    else:
        append_kv(kr[:2], vr[:2], lens[:2], kn[:2], vn[:2])
        kr[2, Smax - 2:], vr[2, Smax - 2:] = kn[2, :2], vn[2, :2]
    out = append_kv_fused(kc, vc, lens, kn, vn)
    assert torch.equal(kc, kr) and torch.equal(vc, vr)
    assert out.tolist() == [min(n + s_new, Smax) for n in lens.tolist()]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o2 = append_kv_fused(kc, vc, lens, kn, vn)
    kc.copy_(k0)
    vc.copy_(v0)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(kc, kr) and torch.equal(vc, vr) and torch.equal(o2, out)


def _late_lengths_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def late_lengths(lens_ptr, new_ptr, B, spin):
        # A programmatic-dependent-launch primary that lets its dependent launch at once and
        # writes the lengths only after a long spin: the decode kernel's early copies see the
        # old lengths and only its post-wait reads see these.
        tl.extra.cuda.gdc_launch_dependents()
        x = tl.load(new_ptr).to(tl.float32)
        for _ in range(spin):
            x = x * 0.999999 + 1e-6
        offs = tl.arange(0, 16)
        new = tl.load(new_ptr + offs, mask=offs < B, other=0)
        tl.store(lens_ptr + offs, tl.where(x > -1.0, new, 0), mask=offs < B)

    return late_lengths


@pytest.mark.gpu
@pytest.mark.parametrize("hq,hkv,D,num_splits", [(25, 25, 64, 1), (25, 25, 64, 4), (12, 12, 64, 3), (12, 12, 64, 2),
                                               (32, 8, 128, 2)])
@pytest.mark.parametrize("early_trigger", [False, True])
def test_decode_lengths_written_by_the_kernel_ahead(hq, hkv, D, num_splits, early_trigger):
    """The decode kernels launch as programmatic dependents and copy their first K/V steps
    before the wait: lengths that the kernel ahead writes late (as the decode loop's
    next-token kernel does) must still be the ones attended to, including lengths that move
    the split ranges (a block boundary crossed) and that grow from zero; unsplit, split with
    the global merge and (12 heads, 2 splits) with the cluster merge."""
    import cute_kernels as ck
    from cute_kernels.attention.reference import flash_attn_with_kvcache_ref

    torch.manual_seed(0)
    B, Smax = 4, 1024
    kc, vc = (torch.randn(B, Smax, hkv, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    q = torch.randn(B, 1, hq, D, device="cuda", dtype=torch.bfloat16)
    old = torch.tensor([255, 0, 511, 700], dtype=torch.int32, device="cuda")
    new = torch.tensor([256, 1, 700, 1024], dtype=torch.int32, device="cuda")
    ref = flash_attn_with_kvcache_ref(q.float(), kc.float(), vc.float(), new)
    late = _late_lengths_kernel()
    lens = old.clone()
    late[(1,)](lens, old, B, 1, launch_pdl=True)  # compile both outside the capture
    ck.flash_attn_with_kvcache(q, kc, vc, lens, num_splits=num_splits, early_trigger=early_trigger)  # compile
    # In a CUDA graph (as the decode loop runs) the decode kernel really launches while the
    # writer spins; eager launches on this stack did not overlap. Before the fix the kernel
    # attended to the old lengths here.
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        late[(1,)](lens, new, B, 200000, launch_pdl=True)
        out = ck.flash_attn_with_kvcache(q, kc, vc, lens, num_splits=num_splits, early_trigger=early_trigger)
    for _ in range(3):
        lens.copy_(old)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(lens, new)
        assert (out.float() - ref).abs().max().item() < 2e-2


@pytest.mark.gpu
def test_decode_nan_stays_in_its_rows_and_graph_replay():
    """A NaN key poisons only the query heads of its KV head in its sequence; the split
    counters reset themselves, so replaying a captured call gives the same answer."""
    import cute_kernels as ck

    B, S, hq, hkv, D = 2, 4000, 32, 8, 128
    q = torch.randn(B, 1, hq, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(B, S, hkv, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k[1, 1234, 5, 7] = float("nan")
    out = ck.flash_attn(q, k, v, num_splits=8)
    bad = torch.isnan(out).any(-1)[:, 0]  # [B, Hq]
    expect = torch.zeros_like(bad)
    expect[1, 5 * 4:6 * 4] = True
    assert torch.equal(bad, expect)
    k[1, 1234, 5, 7] = 0.0
    first = ck.flash_attn(q, k, v, num_splits=8)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o = ck.flash_attn(q, k, v, num_splits=8)
    for _ in range(3):
        o.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(o, first)


def test_wide_suite_shapes_and_best_peer():
    """CPU: the widened suite's shapes (~16k tokens each, 32 query heads on 32 / 8 / 4 KV
    heads) and the best-peer ratio (the faster of cuDNN and FA4 that ran, over ours)."""
    from benchmarks.attention import best_peer_speedups, summarize, wide_shapes
    from benchmarks.common import Row

    shapes = wide_shapes()
    assert len(shapes) == 2 * 6 * 3 and (32, 32, 8, 512, 64) in shapes and (1, 32, 4, 16384, 128) in shapes
    assert all(B * S == 16384 and Hq == 32 and Hq % Hkv == 0 for B, Hq, Hkv, S, _ in shapes)
    with pytest.raises(ValueError, match="GQA ratio"):
        wide_shapes(gqa=(3,))
    rows = [Row("prefill-a", "cute", 1.0), Row("prefill-a", "cudnn", 0.9), Row("prefill-a", "fa4", 1.2),
            Row("prefill-a", "triton", 0.5), Row("prefill-b", "cute", 2.0), Row("prefill-b", "fa4", 2.2)]
    assert best_peer_speedups(rows) == pytest.approx({"prefill-a": 0.9, "prefill-b": 1.1})
    s = summarize(rows)
    assert s["min_speedup_vs_best_peer[prefill]"] == pytest.approx(0.9)


def test_attention_suite_provider_selection_is_checked_on_cpu():
    """--providers: for --wide only, names from the suite's providers, ours among them;
    rejected before any device query."""
    from benchmarks.attention import main

    for argv in (["--providers", "cute,fa4"], ["--wide", "--providers", "cudnn,fa4"],
                 ["--wide", "--providers", "cute,cublas"]):
        with pytest.raises(SystemExit, match="--providers"):
            main(argv)


# ----------------------------------------------------------------------------- FP8 forward


@pytest.mark.compile
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q", [1024, 4096])
def test_fp8_attention_compiles_for_sm90a(tmp_path, head_dim, causal, seqlen_q):
    """e4m3 x e4m3 wgmmas for both products, P rounded to e4m3 in pairs and fed to P V from
    registers (no shared-memory round trip); both configs of prefill_config_fp8 (192-key
    blocks without ping-pong turns at D = 128 from 4096 rows); no spills."""
    from cute_kernels.attention.api import _compile_fp8
    from cute_kernels.attention.config import prefill_config_fp8
    from tests.test_gemm import _ptxas_report

    cfg = prefill_config_fp8(head_dim, seqlen_q, causal)
    _compile_fp8(cfg, causal, keep_dir=str(tmp_path))
    ptx_path = glob.glob(str(tmp_path / "*.ptx"))[0]
    ptx = open(ptx_path).read()
    wgmma = set(re.findall(r"wgmma\.mma_async[.a-z0-9]*", ptx))
    assert all(w.endswith(".e4m3.e4m3") for w in wgmma) and len(wgmma) >= 1, wgmma
    assert f"wgmma.mma_async.sync.aligned.m64n{cfg.n_block}k32.f32.e4m3.e4m3" in wgmma, wgmma
    assert f"wgmma.mma_async.sync.aligned.m64n{head_dim}k32.f32.e4m3.e4m3" in wgmma, wgmma
    # P never goes through shared memory: the one proxy fence is O's, before its TMA store.
    assert "cvt.rn.satfinite.e4m3x2.f32" in ptx and ptx.count("fence.proxy.async") == int(cfg.tma_o)
    report = _ptxas_report(ptx_path)
    assert not report or "0 bytes spill stores" in report
    assert not re.search(r"\(C751\d\)", report or ""), report


def test_fp8_prefill_config():
    from cute_kernels.attention.config import PrefillConfig, prefill_config, prefill_config_fp8

    wide = prefill_config_fp8(128, 4096)
    assert (wide.n_block, wide.pingpong) == (192, False) and prefill_config_fp8(128, 1024).n_block == 128
    # Split by mask: 80 of 96 exp2s before the P V wait without a causal mask, all with one.
    assert wide.exps_before_pv_wait == 80 and prefill_config_fp8(128, 4096, True).exps_before_pv_wait is None
    # D = 64: the 16-bit pick with 4 K/V stages (the 2-stage 192-row tiles were timed on bf16
    # only) and 32 exp2s before the P V wait (the all-after order tied on e4m3).
    assert prefill_config_fp8(64, 4096) == dataclasses.replace(prefill_config(64, 4096), stages=4,
                                                               exps_before_pv_wait=32)
    assert prefill_config(64, 4096).stages == 2 and prefill_config(64, 1024, 1, True).stages == 4
    PrefillConfig(128, n_block=224).validate(in_bytes=1)
    with pytest.raises(ValueError, match="n_block must be one of"):
        PrefillConfig(128, n_block=224).validate()
    with pytest.raises(ValueError, match="accumulators"):
        PrefillConfig(64, 3, n_block=160).validate(in_bytes=1)
    with pytest.raises(ValueError, match="accumulators"):
        PrefillConfig(256, n_block=128).validate()


def test_fp8_attention_validates_inputs():
    import cute_kernels as ck

    f8 = torch.float8_e4m3fn
    q = torch.randn(1, 16, 4, 64).to(f8)
    k = torch.randn(1, 16, 2, 64).to(f8)
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        ck.flash_attn_fp8(q.float(), k, k)
    with pytest.raises(ValueError, match="head dims 64 and 128"):
        ck.flash_attn_fp8(torch.randn(1, 16, 4, 96).to(f8), torch.randn(1, 16, 2, 96).to(f8),
                          torch.randn(1, 16, 2, 96).to(f8))
    with pytest.raises(ValueError, match=r"q_descale must be float32 of shape \(1, 2\)"):
        ck.flash_attn_fp8(q, k, k, q_descale=torch.ones(1, 4))
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        ck.flash_attn_fp8(torch.randn(1, 16, 3, 64).to(f8), k, k)
    with pytest.raises(ValueError, match="v needs unit stride on D"):
        ck.flash_attn_fp8(q, k, torch.randn(1, 16, 64, 2).to(f8).transpose(2, 3))


def test_fp8_references_agree_on_the_cpu():
    """The fp64 reference on the dequantized inputs and the fp32 emulation of the kernel's P
    rounding: close (the emulation's only extra error is P's e4m3 rounding)."""
    from cute_kernels.attention.reference import flash_attn_fp8_emulated, flash_attn_fp8_ref

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 40, h, 64, generator=g).to(torch.float8_e4m3fn) for h in (4, 2, 2))
    qd, kd, vd = (torch.rand(2, 2, generator=g) + 0.5 for _ in range(3))
    for causal in (False, True):
        ref = flash_attn_fp8_ref(q, k, v, q_descale=qd, k_descale=kd, v_descale=vd, causal=causal)
        emu = flash_attn_fp8_emulated(q, k, v, q_descale=qd, k_descale=kd, v_descale=vd, causal=causal)
        err = (emu.double() - ref).abs().max().item()
        assert 0 < err < 0.05 * ref.abs().max().item(), err


def test_quantize_qkv_fp8_on_the_cpu():
    """quantize_qkv_fp8: per (batch, KV head) of k and v, per (batch, KV-head group) of q, the
    largest magnitude lands on e4m3's 448 and every value dequantizes within e4m3's rounding;
    wrong inputs are refused up front."""
    from cute_kernels.attention.api import quantize_qkv_fp8
    from cute_kernels.attention.reference import E4M3_MAX

    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 33, 6, 64, generator=g).bfloat16() * 4
    k = torch.randn(2, 47, 2, 64, generator=g).bfloat16()
    v = torch.randn(2, 47, 2, 64, generator=g).bfloat16() * torch.tensor([0.01, 10.0]).view(1, 1, 2, 1).bfloat16()
    q8, k8, v8, qd, kd, vd = quantize_qkv_fp8(q, k, v)
    for x, x8, d, rep in ((q, q8, qd, 3), (k, k8, kd, 1), (v, v8, vd, 1)):
        assert x8.dtype == torch.float8_e4m3fn and x8.shape == x.shape
        assert d.dtype == torch.float32 and d.shape == (2, 2) and bool((d > 0).all())
        grouped = x8.float().view(2, x.shape[1], 2, rep * 64)
        assert torch.equal(grouped.abs().amax(dim=(1, 3)), torch.full((2, 2), E4M3_MAX))
        deq = (grouped * d[:, None, :, None]).view(x.shape)
        step = d.repeat_interleave(rep, 1)[:, None, :, None] * 2.0 ** -9  # e4m3's subnormal step
        assert bool(((deq - x.float()).abs() <= x.float().abs() / 16 + step).all())
    with pytest.raises(TypeError, match="bfloat16, float16 or float32"):
        quantize_qkv_fp8(q8, k, v)
    with pytest.raises(ValueError, match="Hkv dividing"):
        quantize_qkv_fp8(q[:, :, :5], k, v)
    with pytest.raises(ValueError, match="4-D"):
        quantize_qkv_fp8(q[0], k, v)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads,seqlens", [((8, 8), (1000, 1000)), ((32, 8), (4096, 4096)), ((12, 4), (77, 300)),
                                           ((4, 4), (300, 77))])
def test_fp8_attention_matches_reference(head_dim, causal, heads, seqlens):
    """Error against the fp64 reference on the dequantized inputs within 2x the fp32 emulation
    of the same quantization (P to e4m3 relative to the row max), plus one bf16 ulp of O."""
    import cute_kernels as ck
    from cute_kernels.attention.reference import _dequant, flash_attn_fp8_emulated, flash_attn_fp8_ref

    (hq, hkv), (sq, sk) = heads, seqlens
    f8 = torch.float8_e4m3fn
    q = torch.randn(2, sq, hq, head_dim, device="cuda").to(f8)
    k = torch.randn(2, sk, hkv, head_dim, device="cuda").to(f8)
    v = torch.randn(2, sk, hkv, head_dim, device="cuda").to(f8)
    qd, kd, vd = (torch.rand(2, hkv, device="cuda") * 0.5 + 0.5 for _ in range(3))
    kw = dict(q_descale=qd, k_descale=kd, v_descale=vd, causal=causal)
    out, lse = ck.flash_attn_fp8(q, k, v, return_lse=True, **kw)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    ref = flash_attn_fp8_ref(q, k, v, **kw)
    emu = flash_attn_fp8_emulated(q, k, v, **kw)
    e_ours = (out.double() - ref).abs().max().item()
    e_emu = (emu.double() - ref).abs().max().item()
    assert e_ours <= 2 * e_emu + 2 ** -7 * ref.abs().max().item(), (e_ours, e_emu)
    _, ref_lse = flash_attn_ref(_dequant(q, qd, hq // hkv), _dequant(k, kd, 1), _dequant(v, vd, 1), causal=causal,
                                return_lse=True)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(finite, torch.isfinite(lse))
    assert (lse[finite].double() - ref_lse[finite]).abs().max().item() < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("shapes", [((2, 300, 32, 128), (2, 300, 8, 128)), ((3, 77, 12, 64), (3, 130, 12, 64))])
def test_quantize_qkv_fp8_matches_reference(shapes):
    """The Triton quantizer (fp8_quant.py) against reference.quantize_qkv_fp8_ref: the same
    descales, the same e4m3 bytes but for a rare one-step rounding tie of the division; from
    views of one packed QKV buffer (strided heads)."""
    import cute_kernels as ck
    from cute_kernels.attention.reference import quantize_qkv_fp8_ref

    (B, Sq, Hq, D), (_, Sk, Hkv, _) = shapes
    q = torch.randn(B, Sq, Hq, D, device="cuda", dtype=torch.bfloat16) * 3
    kv = torch.randn(B, Sk, 2, Hkv, D, device="cuda", dtype=torch.bfloat16)
    k, v = kv[:, :, 0] * 0.02, kv[:, :, 1]
    ours, ref = ck.quantize_qkv_fp8(q, k, v), quantize_qkv_fp8_ref(q, k, v)
    for a, b in zip(ours[3:], ref[3:]):
        assert torch.equal(a, b)
    for a, b in zip(ours[:3], ref[:3]):
        assert a.dtype == torch.float8_e4m3fn and a.shape == b.shape and a.is_contiguous()
        assert (a.view(torch.uint8) != b.view(torch.uint8)).float().mean().item() < 1e-4
        assert (a.float() - b.float()).abs().max().item() <= b.float().abs().max().item() / 8


@pytest.mark.compile
@pytest.mark.parametrize("head_dim", [64, 128])
def test_quantize_qkv_fp8_kernels_compile_for_sm90(head_dim):
    """fp8_quant's two Triton kernels build for sm_90 without a GPU: the amax pass reduces with a
    global atomic, the scale pass rounds with the hardware's saturating e4m3 conversion."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from cute_kernels.attention import fp8_quant as fq

    common = {"S": "i32", "H": "i32", "REP": "i32", "stride_b": "i64", "stride_s": "i32", "stride_h": "i32",
              "D": "constexpr", "BLOCK_S": "constexpr"}
    sizes = {"D": head_dim, "BLOCK_S": fq.BLOCK_S}
    amax = ASTSource(fn=fq._amax_kernel, signature={"x_ptr": "*bf16", "amax_ptr": "*fp32", **common}, constexprs=sizes)
    scale = ASTSource(fn=fq._scale_kernel, constexprs={**sizes, "TINY": fq._TINY, "FMAX": fq.E4M3_MAX},
                      signature={"x_ptr": "*bf16", "out_ptr": "*fp8e4nv", "amax_ptr": "*fp32", **common,
                                 "TINY": "constexpr", "FMAX": "constexpr"})
    target = GPUTarget("cuda", 90, 32)
    assert "atom.global" in triton.compile(amax, target=target).asm["ptx"]
    assert "cvt.rn.satfinite.e4m3x2" in triton.compile(scale, target=target).asm["ptx"]


def test_quantize_qkv_fp8_descales_interpreted():
    """fp8_quant's amax pass (Triton, interpreted on the CPU) gives the reference's descales from
    strided views (the interpreter's e4m3 rounding is not the GPU's: the bytes are checked by the
    gpu test above)."""
    from tests.test_gemm_host import _run_interpreted

    _run_interpreted("""
import torch
from cute_kernels.attention.fp8_quant import quantize_qkv
from cute_kernels.attention.reference import quantize_qkv_fp8_ref
qkv = torch.randn(2, 45, 10, 64).bfloat16()
q, k, v = qkv[:, :, :6], qkv[:, :, 6:8] * 5, qkv[:, :, 8:] * 0.01
ours, ref = quantize_qkv(q, k, v), quantize_qkv_fp8_ref(q, k, v)
for a, b in zip(ours, ref):
    assert a.shape == b.shape and a.dtype == b.dtype
for a, b in zip(ours[3:], ref[3:]):
    assert torch.equal(a, b), (a, b)
print("OK")
""")


def test_fp8_vt_matches_reference_interpreted():
    """The FP8 kernel's V^T (Triton, interpreted on the CPU): keys permuted per 32-block, zero
    padding, any input strides (a K/V-interleaved buffer). In a child process: kernels decorated
    while TRITON_INTERPRET is set stay interpreted for the life of the process."""
    from tests.test_gemm_host import _run_interpreted

    _run_interpreted("""
import torch
from cute_kernels.attention.fp8_vt import vt_fp8
from cute_kernels.attention.reference import FP8_KEY_PERM, vt_fp8_ref
assert sorted(FP8_KEY_PERM) == list(range(32))
kv = torch.randn(2, 77, 2, 3, 64).to(torch.float8_e4m3fn)
v = kv[:, :, 1]
out = vt_fp8(v)
ref = vt_fp8_ref(v)
assert out.shape == ref.shape == (2, 3, 64, 96)
assert torch.equal(out.view(torch.uint8), ref.view(torch.uint8))
pad = [k for k in range(64, 96) if 64 + FP8_KEY_PERM[k - 64] >= 77]  # slots of keys past Sk = 77
assert len(pad) == 19 and (out.view(torch.uint8)[..., pad] == 0).all()
print("OK")
""")
