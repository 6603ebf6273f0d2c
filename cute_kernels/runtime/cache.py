"""Compile cache: one `cute.compile` per kernel kind, in memory and on disk.

A kernel kind is a `CompileKey`: everything the compiled code specialises on
(dtypes, operand majors, tile, cluster, epilogue, arch). M, N and K are dynamic,
so one entry serves every problem size of its kind.

`cute.compile` never caches and costs ~1-2 s per GEMM variant. The disk cache
stores the TVM-FFI object file from `export_to_c` and reloads it with
`cute.runtime.load_module` (~ms), so a fresh process does not pay the compile.
The directory is keyed by a hash of this package's sources and the DSL version:
editing a kernel invalidates every entry built from the old code.
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import hashlib
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

from .arch import TARGET_ARCH

_FUNCTION_NAME = "cute_kernel"


@dataclasses.dataclass(frozen=True)
class CompileKey:
    """What one compiled kernel is specialised on (everything but M, N, K and pointers)."""

    kernel: str
    dtypes: tuple[str, ...]
    majors: tuple[str, ...]
    tile: tuple[int, ...]
    cluster: tuple[int, ...]
    epilogue: tuple = ()
    extra: tuple = ()
    arch: str = TARGET_ARCH

    def digest(self) -> str:
        return hashlib.sha256(repr(self).encode()).hexdigest()[:24]


@functools.lru_cache(maxsize=1)
def _source_fingerprint() -> str:
    import cutlass

    h = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]
    for p in sorted(root.rglob("*.py")):
        h.update(p.relative_to(root).as_posix().encode())
        h.update(p.read_bytes())
    h.update(getattr(cutlass, "__version__", "?").encode())
    try:
        import tvm_ffi

        h.update(getattr(tvm_ffi, "__version__", "?").encode())
    except ImportError:
        pass
    return h.hexdigest()[:16]


def cache_dir() -> Path | None:
    """Disk cache location; CUTE_KERNELS_CACHE_DIR overrides, CUTE_KERNELS_DISK_CACHE=0 disables."""
    if os.environ.get("CUTE_KERNELS_DISK_CACHE", "1") == "0":
        return None
    base = os.environ.get("CUTE_KERNELS_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "cute_kernels"
    )
    return Path(base) / _source_fingerprint()


class KernelCache:
    """In-memory dict over an optional on-disk store of exported TVM-FFI objects."""

    def __init__(self) -> None:
        self._mem: dict[CompileKey, Any] = {}
        self._owners: list[Any] = []  # the compiled objects behind _mem's direct callables
        self._lock = threading.Lock()
        self.stats = {"hits": 0, "disk_loads": 0, "compiles": 0, "compile_s": 0.0}

    def get(self, key: CompileKey, compile_fn: Callable[[], Any]) -> Any:
        fn = self._mem.get(key)
        if fn is not None:
            self.stats["hits"] += 1
            return fn
        with self._lock:
            fn = self._mem.get(key)
            if fn is None:
                owner = self._load_or_compile(key, compile_fn)
                self._owners.append(owner)
                fn = self._mem[key] = direct_callable(owner)
        return fn

    def _load_or_compile(self, key: CompileKey, compile_fn: Callable[[], Any]) -> Any:
        d = cache_dir()
        if d is None:
            return self._compile(compile_fn)
        d.mkdir(parents=True, exist_ok=True)
        obj = d / f"{key.kernel}-{key.digest()}.o"
        with open(d / f".{key.digest()}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if obj.exists():
                try:
                    fn = _load(obj)
                    self.stats["disk_loads"] += 1
                    return fn
                except Exception:
                    obj.unlink(missing_ok=True)  # stale or truncated: rebuild below
            fn = self._compile(compile_fn)
            try:
                tmp = obj.with_suffix(f".tmp{os.getpid()}.o")
                fn.export_to_c(str(tmp), function_name=_FUNCTION_NAME)
                os.replace(tmp, obj)
            except Exception:
                pass  # a kernel that cannot be exported still runs from memory
            return fn

    def _compile(self, compile_fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        fn = compile_fn()
        self.stats["compiles"] += 1
        self.stats["compile_s"] += time.perf_counter() - t0
        return fn

    def clear_memory(self) -> None:
        self._mem.clear()


def direct_callable(fn: Any) -> Any:
    """The positional-only tvm_ffi.Function inside a freshly compiled kernel, else fn.

    `cute.compile` wraps the TVM-FFI function in a Python object whose __call__ checks
    its state and forwards through a generated keyword-argument wrapper: two Python
    frames per launch that the positional calls made here never need (a kernel loaded
    from the disk cache is the bare function already). The wrapper object stays
    referenced (KernelCache._owners): it owns what was loaded for the kernel.
    """
    inner = getattr(fn, "__tvm_ffi_object__", None)
    args = getattr(fn, "execution_args", None)
    if inner is None or args is None or getattr(args, "has_pointer_address_arg_specs", True):
        return fn
    return inner() or fn


def _load(path: Path) -> Any:
    import cutlass.cute as cute

    return cute.runtime.load_module(str(path), enable_tvm_ffi=True)[_FUNCTION_NAME]


KERNELS = KernelCache()
