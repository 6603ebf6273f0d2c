"""Compile recipes: what builds one kernel, as data that another process can replay.

A recipe is a `functools.partial` of a module-level compile function with plain arguments
(ints, strings, torch dtypes, frozen dataclasses, tuples, dicts). The kernel cache runs
it on a miss; `cute_kernels.precompile` runs many of them in parallel worker processes,
on any machine (the DSL compiles for sm_90a without a GPU), and manifests store them as
JSON (`to_json` / `from_json`) so that a model's kernels can be built ahead of time.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from typing import Any

import torch


def _qualname(obj) -> str:
    return f"{obj.__module__}:{obj.__qualname__}"


def _resolve(path: str):
    module, _, qual = path.partition(":")
    obj = importlib.import_module(module)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def _encode(v: Any):
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, torch.dtype):
        return {"dtype": str(v).removeprefix("torch.")}
    if isinstance(v, tuple):
        return {"tuple": [_encode(x) for x in v]}
    if isinstance(v, list):
        return [_encode(x) for x in v]
    if isinstance(v, dict):
        return {"dict": [[_encode(k), _encode(x)] for k, x in v.items()]}
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {"dataclass": _qualname(type(v)),
                "fields": {f.name: _encode(getattr(v, f.name)) for f in dataclasses.fields(v)}}
    raise TypeError(f"a compile recipe argument must be plain data, got {type(v).__name__}")


def _decode(v: Any):
    if isinstance(v, list):
        return [_decode(x) for x in v]
    if not isinstance(v, dict):
        return v
    if "dtype" in v:
        return getattr(torch, v["dtype"])
    if "tuple" in v:
        return tuple(_decode(x) for x in v["tuple"])
    if "dict" in v:
        return {_decode(k): _decode(x) for k, x in v["dict"]}
    if "dataclass" in v:
        return _resolve(v["dataclass"])(**{k: _decode(x) for k, x in v["fields"].items()})
    raise ValueError(f"not a recipe value: {v!r}")


def to_json(recipe: functools.partial) -> dict:
    return {"fn": _qualname(recipe.func), "args": [_encode(a) for a in recipe.args],
            "kwargs": {k: _encode(a) for k, a in recipe.keywords.items()}}


def from_json(d: dict) -> functools.partial:
    return functools.partial(_resolve(d["fn"]), *[_decode(a) for a in d["args"]],
                             **{k: _decode(a) for k, a in d["kwargs"].items()})


def normalize(d: dict) -> dict:
    """A recipe's JSON as `to_json` writes it today, without importing its compile function:
    config dataclasses are rebuilt, so a manifest recorded before a field was added names the
    field's default (and so the key a process computes for the same kernel now)."""
    return {"fn": d["fn"], "args": [_encode(_decode(a)) for a in d["args"]],
            "kwargs": {k: _encode(_decode(a)) for k, a in d.get("kwargs", {}).items()}}
