"""Public BF16/FP16 GEMM ops: `gemm` (torch.mm semantics) and `linear` (F.linear + fused epilogue).

The host layer only validates, picks a config, fetches the compiled kernel from the
cache and launches it on torch's current stream (TVM-FFI reads the stream itself).
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from ..runtime import KERNELS, TARGET_ARCH, check_device, env
from ..runtime.dtypes import FP8 as _FP8
from ..runtime.dtypes import SIXTEEN_BIT
from ..tuning import cache as tuning
from . import heuristics
from .config import MAX_ACTIVE_CLUSTERS, GemmConfig, split_tail_tiles, swap_supported, swapped_epilogue
from .heuristics import default_config, skinny_gemv, swap_config
from .reference import ACTIVATIONS, apply_activation, gemm_ref, linear_ref  # noqa: F401

__all__ = ["gemm", "linear", "gemm_ref", "linear_ref", "ACTIVATIONS", "run_gemm", "kernel_for", "compile_entry",
           "clear_dispatch_caches", "swiglu_linear", "swiglu_linear_ref", "swiglu_config",
           "swiglu_fallback"]


def _major(t: torch.Tensor, rows_name: str) -> str:
    """'k' if the K (second) dim is contiguous, rows_name if the first is, else ''."""
    if t.stride(1) == 1 or t.shape[1] == 1:
        return "k"
    if t.stride(0) == 1 or t.shape[0] == 1:
        return rows_name
    return ""


def _tma_ok(t: torch.Tensor, major: str) -> bool:
    """TMA needs a 16-byte aligned base and 16-byte aligned non-unit strides."""
    es = t.element_size()
    if t.data_ptr() % 16:
        return False
    lead = t.stride(0) if major == "k" else t.stride(1)
    return (lead * es) % 16 == 0 and lead >= 1


def _compile(a_dt, b_dt, c_dt, a_major, b_major, cfg: GemmConfig, epi, acc_name: str, keep_dir: str | None = None,
             b_kn: bool = False, pdl: bool = True):
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

    from ..runtime.dtypes import to_cutlass
    from .kernel import GemmSm90

    m, n, k = cute.sym_int32(), cute.sym_int32(), cute.sym_int32()

    def mat(dt, rows, major_is_k, align_elems, kn=False):
        ld = cute.sym_int64(divisibility=align_elems)
        stride = (ld, 1) if major_is_k else (1, ld)
        if kn:  # (K, rows): the same matrix with its modes swapped (GemmSm90.b_kn)
            return make_fake_tensor(to_cutlass(dt), (k, rows), stride[::-1], assumed_align=16)
        return make_fake_tensor(to_cutlass(dt), (rows, k), stride, assumed_align=16)

    es = lambda dt: torch.empty((), dtype=dt).element_size()  # noqa: E731
    fa = mat(a_dt, m, a_major == "k", 16 // es(a_dt))
    fb = mat(b_dt, n, b_major == "k", 16 // es(b_dt), kn=b_kn)
    # SwiGLU writes silu(gate) * up: D has half as many columns as B has rows.
    n_d = cute.sym_int32() if epi.activation == "swiglu" else n
    ld_d = cute.sym_int64(divisibility=16 // es(c_dt))
    # swap_ab: the kernel writes D^T, the caller's row-major D seen M-major (SwapLaunch).
    fd = make_fake_tensor(to_cutlass(c_dt), (m, n_d), (1, ld_d) if cfg.swap_ab else (ld_d, 1), assumed_align=16)
    f32 = cutlass.Float32
    vec = lambda length: make_fake_tensor(f32, (length,), (1,), assumed_align=4)  # noqa: E731
    bias_dt = to_cutlass(epi_bias_dtype(c_dt))
    fbias = make_fake_tensor(bias_dt, (n,), (1,), assumed_align=2) if epi.bias else None
    # A 16-bit residual is TMA-loaded (16-byte base and rows: residual_for_kernel).
    res_div, res_align = (8, 16) if es(c_dt) == 2 else (1, 4)
    fres = (
        make_fake_tensor(to_cutlass(c_dt), (m, n), (cute.sym_int64(divisibility=res_div), 1), assumed_align=res_align)
        if epi.residual else None
    )
    # Block scales are TMA-loaded: scale_a [M, K/128] M-major, scale_b [N/128, K/128]
    # K-major, both with 16-byte aligned bases and strides (quantized.api.block_scales).
    kblocks = cute.sym_int32()
    fsa = make_fake_tensor(f32, (m, kblocks), (1, cute.sym_int64(divisibility=4)), assumed_align=16)
    fsb = make_fake_tensor(f32, (cute.sym_int32(), kblocks), (cute.sym_int64(divisibility=4), 1), assumed_align=16)
    frow = {"none": None, "vector": vec(m), "scalar": vec(1), "block": fsa}[epi.row_scale]
    fcol = {"none": None, "vector": vec(n), "scalar": vec(1), "block": fsb}[epi.col_scale]
    kernel = GemmSm90(cfg, getattr(cutlass, acc_name), epi, b_kn=b_kn, pdl=pdl)
    max_clusters = MAX_ACTIVE_CLUSTERS[cfg.cluster_m * cfg.cluster_n]
    args = (fa, fb, fd, fbias, fres, frow, fcol, f32(1.0), f32(1.0))
    entry = kernel
    if cfg.split_k > 1:
        # Split-K: partials workspace (accumulator dtype) and per-tile arrival counters.
        entry = kernel.call_split
        args += (make_fake_tensor(getattr(cutlass, acc_name), (cute.sym_int32(),), (1,), assumed_align=16),
                 make_fake_tensor(cutlass.Int32, (cute.sym_int32(),), (1,), assumed_align=4), cutlass.Int32(2))
    return cute.compile(
        entry, *args, max_clusters,
        make_fake_stream(use_tvm_ffi_env_stream=True),
        options=f"--enable-tvm-ffi --gpu-arch {TARGET_ARCH}" + (f" --keep-ptx --keep-cubin --dump-dir {keep_dir}" if keep_dir else ""),
    )


def epi_bias_dtype(c_dt: torch.dtype) -> torch.dtype:
    # Bias and residual travel in the output dtype (fp32 output keeps fp32 bias).
    return torch.float32 if c_dt in (torch.float32, torch.int32) else c_dt


def _kernel_view(a_dt, b_dt, a_major, b_major, cfg, epi):
    """The operands as the kernel sees them: under swap_ab, B's rows are its M (A and B,
    their majors and the row / column scale kinds trade places)."""
    if not cfg.swap_ab:
        return a_dt, b_dt, a_major, b_major, epi
    swap_major = {"k": "k", "m": "n", "n": "m"}
    return b_dt, a_dt, swap_major.get(b_major, b_major), swap_major.get(a_major, a_major), swapped_epilogue(epi)


def get_kernel(kernel_name, a_dt, b_dt, c_dt, a_major, b_major, cfg, epi, acc_name="Float32", b_kn=False):
    if cfg.split_k > 2:
        cfg = _compiled_split(cfg)
    a_dt, b_dt, a_major, b_major, epi = _kernel_view(a_dt, b_dt, a_major, b_major, cfg, epi)
    return KERNELS.compiled(kernel_name, _compile, a_dt, b_dt, c_dt, a_major, b_major, cfg, epi, acc_name, b_kn=b_kn)


def compile_entry(kernel_name, a_dt, b_dt, c_dt, a_major, b_major, cfg, epi, acc_name="Float32", b_kn=False):
    """(CompileKey, recipe) of the kernel `get_kernel` returns for these arguments, without
    building it: what `cute_kernels.precompile` builds ahead (the autotuner's candidates)."""
    from ..runtime import CompileKey

    if not isinstance(cfg, GemmConfig):
        raise TypeError(f"cfg must be a GemmConfig, got {type(cfg).__name__}")
    if cfg.split_k > 2:
        cfg = _compiled_split(cfg)
    a_dt, b_dt, a_major, b_major, epi = _kernel_view(a_dt, b_dt, a_major, b_major, cfg, epi)
    rec = functools.partial(_compile, a_dt, b_dt, c_dt, a_major, b_major, cfg, epi, acc_name, b_kn=b_kn)
    return CompileKey.of(kernel_name, rec), rec


@functools.lru_cache(maxsize=256)
def _compiled_split(cfg: GemmConfig) -> GemmConfig:
    # The split count is a runtime value: every split-K config compiles as split_k = 2.
    return dataclasses.replace(cfg, split_k=2)


_UNTUNED_SWAP_MIN_K = 4096


@functools.lru_cache(maxsize=4096)
def _pick_config(M: int, N: int, K: int, in_bytes: int, split: bool = False, tuning_class: tuple | None = None,
                 swappable: bool = False, out_bytes: int = 2, integer: bool = False) -> GemmConfig:
    """The config for an M x N x K problem: the tuning cache's winner for its class when it has
    one (`tuning_class`: op, output, majors, epilogue class; tuning.cache) and no swap_ab tile its
    tuning never met pads M less (below), else the heuristic's (`heuristics.pick_config`: a base
    pick, then the rule chain; swappable: swap_ab can run these operands and this epilogue; split:
    split-K may run; integer: int8 inputs). Memoised: a dispatch pays the lookup once per shape."""
    if tuning_class is not None:
        entry = _tuned_entry(tuning_class, M, N, K)
        swapped = swap_config(M, N, K, in_bytes=in_bytes, out_bytes=out_bytes, integer=integer) if swappable else None
        # An unswapped entry tuned at an M where no swap_ab tile padded less had no swapped
        # rival; where one pads less here and K is long, the heuristic's swap_ab pick runs
        # instead. Same run, H100, 2026-11-26, vs cuBLAS, entry -> swap_ab: bf16
        # 533x4096x14336 0.86x -> 0.92x, 560x4096x4096 0.88x -> 1.00x; fp8 533x4096x14336
        # 1.31x -> 1.41x, 560x4096x4096 1.21x -> 1.40x. At K <= 1600 the entries won
        # (1100x4096x1024 0.82x vs 0.71x, 560x6400x1600 0.86x vs 0.78x).
        if entry is not None and (swapped is None or entry.config.swap_ab or K < _UNTUNED_SWAP_MIN_K
                                  or swap_config(entry.problem.m, N, K, in_bytes=in_bytes, out_bytes=out_bytes,
                                                 integer=integer) is not None):
            # The long-K least-padding swap_ab tile also replaces a tuned entry: the shipped table's
            # entries at 400-1023 tokens were tuned without it, and on 28 shapes they covered it ran
            # 1.008-1.239x faster (`gemm_probe_wf_low_h100.md`; 2966x1024x4096 1.15x,
            # `gemm_probe_long_k_wave_swap_rule_h100.md`). The fp8 rule was fitted against the
            # picks as dispatched, entries included (7309x4096x14336 1.10x over one).
            if swappable and not integer:
                return heuristics.long_k_wave_swap_config(M, N, K, entry.config, in_bytes=in_bytes) or entry.config
            return entry.config
    return heuristics.pick_config(M, N, K, in_bytes=in_bytes, split=split, swappable=swappable, out_bytes=out_bytes,
                                  integer=integer)


def _tuned(tuning_class: tuple, M: int, N: int, K: int) -> GemmConfig | None:
    """The tuning cache's config for this problem, None on a miss. A class the cache cannot
    hold (a layout it does not key) is a miss."""
    entry = _tuned_entry(tuning_class, M, N, K)
    return None if entry is None else entry.config


def _tuned_entry(tuning_class: tuple, M: int, N: int, K: int):
    """The tuning cache's entry (config and the problem it was tuned on) for this problem, or None."""
    try:
        problem = tuning.Problem(*tuning_class, M, N, K)
    except ValueError:
        return None
    return tuning.lookup(problem)


@functools.lru_cache(maxsize=256)
def tuning_class(in_dtype, out_dtype, majors: tuple[str, str], epi, promoted: bool = False) -> tuple:
    """(op, output, majors, epilogue class): the tuning cache's key fields besides N, K, M."""
    return (tuning.op_of(in_dtype, epi, promoted=promoted), tuning.out_name(out_dtype), "".join(majors),
            tuning.epilogue_class(epi))


def clear_dispatch_caches() -> None:
    """Forget memoised config picks and recorded launches (after the tuning cache changed)."""
    _pick_config.cache_clear()
    swiglu_config.cache_clear()
    _gemv_takes.cache_clear()
    _GEMM_PLANS.clear()
    _LINEAR_PLANS.clear()
    _SPLIT_LAUNCHES.clear()


def run_gemm(
    a: torch.Tensor,
    b_nk: torch.Tensor,
    out: torch.Tensor,
    *,
    epi,
    bias=None,
    residual=None,
    row_scale=None,
    col_scale=None,
    alpha: float = 1.0,
    beta: float = 1.0,
    config: GemmConfig | None = None,
    kernel_name: str = "gemm_sm90",
    acc_name: str = "Float32",
) -> torch.Tensor:
    """Launch the kernel on validated, TMA-compatible operands: out = epi(a @ b_nk.T).

    config=None takes the heuristic's choice (split-K included for 16-bit inputs); a
    GemmConfig with split_k > 1 forces split-K (clamped to the number of k-tiles).
    """
    fn = kernel_for(a, b_nk, out.dtype, epi, config=config, kernel_name=kernel_name, acc_name=acc_name)
    fn(a, b_nk, out, bias, residual_for_kernel(residual), row_scale, col_scale, alpha, beta)
    return out


def _residual_ok(res: torch.Tensor) -> bool:
    return res.stride(1) == 1 and not res.data_ptr() & 15 and not res.stride(0) & 7


def residual_for_kernel(res: torch.Tensor | None) -> torch.Tensor | None:
    """The residual as the kernel reads it, copied only when it must be.

    The 16-bit epilogue TMA-loads the residual (or loads it as 4-byte column pairs,
    GemmSm90._load_residual, which also needs an even row stride so that odd N has a
    padding column): it needs unit column stride, a 16-byte aligned base and 16-byte
    row strides. Anything else is copied into a row-padded buffer. 32-bit residuals
    (fp32 output) are read one element at a time and pass through.
    """
    if res is None or res.element_size() != 2 or _residual_ok(res):
        return res
    M, N = res.shape
    buf = torch.empty((M, padded_n(N, res.dtype)), dtype=res.dtype, device=res.device)
    buf[:, :N] = res
    return buf[:, :N]


def kernel_for(a, b_nk, out_dtype, epi, *, config=None, kernel_name="gemm_sm90", acc_name="Float32", b_kn=False):
    """The launch for these operands' dtypes, majors and shape (config from the tuning cache,
    else the heuristic).

    Returns a callable fn(a, b_nk, out, bias, residual, row_scale, col_scale, alpha, beta)
    (with b_kn=True it takes b_nk.t(), torch.mm's [K, N] b, in b_nk's place):
    the compiled kernel itself, a `SplitKLaunch` (the split-K kernel with its
    workspace) when the config splits K, wrapped in a `SwapLaunch` under swap_ab. The heuristic only
    splits 16-bit GEMMs; 8-bit ones split when a config asks for it. 16-bit products of
    at most 8 rows take gemv.GemvLaunch (decode) where heuristics.skinny_gemv says so (not
    where 64 x 16 swap_ab tiles stream the weight faster), unless CUTE_KERNELS_GEMV=0.
    """
    M, K = a.shape
    in_bytes = a.element_size()
    can_swap = swappable(a.dtype, b_nk.dtype, out_dtype, epi)
    if config is None and M <= 8 and in_bytes == 2 and env.enabled("CUTE_KERNELS_GEMV") and skinny_gemv(
            M, b_nk.shape[0], K, can_swap):
        from .gemv import GemvLaunch, gemv_applies  # imports triton: only for skinny products

        if gemv_applies(a, b_nk, out_dtype, epi):
            return GemvLaunch(epi, b_kn)
    majors = (_major(a, "m"), _major(b_nk, "n"))
    cfg = config or _pick_config(M, b_nk.shape[0], K, in_bytes, in_bytes == 2,
                                 tuning_class(a.dtype, out_dtype, majors, epi), can_swap, out_dtype.itemsize,
                                 a.dtype == torch.int8)
    if cfg.swap_ab:
        why = swap_supported(epi, out_dtype.itemsize)
        if why:
            raise ValueError(f"{cfg}: {why}")
        # The swapped kernel reads B as its [N, K] A operand: compiled without b_kn.
        return SwapLaunch(_launch_for(a, b_nk, out_dtype, epi, majors, cfg, kernel_name, acc_name, False), b_kn)
    return _launch_for(a, b_nk, out_dtype, epi, majors, cfg, kernel_name, acc_name, b_kn)


def swappable(a_dtype, b_dtype, out_dtype, epi) -> bool:
    """Whether dispatch may pick a swap_ab config for these operands: 16-bit, fp8 or int8 inputs
    (scaled_mm and int8_mm hand B over as [K, N]: SwapLaunch transposes that view back) and an
    epilogue with a transposed path (`config.swap_supported`); 32-bit outputs for int8 only
    (int8_mm's raw int32)."""
    int8 = a_dtype == torch.int8 and b_dtype == torch.int8
    if out_dtype.itemsize == 4 and not int8:  # fp32 outputs: the swapped 32-bit epilogue is measured on int8 only
        return False
    return ((a_dtype in SIXTEEN_BIT or int8 or (a_dtype in _FP8 and b_dtype in _FP8))
            and swap_supported(epi, out_dtype.itemsize) is None)


def _launch_for(a, b_nk, out_dtype, epi, majors, cfg, kernel_name, acc_name, b_kn):
    K = a.shape[1]
    if cfg.split_k > 1:
        # Every split needs >= 1 k-tile (an empty one would never be fed by the producer).
        split = min(cfg.split_k, -(-K // cfg.tile_k(a.element_size())))
        if split > 1:
            return _split_launch(kernel_name, a.dtype, b_nk.dtype, out_dtype, majors, cfg, epi, acc_name, split, b_kn)
        cfg = dataclasses.replace(cfg, split_k=1)
    return get_kernel(kernel_name, a.dtype, b_nk.dtype, out_dtype, *majors, cfg, epi, acc_name, b_kn)


class SwapLaunch:
    """A swap_ab launch with the compiled kernel's call signature: the kernel computes
    D^T = B A^T into D's transposed view (no copy), with A's row scales as its column
    scales and B's column scales as its row scales."""

    __slots__ = ("inner", "b_kn")

    def __init__(self, inner, b_kn: bool = False):
        self.inner, self.b_kn = inner, b_kn

    def __call__(self, a, b_nk, out, bias, residual, row_scale, col_scale, alpha, beta):
        # b_kn: the caller passes B as [K, N] (K-major), whose transpose is the [N, K] view.
        self.inner(b_nk.t() if self.b_kn else b_nk, a, out.t(), bias, residual, col_scale, row_scale, alpha, beta)
        return out


class SplitKLaunch:
    """Split-K launch with the compiled kernel's call signature.

    One kernel (GemmSm90.call_split): every split writes its partial sums to a
    workspace, and the last split of each tile to arrive adds them up and runs the
    fused epilogue into `out`. The workspace (partials and per-tile counters, which
    the kernel leaves at zero) is cached per device and stream and grows on demand;
    launches on one stream are ordered, so they can share it. No host sync, so the
    launch captures into CUDA graphs.
    """

    __slots__ = ("gemm", "split", "cfg", "ws_dtype")

    def __init__(self, gemm, split: int, cfg: GemmConfig, ws_dtype: torch.dtype):
        self.gemm, self.split, self.cfg, self.ws_dtype = gemm, split, cfg, ws_dtype

    def __call__(self, a, b_nk, out, bias, residual, row_scale, col_scale, alpha, beta):
        M, N = out.shape
        cfg = self.cfg
        tiles = max(split_tail_tiles(cfg, M, N), 1)  # the tiles the kernel splits
        ws, sem = split_workspace(out.device, self.ws_dtype, self.split * tiles * cfg.tile_m * cfg.tile_n, tiles)
        self.gemm(a, b_nk, out, bias, residual, row_scale, col_scale, alpha, beta, ws, sem, self.split)
        return out


_WORKSPACES: dict = {}


def split_workspace(device, dtype: torch.dtype, elems: int, tiles: int):
    """(partials, counters) for at least `elems` partial sums and `tiles` tiles, current stream.

    The counters are zeroed once at allocation; each launch leaves them at zero.
    """
    key = (device, dtype, torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0)
    ws, sem = _WORKSPACES.get(key, (None, None))
    if ws is None or ws.numel() < elems or sem.numel() < tiles:
        elems = max(elems, 0 if ws is None else ws.numel())
        tiles = max(tiles, 0 if sem is None else sem.numel())
        ws = torch.empty(elems, dtype=dtype, device=device)
        sem = torch.zeros(tiles, dtype=torch.int32, device=device)
        _WORKSPACES[key] = (ws, sem)
    return ws, sem


_SPLIT_LAUNCHES: dict = {}


def _split_launch(kernel_name, a_dt, b_dt, out_dtype, majors, cfg, epi, acc_name, split, b_kn=False):
    key = (kernel_name, a_dt, b_dt, out_dtype, majors, cfg, epi, acc_name, split, b_kn)
    launch = _SPLIT_LAUNCHES.get(key)
    if launch is None:
        ws_dtype = torch.int32 if acc_name == "Int32" else torch.float32
        # One compiled kernel serves every split count (S is a runtime argument).
        split_cfg = dataclasses.replace(cfg, split_k=2)
        gemm = get_kernel(kernel_name, a_dt, b_dt, out_dtype, *majors, split_cfg, epi, acc_name, b_kn)
        launch = _SPLIT_LAUNCHES[key] = SplitKLaunch(gemm, split, split_cfg, ws_dtype)
    return launch


# --------------------------------------------------------------------------- validation


def _check_16bit_operands(a: torch.Tensor, b: torch.Tensor, a_name: str, b_name: str) -> None:
    for t, name in ((a, a_name), (b, b_name)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if a.dtype not in SIXTEEN_BIT:
        raise TypeError(f"{a_name} must be bfloat16 or float16, got {a.dtype}")
    if b.dtype != a.dtype:
        raise TypeError(f"{a_name} and {b_name} must have the same dtype, got {a.dtype} and {b.dtype}")
    check_device(a, a_name)
    check_device(b, b_name)
    if a.device != b.device:
        raise ValueError(f"{a_name} is on {a.device} but {b_name} is on {b.device}")


def _prepare_operand(t: torch.Tensor, rows_name: str) -> torch.Tensor:
    """Return t, or a padded copy when its layout or alignment cannot feed TMA.

    The copy pads the contiguous dimension to a multiple of 8 elements with zeros,
    which does not change the product.
    """
    major = _major(t, rows_name)
    if major and _tma_ok(t, major):
        return t
    rows, cols = t.shape
    cols_p = padded_n(cols, t.dtype)
    buf = torch.zeros((rows, cols_p), dtype=t.dtype, device=t.device)
    buf[:, :cols] = t
    return buf[:, :cols]


def padded_n(N: int, dtype: torch.dtype) -> int:
    """N rounded up so that N elements fill whole 16-byte units (TMA's row alignment)."""
    per16 = 16 // dtype.itemsize
    return -(-N // per16) * per16


def _alloc_out(M: int, N: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Output (M, N); when N*elem is not 16-byte aligned the rows are padded and a view returned."""
    n_p = padded_n(N, dtype)
    buf = torch.empty((M, n_p), dtype=dtype, device=device)
    return buf if n_p == N else buf[:, :N]


_GEMM_PLANS: dict = {}


def gemm(a: torch.Tensor, b: torch.Tensor, *, out_dtype: torch.dtype | None = None, out: torch.Tensor | None = None,
         config: GemmConfig | None = None):
    """a @ b with torch.mm semantics on the tensor cores (bf16/fp16 in, fp32 accumulate).

    a [M, K] and b [K, N] may each be row- or column-major. The result is [M, N] in
    out_dtype (default a.dtype; float32 also allowed). When N is not a multiple of 8 the
    result is a view into a row-padded buffer (its stride(0) is N rounded up).

    config: run this kernel config (no tuning-cache lookup, heuristic or skinny GEMV).
    Without split-K, an element's sum runs over K in the same order whatever M, N and its
    place in the output: one config over several shapes gives each element the same bits
    (inference/invariant.py builds tensor-parallel-invariant arithmetic on this).
    """
    if config is not None and not isinstance(config, GemmConfig):
        raise TypeError(f"config must be a GemmConfig, got {type(config).__name__}")
    # Hot path: a plan validated once per (dtypes, shapes, strides, devices, config, and out's
    # when given); only the data pointers' alignment is re-checked per call. With out= there is
    # no allocation either (~3 us of a ~10 us call on the lent machines' CPUs).
    try:
        key = (a.dtype, b.dtype, out_dtype, a.shape, b.shape, a.stride(), b.stride(), a.device, b.device, config)
        if out is not None:
            key += (out.dtype, out.shape, out.stride(), out.device)
        plan = _GEMM_PLANS.get(key)
    except AttributeError:  # not tensors: the full path raises the right error
        key, plan = None, None
    if plan is not None:
        if out is None:
            if not (a.data_ptr() | b.data_ptr()) & 15:
                fn, M, N, n_p, dt = plan
                buf = a.new_empty((M, n_p), dtype=dt)  # ~0.6 us less than torch.empty(device=...)
                o = buf if n_p == N else buf[:, :N]
                fn(a, b, o, None, None, None, None, 1.0, 1.0)
                return o
        elif not (a.data_ptr() | b.data_ptr() | out.data_ptr()) & 15:
            plan[0](a, b, out, None, None, None, None, 1.0, 1.0)
            return out
    return _gemm_slow(a, b, out_dtype, out, key, config)


def _gemm_slow(a, b, out_dtype, out, plan_key, config: GemmConfig | None = None):
    from .config import Epilogue

    _check_16bit_operands(a, b, "a", "b")
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"gemm expects 2-D a [M, K] and b [K, N], got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"shape mismatch: a is {tuple(a.shape)}, b is {tuple(b.shape)} (a.shape[1] must equal b.shape[0])")
    out_dtype = out_dtype or a.dtype
    if out_dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"out_dtype must be bfloat16, float16 or float32, got {out_dtype}")
    M, K = a.shape
    N = b.shape[1]
    if config is not None:
        config.validate(a.element_size(), out_dtype.itemsize)
    if out is not None:
        _check_out(out, M, N, out_dtype, a.device)
    else:
        out = _alloc_out(M, N, out_dtype, a.device)
    if M == 0 or N == 0:
        return out
    if K == 0:
        return out.zero_()
    bt = b.t()
    a_p, b_p = _prepare_operand(a, "m"), _prepare_operand(bt, "n")
    # The launch takes b [K, N] itself (b_kn): no transposed view per call.
    fn = kernel_for(a_p, b_p, out.dtype, Epilogue(), config=config, b_kn=True)
    if plan_key is not None and a_p is a and b_p is bt:
        # Operands usable as they are (and out, when given, validated above): remember the
        # launch for the next call.
        _GEMM_PLANS[plan_key] = (fn, M, N, out.stride(0), out.dtype)
    fn(a_p, b_p.t(), out, None, None, None, None, 1.0, 1.0)
    return out


def _check_out(out: torch.Tensor, M: int, N: int, dtype, device) -> None:
    if out.shape != (M, N) or out.dtype != dtype or out.device != device:
        raise ValueError(f"out must be a {dtype} tensor of shape ({M}, {N}) on {device}, got {out.dtype} {tuple(out.shape)} on {out.device}")
    if out.stride(1) != 1 or (out.stride(0) * out.element_size()) % 16 or out.data_ptr() % 16:
        raise ValueError("out must be row-major with 16-byte aligned rows (stride(1) == 1, stride(0) * itemsize % 16 == 0)")


_LINEAR_PLANS: dict = {}


def _linear_key(x, weight, bias, residual, activation, alpha, beta):
    # Flat, no helper calls: this runs on every linear call (~2.6 vs ~3.4 us with a per-tensor helper).
    return (x.dtype, x.shape, x.stride(), x.device, weight.dtype, weight.shape, weight.stride(), weight.device,
            None if bias is None else (bias.dtype, bias.shape, bias.stride(), bias.device),
            None if residual is None else (residual.dtype, residual.shape, residual.stride(), residual.device),
            activation, alpha != 1.0, beta != 1.0)


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
    alpha: float = 1.0,
    beta: float = 1.0,
) -> torch.Tensor:
    """F.linear with a fused epilogue: act(alpha * x @ weight.T + bias) + beta * residual.

    x [..., K], weight [N, K], bias [N], residual [..., N]; activation in
    {None, "relu", "gelu" (erf), "gelu_tanh" (GPT-2's gelu_new)}. All in one dtype (bf16/fp16).
    """
    # Hot path: a launch validated once per signature (dtypes, shapes, strides, devices,
    # epilogue kind) and recorded only when it needed no copies; per call, only the TMA
    # operands' 16-byte alignment is re-checked.
    try:
        key = _linear_key(x, weight, bias, residual, activation, alpha, beta)
        plan = _LINEAR_PLANS.get(key)
    except AttributeError:  # not tensors: the full path raises the right error
        key, plan = None, None
    if plan is not None and not (x.data_ptr() | weight.data_ptr()) & 15 and (
            residual is None or not residual.data_ptr() & 15):
        fn, M, N, K, n_p, lead = plan
        buf = x.new_empty((M, n_p))
        out = buf if n_p == N else buf[:, :N]
        # 2-D x (and so residual [M, N]) goes as it is: a reshape / view costs ~2.6 us of CPU.
        flat = len(lead) == 1
        res2 = None if residual is None else (residual if flat else residual.reshape(M, N))
        fn(x if flat else x.reshape(M, K), weight, out, bias, res2, None, None, float(alpha), float(beta))
        if n_p == N:
            return out if flat else out.view(*lead, N)
        return out[0] if not lead else _reshape_padded(out, lead, N)
    return _linear_slow(x, weight, bias, activation, residual, alpha, beta, key)


SWIGLU_TILE_N = (256, 128, 64)  # widest first: tile_n / 2 output columns per tile must divide N


@functools.lru_cache(maxsize=1024)
def swiglu_config(M: int, N: int, K: int) -> GemmConfig | None:
    """The config of the [gate; up] GEMM with the SwiGLU epilogue (M x 2N x K, output M x N):
    the tuning cache's winner for the swiglu class, else `swiglu_fallback`. Memoised, as
    _pick_config is: a prefill pays the pick once per shape."""
    from .config import Epilogue

    if N % 32 == 0:
        hit = _tuned(tuning_class(torch.bfloat16, torch.bfloat16, ("k", "k"), Epilogue(activation="swiglu")),
                     M, 2 * N, K)
        if hit is not None:
            return hit
    return swiglu_fallback(M, N, K)


def swiglu_fallback(M: int, N: int, K: int) -> GemmConfig | None:
    """The SwiGLU GEMM's config without a tuned one: the plain GEMM's pick for M x 2N x K
    (tuning cache, else heuristic) without split-K, its tile_n narrowed to the widest of
    SWIGLU_TILE_N whose half divides N where it does not. None when N is not a multiple of 32."""
    from .config import Epilogue

    if N % 32:
        return None
    cfg = _pick_config(M, 2 * N, K, 2, False, tuning_class(torch.bfloat16, torch.bfloat16, ("k", "k"), Epilogue()))
    if cfg.swap_ab:  # the plain class's tuned winner may be swapped; SwiGLU pairs D's columns
        cfg = default_config(M, 2 * N, K)
    cfg = dataclasses.replace(cfg, split_k=1)
    if tuning.swiglu_fits(cfg, N):
        return cfg
    for tn in SWIGLU_TILE_N:
        if N % (tn // 2) == 0:
            # 128 x 256 works cooperatively; 128 x 128 and narrower overlap epilogues (ping-pong).
            pp = tn <= 128
            cand = dataclasses.replace(cfg, tile_m=64 if tn == 64 else 128, tile_n=tn, pingpong=pp, promote=False)
            try:
                cand.validate()
            except ValueError:
                continue
            return cand
    return None


def swiglu_linear(x: torch.Tensor, gate_up: torch.Tensor, *, config: GemmConfig | None = None) -> torch.Tensor:
    """silu(x @ gate.T) * (x @ up.T) for gate_up = [gate; up] ([2N, K]): one GEMM whose epilogue
    writes only the [..., N] product, so the [..., 2N] projection never reaches memory.

    Transformers' roundings (LlamaMLP in 16 bits): each projection and silu rounded to x's
    dtype, the product rounded by the store; silu comes from the approximate exp2 and
    reciprocal, which can move its rounding by one step now and then. x [..., K] and gate_up
    in one dtype (bf16/fp16), on an sm_90 GPU; N must be a multiple of 32. Up to 8 rows run
    the skinny GEMV's SwiGLU epilogue instead (decode)."""
    from .config import Epilogue

    _check_16bit_operands(x, gate_up, "x", "gate_up")
    if gate_up.dim() != 2 or gate_up.shape[0] % 2:
        raise ValueError(f"gate_up must be 2-D [2N, K] ([gate; up]), got shape {tuple(gate_up.shape)}")
    if x.dim() < 1 or x.shape[-1] != gate_up.shape[1]:
        raise ValueError(f"x [..., K] must end in K={gate_up.shape[1]}, got {tuple(x.shape)}")
    N2, K = gate_up.shape
    N = N2 // 2
    if N % 32:
        raise ValueError(f"swiglu_linear needs N (gate_up rows / 2) to be a multiple of 32, got {N}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, K)
    M = x2.shape[0]
    if M == 0 or K == 0:
        return swiglu_linear_ref(x, gate_up)
    if config is None and M <= 8 and env.enabled("CUTE_KERNELS_GEMV"):
        from .gemv import skinny_gemm

        return skinny_gemm(x2.contiguous(), gate_up, swiglu=True).reshape(*lead, N)
    cfg = config or swiglu_config(M, N, K)
    if cfg is None or not tuning.swiglu_fits(cfg, N):
        raise ValueError(f"{cfg} cannot run the swiglu epilogue at N={N}: tile_n / 2 must divide N, no split-K")
    a = _prepare_operand(x2, "m")
    w = gate_up if gate_up.stride(1) == 1 and _tma_ok(gate_up, "k") else _prepare_operand(gate_up.contiguous(), "n")
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    fn = get_kernel("gemm_sm90", x.dtype, x.dtype, x.dtype, _major(a, "m"), "k", cfg, Epilogue(activation="swiglu"))
    fn(a, w, out, None, None, None, None, 1.0, 1.0)
    return out.reshape(*lead, N)


def swiglu_linear_ref(x: torch.Tensor, gate_up: torch.Tensor) -> torch.Tensor:
    """Reference: transformers' LlamaMLP gate/up/act in x's dtype (the torch ops it runs)."""
    N = gate_up.shape[0] // 2
    return torch.nn.functional.silu(x @ gate_up[:N].t()) * (x @ gate_up[N:].t())


def norm_prologue_fits(m: int, n: int, k: int, dtype: torch.dtype, *, bias: bool = False,
                       activation: str | None = None) -> bool:
    """Whether linear(norm(x)) over m <= 8 rows of K = k into n outputs runs as one skinny-GEMV
    launch with the norm (LayerNorm or RMSNorm) in its prologue: exactly where `linear` itself
    would take the GEMV (heuristics.skinny_gemv). Where it takes 64 x 16 swap_ab tiles, the
    norm's own launch and then the tiles ran faster than the fused launch (H200, same run,
    RMSNorm -> 128256 x 4096 at 1 and 8 rows 271 and 341 us -> 247 and 251; heuristics'
    WIDE_DECODE_TILES notes). With WIDE_DECODE_TILES off, always (as before the rule)."""
    from . import heuristics

    if not heuristics.WIDE_DECODE_TILES:
        return True
    return _gemv_takes(m, n, k, dtype, bias, activation or "none")


@functools.lru_cache(maxsize=1024)
def _gemv_takes(m: int, n: int, k: int, dtype: torch.dtype, bias: bool, activation: str) -> bool:
    # Memoised: layernorm_linear asks on every call (an Epilogue and swappable cost ~2 us of host time).
    from .config import Epilogue

    return skinny_gemv(m, n, k, swappable(dtype, dtype, dtype, Epilogue(bias=bias, activation=activation)))


def layernorm_linear(
    x: torch.Tensor,
    ln_weight: torch.Tensor,
    ln_bias: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    eps: float = 1e-5,
    activation: str | None = None,
) -> torch.Tensor:
    """linear(LayerNorm(x), weight, bias, activation=...): GPT-2's ln_1 -> c_attn, ln_2 -> c_fc
    and ln_f -> lm_head. At decode sizes (<= 8 rows, 16-bit, dense) the LayerNorm runs as the
    prologue of the skinny GEMM (matmul/gemv.py), one launch instead of two; otherwise it is
    F.layer_norm followed by `linear`.
    """
    import torch.nn.functional as F

    _check_16bit_operands(x, weight, "x", "weight")
    K = weight.shape[-1]
    for t, n in ((ln_weight, "ln_weight"), (ln_bias, "ln_bias")):
        if not isinstance(t, torch.Tensor) or t.shape != (K,) or t.dtype != x.dtype or t.device != x.device:
            raise ValueError(f"{n} must be a {x.dtype} tensor of shape ({K},) on {x.device}")
    from .gemv import GEMV_MAX_M, LN_MAX_K, gemv_enabled

    x2 = x.reshape(-1, x.shape[-1]) if x.dim() >= 1 else x
    fused = (
        gemv_enabled() and weight.dim() == 2 and K <= LN_MAX_K and x.dim() >= 1 and x.shape[-1] == K and 0 < x2.shape[0] <= GEMV_MAX_M
        and x2.stride(-1) == 1 and weight.stride(-1) == 1 and ln_weight.is_contiguous() and ln_bias.is_contiguous()
        and activation in ACTIVATIONS and weight.shape[0] > 0
        and (bias is None or (isinstance(bias, torch.Tensor) and bias.shape == (weight.shape[0],)
                              and bias.dtype == x.dtype and bias.is_contiguous()))
        and norm_prologue_fits(x2.shape[0], weight.shape[0], K, x.dtype, bias=bias is not None, activation=activation)
    )
    if not fused:
        return linear(F.layer_norm(x, (K,), ln_weight, ln_bias, eps), weight, bias, activation=activation)
    from .gemv import layernorm_gemv

    out = layernorm_gemv(x2, ln_weight, ln_bias, eps, weight, bias, activation)
    return out.view(*x.shape[:-1], weight.shape[0])


def layernorm_linear_ref(x, ln_weight, ln_bias, weight, bias=None, *, eps=1e-5, activation=None):
    """fp32 reference for layernorm_linear."""
    import torch.nn.functional as F

    h = F.layer_norm(x.float(), (x.shape[-1],), ln_weight.float(), ln_bias.float(), eps)
    return linear_ref(h, weight.float(), None if bias is None else bias.float(), activation=activation)


def _linear_slow(x, weight, bias, activation, residual, alpha, beta, plan_key):
    from .config import Epilogue

    _check_16bit_operands(x, weight, "x", "weight")
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D [N, K], got shape {tuple(weight.shape)}")
    if x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x [..., K] must end in K={weight.shape[1]} (weight is {tuple(weight.shape)}), got {tuple(x.shape)}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    N, K = weight.shape
    lead = x.shape[:-1]
    x2 = x.reshape(-1, K)
    M = x2.shape[0]
    copied = False  # any operand copied here makes this call's launch unfit to replay
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or bias.shape != (N,) or bias.dtype != x.dtype or bias.device != x.device:
            raise ValueError(f"bias must be a {x.dtype} tensor of shape ({N},) on {x.device}")
        copied |= not bias.is_contiguous()
        bias = bias.contiguous()
    res2 = None
    if residual is not None:
        if not isinstance(residual, torch.Tensor) or residual.shape != (*lead, N) or residual.dtype != x.dtype:
            raise ValueError(f"residual must be a {x.dtype} tensor of shape {(*lead, N)}")
        if residual.device != x.device:
            raise ValueError(f"residual is on {residual.device}, expected {x.device}")
        res2 = residual_for_kernel(residual.reshape(-1, N))
    out = _alloc_out(M, N, x.dtype, x.device)
    if M and N:
        if K == 0:
            out.copy_(linear_ref(x2, weight, bias, activation=activation, residual=res2, alpha=alpha, beta=beta))
        else:
            epi = Epilogue(
                activation=activation or "none",
                bias=bias is not None,
                residual=res2 is not None,
                alpha=alpha != 1.0,
                beta=res2 is not None and beta != 1.0,
            )
            a_p, w_p = _prepare_operand(x2, "m"), _prepare_operand(weight, "n")
            fn = kernel_for(a_p, w_p, out.dtype, epi)
            fn(a_p, w_p, out, bias, res2, None, None, float(alpha), float(beta))
            copied |= a_p is not x2 or x2.data_ptr() != x.data_ptr() or w_p is not weight
            copied |= residual is not None and res2.data_ptr() != residual.data_ptr()
            if plan_key is not None and not copied and a_p.stride(1) == 1:
                _LINEAR_PLANS[plan_key] = (fn, M, N, K, padded_n(N, x.dtype), tuple(lead))
    if out.is_contiguous():
        return out.reshape(*lead, N)
    return out[0] if not lead else _reshape_padded(out, lead, N)


def _reshape_padded(out: torch.Tensor, lead, N: int) -> torch.Tensor:
    """[M, N] view with padded row stride -> [..., N] view (no copy)."""
    sizes = (*lead, N)
    strides = [out.stride(0)]
    for d in reversed(lead[1:]):
        strides.insert(0, strides[0] * d)
    return out.as_strided(sizes, (*strides, 1))
