"""CompileKey: what one compiled kernel is specialised on (its identity in every cache)."""

from __future__ import annotations

import dataclasses
import hashlib

from .arch import TARGET_ARCH


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
