"""Whole-model quantization: swap every nn.Linear / GPT-2 Conv1D in place.

Schemes:

- "fp8-dynamic":       FP8Linear(mode="row"): per-token e4m3 activations, per-channel e4m3 weights
- "fp8-block":         FP8Linear(mode="block"): 1x128 activation / 128x128 weight scales
- "int8-dynamic":      Int8Linear: per-token int8 activations, per-channel int8 weights
- "int8-smoothquant":  Int8Linear with SmoothQuant factors from `calibration`

lm_head is skipped by default (skip=("lm_head",)). In GPT-2 it is tied to the
token embedding wte, which must stay in floating point for the embedding
lookup; quantizing lm_head therefore adds a second (quantized) copy instead of
saving memory, breaks the tie, and the logits' projection is the layer most
sensitive to quantization error. Pass skip=() to quantize it anyway.

Quantize after loading weights: Hugging Face's `tie_weights()` expects
lm_head.weight to be a Parameter.
"""

from __future__ import annotations

import fnmatch
import warnings
from typing import Iterable, Mapping

import torch
from torch import nn

from .nn import FP8Linear, Int8Linear, is_linear_like

__all__ = ["SCHEMES", "quantize_model"]

SCHEMES = ("fp8-dynamic", "fp8-block", "int8-dynamic", "int8-smoothquant")


def _skipped(name: str, patterns: Iterable[str]) -> bool:
    """fnmatch against the full dotted name, or against any dotted suffix of it."""
    return any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(name, "*." + p) for p in patterns)


def quantize_model(
    model: nn.Module,
    scheme: str,
    *,
    calibration: Iterable | Mapping[str, torch.Tensor] | None = None,
    alpha: float = 0.5,
    skip: Iterable[str] = ("lm_head",),
) -> nn.Module:
    """Replace linear-like modules of `model` in place with quantized ones.

    calibration (int8-smoothquant only): either {module_name: s [K]} as returned
    by `quant.smoothquant.calibrate`, or an iterable of model inputs to
    calibrate on now (with `alpha`). A module missing from the dict is quantized
    without smoothing (with a warning).

    skip: module-name patterns left in float, fnmatch-style, matched against the
    full name or any dotted suffix of it: "lm_head", "mlp.c_proj", "h.0.*".

    Returns `model` (or the replacement, if `model` itself is a linear module).
    """
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    if isinstance(skip, str):
        skip = (skip,)
    skip = tuple(skip)

    smooth: Mapping[str, torch.Tensor] | None = None
    if scheme == "int8-smoothquant":
        if calibration is None:
            raise ValueError(
                "scheme 'int8-smoothquant' needs calibration=: an iterable of model inputs "
                "(dicts or tensors) or a dict {module_name: smoothing factors [K]} from "
                "quant.smoothquant.calibrate"
            )
        if isinstance(calibration, Mapping):
            smooth = calibration
        else:
            from .smoothquant import calibrate

            smooth = calibrate(model, calibration, alpha=alpha)
        if not smooth:
            raise ValueError("calibration produced no smoothing factors (no linear module ran)")
    elif calibration is not None:
        raise ValueError(f"calibration is only used by 'int8-smoothquant', not {scheme!r}")

    targets = [
        (name, mod) for name, mod in model.named_modules() if is_linear_like(mod) and not _skipped(name, skip)
    ]
    missing = []
    replaced: nn.Module | None = None
    for name, mod in targets:
        if scheme == "fp8-dynamic":
            new = FP8Linear.from_float(mod, mode="row")
        elif scheme == "fp8-block":
            new = FP8Linear.from_float(mod, mode="block")
        elif scheme == "int8-dynamic":
            new = Int8Linear.from_float(mod)
        else:
            s = smooth.get(name)
            if s is None:
                missing.append(name)
            new = Int8Linear.from_float(mod, smooth=s)
        if name == "":
            replaced = new
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, new)
    if missing:
        warnings.warn(
            f"no smoothing factors for {len(missing)} module(s), quantized without smoothing: "
            f"{missing[:8]}{' ...' if len(missing) > 8 else ''}",
            stacklevel=2,
        )
    return replaced if replaced is not None else model
