"""`python -m inference bench`: prefill and decode across backends and precisions.

Backends:
- cute:     the patched model (our GEMMs with fused epilogues; attention per --attention)
- cublas:   the unpatched model in eager PyTorch (cuBLAS GEMMs + SDPA)
- compile:  the unpatched model under torch.compile (Inductor)
- tensorrt: the unpatched model exported to ONNX and built with TensorRT (prefill; bf16
            decode on a static-cache engine, tensorrt.StaticCacheStep)

Prefill is one no-cache forward over [batch, prompt_len] returning all logits
(the same work for every backend). Decode is our StaticDecoder (static KV cache,
one CUDA graph per token) for cute, cublas and compile alike, so decode numbers
differ only in the kernels. Metrics, against the dense datasheet peaks of the GPU present
(cute_kernels.runtime.hardware; H100 SXM: 989.4 / 1978.9 TFLOP/s, 3.35 TB/s):
- MFU = useful FLOPs (weight GEMMs + causal attention) / time / peak of the weight
  GEMMs' type (bf16, or fp8/int8).
- MBU = bytes a decode step must read (weights once + the valid KV cache) /
  time / HBM bandwidth.
- per-op breakdown from torch.profiler, with each GEMM shape's TFLOP/s and % of
  its peak.
- decode step timeline (decode_timeline): the kernels of CUDA-graph-replayed steps,
  which overlap under programmatic dependent launch, with how much each one adds to
  the step.
Each variant starts from a CPU copy of the model, so its peak GPU memory is its own.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import gc
import json
import re
import shutil
import tempfile
import time
from pathlib import Path

import torch

from cute_kernels.runtime import hardware

from .adapters import adapter_for
from .device import cute_device_problem
from .models import RANDOM_BANNER, UserError, check_positions

TRT_PRECISIONS = ("bf16", "fp8", "int8")
GEMM_OP = re.compile(r"(^aten::(addmm|mm|bmm|_scaled_mm|_int_mm)$)|(^cute_inference::linear$)|"
                     r"(^(?!aten::)\w+::\w*(mm|gemm|linear)\w*$)")


@dataclasses.dataclass
class Result:
    backend: str
    precision: str
    phase: str = ""  # "prefill" or "decode" where a run times them at different batches; "" for both
    batch: int | None = None
    prefill_ms: float | None = None
    prefill_tok_s: float | None = None
    mfu_pct: float | None = None
    decode_ms_per_step: float | None = None
    decode_tok_s: float | None = None
    mbu_pct: float | None = None
    peak_gib: float | None = None
    top1_vs_eager: float | None = None
    max_logit_diff_vs_eager: float | None = None
    note: str = ""
    breakdown: dict = dataclasses.field(default_factory=dict)
    timeline: dict = dataclasses.field(default_factory=dict)


# --------------------------------------------------------------------------- model arithmetic


def prefill_flops(ad, batch: int, seq: int) -> float:
    """2 FLOPs per matmul weight per token (ad: the model's adapter), plus QK^T and PV under a
    causal mask (half of 4*B*S^2*H*D per layer)."""
    qk = ad.n_heads * ad.head_dim
    return 2.0 * batch * seq * ad.matmul_params() + ad.n_layers * 2.0 * batch * seq * seq * qk


def weight_bytes(model) -> int:
    """Bytes of every parameter and buffer once (tied wte/lm_head counted once), minus wpe (one row read).
    A tensor is identified by its own address and size, not its storage's: the Llama decoder
    re-points q/k/v and gate/up at row blocks of one concatenated storage."""
    seen, total = set(), 0
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        key = (t.data_ptr(), t.numel(), t.dtype)
        if name.endswith("wpe.weight") or key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def decode_bytes(model, ad, batch: int, ctx: float) -> float:
    """Weights once plus the valid K and V rows (16-bit) a decode step reads."""
    return weight_bytes(model) + 2.0 * ad.n_layers * batch * ctx * ad.n_kv_heads * ad.head_dim * 2


# --------------------------------------------------------------------------- timing and profiling


def _time_ms(fn, cuda: bool) -> float:
    if cuda:
        from benchmarks.common import time_ms

        return time_ms(lambda _i: fn())
    fn()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - t0))
    return sorted(times)[1]


def _decode_ms(decoder, ids, steps: int, cuda: bool, repeats: int = 3) -> float:
    decoder.prefill(ids)
    decoder.decode(1)  # captures the CUDA graph (and compiles) outside the timing
    times = []
    for _ in range(repeats):
        decoder.prefill(ids)
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            decoder.decode(steps)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / steps)
        else:
            t0 = time.perf_counter()
            decoder.decode(steps)
            times.append(1e3 * (time.perf_counter() - t0) / steps)
    return sorted(times)[len(times) // 2]


def _dev_time(evt, self_only=False) -> float:
    names = ("self_device_time_total", "self_cuda_time_total") if self_only else ("device_time_total",
                                                                                    "cuda_time_total")
    for n in names:
        if hasattr(evt, n):
            return float(getattr(evt, n))
    return 0.0


def _gemm_mnk(name: str, shapes) -> tuple[int, int, int, int] | None:
    """(batch, M, N, K) of a GEMM op from its recorded input shapes."""
    if name == "aten::addmm":  # (bias, a, b, ...)
        shapes = shapes[1:]
    mats = [s for s in shapes if isinstance(s, (list, tuple)) and len(s) in (2, 3)]
    if len(mats) < 2:
        return None
    a, b = mats[0], mats[1]
    if len(a) == 3 and len(b) == 3:  # bmm [B, M, K] x [B, K, N]
        return a[0], a[1], b[2], a[2]
    if len(a) == 3 and len(b) == 2 and a[2] == b[1]:  # x [B, S, K] against a weight [N, K]
        return 1, a[0] * a[1], b[0], a[2]
    if len(a) != 2 or len(b) != 2:
        return None
    if a[1] == b[0]:
        return 1, a[0], b[1], a[1]
    if a[1] == b[1]:  # weight given as [N, K]
        return 1, a[0], b[0], a[1]
    return None


def profile_breakdown(fn, n_iters: int = 1, top: int = 12, *, cuda: bool | None = None) -> dict:
    """Time per kernel, and per GEMM shape with its TFLOP/s and % of peak, for n_iters calls of fn.

    cuda: whether fn runs on the GPU (default: whether one is present). There these are
    device times of CUDA kernels; for a CPU run, CPU op times.
    """
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available() if cuda is None else cuda
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    fn()
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, record_shapes=True) as prof:
        for _ in range(n_iters):
            fn()
        sync()
    kernels: dict[str, list] = {}
    gemms: dict[tuple, list] = {}
    for e in prof.events():
        is_kernel = str(getattr(e, "device_type", "")).endswith("CUDA")
        if is_kernel or not cuda:
            k = kernels.setdefault(e.name, [0, 0.0])
            k[0] += 1
            k[1] += _dev_time(e, self_only=True) if is_kernel else float(e.self_cpu_time_total)
        if is_kernel or not _is_gemm(e.name):
            continue
        parent, nested = e.cpu_parent, False
        while parent is not None:  # count a GEMM once, at its outermost GEMM op
            nested |= _is_gemm(parent.name)
            parent = parent.cpu_parent
        if nested:
            continue
        shapes = [list(s) for s in (e.input_shapes or [])]
        g = gemms.setdefault((e.name, json.dumps(shapes)), [0, 0.0])
        g[0] += 1
        g[1] += _dev_time(e) if cuda else float(e.cpu_time_total)
    total_us = sum(v[1] for v in kernels.values()) / n_iters
    rows = []
    for (name, shapes), (calls, us) in gemms.items():
        dims = _gemm_mnk(name, json.loads(shapes))
        eightbit = any(t in name for t in ("scaled", "int8", "_int_mm", "fp8"))
        peak = hardware.current().peak_tflops("8bit" if eightbit else "bf16")
        row = {"op": name, "shapes": json.loads(shapes), "calls": calls // n_iters, "ms": us / n_iters / 1e3,
               "pct_time": 100 * us / n_iters / total_us if total_us else None}
        if dims and us > 0:
            tflops = 2.0 * dims[0] * dims[1] * dims[2] * dims[3] * calls / (us * 1e-6) / 1e12
            row.update(mnk=list(dims[1:]), tflops=tflops, pct_peak=100 * tflops / peak)
        rows.append(row)
    rows.sort(key=lambda r: -r["ms"])
    kern = sorted(({"kernel": n[:120], "calls": c // n_iters, "ms": us / n_iters / 1e3,
                    "pct_time": 100 * us / n_iters / total_us if total_us else None}
                   for n, (c, us) in kernels.items()), key=lambda r: -r["ms"])
    return {"device_ms": total_us / 1e3, "kernels": kern[:top], "gemms": rows[:top]}


def _is_gemm(name: str) -> bool:
    return bool(GEMM_OP.search(name)) and name not in ("aten::linear", "aten::matmul")


def _kernel_label(name: str) -> str:
    """A readable kernel name: CuTe DSL kernels by module and class (their mangled names run to
    hundreds of characters), others up to the argument list."""
    m = re.search(r"cute_kernels(\w+?)_object", name)
    if m:
        return m.group(1)
    return name.split("(")[0][:60]


def timeline_summary(kernels: list[dict], n_steps: int) -> dict | None:
    """Where the time of a CUDA-graph-replayed step goes when its kernels overlap (PDL).

    kernels: the device kernel records of n_steps identical replays ({"name", "ts", "dur"} in
    us, optional "grid"). Per kernel kind (name and grid, in order of first appearance in a
    step, "first" its index there): calls per step, mean duration, how long it started before
    every kernel ahead of it had ended ("overlap"), and how much it moved the end of the work
    so far ("adds": its end minus the latest end before it, idle gaps included; the steps'
    kernels are in launch order, which with programmatic dependent launch is also start
    order). A step's adds sum to its span (from the previous step's last end), so they show
    what the step waits for, which the overlapping durations do not. Returns None when the
    records are not n_steps repeats of one kernel sequence."""
    kernels = sorted(kernels, key=lambda k: k["ts"])
    if n_steps < 1 or not kernels or len(kernels) % n_steps:
        return None
    per = len(kernels) // n_steps
    if any(kernels[i]["name"] != kernels[i % per]["name"] for i in range(per, len(kernels))):
        return None  # not n_steps replays of one kernel sequence (a record dropped or extra work)
    kinds: dict[tuple, dict] = {}
    spans = []
    latest = None  # carried across steps: a step's first kernel may start before the last one ends
    for st in range(n_steps):
        step = kernels[st * per:(st + 1) * per]
        begin = step[0]["ts"] if latest is None else latest
        for i, k in enumerate(step):
            end = k["ts"] + k["dur"]
            grid = str(tuple(k.get("grid") or ()))
            row = kinds.setdefault((k["name"], grid), {"kernel": _kernel_label(k["name"]), "grid": grid, "first": i,
                                                       "n": 0, "dur": 0.0, "overlap": 0.0, "adds": 0.0})
            row["n"] += 1
            row["dur"] += k["dur"]
            if latest is None:
                row["adds"] += k["dur"]
            else:
                row["overlap"] += max(0.0, latest - k["ts"])
                row["adds"] += max(0.0, end - latest)
            latest = end if latest is None else max(latest, end)
        spans.append(latest - begin)
    spans.sort()
    rows = [{"kernel": r["kernel"], "grid": r["grid"], "first": r["first"], "calls": r["n"] / n_steps,
             "mean_us": r["dur"] / r["n"],
             "mean_overlap_us": r["overlap"] / r["n"], "adds_us": r["adds"] / n_steps} for r in kinds.values()]
    return {"steps": n_steps, "span_us": spans[len(spans) // 2], "kernels_per_step": per, "kinds": rows}


def decode_timeline(decoder, n_steps: int = 6) -> dict | None:
    """timeline_summary of n_steps decode steps replayed from the decoder's CUDA graph
    (torch.profiler's CUPTI kernel records; the decoder must have room for n_steps + 1 more
    tokens). The profiler adds a little to every kernel, so the span runs a few percent above
    the timed ms/step; the shares are what it is for."""
    from torch.profiler import ProfilerActivity, profile

    decoder.decode(1)  # captured and warm
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        decoder.decode(n_steps)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text()).get("traceEvents", [])
    kernels = [{"name": e["name"], "ts": float(e["ts"]), "dur": float(e["dur"]), "grid": (e.get("args") or {}).get("grid")}
               for e in events if e.get("cat") == "kernel" and "dur" in e]
    return timeline_summary(kernels, n_steps)


# --------------------------------------------------------------------------- variants


def plan_variants(backends, precisions, problem_cute: str | None):
    """[(backend, precision, skip_reason_or_None)]."""
    plan = []
    for b in backends:
        for p in precisions:
            why = None
            if b == "cute" and problem_cute:
                why = problem_cute
            elif b in ("cublas", "compile") and p != "bf16":
                why = f"{b} runs the unpatched bf16 model only"
            elif b == "tensorrt" and p not in TRT_PRECISIONS:
                why = f"the TensorRT path does {', '.join(TRT_PRECISIONS)} only"
            plan.append((b, p, why))
    if "tensorrt" in backends:
        try:
            import tensorrt  # noqa: F401
        except Exception as e:  # noqa: BLE001  (missing libraries raise OSError, not only ImportError)
            plan = [(b, p, w or (f"`import tensorrt` failed ({type(e).__name__}: {e})" if b == "tensorrt" else None))
                    for b, p, w in plan]
    return plan


def _compare(logits, ref_last) -> tuple[float, float]:
    last = logits[:, -ref_last.shape[1]:].float()
    return (float((last.argmax(-1) == ref_last.argmax(-1)).float().mean()),
            float((last - ref_last).abs().max()))


def run_variant(backend, precision, base_cpu, cfg, ids, args, ref_last, workdir: Path,
                decode_ids: dict | None = None) -> list[Result]:
    """One backend/precision: prefill on ids, then decode on ids (decode_ids None: one Result),
    or at each batch of decode_ids {batch: prompt ids} (a prefill Result, then one per batch)."""
    from .patch import patch_model

    res = Result(backend, precision, batch=ids.shape[0])
    out = [res]
    batch, seq, gen = ids.shape[0], ids.shape[1], args.gen_len
    cuda = ids.is_cuda
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    model = copy.deepcopy(base_cpu).to(ids.device).eval()
    extra_bytes = 0
    # Build outside inference_mode (torch.export and weight re-layout want ordinary tensors).
    trt_decoder, trt_note = None, ""
    if backend == "tensorrt":
        prefill, extra_bytes, trt_decoder, trt_note = _tensorrt_prefill(model, precision, ids, workdir, gen)
    else:
        if backend == "cute":
            patch_model(model, precision=precision, attention=args.attention,
                        backend="cute" if cuda else "reference",
                        calibration=[ids[:1]] if precision == "int8-smoothquant" else None)
        forward = torch.compile(model, dynamic=False) if backend == "compile" else model

        def prefill():
            return forward(ids, use_cache=False).logits
    with torch.inference_mode():
        res.top1_vs_eager, res.max_logit_diff_vs_eager = _compare(prefill(), ref_last)
        ms = _time_ms(prefill, cuda)
        res.prefill_ms, res.prefill_tok_s = ms, batch * seq / ms * 1e3
        peak = hardware.current().peak_tflops("bf16" if precision == "bf16" else "8bit")
        if cuda:  # the peaks are H100's: meaningless for a CPU smoke run
            res.mfu_pct = 100 * prefill_flops(adapter_for(model), batch, seq) / (ms * 1e-3) / (peak * 1e12)
        if not args.no_profile:
            res.breakdown["prefill"] = profile_breakdown(prefill, cuda=cuda)
        if backend == "tensorrt" and trt_decoder is None:
            res.note = trt_note or "prefill only"
        elif backend == "tensorrt":
            dms = _decode_ms(trt_decoder, ids, max(gen - 1, 1), cuda)
            res.decode_ms_per_step, res.decode_tok_s = dms, batch / dms * 1e3
            res.mbu_pct = 100 * decode_bytes(model, adapter_for(model), batch, seq + gen / 2) / (dms * 1e-3) / (hardware.current().hbm_tbps * 1e12)
            res.note = "; ".join(n for n in ("decode: static-cache engine", trt_decoder.graph_note) if n)
        elif gen == 0:
            res.note = "prefill only (--gen-len 0)"
        elif decode_ids is None:
            _run_decode(res, model, ids, backend, args, cuda)
        else:
            res.phase, res.note = "prefill", "decode: see the decode rows"
            compile_batches = getattr(args, "compile_decode_batch", None)
            for b, dids in decode_ids.items():
                row = Result(backend, precision, phase="decode", batch=b)
                if backend == "compile" and compile_batches is not None and b not in compile_batches:
                    row.note = "not run (--compile-decode-batch)"
                else:
                    _run_decode(row, model, dids, backend, args, cuda)
                out.append(row)
                gc.collect()
                if cuda:
                    torch.cuda.empty_cache()
    if cuda:
        torch.cuda.synchronize()
        res.peak_gib = (torch.cuda.max_memory_allocated() + extra_bytes) / 2**30
    if extra_bytes:
        res.note += "; peak memory adds TensorRT's engine and scratch memory"
    return out


def _run_decode(res: Result, model, ids, backend: str, args, cuda: bool) -> None:
    """Decode timing (and profile) of the model's static decoder into res: the same one-graph
    loop for every backend, on our kernels or the model's own modules (compile: the step
    under torch.compile, then captured)."""
    from .decoders import decoder_class

    batch, seq, gen = ids.shape[0], ids.shape[1], args.gen_len
    dec = decoder_class(model)(model, batch_size=batch, max_len=seq + gen, compile=backend == "compile")
    dms = _decode_ms(dec, ids, max(gen - 1, 1), cuda)
    res.decode_ms_per_step, res.decode_tok_s = dms, batch / dms * 1e3
    ctx = seq + gen / 2  # average valid context over the generation
    if cuda:
        res.mbu_pct = 100 * decode_bytes(model, adapter_for(model), batch, ctx) / (dms * 1e-3) / (hardware.current().hbm_tbps * 1e12)
    if not args.no_profile and gen >= 6:  # 1 warm-up + 3 profiled steps must fit in the cache
        dec.prefill(ids)
        res.breakdown["decode_step"] = profile_breakdown(dec.step, n_iters=3, cuda=cuda)
    if not args.no_profile and cuda and dec.cuda_graph and gen >= 9:  # 1 + 1 + 6 steps
        dec.prefill(ids)
        try:
            res.timeline = decode_timeline(dec) or {}
        except Exception as e:  # noqa: BLE001 - a report section must not sink the run
            print(f"note: no decode timeline for {res.backend}/{res.precision} ({type(e).__name__}: {e})")


def _tensorrt_prefill(model, precision, ids, workdir: Path, gen: int = 0):
    """The prefill engine's call, the extra GPU bytes TensorRT holds, and for bf16 with gen > 0
    a DecodeEngine (static-cache decode engine, caches filled from the prompt by the PyTorch
    model) or None with the reason."""
    from . import tensorrt as trt_path

    workdir.mkdir(parents=True, exist_ok=True)
    onnx_path = trt_path.export_onnx(model, workdir / "model.onnx", ids, dynamic=False)
    if precision != "bf16":
        amax = trt_path.calibrate_activations(model, [ids[:1]])
        q_path = workdir / f"model_{precision}.onnx"
        n = trt_path.quantize_onnx(onnx_path, q_path, precision, amax, trt_path.gemm_weights(model))
        print(f"  tensorrt: {n} GEMMs quantized to {precision} with Q/DQ")
        onnx_path = q_path
    shape = tuple(ids.shape)
    plan = trt_path.build_engine(onnx_path, min_shape=shape, opt_shape=shape, max_shape=shape)
    runner = trt_path.TRTRunner(plan)
    decoder, note, decode_bytes_held = None, "prefill only (--gen-len 0)" if gen == 0 else "", 0
    if gen > 0 and precision != "bf16":
        note = "prefill only (the decode engine is built for bf16 only)"
    elif gen > 0:
        try:
            decoder, decode_plan = _tensorrt_decoder(trt_path, model, ids, gen, workdir)
            decode_bytes_held = len(decode_plan) + 2 * decoder.k0.numel() * decoder.k0.element_size()
        except Exception as e:  # noqa: BLE001 - the prefill result still stands
            note = f"prefill only (decode engine failed: {type(e).__name__}: {str(e).splitlines()[0][:100]})"
    model.cpu()  # TensorRT holds its own copy of the weights
    torch.cuda.empty_cache()
    scratch = getattr(runner.engine, "device_memory_size_v2", None) or getattr(runner.engine, "device_memory_size", 0)
    extra = len(plan) + int(scratch or 0) + decode_bytes_held
    def prefill():
        return runner(ids)

    return prefill, extra, decoder, note


def _tensorrt_decoder(trt_path, model, ids, gen: int, workdir: Path):
    B, S = ids.shape
    with torch.no_grad():
        out = model(ids, use_cache=True)
    k, v = trt_path.static_cache_from_past(out.past_key_values, S + gen)
    first = out.logits[:, -1].argmax(-1)
    onnx_path = trt_path.export_decode_onnx(model, workdir / "decode.onnx", batch=B, max_len=S + gen)
    plan = trt_path.build_engine(onnx_path, min_shape=None, opt_shape=None, max_shape=None)  # static shapes
    return trt_path.DecodeEngine(trt_path.TRTRunner(plan), k, v, first, S), plan


# --------------------------------------------------------------------------- report


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def format_table(results) -> str:
    head = ("| backend | precision | prefill ms | prefill tok/s | MFU % | decode ms/step | decode tok/s | MBU % | "
            "peak GiB | top-1 vs eager | max dlogit | note |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        lines.append(f"| {r.backend} | {r.precision} | {_fmt(r.prefill_ms, '.2f')} | {_fmt(r.prefill_tok_s, ',.0f')} | "
                     f"{_fmt(r.mfu_pct, '.1f')} | {_fmt(r.decode_ms_per_step, '.3f')} | "
                     f"{_fmt(r.decode_tok_s, ',.0f')} | {_fmt(r.mbu_pct, '.1f')} | {_fmt(r.peak_gib, '.2f')} | "
                     f"{_fmt(None if r.top1_vs_eager is None else 100 * r.top1_vs_eager, '.1f')} | "
                     f"{_fmt(r.max_logit_diff_vs_eager, '.3g')} | {r.note} |")
    return "\n".join(lines)


def format_breakdown(r: Result) -> str:
    out = []
    for phase, b in r.breakdown.items():
        out += [f"### {r.backend} {r.precision}: {phase} ({b['device_ms']:.3f} ms device time per call)", "",
                "| GEMM op | M x N x K | calls | ms | % time | TFLOP/s | % peak |", "|---|---|---|---|---|---|---|"]
        for g in b["gemms"]:
            mnk = " x ".join(map(str, g["mnk"])) if "mnk" in g else str(g["shapes"])
            out.append(f"| {g['op']} | {mnk} | {g['calls']} | {g['ms']:.3f} | {_fmt(g['pct_time'], '.1f')} | "
                       f"{_fmt(g.get('tflops'), '.1f')} | {_fmt(g.get('pct_peak'), '.1f')} |")
        out += ["", "| kernel | calls | ms | % time |", "|---|---|---|---|"]
        out += [f"| `{k['kernel']}` | {k['calls']} | {k['ms']:.3f} | {_fmt(k['pct_time'], '.1f')} |"
                for k in b["kernels"]]
        out.append("")
    return "\n".join(out)


def format_timeline(r: Result) -> str:
    t = r.timeline
    out = [f"### {r.backend} {r.precision}: decode step timeline ({t['steps']} CUDA-graph replays, "
           f"{t['kernels_per_step']} kernels per step, span {t['span_us']:.1f} us under the profiler)", "",
           "| first | kernel | grid | calls/step | mean us | started before the previous end, us | adds to the step, us |",
           "|---|---|---|---|---|---|---|"]
    out += [f"| {k['first']} | `{k['kernel']}` | {k['grid']} | {k['calls']:g} | {k['mean_us']:.2f} | "
            f"{k['mean_overlap_us']:.2f} | {k['adds_us']:.1f} |" for k in t["kinds"]]
    return "\n".join(out + [""])


def _plot(results, path: Path, title: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, key, label in ((axes[0], "prefill_tok_s", "prefill tokens/s"),
                           (axes[1], "decode_ms_per_step", "decode ms/step (lower is better)")):
        rows = [r for r in results if getattr(r, key) is not None]
        ax.bar([f"{r.backend}\n{r.precision}" for r in rows], [getattr(r, key) for r in rows], color="tab:blue")
        ax.set_title(label)
        ax.tick_params(axis="x", labelsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_report(results, skipped, meta, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    phase = f"_{meta['phase']}_b{meta['batch']}" if meta.get("phase") else ""
    stem = f"inference_{meta['model_tag']}{phase}_{meta['gpu_tag']}"
    paths = [out_dir / f"{stem}.json", out_dir / f"{stem}.md"]
    paths[0].write_text(json.dumps({**meta, "results": [dataclasses.asdict(r) for r in results],
                                    "skipped": skipped}, indent=1))
    part = hardware.lookup(meta["gpu"])
    md = [f"# Inference: {meta['model']} on {meta['gpu']} ({meta['date']})", ""]
    if meta["random_weights"]:
        md += ["**Random weights** (same shapes as the real model): speed is real, text is not.", ""]
    md += [(f"{meta.get('phase') or 'prefill and decode'}, batch {meta['batch']}, prompt {meta['prompt_len']}, "
            f"generate {meta['gen_len']}; attention "
            f"{meta['attention']}; torch {meta['torch']}, transformers {meta['transformers']}."), "",
           (f"MFU: useful FLOPs / time / peak ({part.name}: bf16 {part.bf16_tflops}, fp8/int8 {part.fp8_tflops} "
            f"TFLOP/s). MBU: weights + valid KV bytes per decode step / time / {part.hbm_tbps} TB/s. Decode uses one CUDA graph per step for every backend; "
            "prefill is timed as CUDA-graph replays of one forward for every backend (eager launches only where "
            "capture fails, with a printed note). Under capture (and under torch.compile) transformers builds an "
            "explicit causal mask for the stock model's attention; the patched model keeps mask None for plain "
            "causal batches and runs our kernel."), "",
           format_table(results), ""]
    md += [f"- skipped {b}/{p}: {why}" for b, p, why in skipped]
    md += ["", "## Per-op breakdown (torch.profiler)", ""] + [format_breakdown(r) for r in results if r.breakdown]
    if any(r.timeline for r in results):
        md += ["## Decode step timeline (torch.profiler on CUDA-graph replays)", "",
               ("Kernels of one step overlap (programmatic dependent launch), so their durations do not add "
                "up to the step. \"Adds\" is how far each kernel moved the step's end past every kernel "
                "ahead of it (idle gaps included): these sum to the span and show what the step waits for."), ""]
        md += [format_timeline(r) for r in results if r.timeline]
    png = out_dir / f"{stem}.png"
    if _plot(results, png, f"{meta['model']} on {meta['gpu']}, batch {meta['batch']}"):
        md.insert(2, f"![throughput]({png.name})\n")
        paths.append(png)
    else:
        md.insert(2, "(no plot: matplotlib is not installed)\n")
    paths[1].write_text("\n".join(md) + "\n")
    return paths


# --------------------------------------------------------------------------- entry point


def run_bench(args) -> int:
    import transformers

    from .models import llama_name, load_config, load_model, size_name

    transformers.utils.logging.disable_progress_bar()

    if args.device is None:
        args.device = "cuda"
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise UserError("bench needs a CUDA GPU (none found); --device cpu only smoke-tests the pipeline")
    cfg = load_config(args.model, random_weights=args.random_weights)
    check_positions(cfg, args.prompt_len, args.gen_len)
    decode_batches = getattr(args, "decode_batch", None)
    decode_prompt = getattr(args, "decode_prompt_len", None) or args.prompt_len
    if decode_batches:
        check_positions(cfg, decode_prompt, args.gen_len)
    plan = plan_variants(args.backends, args.precisions, cute_device_problem() if cuda else None)
    if not cuda:  # CPU smoke run: the cute backend runs the PyTorch references; no TensorRT
        plan = [(b, p, w or ("needs CUDA" if b == "tensorrt" else None)) for b, p, w in plan]
        print("note: --device cpu is a smoke test of the pipeline (reference kernels, CPU timings, no MFU/MBU)")
    skipped = [(b, p, why) for b, p, why in plan if why]
    for b, p, why in skipped:
        print(f"skip {b}/{p}: {why}")
    if getattr(args, "tune", False):
        precisions = sorted({p for b, p, why in plan if b == "cute" and not why})
        if cuda and precisions:
            from .models import tune_linears

            print(tune_linears(args.model, cfg, precisions, [args.batch * args.prompt_len, args.batch]))
        else:
            print("note: --tune times kernels on the GPU with the cute backend: nothing tuned")
    if args.random_weights:
        print(RANDOM_BANNER.format(name=args.model))
    device, dtype = (torch.device("cuda"), torch.bfloat16) if cuda else (torch.device("cpu"), torch.float32)
    base = load_model(args.model, cfg, random_weights=args.random_weights, device=device, dtype=dtype)
    torch.manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.prompt_len), device=device)
    decode_ids = None
    if decode_batches and args.gen_len:
        decode_ids = {b: torch.randint(0, cfg.vocab_size, (b, decode_prompt), device=device) for b in decode_batches}
    with torch.inference_mode():  # reference: eager logits of the last 16 positions
        ref_last = base(ids, use_cache=False).logits[:, -16:].float()
    base = base.cpu()  # each variant copies it to the GPU, so its peak memory is its own
    if cuda:
        torch.cuda.empty_cache()

    from benchmarks.common import gpu_name, gpu_tag

    out_dir = Path(args.out) if args.out else Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    results = []
    meta = {"model": args.model, "model_tag": size_name(args.model) or llama_name(args.model) or Path(args.model).name,
            "gpu": gpu_name() if cuda else "cpu", "gpu_tag": gpu_tag() if cuda else "cpu", "date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "transformers": transformers.__version__, "batch": args.batch, "prompt_len": args.prompt_len,
            "gen_len": args.gen_len, "attention": args.attention, "random_weights": args.random_weights,
            "phase": "prefill" if args.gen_len == 0 else "decode"}

    def report() -> list[Path]:
        """The reports of what has run so far (one per phase and batch with decode_ids)."""
        groups = [(meta, results)]
        if decode_ids is not None:
            groups = [({**meta, "phase": "prefill", "gen_len": 0}, [r for r in results if r.phase == "prefill"])]
            groups += [({**meta, "phase": "decode", "batch": b, "prompt_len": decode_prompt},
                        [r for r in results if r.phase == "decode" and r.batch == b]) for b in decode_ids]
        return [path for m, rows in groups for path in write_report(rows, skipped, m, out_dir)]

    scratch = Path(tempfile.mkdtemp(prefix="inference-bench-"))  # ONNX files can be GBs: not in results/
    for b, p, why in plan:
        if why:
            continue
        print(f"running {b}/{p} ...", flush=True)
        try:
            results += run_variant(b, p, base, cfg, ids, args, ref_last, scratch / f"{b}_{p}", decode_ids)
        except (NotImplementedError, ImportError, RuntimeError, ValueError) as e:
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            print(f"skip {b}/{p}: {type(e).__name__}: {msg}")
            skipped.append((b, p, f"{type(e).__name__}: {msg}"))
        gc.collect()  # free this variant's model copy, graphs and compiled code before the next
        torch._dynamo.reset()
        if cuda:
            torch.cuda.empty_cache()
        report()  # a run cut short (a timeout) keeps the variants that finished
    shutil.rmtree(scratch, ignore_errors=True)
    print(format_table(results))
    for path in report():
        print(f"wrote {path}")
    return 0
