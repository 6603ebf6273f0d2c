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
            rec = _recipe.normalize(entry["recipe"])
            key = CompileKey.of(entry["kernel"], rec)
            out.append((key, _recipe.from_json(rec) if resolve else rec))
        except (AttributeError, ImportError, KeyError, TypeError, ValueError) as e:
            print(f"precompile: skipping a stale manifest entry ({entry.get('kernel')}): {e}", file=sys.stderr)
    return out


def load_triton(path: str | Path) -> list[dict]:
    """The Triton specializations a manifest lists (runtime.triton_warm), each once."""
    return list(json.loads(Path(path).read_text()).get("triton", []))


def save_manifest(path: str | Path, entries: Iterable[tuple[CompileKey, object]], triton: Iterable[dict] = ()) -> int:
    """Merge (key, recipe) pairs, and Triton specializations, into the manifest at `path`
    (created if absent); returns the number of DSL kernels it lists. Recipes that are not
    plain data are left out."""
    path = Path(path)
    data = json.loads(path.read_text()) if path.exists() else {}
    old = data.get("kernels", [])
    tri = {(t["fn"], t["spec"]): t for t in [*data.get("triton", []), *triton]}
    merged = {}
    for e in old:
        try:
            e = {"kernel": e["kernel"], "recipe": _recipe.normalize(e["recipe"])}
        except (AttributeError, ImportError, KeyError, TypeError, ValueError):
            continue  # an entry that no longer resolves: the next recording drops it
        merged[CompileKey.of(e["kernel"], e["recipe"])] = e
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
    lines = ",\n".join(json.dumps(k, sort_keys=True) for k in kernels)
    tlines = ",\n".join(json.dumps(tri[k], sort_keys=True) for k in sorted(tri))
    tmp.write_text('{"kernels": [\n' + lines + "\n]" + (',\n"triton": [\n' + tlines + "\n]" if tri else "") + "}\n")
    os.replace(tmp, path)
    return len(kernels)
