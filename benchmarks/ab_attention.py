"""Same-run A/B of the prefill attention kernel's schedule options (api.SCHEDULE's candidates).

    python -m benchmarks.ab_attention build   # any machine, CPU is enough: compile every variant
    python -m benchmarks.ab_attention         # on the GPU: time them side by side

`build` exports each variant's compiled kernel to build/ab_attention/ (~5 MB); a GPU run loads
those objects instead of compiling (carry `build` to the GPU machine), and compiles whatever
does not load. Every variant runs on the same inputs in the same process, three rounds
interleaved, best of the rounds. Printed per shape: TFLOP/s of each variant, `DIFF` where its
output is not bit-identical to the current schedule's, each variant's max error against an
fp32 reference on a slice (batch 0, heads 0-1), since rowsum_mma changes the rounding, and, in
the same rounds, SDPA's cuDNN backend and FlashAttention-4 where importable (the bars' references).
"""

from __future__ import annotations

import os
import sys

import torch

from cute_kernels.attention import api
from cute_kernels.attention.kernel import softmax_scale_log2

# name -> FlashAttnFwdSm90 schedule options ("base" is the current default schedule).
VARIANTS = {
    "base": {},
    "kahead": dict(k_ahead=True),
    "vrel": dict(release_v_early=True),
    "kv": dict(k_ahead=True, release_v_early=True),
    "rsum": dict(rowsum_mma=True),
    "rsum_kv": dict(rowsum_mma=True, k_ahead=True, release_v_early=True),
    "st3": dict(stages=3),  # D = 128 only: three K/V stages fill 225 KB of smem
    "st3_kv": dict(stages=3, k_ahead=True, release_v_early=True),
    "st3_all": dict(stages=3, k_ahead=True, release_v_early=True, rowsum_mma=True),  # 232448 B: the smem limit
}
D64_SKIP = ("st3", "st3_kv", "st3_all")  # D = 64 already runs four stages
SHAPES = [(2, 16, 8192, 128), (8, 16, 2048, 128), (4, 16, 4096, 128), (16, 12, 1024, 64), (4, 32, 4096, 64)]
OBJ_DIR = os.path.join("build", "ab_attention")


def _configs():
    for (B, H, S, D) in SHAPES:
        wg = api.mma_warpgroups(D, S)
        for causal in (False, True):
            for name, sched in VARIANTS.items():
                if not (D == 64 and name in D64_SKIP):
                    yield (B, H, S, D), causal, wg, name, sched


def _obj(D: int, causal: bool, wg: int, name: str) -> str:
    return os.path.join(OBJ_DIR, f"{name}_d{D}_c{int(causal)}_w{wg}.o")


def build() -> None:
    os.makedirs(OBJ_DIR, exist_ok=True)
    done = set()
    for (_, _, _, D), causal, wg, name, sched in _configs():
        path = _obj(D, causal, wg, name)
        if path not in done:
            api._compile(torch.bfloat16, D, causal, num_mma_wg=wg, schedule=sched).export_to_c(
                path, function_name="kernel")
            done.add(path)
            print("built", path, flush=True)


def _load(cache: dict, D: int, causal: bool, wg: int, name: str, sched: dict):
    key = (D, causal, wg, name)
    if key not in cache:
        import cutlass.cute as cute

        try:
            cache[key] = cute.runtime.load_module(_obj(*key), enable_tvm_ffi=True)["kernel"]
        except Exception as e:  # not built, or built from other sources: compile here
            print(f"compiling {key} ({type(e).__name__})", flush=True)
            cache[key] = api._compile(torch.bfloat16, D, causal, num_mma_wg=wg, schedule=sched)
    return cache[key]


def _run(fn, q, k, v, sms: int):
    B, Sq, Hq, D = q.shape
    out = torch.empty_like(q)
    lse = torch.empty((B, Hq, Sq), dtype=torch.float32, device=q.device)
    ratio = Hq // k.shape[2]
    fn(q, k, v, out, lse, None, None, softmax_scale_log2(D, None), ratio, sms,
       api.heads_per_group(k.shape[1], D, ratio))
    return out


def bench() -> None:
    from .attention import providers
    from .common import time_ms

    refs = {n: f for n, f in providers().items() if n in ("cudnn", "fa4")}
    cache: dict = {}
    for (B, H, S, D) in SHAPES:
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        wg = api.mma_warpgroups(D, S)
        qs, ks, vs = (t[:1, :, :2].float().transpose(1, 2) for t in (q, k, v))
        for causal in (False, True):
            flops = 4 * B * H * S * S * D / (2 if causal else 1)
            sms = api.num_sms(0) if (not causal) or S <= api.PERSISTENT_CAUSAL_MAX_SK else 1 << 30
            gold = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=causal).transpose(1, 2)
            names = [(n, s) for n, s in VARIANTS.items() if not (D == 64 and n in D64_SKIP)]
            best, same, err, ref = {}, {}, {}, None
            for rnd in range(3):
                for name, sched in names:
                    fn = _load(cache, D, causal, wg, name, sched)
                    if rnd == 0:
                        o = _run(fn, q, k, v, sms)
                        ref = o.clone() if ref is None else ref
                        same[name] = torch.equal(o, ref)
                        err[name] = (o[:1, :, :2].float() - gold).abs().max().item()
                    t = time_ms(lambda i: _run(fn, q, k, v, sms))
                    best[name] = min(best.get(name, float("inf")), t)
                for name, ref_fn in refs.items():
                    try:
                        t = time_ms(lambda i: ref_fn(q, k, v, causal))
                    except Exception as e:  # noqa: BLE001 - a reference that cannot run is left out
                        print(f"    {name} not timed: {type(e).__name__}: {e}")
                        continue
                    best[name] = min(best.get(name, float("inf")), t)
            print(f"{B}x{H}x{S}x{D}{' causal' if causal else ''}: " + "  ".join(
                f"{n} {flops / t / 1e9:.1f}{'' if same.get(n, True) else ' DIFF'}" for n, t in best.items()), flush=True)
            print("    max err vs fp32 (b0, h0-1): " + "  ".join(f"{n} {e:.1e}" for n, e in err.items()), flush=True)


if __name__ == "__main__":
    build() if sys.argv[1:] == ["build"] else bench()
