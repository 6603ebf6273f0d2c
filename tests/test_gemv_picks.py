"""The one-row GEMV launch picks against their committed evidence (no GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_picks_match_the_committed_sweep():
    """Every shape of benchmarks/results/gemv_sweep_h100.json gets the config its "after" column
    timed, so the table stays true to the code."""
    from cute_kernels.matmul.gemv import _launch_blocks

    rows = json.loads((ROOT / "benchmarks/results/gemv_sweep_h100.json").read_text())["rows"]
    assert rows
    for r in rows:
        assert list(_launch_blocks(1, r["N"], r["K"], rms=r["rms_prologue"])) == r["after"]["cfg"], (r["set"], r["shape"])


@pytest.mark.parametrize("stems", [("gemv_sweep_step_h100", "gemv_sweep_bf16_dot_h100"), ("gemv_sweep_fp8_h100", "gemv_sweep_fp8_dot_h100")])
def test_step_picks_match_their_sweeps(stems):
    """The decode step's launches (fused prologue / epilogues, 16- and 8-bit weights): each shape's
    pick is the config its sweeps (FMA and tl.dot candidates) found fastest, or within 2% of it."""
    from cute_kernels.matmul.gemv import _launch_blocks

    timed: dict = {}
    for stem in stems:
        for r in json.loads((ROOT / f"benchmarks/results/{stem}.json").read_text())["rows"]:
            t = timed.setdefault((r["N"], r["K"], r["kind"], r["weights"]), {})
            t.update({json.dumps(b["cfg"]): b["us"] for b in r["best"]})
    assert timed
    for (N, K, kind, weights), t in timed.items():
        pick = json.dumps(list(_launch_blocks(1, N, K, 1 if weights != "bf16" else 2, kind == "rms_swiglu",
                                              kind.startswith("rms"))))
        assert pick in t and t[pick] <= 1.02 * min(t.values()), (N, K, kind, weights, pick)


@pytest.mark.parametrize("stem", ["gemv_sweep_heads_m2_h100", "gemv_sweep_heads_m7_h100", "gemv_sweep_short_m2_h100",
                                  "gemv_sweep_short_m7_h100"])
def test_batch_picks_match_their_sweeps(stem):
    """2-8 rows of 16-bit weights at K < 2048 (GPT-2's c_attn, c_fc, vocabulary heads): each
    pick is the fastest config of its sweep or within 2% of it, and at least as fast as cuBLAS
    on the vocabulary heads, where the sweep was run for that."""
    from cute_kernels.matmul.gemv import _launch_blocks

    rows = json.loads((ROOT / f"benchmarks/results/{stem}.json").read_text())["rows"]
    assert rows
    for r in rows:
        t = {json.dumps(b["cfg"]): b["us"] for b in r["best"]}
        pick = json.dumps(list(_launch_blocks(r["M"], r["N"], r["K"])))
        assert pick in t and t[pick] <= 1.02 * min(t.values()), (stem, r["shape"], pick)
        if r["N"] >= 32768:
            assert t[pick] < r["cublas_us"], (stem, r["shape"])


def test_gemv_sweep_without_a_gpu_says_so():
    import torch

    if torch.cuda.is_available():
        return
    p = subprocess.run([sys.executable, "-m", "benchmarks.gemv_sweep", "--default-only"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout.strip() == "error: gemv_sweep needs a CUDA GPU", p.stdout + p.stderr


def test_vocab_gemv_rows():
    """Vocabulary-sized 16-bit weights take the most rows (a multiple of 8) within 28 KB a CTA:
    16 below K = 1024, 8 from it; narrower weights keep their 96 KB slices."""
    from cute_kernels.matmul.gemv import gemv_sm90_config

    rows = {k: gemv_sm90_config(50257, k, False).rows for k in (768, 896, 1024, 1280, 1600)}
    assert rows == {768: 16, 896: 16, 1024: 8, 1280: 8, 1600: 8}
    assert gemv_sm90_config(151936, 896, False).rows == 16
    assert gemv_sm90_config(4800, 1600, False).rows == 32  # 96 KB
    assert gemv_sm90_config(50257, 1024, False, slice_bytes=32 * 1024).rows == 16
