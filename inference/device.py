"""Which device a generate/bench run uses, and whether our kernels can run on it."""

from __future__ import annotations

from .models import UserError


def resolve_device(args):
    """The torch device of a generate/bench run: --device, with the backend's requirements.

    --device cpu runs the PyTorch references (backend 'reference'); the cute kernels need an
    sm_90 GPU and say so in one line otherwise."""
    import torch

    backend = getattr(args, "backend", "cute")
    if args.device is None:
        args.device = "cuda" if backend == "cute" or torch.cuda.is_available() else "cpu"
    if args.device == "cpu":
        if backend == "cute":
            args.backend = "reference"
        return torch.device("cpu")
    if backend == "cute":
        problem = cute_device_problem()
        if problem:
            raise UserError(f"{problem} (on a CPU machine use --device cpu: the PyTorch references)")
        return torch.device("cuda")
    if not torch.cuda.is_available():
        raise UserError("no CUDA GPU found (on a CPU machine use --device cpu)")
    return torch.device("cuda")


def cute_device_problem() -> str | None:
    """Why the cute kernels cannot run here, or None if an sm_90 GPU is present."""
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU found; the cute kernels need an NVIDIA Hopper GPU (sm_90)"
    major, minor = torch.cuda.get_device_capability(0)
    if (major, minor) != (9, 0):
        return f"{torch.cuda.get_device_name(0)} is sm_{major}{minor}; the cute kernels need sm_90 (H100/H200)"
    return None
