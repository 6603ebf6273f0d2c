"""Compile cache: one `cute.compile` per kernel kind, in memory and on disk.

A kernel kind is a `CompileKey`: the compile function and every argument it is built
from (dtypes, operand majors, the frozen config, the epilogue, arch). M, N and K are
dynamic, so one entry serves every problem size of its kind.

`cute.compile` never caches and costs ~1-2 s per GEMM variant. The disk cache
stores the TVM-FFI object file from `export_to_c`, so a fresh process does not pay
the compile. The directory is keyed by a hash of this package's sources and the DSL version:
editing a kernel invalidates every entry built from the old code.

Beside each object the cache links a shared library (`cc -shared` against the DSL's
runtime and libtvm_ffi) and loads that with `tvm_ffi.load_module`: a warm process then
never imports the DSL (about 0.7 s on the H100 machine). Where no C compiler is present,
or the library was linked on another machine, the object is loaded through the DSL.

Call sites ask `KERNELS.compiled(name, compile_fn, *args)`: the compile function and its
plain-data arguments are the recipe, and the CompileKey is derived from it (runtime.key).

Every miss names a compile *recipe* (`runtime.recipe`: a partial of a module-level
compile function with plain-data arguments). The cache remembers which kernels a
process asked for (`KernelCache.used`); with CUTE_KERNELS_RECORD=<file> set it merges
them into that manifest at exit, and `cute_kernels.precompile` replays a manifest in
parallel worker processes on any machine, so a model's kernels can be built ahead of
time (a container build, a CPU box) or all at once on first use.
"""

from __future__ import annotations

import atexit
import fcntl
import functools
import hashlib
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

from . import env
from .key import CompileKey  # noqa: F401  (public here)

_FUNCTION_NAME = "cute_kernel"


def _version(dist: str) -> str:
    # Package metadata, not an import: the DSL takes most of a second to import.
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "?"


@functools.lru_cache(maxsize=1)
def _source_fingerprint() -> str:
    h = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]
    for p in sorted(root.rglob("*.py")):
        h.update(p.relative_to(root).as_posix().encode())
        h.update(p.read_bytes())
    for dist in ("nvidia-cutlass-dsl", "apache-tvm-ffi"):
        h.update(_version(dist).encode())
    return h.hexdigest()[:16]


