"""Build a model's kernels ahead of time, in parallel: `python -m cute_kernels.precompile --model gpt2`.

A *manifest* lists the kernels a job uses, each as its compile key and recipe
(`runtime.recipe`). The manifests shipped in `cute_kernels/manifests/` were recorded by
running the job on an H100 with CUTE_KERNELS_RECORD=<file> (`runtime.cache`). Replaying
one compiles every kernel that the disk cache lacks, each in its own worker process
(the CuTe DSL compiles for sm_90a without a GPU, so this runs on a CPU machine too; a
container build can fill the cache once). The inference CLI replays its model's
manifest before the first forward, so a cold start compiles in parallel rather than one
kernel at a time as the forward meets them.

The disk cache is keyed by the sources and the DSL/TVM-FFI versions
(`runtime.cache.cache_dir`): point CUTE_KERNELS_CACHE_DIR at the same directory on the
machine that runs the model.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from .runtime import recipe as _recipe
from .runtime import triton_warm
from .runtime.cache import CompileKey, build_to_disk, cache_dir, object_path
from .runtime.manifest import load_manifest, load_triton, save_manifest  # noqa: F401  (public here)

MANIFEST_DIR = Path(__file__).resolve().parent / "manifests"


def manifest_path(name: str) -> Path:
    return MANIFEST_DIR / f"{name}.json"


def available_manifests() -> list[str]:
    return sorted(p.stem for p in MANIFEST_DIR.glob("*.json"))


def _build(entry: dict, directory: str) -> tuple[str, str, float]:
    """Worker process: compile one manifest entry into the disk cache at `directory`."""
    t0 = time.perf_counter()
    key = CompileKey.of(entry["kernel"], entry["recipe"])
    status = build_to_disk(key, _recipe.from_json(entry["recipe"]), Path(directory))
    return key.kernel, status, time.perf_counter() - t0


def missing(entries: Iterable[tuple[CompileKey, object]]) -> list[tuple[CompileKey, object]]:
    """The entries whose kernel the disk cache does not hold yet."""
    out = []
    for key, rec in entries:
        obj = object_path(key)
        if obj is not None and not obj.exists():
            out.append((key, rec))
    return out


def precompile(entries: Iterable[tuple[CompileKey, object]], jobs: int | None = None, *, log=None,
               on_ready: Callable[[CompileKey, str], None] | None = None, triton: Iterable[dict] = ()) -> dict:
    """Compile every entry the disk cache lacks, `jobs` worker processes at a time
    (default: one per CPU core, at most one per kernel). Returns counts and the wall time.

    on_ready(key, status) is called for each entry as soon as it can be loaded: at once
    for those already cached, then in the order the builds finish (status "compiled",
    "cached", "not exported" or "failed"), so a caller can use the first kernels while
    the others still build (the autotuner times candidates that way).

    `triton`: recorded Triton specializations (runtime.triton_warm) to compile into Triton's
    own cache (TRITON_CACHE_DIR, else ~/.triton/cache), for the GPU present or, on a machine
    without one, for the recorded target. They go to the pool first: a cold start needs them
    at its first step."""
    entries = list(entries)
    if jobs is not None and (not isinstance(jobs, int) or jobs < 1):
        raise ValueError(f"jobs must be an int >= 1 or None, got {jobs!r}")
    todo = missing(entries)
    tri_todo = [t for t in triton if not triton_warm.is_cached(t)]
    stats = {"kernels": len(entries), "cached": len(entries) - len(todo), "compiled": 0, "failed": 0, "wall_s": 0.0}
    if on_ready is not None:
        pending = {k for k, _ in todo}
        for key, _ in entries:
            if key not in pending:
                on_ready(key, "cached")
    if not todo and not tri_todo:
        return stats
    from concurrent.futures import ProcessPoolExecutor, as_completed  # here: the manifest writer runs at exit,
    from multiprocessing import get_context  # after threading's shutdown, where importing this fails

    jobs = max(1, min(jobs or os.cpu_count() or 1, len(todo) + len(tri_todo)))
    t0 = time.perf_counter()
    payload = [{"kernel": k.kernel, "recipe": r if isinstance(r, dict) else _recipe.to_json(r)} for k, r in todo]
    # spawn, not fork: the parent may hold a CUDA context, which a forked child must not touch.
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
        tri_futures = [pool.submit(triton_warm.preload, t) for t in tri_todo]
        directory = str(object_path(todo[0][0]).parent) if todo else ""
        futures = {pool.submit(_build, p, directory): key for p, (key, _) in zip(payload, todo)}
        for fut in as_completed(futures):
            try:
                name, status, secs = fut.result()
                stats["compiled" if status == "compiled" else "cached"] += 1
                if log:
                    log(f"  {name}: {status} in {secs:.1f} s")
            except Exception as e:  # noqa: BLE001 - one kernel that fails to build must not stop the rest
                status = "failed"
                stats["failed"] += 1
                if log:
                    log(f"  a kernel failed to build: {type(e).__name__}: {e}")
            if on_ready is not None:
                on_ready(futures[fut], status)
        for fut in tri_futures:
            name, status, secs = fut.result()  # preload catches its own failures
            key = "triton_compiled" if status == "compiled" else "triton_cached" if status == "cached" else "triton_failed"
            stats[key] = stats.get(key, 0) + 1
            if log:
                log(f"  {name} (Triton): {status} in {secs:.1f} s")
    stats["wall_s"] = time.perf_counter() - t0
    return stats


class JsonRecipe(dict):
    """A recipe still in its manifest JSON: resolved (its kernel module imported) only if the
    kernel must be compiled after all. A manifest records it as the JSON it is."""

    def __call__(self):
        return _recipe.from_json(self)()


def ensure_manifest(name: str, jobs: int | None = None, *, load: bool = False) -> dict | None:
    """Replay the shipped manifest `name` if there is one (None otherwise). With load=True the
    kernels are then loaded into the process's kernel cache too (a caller overlapping this
    with its own start-up: the first launches find them in memory)."""
    path = manifest_path(name)
    if not path.exists() or cache_dir() is None:
        return None
    # Unresolved recipes: this process only checks the disk cache; the workers import the kernels.
    entries = load_manifest(path, resolve=False)
    stats = precompile(entries, jobs, triton=load_triton(path))
    if load:
        from .runtime import KERNELS

        t0 = time.perf_counter()
        for key, rec in entries:
            if object_path(key).exists():
                KERNELS.get(key, JsonRecipe(rec))
        stats["load_s"] = time.perf_counter() - t0
    return stats


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m cute_kernels.precompile",
                                description="Fill the kernel disk cache ahead of time (no GPU needed).")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help=f"a shipped manifest: {', '.join(available_manifests()) or 'none'}")
    src.add_argument("--manifest", help="a manifest file (recorded with CUTE_KERNELS_RECORD=<file>)")
    p.add_argument("--jobs", type=int, default=None, help="worker processes (default: one per CPU core)")
    args = p.parse_args(argv)
    path = manifest_path(args.model) if args.model else Path(args.manifest)
    if not path.exists():
        print(f"error: no manifest {path} (shipped: {', '.join(available_manifests()) or 'none'})", file=sys.stderr)
        return 2
    if cache_dir() is None:
        print("error: the disk cache is off (CUTE_KERNELS_DISK_CACHE=0): nothing to precompile into", file=sys.stderr)
        return 2
    entries = load_manifest(path)
    print(f"precompile: {len(entries)} kernels from {path.name} into {object_path(entries[0][0]).parent}"
          if entries else f"precompile: {path.name} lists no kernels")
    stats = precompile(entries, args.jobs, log=print, triton=load_triton(path))
    print(f"precompile: {stats['compiled']} compiled, {stats['cached']} already cached, {stats['failed']} failed "
          f"({stats['wall_s']:.1f} s)")
    if stats.get("triton_compiled") or stats.get("triton_failed"):
        from .runtime.triton_warm import cache_root

        print(f"precompile: {stats.get('triton_compiled', 0)} Triton kernels compiled into {cache_root()} (ship it "
              f"with the kernel cache, or set TRITON_CACHE_DIR on both machines), {stats.get('triton_cached', 0)} "
              f"already there, {stats.get('triton_failed', 0)} left to the first run")
    return 1 if stats["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
