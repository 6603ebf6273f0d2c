"""Time to first output of the README's main command, cold and warm: `python -m benchmarks.startup`.

Each case runs the command in a fresh process and takes the wall time around it (the
interpreter's start and exit included) and the phase breakdown the command prints as its last
line. Cases:
- cold: empty kernel and Triton caches (fresh temporary directories);
- warm 1..N: the same caches again;
- with `--precompiled DIR`: a copy of a kernel cache that `python -m cute_kernels.precompile`
  filled on a machine without a GPU, with a copy of the Triton cache the same command filled
  there (`--precompiled-triton DIR`; else an empty one), then once more warm.
Before the first case one untimed process imports torch and transformers and starts CUDA, so
the cold case measures cold kernel caches, not a machine whose disk cache has not yet read
the libraries.
Results: benchmarks/results/startup_<gpu>.json and .md (CUTE_KERNELS_RESULTS_DIR to redirect).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import RESULTS_DIR, gpu_name, gpu_tag, require_hopper

COMMAND = [sys.executable, "-m", "inference", "generate", "--model", "gpt2", "--random-weights", "--prompt", "The_GPU",
           "--max-new-tokens", "32"]


def parse_startup(text: str) -> dict:
    """The phases (s) and kernel counts from the command's `--- startup ---` line."""
    lines = text.strip().splitlines()
    line = lines[lines.index("--- startup ---") + 1] if "--- startup ---" in lines else ""
    head, _, tail = line.partition("; ")
    phases = {n.strip(): float(v) for n, v in re.findall(r"([a-z][a-z ]*?) ([\d.]+)(?:,|$)", head.partition(": ")[2])}
    out = {"phases_s": phases, "note": tail}
    m = re.search(r"(\d+) loaded from the disk cache \(([\d.]+) s\), (\d+) compiled", tail)
    if m:
        out.update(kernels_loaded=int(m[1]), load_s=float(m[2]), kernels_compiled_in_process=int(m[3]))
    m = re.search(r"(?:(\d+) kernels)?(?: and )?(?:(\d+) Triton kernels)? compiled in parallel \(([\d.]+) s\)", tail)
    if m:
        out.update(kernels_compiled_in_parallel=int(m[1] or 0), triton_compiled_in_parallel=int(m[2] or 0),
                   parallel_compile_wall_s=float(m[3]))
    return out


def run_case(name: str, kernel_cache: Path, triton_cache: Path) -> dict:
    env = {**os.environ, "CUTE_KERNELS_CACHE_DIR": str(kernel_cache), "TRITON_CACHE_DIR": str(triton_cache)}
    t0 = time.perf_counter()
    p = subprocess.run(COMMAND, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"error: {name}: the command failed ({p.returncode}):\n{p.stderr[-2000:]}")
    row = {"case": name, "wall_s": round(wall, 2), **parse_startup(p.stdout)}
    print(f"{name}: {wall:.2f} s  ({row['phases_s']})", flush=True)
    return row


def _extras() -> str:
    """Optional packages that transformers imports at startup when present (FlashAttention's
    `flash_attn` takes about half a second): named, since they change the imports phase."""
    import importlib.util

    found = [m for m in ("flash_attn", "quack") if importlib.util.find_spec(m) is not None]
    return f"also installed: {', '.join(found)}; " if found else "no flash_attn or quack installed; "


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.startup", description=__doc__.splitlines()[0])
    ap.add_argument("--warm", type=int, default=3, help="warm runs after the cold one")
    ap.add_argument("--precompiled", type=Path, help="a kernel cache filled by cute_kernels.precompile elsewhere")
    ap.add_argument("--precompiled-triton", type=Path,
                    help="the Triton cache (TRITON_CACHE_DIR) that the same precompile filled")
    args = ap.parse_args(argv)
    require_hopper("benchmarks.startup")
    subprocess.run([sys.executable, "-c", "import torch, transformers; torch.cuda.init()"], check=True, timeout=600)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        kc, tc = tmp / "kernels", tmp / "triton"
        rows.append(run_case("cold: empty kernel and Triton caches", kc, tc))
        rows += [run_case(f"warm {i + 1}", kc, tc) for i in range(args.warm)]
        if args.precompiled:
            pc = tmp / "precompiled"
            shutil.copytree(args.precompiled, pc)
            tc2 = tmp / "t2"
            if args.precompiled_triton:
                shutil.copytree(args.precompiled_triton, tc2)
            what = "kernel and Triton caches" if args.precompiled_triton else "kernel cache (Triton cache empty)"
            rows.append(run_case(f"{what} precompiled without a GPU", pc, tc2))
            rows.append(run_case("the same caches, next process", pc, tc2))
    warm = sorted(r["wall_s"] for r in rows if r["case"].startswith("warm"))
    summary = {"cold_wall_s": rows[0]["wall_s"], "warm_median_wall_s": warm[len(warm) // 2] if warm else None}
    if args.precompiled:
        summary["precompiled_first_wall_s"] = rows[-2]["wall_s"]
    import torch
    import transformers

    from cute_kernels.runtime.cache import _version

    payload = {"suite": "startup", "gpu": gpu_name(), "date": datetime.date.today().isoformat(),
               "command": " ".join(["python", *COMMAND[1:]]),
               "conditions": f"torch {torch.__version__}, transformers {transformers.__version__}, "
                             f"nvidia-cutlass-dsl {_version('nvidia-cutlass-dsl')}, {os.cpu_count()} CPU cores; "
                             f"{_extras()}Python bytecode compiled beforehand (as pip install does); libraries in the OS file cache "
                             "(one untimed import of torch and transformers first); wall = the whole command in a fresh "
                             "process; phases as the command prints them",
               "rows": rows, "summary": summary}
    from cute_kernels.runtime import env

    out_dir = Path(env.get("CUTE_KERNELS_RESULTS_DIR") or RESULTS_DIR)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"startup_{gpu_tag()}.json"
    path.write_text(json.dumps(payload, indent=1) + "\n")
    names = list(rows[0]["phases_s"])
    md = [f"# startup on {payload['gpu']} ({payload['date']})", "", f"`{payload['command']}`; {payload['conditions']}.",
          "", "| case | wall s | " + " | ".join(names) + " | kernels |", "|---" * (len(names) + 3) + "|"]
    for r in rows:
        md.append(f"| {r['case']} | {r['wall_s']:.2f} | " + " | ".join(f"{r['phases_s'].get(n, 0):.1f}" for n in names)
                  + f" | {r['note']} |")
    md += ["", "## Summary", ""] + [f"- {k}: {v}" for k, v in summary.items()]
    path.with_suffix(".md").write_text("\n".join(md) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
