"""Decode-size products on wide weights: the skinny GEMV against 64 x 16 swap_ab tiles.

    python -m benchmarks.skinny_heads [--shapes NxK,...] [--norm-shapes NxK,...] [--m 1,2,8]
                                      [--models llama-3-8b,gpt2-xl] [--batches 1,8] [--no-decode] [--no-write]

What `heuristics.WIDE_DECODE_TILES` decides, measured three ways in one run:

- plain products at one row (`--shapes`): the skinny GEMV (`gemv.skinny_gemm`, one-row form)
  against the 64-row swap_ab tiles dispatch picks with the GEMV left out (`gemm(config=)`), and
  cuBLAS (`F.linear`);
- a norm before a wide product (`--norm-shapes` x `--m` rows: the lm_heads): RMSNorm and
  LayerNorm in the GEMV's prologue (one launch) against the norm's own launch and then the tiles;
- the decode step (`--models` x `--batches`, random weights, CUDA graph, 63 tokens after a
  128-token prompt): `WIDE_DECODE_TILES` on and off, each decoder built three times in
  alternating order, the fastest of each kept; the greedy tokens of both are compared.

Kernel timings use the suites' one helper (CUDA-graph replays, weights rotated through L2,
median), every output checked against the first provider's. Writes skinny_heads_<gpu>.{json,md}.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from .common import Row, geomean, require_hopper, rotation_count, time_ms, write_results

SHAPES = ("32000x4096,50257x768,50257x1600,128256x2048,128256x4096,152064x3584,28672x4096,14336x4096,"
          "37888x3584,8192x28672,55296x5120,10240x8192,16384x2048,6144x4096,6400x1600,4800x1600,"
          "4096x14336,4096x4096,2048x8192,3072x2048")
NORM_SHAPES = "32000x4096,128256x4096,152064x3584,128256x2048,50257x1600,50257x768"


def _pairs(text: str) -> list[tuple[int, int]]:
    try:
        out = [tuple(int(v) for v in s.split("x")) for s in text.split(",") if s]
    except ValueError:
        raise SystemExit(f"error: expected NxK,NxK,..., got {text!r}") from None
    if any(len(p) != 2 or min(p) < 1 for p in out):
        raise SystemExit(f"error: expected NxK,NxK,... with positive sizes, got {text!r}")
    return out


def _tiles(m: int, n: int, k: int):
    """The config dispatch runs for a plain bf16 m x n x k product without the GEMV."""
    from benchmarks.gemm import grid_problem
    from cute_kernels.tuning import tune

    return tune.dispatch_config(grid_problem("bf16", m, n, k))


def _time_set(case: str, providers: dict, rot: int, rows: list, gbytes: float) -> dict:
    """Time each provider (fn(i) on input set i of rot) after checking it against the first one."""
    ref, out = None, {}
    for name, fn in providers.items():
        y = fn(0).float()
        if ref is None:
            ref = y
        else:
            err = ((y - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
            if err > 2e-2:
                raise RuntimeError(f"{case} {name}: differs from {next(iter(providers))} by {err:.3g}")
        ms = time_ms(fn, n_rotate=rot)
        out[name] = ms
        rows.append(Row(case, name, ms, gbps=gbytes / ms * 1e3))
    print(case, " ".join(f"{p}={v * 1e3:.1f}us" for p, v in out.items()), flush=True)
    return out


def kernels(shapes, norm_shapes, ms_list, rows: list) -> dict:
    import cute_kernels as ck
    from cute_kernels.matmul.gemv import skinny_gemm
    from inference import ops

    plain, rms, ln = [], [], []
    for n, k in shapes:
        rot = rotation_count(n * k * 2)
        ws = [(torch.randn(n, k, device="cuda") / k ** 0.25).to(torch.bfloat16) for _ in range(rot)]
        x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
        cfg = _tiles(1, n, k)
        t = _time_set(f"1x{n}x{k}", {
            "gemv": lambda i: skinny_gemm(x, ws[i]),
            "tiles": lambda i: ck.gemm(x, ws[i].t(), config=cfg),
            "cublas": lambda i: F.linear(x, ws[i])}, rot, rows, n * k * 2 / 1e9)
        if n > 4096:
            plain.append(t["gemv"] / t["tiles"])
        del ws
    for (n, k), m in [(s, m) for s in norm_shapes for m in ms_list]:
        rot = rotation_count(n * k * 2)
        ws = [(torch.randn(n, k, device="cuda") / k ** 0.25).to(torch.bfloat16) for _ in range(rot)]
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        g = (torch.rand(k, device="cuda") + 0.5).to(torch.bfloat16)
        b = (torch.randn(k, device="cuda") * 0.1).to(torch.bfloat16)
        cfg = _tiles(m, n, k)
        t = _time_set(f"rms {m}x{n}x{k}", {
            "gemv+norm": lambda i: skinny_gemm(x, ws[i], rms=(g, 1e-5)),
            "norm,tiles": lambda i: ck.gemm(ops.rms_norm(x, g, 1e-5, "cute"), ws[i].t(), config=cfg)},
            rot, rows, n * k * 2 / 1e9)
        rms.append(t["gemv+norm"] / t["norm,tiles"])
        t = _time_set(f"ln {m}x{n}x{k}", {
            "gemv+norm": lambda i: skinny_gemm(x, ws[i], ln=(g, b, 1e-5)),
            "norm,tiles": lambda i: ck.gemm(F.layer_norm(x, (k,), g, b, 1e-5), ws[i].t(), config=cfg)},
            rot, rows, n * k * 2 / 1e9)
        ln.append(t["gemv+norm"] / t["norm,tiles"])
        del ws
    torch.cuda.empty_cache()
    summary = {}
    if plain:
        summary.update({"geomean_tiles_over_gemv[1 row, N > 4096]": geomean(plain),
                        "min_tiles_over_gemv[1 row, N > 4096]": min(plain)})
    if rms:
        summary.update({"geomean_split_over_fused[rms]": geomean(rms), "min_split_over_fused[rms]": min(rms),
                        "geomean_split_over_fused[ln]": geomean(ln), "min_split_over_fused[ln]": min(ln)})
    return summary


def decode(models, batches, rows: list) -> dict:
    from cute_kernels.matmul import heuristics
    from inference.bench import _decode_ms
    from inference.decode import StaticDecoder
    from inference.decode_llama import LlamaStaticDecoder
    from inference.models import load_config, load_model
    from inference.patch import patch_model

    summary, saved = {}, heuristics.WIDE_DECODE_TILES
    try:
        for name in models:
            cfg = load_config(name, random_weights=True)
            model = load_model(name, cfg, random_weights=True, device=torch.device("cuda"), dtype=torch.bfloat16)
            patch_model(model, precision="bf16", attention="cute", backend="cute")
            cls = StaticDecoder if name.startswith("gpt2") else LlamaStaticDecoder
            for batch in batches:
                torch.manual_seed(0)
                ids = torch.randint(0, cfg.vocab_size, (batch, 128), device="cuda")
                ms, tokens = {True: [], False: []}, {}
                for on in (True, False) * 3:
                    heuristics.WIDE_DECODE_TILES = on
                    with torch.inference_mode():
                        dec = cls(model, batch_size=batch, max_len=128 + 64)
                        ms[on].append(_decode_ms(dec, ids, 63, True))
                        tokens.setdefault(on, dec.generate(ids, 24).tolist())
                    del dec
                    torch.cuda.empty_cache()
                case = f"{name} decode b{batch}"
                same = tokens[True] == tokens[False]
                for on in (True, False):
                    rows.append(Row(case, "cute" if on else "cute gemv", min(ms[on]),
                                    extra={"wide_decode_tiles": on, "ms_per_token_all": ms[on], "same_tokens": same}))
                summary[f"decode_speedup[{name} b{batch}]"] = min(ms[False]) / min(ms[True])
                summary[f"same_tokens[{name} b{batch}]"] = same
                print(case, f"on {min(ms[True]):.3f} ms/token, off {min(ms[False]):.3f}, same tokens {same}",
                      flush=True)
            del model
            torch.cuda.empty_cache()
    finally:
        heuristics.WIDE_DECODE_TILES = saved
    return summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=SHAPES, help="one-row plain products N x K")
    p.add_argument("--norm-shapes", default=NORM_SHAPES, help="norm -> product weights N x K")
    p.add_argument("--m", default="1,2,8", help="rows of the norm -> product cases")
    p.add_argument("--models", default="llama-3-8b,gpt2-xl")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--no-decode", action="store_true", help="kernels only")
    p.add_argument("--no-write", action="store_true", help="print, write no results files")
    args = p.parse_args(argv)
    shapes, norm_shapes = _pairs(args.shapes), _pairs(args.norm_shapes)
    try:
        ms_list = [int(v) for v in args.m.split(",")]
        batches = [int(v) for v in args.batches.split(",")]
    except ValueError:
        raise SystemExit("error: --m and --batches take comma-separated integers") from None
    if not all(1 <= m <= 8 for m in ms_list):
        raise SystemExit("error: --m takes rows from 1 to 8 (the skinny GEMV's range)")
    require_hopper("skinny_heads")
    from cute_kernels.runtime.timing import warm_up

    warm_up(500)
    rows: list[Row] = []
    summary = kernels(shapes, norm_shapes, ms_list, rows)
    if not args.no_decode:
        summary.update(decode([s for s in args.models.split(",") if s], batches, rows))
    for k, v in summary.items():
        print(f"{k}: {v:.3f}" if isinstance(v, float) else f"{k}: {v}")
    if args.no_write:
        return 0
    path = write_results("skinny_heads", rows, summary, notes=(
        "`python -m benchmarks.skinny_heads`: bf16, randn inputs, weights rotated through L2, CUDA-graph "
        "medians; `gemv` the skinny GEMV, `tiles` the 64-row swap_ab tiles dispatch runs without it, "
        "`gemv+norm` the norm in the GEMV's prologue, `norm,tiles` the norm's own launch then the tiles; "
        "decode rows: ms per token, `cute` with heuristics.WIDE_DECODE_TILES on, `cute gemv` off."))
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
