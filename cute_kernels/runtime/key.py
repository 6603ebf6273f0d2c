"""CompileKey: what one compiled kernel is specialised on (its identity in every cache).

A key is derived from the kernel's compile recipe (runtime.recipe: the compile function
and its plain-data arguments, as canonical JSON), so everything a build depends on is in
the key by construction: a config field added tomorrow changes the key without anyone
remembering to add it. Runtime values (M, N, K, pointers, a split-K count) are not
compile arguments and so are not in it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

from .arch import TARGET_ARCH


@dataclasses.dataclass(frozen=True)
class CompileKey:
    kernel: str  # a readable name: the disk cache's file names and the stats use it
    recipe: str  # canonical JSON of the compile recipe
    arch: str = TARGET_ARCH

    @classmethod
    def of(cls, kernel: str, recipe) -> CompileKey:
        """The key of `recipe` (a functools.partial of a compile function, or its JSON form)."""
        from . import recipe as _recipe

        data = recipe if isinstance(recipe, dict) else _recipe.to_json(recipe)
        return cls(kernel, json.dumps(data, sort_keys=True, separators=(",", ":")))

    def digest(self) -> str:
        return hashlib.sha256(repr(self).encode()).hexdigest()[:24]
