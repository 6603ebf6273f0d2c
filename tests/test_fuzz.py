"""Randomized cases for every public op, checked against the references (gpu tier).

Each case is a pure function of (family, index, CK_FUZZ_SEED): shapes drawn
log-uniformly, including sizes that are not multiples of 8 and the (N, K) of real models'
linears, strided views, GQA ratios, causal masks, ragged caches, optional epilogue
operands. A failure names its draw, so it reproduces with

    CK_FUZZ_SEED=S pytest tests/test_fuzz.py -k "linear and 17"

CK_FUZZ_CASES sets the cases per family (default 12); CK_FUZZ_SEED
draws a different set (default 0). The error rule is the suite's: at most 2x the error of
torch's same-precision op against an fp64 reference (fp8 attention: 2x the error of an fp32
emulation of the same quantization); integer products bit-exact.
"""

from __future__ import annotations

import itertools
import math
import os
import random
import zlib

import pytest
import torch

from cute_kernels.activations import apply as apply_activation
from cute_kernels.tuning.models import MODELS

CASES = int(os.environ.get("CK_FUZZ_CASES", "12"))
SEED = int(os.environ.get("CK_FUZZ_SEED", "0"))
E4M3 = torch.float8_e4m3fn
# The fp64 references hold their operands and the fp32 attention references their score
# matrices: draws above these sizes are drawn again.
MAX_GEMM_MACS = 4e10
MAX_WEIGHT = 1.5e8
MAX_SCORES = 2.5e8
MODEL_NK = sorted({(lin.n, lin.k) for m in MODELS.values() for lin in m.linears()})


def _rng(family: str, index: int) -> random.Random:
    return random.Random(f"{family}/{SEED}/{index}")


def _log_int(r: random.Random, lo: int, hi: int) -> int:
    return max(lo, min(hi, round(math.exp(r.uniform(math.log(lo), math.log(hi + 1))))))


