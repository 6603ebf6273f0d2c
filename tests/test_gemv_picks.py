"""The one-row GEMV launch picks against their committed evidence (no GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_picks_match_the_committed_sweep():
    """Every shape of benchmarks/results/gemv_sweep_h100.json gets the config its "after" column
    timed, so the table stays true to the code."""
    from cute_kernels.matmul.gemv import _launch_blocks

    rows = json.loads((ROOT / "benchmarks/results/gemv_sweep_h100.json").read_text())["rows"]
    assert rows
    for r in rows:
        assert list(_launch_blocks(1, r["N"], r["K"])) == r["after"]["cfg"], (r["set"], r["shape"])


def test_gemv_sweep_without_a_gpu_says_so():
    import torch

    if torch.cuda.is_available():
        return
    p = subprocess.run([sys.executable, "-m", "benchmarks.gemv_sweep", "--default-only"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout.strip() == "error: gemv_sweep needs a CUDA GPU", p.stdout + p.stderr
