"""Launching an already compiled Triton kernel without `JITFunction.run`'s per-call work.

`kernel[grid](...)` binds the arguments, computes a specialization key for every one of
them (value 1 / divisibility by 16 for ints, 16-byte alignment for pointers), looks the
key up and builds launch metadata: ~28 us of CPU per call on a lent H100 machine (Triton
3.6) against ~9 us for the launcher itself, more than the quantize kernels it launches
take on the GPU at decode and small-prefill sizes.

`TritonLaunch` keeps, per key, the `CompiledKernel` that the first call through the JIT
produced, and later calls go straight to its launcher. The key must pin every non-pointer
argument (they are specialized on their values) and the launch options: `__call__` takes a
caller-built key, `all_args` builds it from the arguments. The direct path is taken only
when every tensor argument is 16-byte aligned, which the captured specialization then
assumed too (anything else goes through the JIT). CUTE_KERNELS_TRITON_DIRECT=0, read when a
kernel would be captured, keeps every launch on the JIT.
Uses the CompiledKernel launcher interface the JIT itself calls (`run`, `function`,
`packed_metadata`, `launch_metadata`, the runtime knobs' launch hooks), as in Triton 3.6
and 3.9; a kernel object without it is never captured (every call goes through the JIT).
"""

from __future__ import annotations

import torch

__all__ = ["TritonLaunch"]


class TritonLaunch:
    """launch = TritonLaunch(jit_fn), then either

    launch(key, grid, ptrs, scalars, constexprs, num_warps=...): ptrs (tensors) and scalars
    are the kernel's leading non-constexpr parameters in order, constexprs the rest by name,
    and `key` pins the scalars, the constexprs, the options and the tensors' dtypes; or
    launch.all_args(grid, args, num_warps=...): every parameter in order.
    grid has 3 dims; the JIT's launch options (num_warps, ...) go as keywords.
    """

    def __init__(self, jit_fn):
        from triton import knobs

        self.jit_fn = jit_fn
        self._runtime = knobs.runtime  # the launch hooks live here (passed through as the JIT does)
        self._compiled: dict = {}
        self._names = list(getattr(jit_fn, "arg_names", ()))

    def __call__(self, key, grid, ptrs: tuple, scalars: tuple, constexprs: dict, **options):
        hit = self._compiled.get(key)
        aligned = all(not (p.data_ptr() & 15) for p in ptrs)
        if hit is not None and aligned:
            kernel, tail = hit
            self._run(kernel, grid, ptrs + scalars + tail, ptrs[0].device.index)
            return None
        kernel = self.jit_fn[grid](*ptrs, *scalars, **constexprs, **options)
        if hit is None and aligned and self._capturable(kernel, grid):
            # The launcher takes every parameter in definition order, constexprs included.
            names = self._names[len(ptrs) + len(scalars):]
            if set(names) == set(constexprs):
                self._compiled[key] = (kernel, tuple(constexprs[n] for n in names))
        return kernel

    def all_args(self, grid, args: tuple, **options):
        """Launch with every parameter given, in definition order (None for absent pointers,
        constexprs included). The key is built here: each tensor's dtype, every other value,
        the options, the device; tensors must be 16-byte aligned for the direct path. Both
        entry points return the CompiledKernel when the launch went through the JIT (None
        otherwise)."""
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        key = (tensors[0].device.index, *(a.dtype if isinstance(a, torch.Tensor) else a for a in args),
               *options.items())
        hit = self._compiled.get(key)
        aligned = all(not (t.data_ptr() & 15) for t in tensors)
        if hit is not None and aligned:
            self._run(hit, grid, args, key[0])
            return None
        kernel = self.jit_fn[grid](*args, **options)
        if hit is None and aligned and len(args) == len(self._names) and self._capturable(kernel, grid):
            self._compiled[key] = kernel
        return kernel

    def _run(self, kernel, grid, args: tuple, device_index: int) -> None:
        """What JITFunction.run does once it has the kernel: the launcher call itself."""
        stream = _current_raw_stream(device_index)
        rt = self._runtime
        kernel.run(grid[0], grid[1], grid[2], stream, kernel.function, kernel.packed_metadata,
                   kernel.launch_metadata(grid, stream, *args), rt.launch_enter_hook, rt.launch_exit_hook, *args)

    @staticmethod
    def _capturable(kernel, grid) -> bool:
        return len(grid) == 3 and _launchable(kernel) and _enabled()


ENV = "CUTE_KERNELS_TRITON_DIRECT"  # "0": every launch through the JIT (for A/Bs and as a way out)


def _enabled() -> bool:

    from . import env

    return env.enabled(ENV)


def _launchable(kernel) -> bool:
    return all(hasattr(kernel, a) for a in ("run", "function", "packed_metadata", "launch_metadata"))


def _current_raw_stream(index: int) -> int:
    # What Triton's own launch path reads (~0.2 us; torch.cuda.current_stream(d).cuda_stream
    # builds a Stream object: ~5 us on the lent machines).
    return torch._C._cuda_getCurrentRawStream(index)
