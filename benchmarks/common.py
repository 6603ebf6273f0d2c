"""Result rows, tables and writers every benchmark uses, and the timing helper they share.

Timing lives in the package (`cute_kernels.runtime.timing`: CUDA-graph replays, median,
L2-rotated inputs) because the autotuner measures with it too; it is re-exported here.
"""

from __future__ import annotations

import datetime
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from cute_kernels.runtime.timing import rotation_count, time_ms, warm_up  # noqa: F401  (one timing helper for every suite)

RESULTS_DIR = Path(__file__).resolve().parent / "results"
RESULTS_DIGITS = 6  # significant digits of the floats in a results file (results_json)

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


def gpu_tag(name: str | None = None) -> str:
    """The results-file tag of GPU `name` (default: this machine's)."""
    name = (gpu_name() if name is None else name).lower()
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


def parse_config_fields(config_cls, spec: str, example: str = "128, True, None") -> dict:
    """An A/B script's `--set FIELD=VALUE[,FIELD=VALUE]` for a frozen config dataclass
    (head_dim excluded: it is the shape's): {'field': value}, values as Python literals."""
    import ast
    import dataclasses

    fields = {f.name for f in dataclasses.fields(config_cls)} - {"head_dim"}
    out = {}
    for part in spec.split(","):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in fields:
            raise ValueError(f"--set takes FIELD=VALUE with FIELD a {config_cls.__name__} field other than head_dim, "
                             f"got {part!r}")
        try:
            out[name] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            raise ValueError(f"--set {part!r}: the value must be a Python literal ({example})") from None
    return out


def add_ab_arguments(p, default_name: str | None, default_reps: int) -> None:
    """The options every same-run A/B script shares: --name, --reps, --out."""
    p.add_argument("--name", default=default_name, help="results name suffix")
    p.add_argument("--reps", type=int, default=default_reps,
                   help="repetitions per variant, every other one in reverse order (median kept)")
    p.add_argument("--out", default=None, help="results folder (default benchmarks/results)")


def apply_ab_arguments(p, args) -> None:
    """Check --reps and point the results at --out."""
    if args.reps < 1:
        p.error("--reps must be >= 1")
    if args.out:
        import os

        os.environ["CUTE_KERNELS_RESULTS_DIR"] = args.out


def results_dir() -> Path:
    """Where results files go: CUTE_KERNELS_RESULTS_DIR, else benchmarks/results."""
    from cute_kernels.runtime import env

    return Path(env.get("CUTE_KERNELS_RESULTS_DIR") or RESULTS_DIR)


def _round_floats(value, digits: int = RESULTS_DIGITS):
    """value with every float rounded to `digits` significant digits (timings carry no more)."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}") if math.isfinite(value) else value
    if isinstance(value, list):
        return [_round_floats(v, digits) for v in value]
    if isinstance(value, dict):
        return {k: _round_floats(v, digits) for k, v in value.items()}
    return value


def results_json(payload: dict) -> str:
    """A results payload as JSON with one row a line and floats to RESULTS_DIGITS significant
    digits: about a third the size of indented full-precision JSON (the committed results travel
    to the GPU machine with the tree), and a row still diffs as a line."""
    fields = []
    for key, value in _round_floats(payload).items():
        if key == "rows" and isinstance(value, list):
            text = "[\n" + ",\n".join(json.dumps(r) for r in value) + "\n]"
        else:
            text = json.dumps(value, indent=1 if key == "summary" else None)
        fields.append(f"{json.dumps(key)}: {text}")
    return "{\n" + ",\n".join(fields) + "\n}\n"


def write_results(suite: str, rows: Sequence[Row], summary: dict, notes: str = "", baseline: str = "cublas",
                  *, gpu: str | None = None, date: str | None = None) -> Path:
    """Write benchmarks/results/<suite>_<gpu>.json and .md; return the JSON path. gpu / date:
    the GPU and day the rows were measured on (default: this machine, today), for results
    assembled from files measured elsewhere."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out_dir = results_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    gpu = gpu_name() if gpu is None else gpu
    tag = gpu_tag(gpu)
    payload = {
        "gpu": gpu,
        "date": date or datetime.date.today().isoformat(),
        "rows": [{k: v for k, v in asdict(r).items() if v is not None and v != {}} for r in rows],
        "summary": summary,
    }
    jpath = out_dir / f"{suite}_{tag}.json"
    jpath.write_text(results_json(payload))
    md = [f"# {suite} on {payload['gpu']} ({payload['date']})", ""]
    if notes:
        md += [notes, ""]
    md += [format_table(rows, baseline=baseline), "", "## Summary", ""]
    md += [f"- {k}: {v:.3f}" if isinstance(v, float) else f"- {k}: {v}" for k, v in summary.items()]
    (out_dir / f"{suite}_{tag}.md").write_text("\n".join(md) + "\n")
    return jpath
