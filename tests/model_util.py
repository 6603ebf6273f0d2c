"""Shared by the model tests: varied weights, a script's results from fresh processes, the 2x-error
rule and greedy agreement by the near-tie rule."""

from __future__ import annotations

import os
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
    """{mode: what `python -c script mode out.pt` saved with torch.save}, one process each.

    The processes run on one CPU thread, so that no GEMM can be split over threads differently
    in one process than in the other (the callers compare the processes' outputs bit for bit;
    a CI run once saw last-bit differences between them on a busy 2-core machine)."""
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    outs = {}
    for mode in modes:
        f = tmp_path / f"{mode}.pt"
        r = subprocess.run([sys.executable, "-c", script, mode, str(f)], cwd=repo, capture_output=True, text=True,
                           timeout=300, env=env)
        assert r.returncode == 0, r.stderr[-3000:]
        outs[mode] = torch.load(f)
    return outs


# --------------------------------------------------------------------------- greedy agreement with near ties


@torch.no_grad()
def logit_error_bound(reference, precise, ids: torch.Tensor) -> torch.Tensor:
    """Per batch row, max |logit| difference between `reference` (the stock model in the
    precision under test) and `precise` (the same weights in a higher precision) on ids:
    how far the reference's own logits may be from the truth."""
    a = reference(ids).logits.float()
    b = precise(ids.to(next(precise.parameters()).device)).logits.float().to(a.device)
    return (a - b).abs().amax(dim=(1, 2))


@torch.no_grad()
def greedy_divergences(reference, prompt: torch.Tensor, tokens: torch.Tensor, bound: torch.Tensor) -> list[dict]:
    """Where greedy tokens of ours leave the reference, row by row.

    The reference is teacher-forced over prompt + tokens, so position t asks what the
    reference would pick after our first t tokens. At the first t where our token is not the
    reference's argmax, the divergence is a near tie (acceptable) when the reference's logit
    gap between its argmax and our token is below 2 * bound[row] (the reference's own error
    bound, `logit_error_bound`): both choices are within the rounding noise of the logits.
    That gap is at least the top-2 gap, so this is stricter than comparing the top two only.
    Tokens after a divergence are not compared (the contexts differ from there on).
    Returns per row {"first": t or None, "gap": float or None, "ok": bool}."""
    S, N = prompt.shape[1], tokens.shape[1]
    logits = reference(torch.cat([prompt, tokens.to(prompt.device)], 1)).logits[:, S - 1:S - 1 + N].float()
    top = logits.argmax(-1)
    out = []
    for b in range(tokens.shape[0]):
        bad = (top[b] != tokens[b].to(top.device)).nonzero()
        if not len(bad):
            out.append({"first": None, "gap": None, "ok": True})
            continue
        t = int(bad[0])
        row = logits[b, t]
        gap = float(row[top[b, t]] - row[int(tokens[b, t])])
        out.append({"first": t, "gap": gap, "ok": gap < 2 * float(bound[b])})
    return out


def assert_greedy_agrees(reference, prompt, tokens, bound, what: str = "") -> list[dict]:
    """greedy_divergences with every row acceptable; the report names the offending rows."""
    rows = greedy_divergences(reference, prompt, tokens, bound)
    bad = [(b, r, float(bound[b])) for b, r in enumerate(rows) if not r["ok"]]
    assert not bad, f"{what}: divergences beyond a near tie (row, where, gap, bound): {bad}"
    return rows


def assert_within_2x_error(ours: torch.Tensor, base: torch.Tensor, ref: torch.Tensor, msg="") -> None:
    """The project's tolerance: ours' error against the fp32 reference `ref`, max and RMS, at most
    twice that of `base` (torch's own run at the same precision), plus 1e-3 of the reference's range."""
    ours, base, ref = ours.float(), base.float(), ref.float()
    slack = 1e-3 * float(ref.abs().max())
    for metric in (lambda e: e.abs().max(), lambda e: e.pow(2).mean().sqrt()):
        e_ours, e_base = float(metric(ours - ref)), float(metric(base - ref))
        assert e_ours <= 2 * e_base + slack, (msg, e_ours, e_base)