def _mult(r: random.Random, lo: int, hi: int, step: int) -> int:
    return max(step, _log_int(r, lo, hi) // step * step)


# ------------------------------------------------------------------------------ draws (CPU)


def draw_linear(i: int) -> dict:
    r = _rng("linear", i)
    while True:
        m = _log_int(r, 1, 4096)
        pick = r.random()
        if pick < 0.5:
            n, k = r.choice(MODEL_NK)
        elif pick < 0.9:
            n, k = _mult(r, 8, 8192, 8), _mult(r, 16, 8192, 8)
        else:  # rows the TMA cannot take as they are: the padded-copy path
            n, k = _log_int(r, 1, 3000), _log_int(r, 1, 3000)
        if m * n * k <= MAX_GEMM_MACS and n * k <= MAX_WEIGHT:
            break
    residual = r.random() < 0.3
    return dict(m=m, n=n, k=k, dtype=r.choice(["bfloat16", "bfloat16", "float16"]),
                bias=r.random() < 0.5, activation=r.choice([None, "relu", "gelu", "gelu_tanh"]),
                residual=residual, alpha=r.choice([1.0, 1.0, 1.0, 0.5]), beta=r.choice([1.0, 1.0, -0.75]) if residual else 1.0,
                x_view=r.choice(["contiguous", "contiguous", "column_slice", "3d"]))


def draw_gemm(i: int) -> dict:
    r = _rng("gemm", i)
    while True:
        m, n, k = _log_int(r, 1, 4096), _log_int(r, 8, 8192), _mult(r, 16, 8192, 8)
        if r.random() < 0.5:
            n = n // 8 * 8 or 8
        if m * n * k <= MAX_GEMM_MACS:
            break
    return dict(m=m, n=n, k=k, dtype=r.choice(["bfloat16", "float16"]), a_major=r.choice("km"),
                b_major=r.choice("kn"), out=r.choice(["same", "same", "float32"]))


def draw_gemm_config(i: int) -> dict:
    """A config from the space the tuner searches (any of them can win a class and be
    dispatched for every shape of it), on a shape of its own."""
    from benchmarks.compile_sweep import draw_config

    r = _rng("gemm_config", i)
    cfg = draw_config(r, "bf16")
    while True:
        m, n, k = _log_int(r, 1, 4096), _mult(r, 8, 8192, 8), _mult(r, 16, 8192, 8)
        if m * n * k <= MAX_GEMM_MACS:
            return dict(m=m, n=n, k=k, config=cfg, dtype=r.choice(["bfloat16", "float16"]))


def draw_scaled_mm(i: int) -> dict:
    r = _rng("scaled_mm", i)
    while True:
        m = _log_int(r, 1, 4096)
        if r.random() < 0.5:
            n, k = r.choice(MODEL_NK)
            n, k = n // 16 * 16, k // 16 * 16
        else:
            n, k = _mult(r, 16, 8192, 16), _mult(r, 16, 8192, 16)
        if m * n * k <= MAX_GEMM_MACS and n * k <= MAX_WEIGHT:
            break
    return dict(m=m, n=n, k=k, granularity=r.choice(["tensor", "row"]), bias=r.random() < 0.4,
                activation=r.choice([None, None, "relu", "gelu_tanh"]), residual=r.random() < 0.2,
                fast=r.random() < 0.5)


def draw_int8_mm(i: int) -> dict:
    r = _rng("int8_mm", i)
    while True:
        m, n, k = _log_int(r, 1, 4096), _mult(r, 16, 8192, 16), _mult(r, 16, 8192, 16)
        if m * n * k <= MAX_GEMM_MACS:
            break
    scaled = r.random() < 0.5
    return dict(m=m, n=n, k=k, scaled=scaled, bias=scaled and r.random() < 0.5)


def _heads(r: random.Random) -> tuple[int, int]:
    hkv = r.choice([1, 2, 4, 8])
    return hkv * r.choice([1, 1, 2, 4, 7, 8]), hkv


def draw_attention(i: int) -> dict:
    r = _rng("attention", i)
    while True:
        b = r.choice([1, 1, 2, 3])
        hq, hkv = _heads(r)
        d = r.choice([64, 128])
        if r.random() < 0.3:  # decode: one query row against a long cache
            sq, sk = 1, _log_int(r, 1, 20000)
        else:
            sq = _log_int(r, 2, 3000)
            sk = sq if r.random() < 0.5 else _log_int(r, 1, 4000)
        if b * hq * sq * sk <= MAX_SCORES:
            break
    return dict(b=b, sq=sq, sk=sk, hq=hq, hkv=hkv, d=d, causal=r.random() < 0.5,
                layout=r.choice(["bshd", "bshd", "hf_view"]), scale=r.choice([None, None, None, 0.11]))


def draw_kvcache(i: int) -> dict:
    r = _rng("kvcache", i)
    b = r.choice([1, 2, 3, 4])
    hq, hkv = _heads(r)
    s_new = 1 if r.random() < 0.7 else _log_int(r, 2, 16)
    smax = _log_int(r, s_new + 1, 6000)
    lens = [r.randint(0, smax - s_new) for _ in range(b)]
    return dict(b=b, hq=hq, hkv=hkv, d=r.choice([64, 128]), s_new=s_new, smax=smax, lens=lens,
                append=r.random() < 0.6)


def draw_attention_fp8(i: int) -> dict:
    r = _rng("attention_fp8", i)
    while True:
        b = r.choice([1, 2])
        hkv = r.choice([1, 2, 4, 8])
        hq = hkv * r.choice([1, 4, 8])
        sq = _log_int(r, 2, 3000)
        sk = sq if r.random() < 0.5 else _log_int(r, 1, 4000)
        if b * hq * sq * sk <= MAX_SCORES:
            break
    return dict(b=b, sq=sq, sk=sk, hq=hq, hkv=hkv, d=r.choice([64, 128]), causal=r.random() < 0.5,
                descale=r.random() < 0.7)


def draw_swiglu(i: int) -> dict:
    r = _rng("swiglu", i)
    while True:
        m = _log_int(r, 1, 4096)
        if r.random() < 0.5:
            shape = r.choice([s for s in MODELS.values() if s.gated])
            n, k = shape.intermediate, shape.hidden
        else:
            n, k = _mult(r, 32, 14336, 32), _mult(r, 16, 8192, 8)
        if 2 * m * n * k <= MAX_GEMM_MACS and 2 * n * k <= MAX_WEIGHT:
            break
    return dict(m=m, n=n, k=k, dtype=r.choice(["bfloat16", "bfloat16", "float16"]))


def draw_layernorm_linear(i: int) -> dict:
    r = _rng("layernorm_linear", i)
    m = r.randint(1, 8) if r.random() < 0.5 else _log_int(r, 1, 4096)  # <= 8 rows: the fused prologue
    k = r.choice([768, 1024, 1280, 1600]) if r.random() < 0.6 else _mult(r, 16, 4096, 8)
    n = _log_int(r, 8, 8192) // 8 * 8 or 8
    return dict(m=m, n=n, k=k, dtype=r.choice(["bfloat16", "float16"]), bias=r.random() < 0.5,
                activation=r.choice([None, "gelu_tanh"]))


def draw_scaled_mm_blockwise(i: int) -> dict:
    r = _rng("scaled_mm_blockwise", i)
    while True:
        m, k = _log_int(r, 1, 4096), _mult(r, 16, 8192, 16)
        n = _log_int(r, 16, 8192) if r.random() < 0.3 else _mult(r, 16, 8192, 16)
        if m * n * k <= MAX_GEMM_MACS:
            break
    return dict(m=m, n=n, k=k, m_major=r.random() < 0.7, bias=r.random() < 0.3)


def draw_varlen(i: int) -> dict:
    r = _rng("varlen", i)
    while True:
        hq, hkv = _heads(r)
        q_lens = [0 if r.random() < 0.15 else _log_int(r, 1, 1500) for _ in range(r.randint(1, 5))]
        k_lens = [q if r.random() < 0.6 else _log_int(r, 1, 2000) for q in q_lens]
        if hq * sum(a * b for a, b in zip(q_lens, k_lens)) <= MAX_SCORES:
            break
    return dict(hq=hq, hkv=hkv, d=r.choice([64, 128]), q_lens=q_lens, k_lens=k_lens, causal=r.random() < 0.5)


DRAWS = {"linear": draw_linear, "gemm": draw_gemm, "scaled_mm": draw_scaled_mm, "int8_mm": draw_int8_mm,
         "attention": draw_attention, "kvcache": draw_kvcache, "attention_fp8": draw_attention_fp8,
         "gemm_config": draw_gemm_config, "swiglu": draw_swiglu, "layernorm_linear": draw_layernorm_linear,
         "scaled_mm_blockwise": draw_scaled_mm_blockwise, "varlen": draw_varlen}


def test_draws_are_reproducible_and_in_range():
    for family, draw in DRAWS.items():
        for i in range(max(CASES, 24)):
            d = draw(i)
            assert d == draw(i), family
            if "m" in d:
                assert d["m"] >= 1 and d["n"] >= 1 and d["k"] >= 1
                assert d["m"] * d["n"] * d["k"] <= MAX_GEMM_MACS
            if family in ("scaled_mm", "int8_mm"):
                assert d["k"] % 16 == 0 and d["n"] % 16 == 0
            if family == "swiglu":
                assert d["n"] % 32 == 0
            if family == "varlen":
                assert len(d["q_lens"]) == len(d["k_lens"]) >= 1
            if family == "kvcache":
                assert all(0 <= n_ <= d["smax"] - d["s_new"] for n_ in d["lens"])
            if "hq" in d:
                assert d["hq"] % d["hkv"] == 0


def test_compile_sweep_draws_valid_configs_and_epilogues():
    from benchmarks.compile_sweep import draw_config, draw_epilogue

    for dtype, in_bytes in (("bf16", 2), ("fp8", 1), ("int8", 1)):
        r = random.Random(dtype)
        for _ in range(200):
            cfg = draw_config(r, dtype)
            cfg.validate(in_bytes, 2, integer=dtype == "int8")
            epi = draw_epilogue(r, cfg, dtype)
            if cfg.swap_ab:
                assert not {"bias", "residual", "activation"} & set(epi)
            if cfg.tile_m == 192:
                assert "residual" not in epi
            assert ("row_scale" in epi) == (dtype != "bf16")


# ------------------------------------------------------------------------------ gpu tier


def _close(ours: torch.Tensor, theirs: torch.Tensor, ref: torch.Tensor, case: dict, slack: float = 1e-6) -> None:
    assert torch.isfinite(ours).all(), f"non-finite output for {case}"
    ref = ref.double()
    e_ours = (ours.double() - ref).abs().max().item() if ours.numel() else 0.0
    e_theirs = (theirs.double() - ref).abs().max().item() if ours.numel() else 0.0
    scale = ref.abs().max().item() if ours.numel() else 0.0
    assert e_ours <= 2 * e_theirs + slack * max(scale, 1.0), \
        f"error {e_ours:.4g} vs torch {e_theirs:.4g} (|ref| max {scale:.3g}) for {case}"


def _gen(family: str, i: int) -> torch.Generator:
    g = torch.Generator(device="cuda")
    g.manual_seed(zlib.crc32(f"{family}/{SEED}/{i}".encode()))
    return g


def _randn(g, *shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device="cuda", generator=g).to(dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("i", range(CASES))
def test_linear(i):
    import cute_kernels as ck

    c = draw_linear(i)
    g, dt = _gen("linear", i), getattr(torch, c["dtype"])
    m, n, k = c["m"], c["n"], c["k"]
    if c["x_view"] == "column_slice":
        x = _randn(g, m, k + 24, dtype=dt)[:, :k]
    elif c["x_view"] == "3d" and m % 2 == 0:
        x = _randn(g, 2, m // 2, k, dtype=dt)
    else:
        x = _randn(g, m, k, dtype=dt)
    w = _randn(g, n, k, dtype=dt) / math.sqrt(k)
    bias = _randn(g, n, dtype=dt) if c["bias"] else None
    res = _randn(g, *x.shape[:-1], n, dtype=dt) if c["residual"] else None
    out = ck.linear(x, w, bias, activation=c["activation"], residual=res, alpha=c["alpha"], beta=c["beta"])
    assert out.shape == (*x.shape[:-1], n) and out.dtype == dt

    def chain(xx, ww, bb, rr, to):
        t = torch.nn.functional.linear(xx, ww) * c["alpha"]
        if bb is not None:
            t = t + bb
        t = apply_activation(t.to(to), c["activation"]).to(to)
        return t if rr is None else t + c["beta"] * rr

    f64 = torch.float64
    ref = chain(x.to(f64), w.to(f64), None if bias is None else bias.to(f64), None if res is None else res.to(f64), f64)
    # torch eager in the same precision: each op rounds to the input dtype
    t = torch.nn.functional.linear(x, w) * c["alpha"]
    if bias is not None:
        t = t + bias
    t = apply_activation(t.float(), c["activation"]).to(dt)
    theirs = t if res is None else t + c["beta"] * res
    _close(out, theirs, ref, c)


@pytest.mark.gpu
@pytest.mark.parametrize("i", range(CASES))
def test_gemm(i):
    import cute_kernels as ck

    c = draw_gemm(i)
    g, dt = _gen("gemm", i), getattr(torch, c["dtype"])
    m, n, k = c["m"], c["n"], c["k"]
    a = _randn(g, m, k, dtype=dt) if c["a_major"] == "k" else _randn(g, k, m, dtype=dt).t()
    b = _randn(g, k, n, dtype=dt) if c["b_major"] == "n" else _randn(g, n, k, dtype=dt).t()
    out_dtype = dt if c["out"] == "same" else torch.float32
    out = ck.gemm(a, b, out_dtype=out_dtype)
    assert out.shape == (m, n) and out.dtype == out_dtype
    ref = a.double() @ b.double()
    theirs = a @ b
    if out_dtype != dt:
        # An fp32 output shows the accumulation itself. Tensor cores add their products into
        # fp32 with truncation; cuBLAS's error here depends on its kernel (H200, ours vs
        # cuBLAS, max error: 332 x 56 x 1176 2.3e-4 vs 2.3e-4 unsplit, 3.7e-5 once it splits
        # K; 2 x 2733 x 1776 3.4e-4 vs 6.7e-5 on gemmSN's fp32 FMAs). The budget is the larger
        # of cuBLAS's error and that of one fp32 accumulator over K that truncates each add.
        try:
            theirs = torch.mm(a, b, out_dtype=torch.float32)
        except (TypeError, RuntimeError):  # a torch without mm(out_dtype=)
            theirs = theirs.float()
        acc = torch.zeros(m, n, dtype=torch.float64, device="cuda")
        ad, bd = a.double(), b.double()
        for k0 in range(0, k, 16):
            acc = _round_to_zero_f32(acc + ad[:, k0:k0 + 16] @ bd[k0:k0 + 16]).double()
        if (acc - ref).abs().max() > (theirs.double() - ref).abs().max():
            theirs = acc
    _close(out, theirs, ref, c)


def _round_to_zero_f32(x: torch.Tensor) -> torch.Tensor:
    """fp64 -> fp32 rounded toward zero."""
    y = x.float()
    over = y.double().abs() > x.abs()
    return torch.where(over, torch.nextafter(y, torch.zeros_like(y)), y)


@pytest.mark.gpu
@pytest.mark.parametrize("i", range(CASES))
def test_gemm_config(i):
    import cute_kernels as ck

    c = draw_gemm_config(i)
    g, dt = _gen("gemm_config", i), getattr(torch, c["dtype"])
    a = _randn(g, c["m"], c["k"], dtype=dt)
    b = _randn(g, c["n"], c["k"], dtype=dt).t()
    out = ck.gemm(a, b, config=c["config"])
    _close(out, a @ b, a.double() @ b.double(), c)


@pytest.mark.gpu
@pytest.mark.parametrize("i", range(CASES))
def test_scaled_mm(i):
    import cute_kernels as ck
    from tests.test_quantized_gemm import _quant_fp8

    c = draw_scaled_mm(i)
    g = _gen("scaled_mm", i)
    m, n, k = c["m"], c["n"], c["k"]
    dim = None if c["granularity"] == "tensor" else 1
    a, sa = _quant_fp8(torch.randn(m, k, device="cuda", generator=g), dim)
    wq, sw = _quant_fp8(torch.randn(n, k, device="cuda", generator=g), dim)
    b, sb = wq.t(), (sw.reshape(1, -1) if dim else sw)
    bias = _randn(g, n) if c["bias"] else None
    res = _randn(g, m, n) if c["residual"] else None
    out = ck.scaled_mm(a, b, sa, sb, bias=bias, activation=c["activation"], residual=res,
                       out_dtype=torch.bfloat16, use_fast_accum=c["fast"])
    assert out.shape == (m, n) and out.dtype == torch.bfloat16
    ref = (a.double() * sa.double()) @ (b.double() * sb.double())
    if bias is not None:
        ref = ref + bias.double()
    ref = apply_activation(ref, c["activation"])
    if res is not None:
        ref = ref + res.double()
    try:
        t = torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=torch.bfloat16, use_fast_accum=c["fast"])
        t = apply_activation(t.float(), c["activation"]).to(torch.bfloat16)
        theirs = t if res is None else t + res
    except RuntimeError:  # shapes cuBLASLt refuses: hold ours to one bf16 rounding of the output
        theirs = ref.to(torch.bfloat16)
    _close(out, theirs, ref, c, slack=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("i", range(CASES))
def test_int8_mm(i):
    import cute_kernels as ck

    c = draw_int8_mm(i)
    g = _gen("int8_mm", i)
    m, n, k = c["m"], c["n"], c["k"]
    a = torch.randint(-128, 128, (m, k), device="cuda", dtype=torch.int8, generator=g)
    b = torch.randint(-128, 128, (n, k), device="cuda", dtype=torch.int8, generator=g).t()
    exact = a.double() @ b.double()  # |sum| < 2^31 and exact in fp64 for K <= 8192
    if not c["scaled"]:
        out = ck.int8_mm(a, b)
        assert out.dtype == torch.int32 and out.shape == (m, n)
        assert torch.equal(out, exact.to(torch.int32)), f"int8_mm not bit-exact for {c}"
        return
    sa = torch.rand(m, 1, device="cuda", generator=g) / 100 + 1e-4
    sb = torch.rand(1, n, device="cuda", generator=g) / 100 + 1e-4
    bias = _randn(g, n) if c["bias"] else None
    out = ck.int8_mm(a, b, sa, sb, bias=bias)
    ref = exact * sa.double() * sb.double() + (0 if bias is None else bias.double())
    _close(out, ref.to(torch.bfloat16), ref, c)


def _sdpa(q, k, v, causal, scale):
    """torch's bf16 SDPA on the same inputs, bottom-right causal through an explicit mask."""
    sq, sk, rep = q.shape[1], k.shape[1], q.shape[2] // k.shape[2]
    mask = None
    if causal:
        mask = torch.arange(sk, device="cuda")[None, :] <= torch.arange(sq, device="cuda")[:, None] + sk - sq
    return torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2).repeat_interleave(rep, 1), v.transpose(1, 2).repeat_interleave(rep, 1),
        attn_mask=mask, scale=scale).transpose(1, 2).nan_to_num(0.0)


@pytest.mark.gpu
@pytest.mark.parametrize("i", range(CASES))
def test_flash_attn(i):
    import cute_kernels as ck
    from cute_kernels.attention.reference import flash_attn_ref

    c = draw_attention(i)
    g = _gen("attention", i)
    b, sq, sk, hq, hkv, d = c["b"], c["sq"], c["sk"], c["hq"], c["hkv"], c["d"]
    if c["layout"] == "hf_view":  # transformers hands over [B, H, S, D].transpose(1, 2)
        q = _randn(g, b, hq, sq, d).transpose(1, 2)
        k, v = (_randn(g, b, hkv, sk, d).transpose(1, 2) for _ in range(2))
    else:
        q = _randn(g, b, sq, hq, d)
        k, v = (_randn(g, b, sk, hkv, d) for _ in range(2))
    out, lse = ck.flash_attn(q, k, v, causal=c["causal"], softmax_scale=c["scale"], return_lse=True)
    assert out.shape == (b, sq, hq, d) and out.dtype == torch.bfloat16
    ref, ref_lse = flash_attn_ref(q.double(), k.double(), v.double(), causal=c["causal"], softmax_scale=c["scale"],
                                  return_lse=True)
    _close(out, _sdpa(q, k, v, c["causal"], c["scale"]), ref, c, slack=1e-3)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(finite, torch.isfinite(lse)), f"LSE -inf rows differ for {c}"
    if finite.any():
        assert (lse[finite].double() - ref_lse[finite]).abs().max().item() < 1e-2, f"LSE off for {c}"


@pytest.mark.gpu
@pytest.mark.parametrize("i", range(CASES))
def test_flash_attn_with_kvcache(i):
    import cute_kernels as ck
    from cute_kernels.attention.reference import flash_attn_ref

    c = draw_kvcache(i)
    g = _gen("kvcache", i)
    b, hq, hkv, d, s_new, smax = c["b"], c["hq"], c["hkv"], c["d"], c["s_new"], c["smax"]
    kc, vc = (_randn(g, b, smax, hkv, d) for _ in range(2))
    q = _randn(g, b, s_new, hq, d)
    kn, vn = (_randn(g, b, s_new, hkv, d) for _ in range(2)) if c["append"] else (None, None)
    lens = torch.tensor(c["lens"], dtype=torch.int32, device="cuda")
    kc0, vc0 = kc.clone(), vc.clone()
    out = ck.flash_attn_with_kvcache(q, kc, vc, lens, k_new=kn, v_new=vn)
    assert out.shape == q.shape
    for s in range(b):
        n0 = c["lens"][s]
        if c["append"]:
            assert torch.equal(kc[s, n0:n0 + s_new], kn[s]) and torch.equal(vc[s, n0:n0 + s_new], vn[s]), \
                f"append wrote the wrong cache rows for {c}"
            seen = n0 + s_new
        else:
            seen = n0
        # nothing but the appended rows may change
        untouched = torch.ones(smax, dtype=torch.bool, device="cuda")
        if c["append"]:
            untouched[n0:n0 + s_new] = False
        assert torch.equal(kc[s][untouched], kc0[s][untouched]) and torch.equal(vc[s][untouched], vc0[s][untouched])
        ks, vs, qs = kc[s:s + 1, :seen], vc[s:s + 1, :seen], q[s:s + 1]
        if seen == 0:
            assert (out[s] == 0).all(), f"empty cache must give zeros for {c}"
            continue
        ref = flash_attn_ref(qs.double(), ks.double(), vs.double(), causal=True)  # bottom-right, as the cache's
        _close(out[s:s + 1], _sdpa(qs, ks, vs, True, None), ref, c, slack=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("i", range(CASES))
def test_flash_attn_fp8(i):
    import cute_kernels as ck
    from cute_kernels.attention.reference import flash_attn_fp8_emulated, flash_attn_fp8_ref

    c = draw_attention_fp8(i)
    g = _gen("attention_fp8", i)
    b, sq, sk, hq, hkv, d = c["b"], c["sq"], c["sk"], c["hq"], c["hkv"], c["d"]
    q8 = (torch.randn(b, sq, hq, d, device="cuda", generator=g) * 2).to(E4M3)
    k8, v8 = ((torch.randn(b, sk, hkv, d, device="cuda", generator=g) * 2).to(E4M3) for _ in range(2))
    kw = dict(causal=c["causal"])
    if c["descale"]:
        kw.update({n: torch.rand(b, hkv, device="cuda", generator=g) * 0.5 + 0.25
                   for n in ("q_descale", "k_descale", "v_descale")})
    out = ck.flash_attn_fp8(q8, k8, v8, **kw)
    assert out.shape == (b, sq, hq, d) and out.dtype == torch.bfloat16
    ref = flash_attn_fp8_ref(q8, k8, v8, **kw)
    emu = flash_attn_fp8_emulated(q8, k8, v8, **kw)
    assert torch.isfinite(out).all(), f"non-finite output for {c}"
    e_ours = (out.double() - ref).abs().max().item()
    e_emu = (emu.double() - ref).abs().max().item()
    # the emulation keeps fp32 outputs: one bf16 rounding of |O| max on top
    assert e_ours <= 2 * e_emu + ref.abs().max().item() / 256, f"error {e_ours:.4g} vs emulation {e_emu:.4g} for {c}"


@pytest.mark.gpu
@pytest.mark.parametrize("i", range(CASES))
def test_swiglu_linear(i):
    import cute_kernels as ck

    c = draw_swiglu(i)
    g, dt = _gen("swiglu", i), getattr(torch, c["dtype"])
    m, n, k = c["m"], c["n"], c["k"]
    x = _randn(g, m, k, dtype=dt)
    gate_up = _randn(g, 2 * n, k, dtype=dt) / math.sqrt(k)
    out = ck.swiglu_linear(x, gate_up)
    assert out.shape == (m, n) and out.dtype == dt
    xd, wd = x.double(), gate_up.double()
    ref = torch.nn.functional.silu(xd @ wd[:n].t()) * (xd @ wd[n:].t())
    _close(out, ck.swiglu_linear_ref(x, gate_up), ref, c)


@pytest.mark.gpu
@pytest.mark.parametrize("i", range(CASES))
def test_layernorm_linear(i):
    import cute_kernels as ck

    c = draw_layernorm_linear(i)
    g, dt = _gen("layernorm_linear", i), getattr(torch, c["dtype"])
    m, n, k = c["m"], c["n"], c["k"]
    x = _randn(g, m, k, dtype=dt) * 3 + 0.5
    lw = (_randn(g, k) * 0.2 + 1).to(dt)
    lb = (_randn(g, k) * 0.1).to(dt)
    w = _randn(g, n, k, dtype=dt) / math.sqrt(k)
    bias = _randn(g, n, dtype=dt) if c["bias"] else None
    out = ck.layernorm_linear(x, lw, lb, w, bias, activation=c["activation"])
    assert out.shape == (m, n) and out.dtype == dt

    def run(xx, ww, lww, lbb, bb, to):
        h = torch.nn.functional.layer_norm(xx, (k,), lww, lbb, 1e-5)
        t = torch.nn.functional.linear(h, ww, bb)
        return apply_activation(t.double() if to is torch.float64 else t.float(), c["activation"]).to(to)

    ref = run(x.double(), w.double(), lw.double(), lb.double(), None if bias is None else bias.double(), torch.float64)
    _close(out, run(x, w, lw, lb, bias, dt), ref, c)


@pytest.mark.gpu
@pytest.mark.parametrize("i", range(CASES))
def test_scaled_mm_blockwise(i):
    import cute_kernels as ck
    import quant

    c = draw_scaled_mm_blockwise(i)
    g = _gen("scaled_mm_blockwise", i)
    m, n, k = c["m"], c["n"], c["k"]
    # magnitudes spread over the K groups and the weight rows, so the block scales differ
    spread = torch.logspace(-2, 2, k, device="cuda")[torch.randperm(k, device="cuda", generator=g)]
    x = torch.randn(m, k, device="cuda", generator=g) * spread
    w = torch.randn(n, k, device="cuda", generator=g) * (torch.rand(n, 1, device="cuda", generator=g) * 4 + 0.1)
    a, sa = quant.quantize_fp8(x, "block")
    b, sb = quant.quantize_weight_fp8_block(w)
    if not c["m_major"]:
        sa = sa.contiguous()
    bias = _randn(g, n) if c["bias"] else None
    out = ck.scaled_mm_blockwise(a, b, sa, sb, bias=bias)
    assert out.shape == (m, n) and out.dtype == torch.bfloat16
    ref = ck.scaled_mm_blockwise_ref(a, b, sa, sb, bias=bias, out_dtype=torch.float32)
    # exactly the dequantized products: the output's bf16 rounding is the error budget
    _close(out, ref.to(torch.bfloat16), ref, c, slack=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("i", range(CASES))
def test_flash_attn_varlen(i):
    import cute_kernels as ck

    c = draw_varlen(i)
    g = _gen("varlen", i)
    hq, hkv, d = c["hq"], c["hkv"], c["d"]
    tq, tk = sum(c["q_lens"]), sum(c["k_lens"])
    q = _randn(g, tq, hq, d)
    k, v = (_randn(g, tk, hkv, d) for _ in range(2))
    cu_q = torch.tensor([0, *itertools.accumulate(c["q_lens"])], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, *itertools.accumulate(c["k_lens"])], dtype=torch.int32, device="cuda")
    out = ck.flash_attn_varlen(q, k, v, cu_q, cu_k, max(c["q_lens"]), max(c["k_lens"]), causal=c["causal"])
    assert out.shape == q.shape
    from cute_kernels.attention.reference import flash_attn_ref

    for s, (qs, ks) in enumerate(zip(cu_q.tolist()[:-1], cu_k.tolist()[:-1])):
        nq, nk = c["q_lens"][s], c["k_lens"][s]
        if nq == 0:
            continue
        qq, kk, vv = q[None, qs:qs + nq], k[None, ks:ks + nk], v[None, ks:ks + nk]
        ref = flash_attn_ref(qq.double(), kk.double(), vv.double(), causal=c["causal"])
        _close(out[None, qs:qs + nq], _sdpa(qq, kk, vv, c["causal"], None), ref, dict(c, sequence=s), slack=1e-3)
