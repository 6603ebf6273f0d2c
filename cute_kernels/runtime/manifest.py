"""Manifests: the kernels a job uses, as JSON (kernel name + compile recipe), one per line.

Written by the kernel cache at exit under CUTE_KERNELS_RECORD, replayed by
`cute_kernels.precompile`. The compile key is derived from the recipe (runtime.key), so a
manifest never disagrees with the cache about which file holds a kernel.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from . import recipe as _recipe
from .key import CompileKey


def load_manifest(path: str | Path, *, resolve: bool = True) -> list[tuple[CompileKey, object]]:
    """(key, recipe) pairs of a manifest file. resolve=True returns callable recipes and skips,
    with a warning on stderr, entries that no longer resolve (a renamed function or config
    field); resolve=False returns the recipes' JSON without importing any kernel module (what
    a warm start checks against the disk cache)."""
    data = json.loads(Path(path).read_text())
    out = []
    for entry in data.get("kernels", []):
        try:
            key = CompileKey.of(entry["kernel"], entry["recipe"])
            out.append((key, _recipe.from_json(entry["recipe"]) if resolve else entry["recipe"]))
        except (AttributeError, ImportError, KeyError, TypeError, ValueError) as e:
            print(f"precompile: skipping a stale manifest entry ({entry.get('kernel')}): {e}", file=sys.stderr)
    return out


def save_manifest(path: str | Path, entries: Iterable[tuple[CompileKey, object]]) -> int:
    """Merge (key, recipe) pairs into the manifest at `path` (created if absent); returns
    the number of kernels it lists. Recipes that are not plain data are left out."""
    path = Path(path)
    old = json.loads(path.read_text()).get("kernels", []) if path.exists() else []
    merged = {CompileKey.of(e["kernel"], e["recipe"]): e for e in old if "kernel" in e}
    for key, rec in entries:
        try:
            entry = {"kernel": key.kernel, "recipe": rec if isinstance(rec, dict) else _recipe.to_json(rec)}
        except (AttributeError, TypeError):
            continue
        merged[CompileKey.of(entry["kernel"], entry["recipe"])] = entry
    kernels = [merged[k] for k in sorted(merged, key=lambda k: (k.kernel, k.recipe))]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    # One kernel per line: diffs of a re-recorded manifest stay readable.
    tmp.write_text('{"kernels": [\n' + ",\n".join(json.dumps(k, sort_keys=True) for k in kernels) + "\n]}\n")
    os.replace(tmp, path)
    return len(kernels)
