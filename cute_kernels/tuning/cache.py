"""The tuning cache: measured GEMM configs per problem class, on disk, looked up before the
heuristics (matmul.api._pick_config, quantized.api._promoted_config).

A problem class is the op (OPS), the output dtype, the operand majors, the epilogue
class, N, K and an M bucket (`m_bucket`). Its entry is the config that won when the
autotuner (tuning.tune) timed the candidates on one GPU, with the measured times.

Two sources, looked up in this order:

- the user's cache, `<cache root>/tuning/<gpu slug>-dsl<version>-<source hash>.json`
  (runtime.cache.cache_root; CUTE_KERNELS_CACHE_DIR moves it), written by the tuner;
- the shipped table `cute_kernels/tuning/tables/<gpu slug>.json`, read-only.

Both carry a header (format, GPU name, DSL version, hash of matmul/kernel.py and
matmul/config.py): a file whose header does not match this process, or that does not
parse, is ignored with one warning, and the user's cache is rebuilt on the next write. A
config measured on another GPU or DSL version is never used. Files are read once per
process, on the first GEMM dispatch that asks (never at import), and never without a GPU.
Writes take a file lock and merge with what is on disk, so processes tuning at once keep
each other's entries.
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import hashlib
import json
import math
import os
import re
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from ..matmul.config import GemmConfig
from ..runtime import env

FORMAT = 1
TABLES_DIR = Path(__file__).resolve().parent / "tables"

OPS = ("bf16", "fp16", "fp8-tensor", "fp8-row", "fp8-tensor-promoted", "fp8-row-promoted", "fp8-block", "int8")
_OUTS = {"bf16": ("bf16", "fp16", "fp32"), "fp16": ("bf16", "fp16", "fp32"), "int8": ("int32", "bf16", "fp16")}
MAJORS = ("kk", "kn", "mk", "mn")  # A's contiguous dim (k or m), then B's (k or n) as [N, K]
# What changes the epilogue's cost, and so which config wins: nothing to load (scalar scales
# fold into one factor), per-column / per-row vectors (bias, scales: staged by the vector
# loader warp), or a residual tile (TMA slabs or column pairs, residual smem); and the SwiGLU
# epilogue (matmul.swiglu_linear), whose N is the [gate; up] rows, 2x the output's width,
# and whose tiles must split evenly into matching gate and up halves.
EPILOGUES = ("plain", "vector", "residual", "swiglu")
SWIGLU_WIDTHS = (64, 128, 192, 256)  # the tile widths the SwiGLU epilogue compiles for


def swiglu_fits(cfg: GemmConfig, n_out: int) -> bool:
    """Whether `cfg` runs the SwiGLU epilogue for an output n_out wide: a width the epilogue
    compiles for whose half (the output columns of one tile) divides n_out, and no split-K."""
    return cfg.split_k == 1 and cfg.tile_n in SWIGLU_WIDTHS and n_out % (cfg.tile_n // 2) == 0
# M up to here is its own bucket: decode and short-prefill batches, a handful of values met
# over and over, where one more or one fewer row changes the split-K and 64-row-tile picks.
EXACT_M = 16


def m_bucket(m: int) -> tuple[int, int]:
    """The M bucket of `m`, as its inclusive bounds (lo, hi).

    M <= EXACT_M is exact. Above, buckets are half octaves [2^(j/2), 2^((j+1)/2)): a
    measured winner stands for M within a factor of 1.41 of where it was measured, which
    moves the tile counts along M (and so the wave quantisation that decides between
    tile shapes) by at most that factor, while keeping the buckets per decade at 6.6
    (17..16384 is 20 buckets), cheap enough to tune all of them for a model.
    """
    if not isinstance(m, int) or isinstance(m, bool) or m < 1:
        raise ValueError(f"M must be an int >= 1, got {m!r}")
    if m <= EXACT_M:
        return m, m
    j = (m * m).bit_length() - 1  # the largest j with 2^(j/2) <= m, in integers
    lo = max(EXACT_M + 1, math.isqrt((1 << j) - 1) + 1)
    hi = math.isqrt((1 << (j + 1)) - 1)
    return lo, hi


def epilogue_class(epi) -> str:
    """The EPILOGUES class of a matmul.config.Epilogue."""
    if epi.activation == "swiglu":
        return "swiglu"
    if epi.residual:
        return "residual"
    if epi.bias or "vector" in (epi.row_scale, epi.col_scale) or epi.block_scaled:
        return "vector"
    return "plain"


def op_of(in_dtype, epi, *, promoted: bool = False) -> str:
    """The OPS name of a GEMM with inputs of torch dtype `in_dtype` and Epilogue `epi`."""
    import torch

    if in_dtype in (torch.bfloat16, torch.float16):
        return "bf16" if in_dtype == torch.bfloat16 else "fp16"
    if in_dtype == torch.int8:
        return "int8"
    if in_dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        if epi.block_scaled:
            return "fp8-block"
        kind = "fp8-row" if "vector" in (epi.row_scale, epi.col_scale) else "fp8-tensor"
        return f"{kind}-promoted" if promoted else kind
    raise TypeError(f"no GEMM op for input dtype {in_dtype}")


def out_name(dtype) -> str:
    import torch

    names = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int32: "int32"}
    if dtype not in names:
        raise TypeError(f"no GEMM output dtype {dtype}")
    return names[dtype]


@dataclass(frozen=True)
class Problem:
    """One GEMM to tune: the class fields of the cache key, and the M it is measured at."""

    op: str
    out: str
    majors: str
    epilogue: str
    m: int
    n: int
    k: int

    def __post_init__(self):
        if self.op not in OPS:
            raise ValueError(f"op must be one of {OPS}, got {self.op!r}")
        outs = _OUTS.get(self.op, ("bf16", "fp16"))
        if self.out not in outs:
            raise ValueError(f"{self.op} writes {'/'.join(outs)}, got out={self.out!r}")
        if self.majors not in MAJORS:
            raise ValueError(f"majors must be one of {MAJORS}, got {self.majors!r}")
        if self.eight_bit and self.majors != "kk":
            raise ValueError("8-bit GEMMs read K-major operands only (majors 'kk')")
        if self.epilogue not in EPILOGUES:
            raise ValueError(f"epilogue must be one of {EPILOGUES}, got {self.epilogue!r}")
        if self.op in ("fp8-row", "fp8-row-promoted", "fp8-block") and self.epilogue == "plain":
            raise ValueError(f"{self.op} applies per-row scales: its epilogue class is 'vector' or 'residual'")
        if self.out == "int32" and self.epilogue != "plain":
            raise ValueError("int8 with an int32 output has no epilogue operands (epilogue 'plain')")
        if self.epilogue == "swiglu" and (self.op not in ("bf16", "fp16") or self.out != self.op
                                          or self.majors != "kk" or self.n % 64):
            raise ValueError("the swiglu class is a 16-bit GEMM writing its input dtype, K-major operands, and "
                             f"n = 2 x the output width, a multiple of 64; got {self}")
        for name in ("m", "n", "k"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if self.eight_bit and self.k % 16:
            raise ValueError(f"8-bit GEMMs need K % 16 == 0, got K={self.k}")

    @property
    def integer(self) -> bool:
        """int8 inputs: swap_ab widths step by 16 (wgmma's s8 shapes)."""
        return self.op == "int8"

    @property
    def eight_bit(self) -> bool:
        return self.op.startswith(("fp8", "int8"))

    @property
    def promoted(self) -> bool:
        return self.op.endswith("promoted") or self.op == "fp8-block"

    @property
    def in_bytes(self) -> int:
        return 1 if self.eight_bit else 2

    @property
    def out_bytes(self) -> int:
        return 4 if self.out in ("fp32", "int32") else 2

    @property
    def key(self) -> tuple:
        return (self.op, self.out, self.majors, self.epilogue, self.n, self.k, m_bucket(self.m)[0])

    def check(self, cfg: GemmConfig) -> None:
        """Raise ValueError unless `cfg` can run this problem (and keep its numerics: the
        promoted ops need promote, the others must not have it)."""
        if not isinstance(cfg, GemmConfig):
            raise TypeError(f"config must be a GemmConfig, got {type(cfg).__name__}")
        cfg.validate(self.in_bytes, self.out_bytes, integer=self.integer)
        if cfg.promote != self.promoted:
            raise ValueError(f"{self.op} needs promote={self.promoted}, got {cfg}")
        if cfg.swap_ab and (self.epilogue != "plain" or not (self.out_bytes == 2 or self.out == "int32")):
            raise ValueError(f"swap_ab runs the plain epilogue class with 16-bit or int32 outputs, got "
                             f"{self.epilogue} {self.out}")
        if cfg.tile_m == 192 and self.epilogue in ("residual", "swiglu"):
            raise ValueError(f"a 192-row tile takes no residual or SwiGLU epilogue, got {self.epilogue}")
        if self.epilogue == "swiglu" and not swiglu_fits(cfg, self.n // 2):
            raise ValueError(f"the swiglu epilogue needs split_k 1 and tile_n / 2 dividing {self.n // 2}, got {cfg}")
        if self.epilogue == "residual" and cfg.split_k > 1 and accumulators_per_thread(cfg) >= SPLIT_RESIDUAL_SPILL_ACC:
            raise ValueError(f"split-K with a residual spills at {accumulators_per_thread(cfg)} accumulators a "
                             f"consumer thread (ptxas), got {cfg}")


# Split-K builds load a residual through registers (its TMA slabs would be issued before the
# CTA knows whether it finishes the tile), and from this many fp32 accumulators a consumer
# thread ptxas spills: 128 x 192 ping-pong, 256 x 96 ping-pong and 256 x 192 cooperative, bf16
# and fp16, with or without a bias, 4-124 bytes; 160 (128 x 160 ping-pong, 256 x 160) do not.
# The heuristic never picks them; the tuner's last-wave splits would time them.
SPLIT_RESIDUAL_SPILL_ACC = 192
# Consumer warpgroups of a cooperative tile: 64 rows each, except 256-row tiles (two of 128).
_COOP_WARPGROUPS = {64: 1, 128: 2, 192: 3, 256: 2}


def accumulators_per_thread(cfg: GemmConfig) -> int:
    """fp32 accumulators a consumer thread holds: a ping-pong warpgroup owns the whole tile,
    a cooperative tile is shared by its warpgroups."""
    threads = 128 if cfg.pingpong else 128 * _COOP_WARPGROUPS[cfg.tile_m]
    return cfg.tile_m * cfg.tile_n // threads


@dataclass(frozen=True)
class Entry:
    """A tuned problem class: the winning config, its time and the heuristic's, both
    measured at problem.m."""

    problem: Problem
    config: GemmConfig
    ms: float
    heuristic_ms: float

    def to_json(self) -> dict:
        p = self.problem
        lo, hi = m_bucket(p.m)
        return {"op": p.op, "out": p.out, "majors": p.majors, "epilogue": p.epilogue, "n": p.n, "k": p.k,
                "m_lo": lo, "m_hi": hi, "m": p.m, "config": dataclasses.asdict(self.config),
                "ms": round(self.ms, 6), "heuristic_ms": round(self.heuristic_ms, 6)}

    @classmethod
    def from_json(cls, d: dict) -> Entry:
        """Raises ValueError / TypeError / KeyError on a malformed or invalid entry."""
        p = Problem(d["op"], d["out"], d["majors"], d["epilogue"], d["m"], d["n"], d["k"])
        if m_bucket(p.m)[0] != d["m_lo"]:
            raise ValueError("M bucket bounds do not match this format's buckets")
        cfg = GemmConfig(**d["config"])
        p.check(cfg)
        return cls(p, cfg, float(d["ms"]), float(d["heuristic_ms"]))


# --------------------------------------------------------------------------- identity


@functools.lru_cache(maxsize=1)
def _cuda_name() -> str | None:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def gpu_name() -> str | None:
    """The name of GPU 0 (what the tuning files are keyed on), None without a GPU. Queried on
    first use, never at import."""
    return _cuda_name()


def slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"a GPU name must be a non-empty str, got {name!r}")
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


@functools.lru_cache(maxsize=1)
def source_hash() -> str:
    """Hash of the GEMM kernel and its config code: a winner measured on other kernel code
    may lose on this one."""
    root = Path(__file__).resolve().parents[1] / "matmul"
    h = hashlib.sha256()
    for name in ("kernel.py", "config.py"):
        h.update(name.encode())
        h.update((root / name).read_bytes())
    return h.hexdigest()[:16]


def dsl_version() -> str:
    from ..runtime.cache import _version

    return _version("nvidia-cutlass-dsl")


def header(gpu: str) -> dict:
    return {"format": FORMAT, "gpu": gpu, "dsl": dsl_version(), "source": source_hash()}


def user_path(gpu: str) -> Path:
    """The user's tuning cache for `gpu` with this DSL and kernel source."""
    from ..runtime.cache import cache_root

    return cache_root() / "tuning" / f"{slug(gpu)}-dsl{dsl_version()}-{source_hash()}.json"


def table_path(gpu: str) -> Path:
    """The shipped, read-only table for `gpu`."""
    return TABLES_DIR / f"{slug(gpu)}.json"


# --------------------------------------------------------------------------- reading


_WARNED: set = set()
_LOCK = threading.Lock()
_STATE: dict = {}  # gpu name -> (user entries, table entries), each {key: Entry}


def _warn_once(path: Path, why: str) -> None:
    if path not in _WARNED:
        _WARNED.add(path)
        warnings.warn(f"tuning file {path} ignored ({why}); GEMM configs fall back to the heuristics "
                      "for what it held, and a tuning cache is rebuilt on its next write", stacklevel=3)


def read(path: Path, gpu: str) -> dict | None:
    """{key: Entry} of the tuning file at `path`, {} if there is none, None when it is corrupt
    or its header does not match `gpu` and this process (warned once per file). Entries
    whose config no longer validates are left out."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as e:
        _warn_once(path, f"unreadable: {type(e).__name__}")
        return None
    try:
        data = json.loads(text)
        head = {k: data[k] for k in ("format", "gpu", "dsl", "source")}
        rows = data["entries"]
        if not isinstance(rows, list):
            raise TypeError("entries is not a list")
    except (ValueError, TypeError, KeyError) as e:
        _warn_once(path, f"not a tuning file: {type(e).__name__}")
        return None
    want = header(gpu)
    if head != want:
        diff = ", ".join(f"{k} {head[k]!r} != {want[k]!r}" for k in want if head[k] != want[k])
        _warn_once(path, f"made for another setup: {diff}")
        return None
    out = {}
    for row in rows:
        try:
            e = Entry.from_json(row)
        except (ValueError, TypeError, KeyError):
            continue  # a config this code no longer accepts: the heuristic takes that class
        out[e.problem.key] = e
    return out


def _state(gpu: str) -> tuple[dict, dict]:
    st = _STATE.get(gpu)
    if st is None:
        with _LOCK:
            st = _STATE.get(gpu)
            if st is None:
                st = _STATE[gpu] = (read(user_path(gpu), gpu) or {}, read(table_path(gpu), gpu) or {})
    return st


def lookup(problem: Problem) -> Entry | None:
    """The tuned entry for `problem`'s class: the user's cache first, then the shipped table.
    None without a GPU, with CUTE_KERNELS_TUNING=0, when neither has the class, when the
    entry's config pads `problem`'s rows more than MAX_EXTRA_PADDING times as much as the M it
    was tuned at (below), or when it runs `problem` in a different number of waves than there:
    an M bucket spans up to sqrt(2) in M, and past a wave boundary the tuned tile is no longer
    the measured one (H100 grid, 2026-11-26: Llama-3-8B's 4096 x 4096 tuned at M = 633,
    128 x 160 in one wave, 0.63x cuBLAS at M = 695 in two; the heuristic's pick there is two
    waves of wider tiles)."""
    from ..matmul.heuristics import config_waves

    if not isinstance(problem, Problem):
        raise TypeError(f"problem must be a Problem, got {type(problem).__name__}")
    if not env.enabled("CUTE_KERNELS_TUNING"):
        return None
    gpu = gpu_name()
    if gpu is None:
        return None
    entry = find(problem, gpu)
    if entry is not None and problem.m != entry.problem.m and (
            config_waves(entry.config, problem.m, problem.n) != config_waves(entry.config, entry.problem.m, problem.n)
            or m_padding(entry.config, problem.m) > m_padding(entry.config, entry.problem.m) * MAX_EXTRA_PADDING):
        return None
    return entry


# An entry's config pads the rows it was tuned at by some fraction; at an M of its bucket where
# the same tiles pad more than this factor over that, the measured win does not carry over
# (H100, 2026-11-26: on grid seed 601, 773x3072x1024 ran a 128 x 176 swap_ab entry tuned at
# M = 861, 880 rows for 773, at 0.84x the heuristic's 128 x 160; in the GEMM suite, 512x1600x6400
# ran a 64 x 160 swap_ab entry tuned at M = 609, 640 rows for 512, at 0.47x cuBLAS).
MAX_EXTRA_PADDING = 1.10


def m_padding(cfg, m: int) -> float:
    """Rows computed / rows asked for: M padded to `cfg`'s tiles along M (tile_n under
    swap_ab, where the tokens run along the kernel's N)."""
    t = cfg.tile_n if cfg.swap_ab else cfg.tile_m
    return math.ceil(m / t) * t / m


def find(problem: Problem, gpu: str) -> Entry | None:
    """The entry for `problem`'s class in `gpu`'s user cache, else its shipped table."""
    user, table = _state(gpu)
    key = problem.key
    return user.get(key) or table.get(key)


def entries(gpu: str | None = None) -> list[Entry]:
    """The entries of the user's tuning cache for `gpu` (default: this GPU)."""
    gpu = gpu or gpu_name()
    return [] if gpu is None else list(_state(gpu)[0].values())


def forget() -> None:
    """Drop what this process read, so the next lookup reads the files again."""
    with _LOCK:
        _STATE.clear()
        _WARNED.clear()


# --------------------------------------------------------------------------- writing


def _write(path: Path, gpu: str, rows: dict) -> None:
    payload = {**header(gpu), "entries": [e.to_json() for _, e in sorted(rows.items(), key=lambda kv: str(kv[0]))]}
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(payload, indent=1) + "\n")
    os.replace(tmp, path)  # readers see the old file or the new one, never a torn one


