"""Manifests: the kernels a job uses, as JSON (compile key + recipe per kernel), one per line.

Written by the kernel cache at exit under CUTE_KERNELS_RECORD, replayed by
`cute_kernels.precompile`.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from . import recipe as _recipe
from .key import CompileKey


def _key_json(key: CompileKey) -> dict:
    return {f: _recipe._encode(getattr(key, f)) for f in key.__dataclass_fields__}


def _key_from_json(d: dict) -> CompileKey:
    return CompileKey(**{f: _recipe._decode(v) for f, v in d.items()})


def load_manifest(path: str | Path) -> list[tuple[CompileKey, object]]:
    """(key, recipe) pairs of a manifest file; entries whose recipe no longer resolves
    (a renamed function or config field) are skipped with a warning on stderr."""
    data = json.loads(Path(path).read_text())
    out = []
    for entry in data.get("kernels", []):
        try:
            out.append((_key_from_json(entry["key"]), _recipe.from_json(entry["recipe"])))
        except (AttributeError, ImportError, TypeError, ValueError) as e:
            print(f"precompile: skipping a stale manifest entry ({entry['key'].get('kernel')}): {e}", file=sys.stderr)
    return out


def save_manifest(path: str | Path, entries: Iterable[tuple[CompileKey, object]]) -> int:
    """Merge (key, recipe) pairs into the manifest at `path` (created if absent); returns
    the number of kernels it lists. Recipes that are not plain data are left out."""
    path = Path(path)
    old = json.loads(path.read_text()).get("kernels", []) if path.exists() else []
    merged = {json.dumps(e["key"], sort_keys=True): e for e in old}
    for key, rec in entries:
        try:
            entry = {"key": _key_json(key), "recipe": _recipe.to_json(rec)}
        except (AttributeError, TypeError):
            continue
        merged[json.dumps(entry["key"], sort_keys=True)] = entry
    kernels = sorted(merged.values(), key=lambda e: (e["key"]["kernel"], json.dumps(e["key"], sort_keys=True)))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    # One kernel per line: diffs of a re-recorded manifest stay readable.
    tmp.write_text('{"kernels": [\n' + ",\n".join(json.dumps(k) for k in kernels) + "\n]}\n")
    os.replace(tmp, path)
    return len(kernels)
