"""GPU timing: the one helper that every benchmark and the autotuner measure with.

`triton.testing.do_bench`-style CUDA-event timing, median of many runs after a warm-up,
with the inputs rotated across enough copies to overflow L2 (50 MB on H100) so small
shapes are not measured out of cache. CUDA graphs by default, so the figure is device
time and host launch cost (which differs between providers and machines) stays out.
Imports torch when called, never at import.
"""

from __future__ import annotations

import math
import numbers
from typing import Callable


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
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if not isinstance(n_rotate, numbers.Integral) or n_rotate < 1:
        raise ValueError(f"n_rotate must be an int >= 1, got {n_rotate!r}")
    if not (warmup_ms >= 0 and rep_ms > 0 and max_reps >= 1):
        raise ValueError("warmup_ms must be >= 0, rep_ms > 0 and max_reps >= 1")
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
    if not isinstance(bytes_per_set, numbers.Integral) or bytes_per_set < 0:
        raise ValueError(f"bytes_per_set must be an int >= 0, got {bytes_per_set!r}")
    from . import hardware

    l2_bytes = hardware.current().l2_mb * 1024 * 1024
    return max(1, min(32, math.ceil(3 * l2_bytes / max(bytes_per_set, 1))))


def warm_up(ms: float = 300.0) -> None:
    """Keep the GPU busy with large bf16 GEMMs for about `ms` milliseconds, so that clocks
    and power state have settled before the first figure that matters is taken."""
    if not ms >= 0:
        raise ValueError(f"ms must be >= 0, got {ms!r}")
    import time

    import torch

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        for _ in range(8):
            torch.mm(a, a)
        torch.cuda.synchronize()
