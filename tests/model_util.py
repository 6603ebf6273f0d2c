"""Shared by the model tests: varied weights, and a script's results from fresh processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch


def vary_weights(model):
    """Non-zero biases and larger weights than the init: varied greedy tokens, real epilogue work."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
            elif p.dim() == 2:
                p.normal_(0, 0.3)
    return model


def fresh_process_results(script: str, modes, tmp_path) -> dict:
    """{mode: what `python -c script mode out.pt` saved with torch.save}, one process each."""
    repo = Path(__file__).resolve().parents[1]
    outs = {}
    for mode in modes:
        f = tmp_path / f"{mode}.pt"
        r = subprocess.run([sys.executable, "-c", script, mode, str(f)], cwd=repo, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        outs[mode] = torch.load(f)
    return outs
