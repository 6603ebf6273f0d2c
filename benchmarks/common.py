"""The one timing helper and result writer every benchmark uses.

Timing: `triton.testing.do_bench`-style CUDA-event timing, median of many runs
after a warm-up, with the inputs rotated across enough copies to overflow L2
(50 MB on H100) so small shapes are not measured out of cache.
"""

from __future__ import annotations

import datetime
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

RESULTS_DIR = Path(__file__).resolve().parent / "results"

# Dense datasheet peaks for H100 SXM (TFLOP/s) and HBM bandwidth (TB/s).
class _Peaks(dict):
    """Dense TFLOP/s of the GPU present by dtype kind (cute_kernels.runtime.hardware), looked
    up when a report first reads it, not at import."""

    def __missing__(self, kind):
        from cute_kernels.runtime import hardware

        return hardware.current().peak_tflops(kind)


PEAK_TFLOPS = _Peaks()


def peak_tbps() -> float:
    """HBM bandwidth of the GPU present, TB/s."""
    from cute_kernels.runtime import hardware

    return hardware.current().hbm_tbps


@dataclass
class Row:
    case: str
    provider: str
    ms: float
    tflops: float | None = None
    pct_peak: float | None = None
    gbps: float | None = None
    extra: dict = field(default_factory=dict)


def time_ms(
    fn: Callable[[int], object],
    *,
    n_rotate: int = 1,
    warmup_ms: float = 25.0,
    rep_ms: float = 200.0,
    max_reps: int = 2000,
    graph: bool = True,
) -> float:
    """Median milliseconds of `fn(i)`, where i cycles over n_rotate input sets.

    `fn` takes the rotation index so the caller can pick a different copy of the
    inputs each call; an L2 flush is not used (it would add its own kernel time).

    With graph=True (default) the calls are captured in a CUDA graph, one replay
    running each input set once, so the figure is device time: host launch cost,
    which differs between providers and machines, is reported separately. Falls
    back to per-call events if the provider cannot be captured.
    """
    import torch

    if graph:
        try:
            return _time_graph_ms(fn, n_rotate, rep_ms)
        except Exception as e:  # not capturable: time launches instead, and say so
            print(f"[time_ms] CUDA graph capture failed ({type(e).__name__}: {e}); timing eager launches")
            torch.cuda.synchronize()

    fn(0)
    torch.cuda.synchronize()
    # Estimate the per-call time to size warm-up and repetitions.
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(5):
        fn(i % n_rotate)
    end.record()
    torch.cuda.synchronize()
    est = max(start.elapsed_time(end) / 5, 1e-3)
    n_warm = max(1, int(warmup_ms / est))
    n_rep = max(10, min(max_reps, int(rep_ms / est)))
    for i in range(n_warm):
        fn(i % n_rotate)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    for i in range(n_rep):
        starts[i].record()
        fn(i % n_rotate)
        ends[i].record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    return times[len(times) // 2]


def _time_graph_ms(fn, n_rotate: int, rep_ms: float) -> float:
    import torch

    calls = max(n_rotate, 8)  # at least 8 launches per replay so graph launch cost amortizes
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(calls):  # warm-up outside capture (compiles, allocator)
            fn(i % n_rotate)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fn(i % n_rotate)
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    g.replay()
    end.record()
    torch.cuda.synchronize()
    est = max(start.elapsed_time(end), 1e-3)
    reps = max(5, min(500, int(rep_ms / est)))
    for _ in range(max(2, reps // 10)):
        g.replay()
    times = []
    for _ in range(reps):
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    times.sort()
    return times[len(times) // 2]


def rotation_count(bytes_per_set: int) -> int:
    """How many input copies make one pass over them overflow L2 (3x, as QuACK does)."""
    from cute_kernels.runtime import hardware

    l2_bytes = hardware.current().l2_mb * 1024 * 1024
    return max(1, min(32, math.ceil(3 * l2_bytes / max(bytes_per_set, 1))))


def require_hopper(tool: str) -> None:
    """Exit with one line on stderr (status 2, no traceback) unless an sm_90 GPU is present."""
    import sys

    import torch

    if not torch.cuda.is_available():
        why = "no CUDA GPU found"
    elif torch.cuda.get_device_capability(0) != (9, 0):
        major, minor = torch.cuda.get_device_capability(0)
        why = f"{torch.cuda.get_device_name(0)} is sm_{major}{minor}"
    else:
        return
    print(f"error: {tool} times kernels on an NVIDIA Hopper GPU (sm_90): {why}", file=sys.stderr)
    raise SystemExit(2)


def gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def gpu_tag() -> str:
    name = gpu_name().lower()
    for tag in ("h100", "h200", "h800", "a100", "b200"):
        if tag in name:
            return tag
    return name.replace(" ", "_") or "cpu"


def geomean(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def speedups(rows: Sequence[Row], ours: str, vs: str) -> dict[str, float]:
    """case -> time(vs) / time(ours) for cases where both providers ran."""
    t = {(r.case, r.provider): r.ms for r in rows}
    return {c: t[(c, vs)] / t[(c, ours)] for (c, p) in t if p == ours and (c, vs) in t}


def format_table(rows: Sequence[Row], baseline: str | None = "cublas") -> str:
    base = {r.case: r.ms for r in rows if r.provider == baseline}
    head = f"| {'case':<34} | {'provider':<12} | {'ms':>9} | {'TFLOP/s':>8} | {'% peak':>6} | {'GB/s':>7} | {'vs ' + (baseline or '-'):>10} |"
    lines = [head, "|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|"]
    for r in rows:
        ratio = f"{base[r.case] / r.ms:.3f}x" if r.case in base and r.ms else "-"
        tf = f"{r.tflops:.1f}" if r.tflops is not None else "-"
        pk = f"{r.pct_peak:.1f}" if r.pct_peak is not None else "-"
        gb = f"{r.gbps:.0f}" if r.gbps is not None else "-"
        lines.append(
            f"| {r.case:<34} | {r.provider:<12} | {r.ms:9.4f} | {tf:>8} | {pk:>6} | {gb:>7} | {ratio:>10} |"
        )
    return "\n".join(lines)


def write_results(suite: str, rows: Sequence[Row], summary: dict, notes: str = "", baseline: str = "cublas") -> Path:
    """Write benchmarks/results/<suite>_<gpu>.json and .md; return the JSON path."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    from cute_kernels.runtime import env

    out_dir = Path(env.get("CUTE_KERNELS_RESULTS_DIR") or RESULTS_DIR)
    out_dir.mkdir(parents=True, exist_ok=True)
    tag = gpu_tag()
    payload = {
        "gpu": gpu_name(),
        "date": datetime.date.today().isoformat(),
        "rows": [{k: v for k, v in asdict(r).items() if v is not None and v != {}} for r in rows],
        "summary": summary,
    }
    jpath = out_dir / f"{suite}_{tag}.json"
    jpath.write_text(json.dumps(payload, indent=1))
    md = [f"# {suite} on {payload['gpu']} ({payload['date']})", ""]
    if notes:
        md += [notes, ""]
    md += [format_table(rows, baseline=baseline), "", "## Summary", ""]
    md += [f"- {k}: {v:.3f}" if isinstance(v, float) else f"- {k}: {v}" for k, v in summary.items()]
    (out_dir / f"{suite}_{tag}.md").write_text("\n".join(md) + "\n")
    return jpath