def cache_root() -> Path:
    """The folder every on-disk cache lives under: CUTE_KERNELS_CACHE_DIR, else
    $XDG_CACHE_HOME/cute_kernels, else ~/.cache/cute_kernels."""
    return Path(env.get("CUTE_KERNELS_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "cute_kernels"))


def cache_dir() -> Path | None:
    """Disk cache location of compiled kernels (a folder per source fingerprint under
    `cache_root()`); CUTE_KERNELS_DISK_CACHE=0 disables it."""
    if not env.enabled("CUTE_KERNELS_DISK_CACHE"):
        return None
    return cache_root() / _source_fingerprint()


def object_path(key: CompileKey, directory: Path | None = None) -> Path | None:
    """Where the disk cache (or `directory`) keeps `key`'s exported kernel (None: disk cache off)."""
    d = cache_dir() if directory is None else Path(directory)
    return None if d is None else d / f"{key.kernel}-{key.digest()}.o"


class KernelCache:
    """In-memory dict over an optional on-disk store of exported TVM-FFI objects."""

    def __init__(self) -> None:
        self._mem: dict[CompileKey, Any] = {}
        self._fast: dict[tuple, Any] = {}
        self._owners: list[Any] = []  # the compiled objects behind _mem's direct callables
        self._lock = threading.Lock()
        self.used: dict[CompileKey, Callable[[], Any]] = {}  # every kernel asked for, with its recipe
        self.stats = {"hits": 0, "disk_loads": 0, "load_s": 0.0, "compiles": 0, "compile_s": 0.0}

    def compiled(self, kernel: str, compile_fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """The kernel that `compile_fn(*args, **kwargs)` builds (a module-level function whose
        arguments are hashable plain data: runtime.recipe). The front dict is keyed by the
        call itself (hashing a few small objects), the CompileKey by the recipe's canonical
        JSON, so both see every argument, and nothing else."""
        fast = (kernel, compile_fn, args, tuple(kwargs.items()) if kwargs else ())
        fn = self._fast.get(fast)
        if fn is None:
            rec = functools.partial(compile_fn, *args, **kwargs)
            fn = self._fast[fast] = self.get(CompileKey.of(kernel, rec), rec)
        return fn

    def get(self, key: CompileKey, recipe: Callable[[], Any]) -> Any:
        """The kernel for `key`: from memory, else the disk cache, else `recipe()` (a
        `runtime.recipe` partial, so that manifests and worker processes can replay it)."""
        fn = self._mem.get(key)
        if fn is not None:
            self.stats["hits"] += 1
            return fn
        with self._lock:
            fn = self._mem.get(key)
            if fn is None:
                self.used.setdefault(key, recipe)
                owner = self._load_or_compile(key, recipe)
                self._owners.append(owner)
                fn = self._mem[key] = direct_callable(owner)
        return fn

    def _load_or_compile(self, key: CompileKey, recipe: Callable[[], Any]) -> Any:
        obj = object_path(key)
        if obj is None:
            return self._compile(recipe)
        with _locked(obj):
            if obj.exists():
                try:
                    t0 = time.perf_counter()
                    fn = _load(obj)
                    self.stats["disk_loads"] += 1
                    self.stats["load_s"] += time.perf_counter() - t0
                    return fn
                except Exception:
                    obj.unlink(missing_ok=True)  # stale or truncated: rebuild below
                    obj.with_suffix(".so").unlink(missing_ok=True)
            fn = self._compile(recipe)
            _export(fn, obj)
            return fn

    def _compile(self, compile_fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        fn = compile_fn()
        self.stats["compiles"] += 1
        self.stats["compile_s"] += time.perf_counter() - t0
        return fn

    def clear_memory(self) -> None:
        self._mem.clear()
        self._fast.clear()


class _locked:
    """An exclusive file lock beside `obj`: one process builds a kernel, the others wait
    for it and load the result."""

    def __init__(self, obj: Path) -> None:
        obj.parent.mkdir(parents=True, exist_ok=True)
        self._path = obj.parent / f".{obj.stem}.lock"

    def __enter__(self):
        self._file = open(self._path, "w")
        fcntl.flock(self._file, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        self._file.close()  # closing releases the lock


def _export(fn: Any, obj: Path) -> bool:
    """Write a compiled kernel to the disk cache atomically (write to a temp file, rename),
    and link its shared library beside it."""
    try:
        tmp = obj.with_suffix(f".tmp{os.getpid()}.o")
        fn.export_to_c(str(tmp), function_name=_FUNCTION_NAME)
        os.replace(tmp, obj)
    except Exception:
        return False  # a kernel that cannot be exported still runs from memory
    _link(obj)
    return True


def _link(obj: Path) -> bool:
    """Link the object `obj` into `obj.so` against the DSL runtime and libtvm_ffi of this
    machine (absolute rpaths). False where there is no C compiler or the link fails: the
    object then keeps loading through the DSL."""
    import shutil
    import subprocess

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return False
    from cutlass.runtime import find_runtime_libraries  # the DSL is loaded whenever an object is written or read

    libs = [p for p in find_runtime_libraries(enable_tvm_ffi=True) if Path(p).exists()]
    rpaths = [f"-Wl,-rpath,{d}" for d in sorted({str(Path(p).parent) for p in libs})]
    tmp = obj.with_suffix(f".tmp{os.getpid()}.so")
    try:
        subprocess.run([cc, "-shared", "-o", str(tmp), str(obj), *libs, *rpaths], check=True, capture_output=True,
                       timeout=120)
        os.replace(tmp, obj.with_suffix(".so"))
        return True
    except (OSError, subprocess.SubprocessError):
        tmp.unlink(missing_ok=True)
        return False


def build_to_disk(key: CompileKey, recipe: Callable[[], Any], directory: Path | None = None) -> str:
    """Compile `key` into the disk cache (or `directory`) unless it is there: "cached",
    "compiled" or "not exported". What `cute_kernels.precompile`'s worker processes run, given
    the parent's cache directory, so that both agree on it by construction."""
    obj = object_path(key, directory)
    if obj is None:
        raise RuntimeError("the disk cache is off (CUTE_KERNELS_DISK_CACHE=0): nothing to precompile into")
    with _locked(obj):
        if obj.exists():
            return "cached"
        return "compiled" if _export(recipe(), obj) else "not exported"


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


def _load(obj: Path) -> Any:
    """The kernel in the disk cache at `obj`: its shared library through TVM-FFI alone when
    that loads, else the object through the DSL (linking the library for the next process)."""
    lib = obj.with_suffix(".so")
    if lib.exists():
        try:
            import tvm_ffi

            return tvm_ffi.load_module(str(lib))[_FUNCTION_NAME]
        except Exception:
            lib.unlink(missing_ok=True)  # linked on another machine (its rpaths do not resolve here)
    import cutlass.cute as cute

    fn = cute.runtime.load_module(str(obj), enable_tvm_ffi=True)[_FUNCTION_NAME]
    _link(obj)
    return fn


KERNELS = KernelCache()

RECORD_ENV = "CUTE_KERNELS_RECORD"  # a manifest file: the kernels this process used are merged into it at exit


def _record_at_exit() -> None:
    path = env.get(RECORD_ENV)
    from .triton_warm import recorded

    if path and (KERNELS.used or recorded()):
        from .manifest import save_manifest

        save_manifest(path, KERNELS.used.items(), recorded())


atexit.register(_record_at_exit)
if env.get(RECORD_ENV):  # Triton's compiles are recorded too (runtime.triton_warm)
    try:
        from .triton_warm import install_recorder

        install_recorder()
    except ImportError:  # no Triton: nothing of it to record
        pass
