"""The Triton kernels of a job: recorded into its manifest, compiled ahead in worker processes.

A cold start of the inference CLI spent about 5 s of its first step in Triton's JIT (the
decode GEMVs, the next-token glue, the fused LayerNorm), one kernel after another, on the
critical path, while the CuTe DSL kernels were already built in parallel. Triton's JIT
writes every kernel to its own disk cache (`TRITON_CACHE_DIR`, default ~/.triton/cache),
so compiling the same specializations in worker processes beforehand turns those compiles
into cache loads.

Recording: with CUTE_KERNELS_RECORD set, a `jit_post_compile_hook` notes each compiled
specialization (Triton's own `specialization_data`, what `JITFunction.preload` takes), the
kernel's module-level name and its cache directory. Replaying (`preload`, in a worker)
imports the kernel and compiles the specialization into Triton's disk cache:
- with a GPU, through `JITFunction.preload`, the same path as a launch, then builds the
  kernel's C launcher (also cached);
- without one (a CPU machine, a container build), through `triton.compile` for the recorded
  target (sm_90 if the record names none). The cache key is Triton's own (sources,
  specialization, options, ptxas version, target), so the GPU machine's first launch finds
  the entry when it runs the same Triton. The recorded options name the recording machine's
  libdevice path, which is dropped for this machine's: the key hashes the file, not the path.

A record from another Triton version or GPU names a cache directory that does not exist
here: it is replayed (and fails harmlessly if that Triton cannot read it; the kernel then
compiles on first use, as without a manifest).
"""

from __future__ import annotations

import glob
import importlib
import os
import time
from pathlib import Path

_RECORDED: dict[tuple[str, str], dict] = {}


def cache_root() -> Path:
    """Triton's disk cache (its default, read without importing Triton)."""
    return Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")


def is_cached(entry: dict) -> bool:
    """Whether Triton's disk cache already holds the entry's kernel (its group file is written
    last), or a preload here already did what it could: a record whose cache directory differs
    from what this Triton builds (an edited kernel source, another Triton) leaves a marker, so
    that every later start does not spawn a worker to retry it."""
    d = entry.get("cache_dir")
    root = cache_root()
    return bool(d) and (bool(glob.glob(str(root / d / "__grp__*.json"))) or (root / f"{d}.preloaded").exists())


def install_recorder() -> None:
    """Note every Triton specialization compiled in this process (chained after any hook already set)."""
    from triton import knobs

    previous = knobs.runtime.jit_post_compile_hook

    def hook(*, key, repr, fn, compile, is_manual_warmup, already_compiled):
        # A warm-up is not a launch: preload workers (which inherit the recording switch) would
        # otherwise record the very specializations they replay, stale ones included.
        if is_manual_warmup:
            return previous(key=key, repr=repr, fn=fn, compile=compile, is_manual_warmup=is_manual_warmup,
                            already_compiled=already_compiled) if previous is not None else None
        try:
            jit = fn.jit_function
            kernel = jit.device_caches[compile["device"]][0].get(key)
            module, name = jit.fn.__module__, jit.fn.__qualname__
            if kernel is not None and getattr(importlib.import_module(module), name, None) is jit:
                from triton.runtime.cache import _base32

                spec = compile["specialization_data"]
                _RECORDED[(f"{module}:{name}", spec)] = {"fn": f"{module}:{name}", "spec": spec,
                                                         "cache_dir": _base32(kernel.hash)}
        except Exception:  # noqa: BLE001 - recording is best effort; the launch itself must not fail
            pass
        if previous is not None:
            return previous(key=key, repr=repr, fn=fn, compile=compile, is_manual_warmup=is_manual_warmup,
                            already_compiled=already_compiled)
        return None

    knobs.runtime.jit_post_compile_hook = hook


def recorded() -> list[dict]:
    return list(_RECORDED.values())


def preload(entry: dict) -> tuple[str, str, float]:
    """Worker process: compile one recorded specialization into Triton's disk cache.
    Returns (kernel, status, seconds), status "cached", "compiled" or "failed: why"."""
    t0 = time.perf_counter()
    if is_cached(entry):
        return entry["fn"], "cached", 0.0
    gpu = _has_gpu()
    try:
        module, name = entry["fn"].split(":")
        jit = getattr(importlib.import_module(module), name)
        if gpu:
            _build_launcher(jit.preload(entry["spec"]))
        else:
            cross_compile(jit, entry["spec"])
        status = "compiled"
    except Exception as e:  # noqa: BLE001 - another Triton version: compiled on first use instead
        status = f"failed: {type(e).__name__}: {e}"
    # The marker stops a GPU machine from retrying a record its Triton cannot hit; a CPU
    # machine's cache is copied to the GPU machine, where the record may well hit.
    if gpu and not is_cached(entry):
        try:
            (cache_root() / f"{entry['cache_dir']}.preloaded").write_text(status)
        except OSError:
            pass
    return entry["fn"], status, time.perf_counter() - t0


def _build_launcher(kernel) -> None:
    """Build the kernel's host launcher too: Triton compiles it with the system C compiler on
    the first launch (cached beside the kernel), about 0.2 s each on the critical path
    otherwise. The launcher needs no CUDA context, unlike loading the kernel itself."""
    try:
        from triton.runtime.driver import driver

        driver.active.launcher_cls(kernel.src, kernel.metadata)
    except Exception:  # noqa: BLE001 - a Triton without this interface builds it at the first launch
        pass


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def cross_compile(jit, spec: str):
    """Compile a recorded specialization with no GPU present (`JITFunction.preload` without
    its device lookup): the recorded target, else sm_90; this machine's libdevice."""
    import json

    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend

    def tup(v):  # JSON turned the specialization's tuples into lists
        return tuple(tup(x) for x in v) if isinstance(v, list) else v

    def constant(v):
        if isinstance(v, str) and tl.dtype.is_dtype(v):
            return tl.dtype(v)
        if isinstance(v, dict) and "constexpr" in v:
            return tl.constexpr(tup(v["constexpr"]))
        if isinstance(v, dict):
            raise ValueError(f"a constant Triton cannot rebuild without a GPU: {v}")
        return tup(v)

    d = json.loads(spec)
    target = GPUTarget(**d["target"]) if d.get("target") else GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    options = backend.parse_options({k: tup(v) for k, v in d["options"].items() if k != "extern_libs"})
    src = ASTSource(jit, {k: tup(v) for k, v in d["signature"].items()},
                    {tuple(k): constant(v) for k, v in zip(d["constant_keys"], d["constant_vals"])},
                    {tuple(k): v for k, v in zip(d["attrs_keys"], d["attrs_vals"])})
    return triton.compile(src, target=target, options=options.__dict__)
