"""SmoothQuant calibration: per-input-channel smoothing factors for W8A8.

LLM activations have a few input channels with values 10-100x larger than the
rest; with per-token INT8 scales those channels set the scale and every other
channel of the token is rounded to a handful of levels. Weights are smooth, so
SmoothQuant moves the difficulty: for each linear layer with input channel j,

    s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)

and the layer computes (X / s) @ (W * s)^T, which is X @ W^T exactly but with
activation outliers divided down and the weight columns scaled up. alpha = 0.5
splits the range evenly; larger alpha pushes more into the weights.

`calibrate` runs the model on a few batches with forward pre-hooks on every
linear-like module (nn.Linear and GPT-2's Conv1D), records max|X_j| over all
tokens, and returns {module_name: s [K] float32 on the CPU}.

Clamping: max|X_j| and max|W_j| are floored at 1e-5 so a dead channel does not
give 0 or Inf, and s is clamped to [1e-5, 1e5]. A channel that never fired
(max|X_j| == 0) or has an all-zero weight column gets s_j = 1: there is nothing
to balance, and dividing future inputs by a tiny s would create an outlier.
NaN in calibration activations is ignored (treated as 0) so one bad batch does
not poison a channel.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import torch
from torch import nn

from .nn import is_linear_like, linear_weight_nk

__all__ = ["calibrate", "collect_act_absmax", "smoothing_factors"]

_FLOOR = 1e-5
_S_MIN, _S_MAX = 1e-5, 1e5


def _model_device(model: nn.Module) -> torch.device | None:
    for p in model.parameters():
        return p.device
    for b in model.buffers():
        return b.device
    return None


def _to_device(obj, device):
    if device is None:
        return obj
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, Mapping):
        return {k: _to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_device(v, device) for v in obj)
    return obj


def _run(model: nn.Module, batch) -> None:
    if isinstance(batch, Mapping):
        model(**batch)
    elif isinstance(batch, (list, tuple)):
        model(*batch)
    else:
        model(batch)


@torch.no_grad()
def collect_act_absmax(
    model: nn.Module, batches: Iterable, names: Iterable[str] | None = None
) -> dict[str, torch.Tensor]:
    """{module_name: max over all calibration tokens of |x_j|, [K] fp32 CPU}.

    `batches` yields model inputs: a dict (model(**b)), a tuple/list (model(*b))
    or a tensor (model(b)); tensors are moved to the model's device. Only modules
    that ran at least once appear in the result.
    """
    wanted = set(names) if names is not None else None
    stats: dict[str, torch.Tensor] = {}
    hooks = []

    def make_hook(name):
        def hook(module, args, kwargs):
            x = args[0] if args else next(iter(kwargs.values()))
            a = x.detach().reshape(-1, x.shape[-1]).abs().float().amax(dim=0)
            a = torch.nan_to_num(a, nan=0.0)
            prev = stats.get(name)
            stats[name] = a if prev is None else torch.maximum(prev, a)

        return hook

    for name, module in model.named_modules():
        if is_linear_like(module) and (wanted is None or name in wanted):
            hooks.append(module.register_forward_pre_hook(make_hook(name), with_kwargs=True))
    if not hooks:
        raise ValueError("model has no nn.Linear / Conv1D modules to calibrate")

    was_training = model.training
    device = _model_device(model)
    model.eval()
    n = 0
    try:
        for batch in batches:
            _run(model, _to_device(batch, device))
            n += 1
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    if n == 0:
        raise ValueError("calibration needs at least one batch; `batches` was empty")
    return {k: v.cpu() for k, v in stats.items()}


def smoothing_factors(act_absmax: torch.Tensor, weight_nk: torch.Tensor, alpha: float = 0.5) -> torch.Tensor:
    """s [K] from activation max|X_j| [K] and the [N, K] weight (see module docstring)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    a = act_absmax.detach().float().cpu()
    w = weight_nk.detach().float().abs().amax(dim=0).cpu()
    if a.shape != w.shape:
        raise ValueError(f"activation stats [{a.numel()}] do not match weight in_features [{w.numel()}]")
    s = a.clamp(min=_FLOOR).pow(alpha) / w.clamp(min=_FLOOR).pow(1.0 - alpha)
    s = s.clamp(_S_MIN, _S_MAX)
    return torch.where((a > 0) & (w > 0), s, torch.ones_like(s))


def calibrate(model: nn.Module, batches: Iterable, alpha: float = 0.5) -> dict[str, torch.Tensor]:
    """{module_name: smoothing factors s [K] (fp32, CPU)} for every linear-like
    module that ran on the calibration batches."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    stats = collect_act_absmax(model, batches)
    modules = dict(model.named_modules())
    return {name: smoothing_factors(a, linear_weight_nk(modules[name]), alpha) for name, a in stats.items()}