def store(new: Iterable[Entry], gpu: str | None = None, path: Path | None = None) -> Path:
    """Merge `new` into the user's tuning cache for `gpu` (default: this GPU) or into `path`:
    under an exclusive file lock, read what is there (a corrupt or mismatched file counts as
    empty), replace the classes `new` tunes, write a temporary file and rename it over the
    old one. Returns the file's path."""
    new = list(new)
    for e in new:
        if not isinstance(e, Entry):
            raise TypeError(f"store takes Entry objects, got {type(e).__name__}")
    gpu = gpu or gpu_name()
    if gpu is None:
        raise ValueError("no GPU: a tuning cache is kept per GPU model, name one with gpu=")
    path = Path(path) if path is not None else user_path(gpu)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        rows = read(path, gpu) or {}
        rows.update((e.problem.key, e) for e in new)
        _write(path, gpu, rows)
    with _LOCK:
        if gpu in _STATE and path == user_path(gpu):
            _STATE[gpu] = (rows, _STATE[gpu][1])
    return path


def write_table(gpu: str) -> Path:
    """Write the shipped table of `gpu` (tables/<slug>.json) with this process's header: the
    entries it holds that still validate, merged with the user's tuning cache for `gpu` (which
    wins on a class both hold). Run on that GPU after tuning to ship its winners; without a
    GPU it only restamps the header, for a source change that cannot move a winner."""
    if not isinstance(gpu, str) or not gpu.strip():
        raise ValueError(f"gpu must be a GPU name, got {gpu!r}")
    path = table_path(gpu)
    try:
        rows = json.loads(path.read_text()).get("entries", [])
    except (OSError, ValueError, AttributeError):
        rows = []
    kept = {}
    for row in rows:
        try:
            e = Entry.from_json(row)
        except (ValueError, TypeError, KeyError):
            continue
        kept[e.problem.key] = e
    kept.update(read(user_path(gpu), gpu) or {})
    TABLES_DIR.mkdir(parents=True, exist_ok=True)
    _write(path, gpu, kept)
    with _LOCK:
        _STATE.pop(gpu, None)
    return path
