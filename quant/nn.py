"""Drop-in FP8 / INT8 replacements for nn.Linear and GPT-2's Conv1D.

Weights are quantized once, statically, per output channel (or per 128x128 block
for FP8 "block" mode); activations are quantized dynamically per token (or per
1x128 group) on every forward by the fused Triton kernel, then one scaled GEMM
applies both scales and the bias in its epilogue. Per-token activation scales
matter because LLM activations differ by orders of magnitude between tokens; a
per-tensor scale would crush the small ones.

Layout: the quantized weight is stored K-major as [N, K] (nn.Linear's layout)
whatever the source module was, so the GEMM reads it as a column-major [K, N]
operand via `weight.t()` with no copy. GPT-2's Conv1D keeps its weight [K, N];
`from_float` transposes it once.

Everything the forward needs is a registered buffer, so `state_dict()` /
`load_state_dict()` round-trip a quantized model (build the same quantized
skeleton, e.g. with `quant.quantize_model`, then load).

Buffers (N = out_features, K = in_features):

- FP8Linear, mode "row":   weight [N, K] fp8, weight_scale [N, 1] fp32
- FP8Linear, mode "block": weight [N, K] fp8, weight_scale [ceil(N/128), ceil(K/128)] fp32
- Int8Linear:              weight [N, K] int8, weight_scale [N, 1] fp32
- all: bias [N] (source dtype) or absent; inv_smooth [K] fp32 or absent

SmoothQuant: with smoothing factors s [K], the weight's input channels are
multiplied by s before quantizing and the activations by `inv_smooth` = 1/s
inside the quantize kernel (fused, no extra pass), so x @ W^T is unchanged in
exact arithmetic while activation outliers move into the weight.

Dispatch: CUDA tensors on an sm_90 GPU go to `cute_kernels.scaled_mm`,
`scaled_mm_blockwise` and `int8_mm`; anything else (CPU, other GPUs) runs the
PyTorch references, which is slow but exact enough for tests. Set a module's
`backend` attribute to "kernels" or "reference" to force one path.
"""

from __future__ import annotations

import functools
import warnings

import torch
from torch import nn

from ._reference import BLOCK
from .quantize import FP8_DTYPES, layernorm_quantize, quantize, quantize_weight, quantize_weight_fp8_block

__all__ = ["FP8Linear", "Int8Linear", "is_linear_like", "linear_weight_nk"]

BACKENDS = ("auto", "kernels", "reference")


# ---------------------------------------------------------------------------
# Source-module helpers


@functools.lru_cache(maxsize=1)
def _conv1d_class():
    try:
        from transformers.pytorch_utils import Conv1D
    except Exception:  # transformers absent or moved: only nn.Linear is recognised
        return None
    return Conv1D


def is_linear_like(module: nn.Module) -> bool:
    """nn.Linear or Hugging Face's Conv1D (GPT-2), the modules we know how to replace."""
    conv = _conv1d_class()
    return isinstance(module, nn.Linear) or (conv is not None and isinstance(module, conv))


def linear_weight_nk(module: nn.Module) -> torch.Tensor:
    """The module's weight as [N, K] = [out, in] (a view; Conv1D stores [in, out])."""
    if isinstance(module, nn.Linear):
        return module.weight
    conv = _conv1d_class()
    if conv is not None and isinstance(module, conv):
        return module.weight.t()
    raise TypeError(
        f"expected nn.Linear or transformers Conv1D, got {type(module).__name__}"
    )


# ---------------------------------------------------------------------------
# GEMM dispatch


@functools.lru_cache(maxsize=1)  # asked on every forward; the answer does not change in a process
def _hopper() -> bool:
    from cute_kernels.runtime import is_hopper_available

    return is_hopper_available()


_WARNED_FALLBACK = False


def _use_kernels(backend: str, x: torch.Tensor) -> bool:
    if backend == "kernels":
        return True
    if backend == "reference":
        return False
    if x.is_cuda and not _hopper():
        # Say so once: a non-Hopper GPU silently running the (slow) reference GEMM
        # would look like a working fast path in every timing.
        global _WARNED_FALLBACK
        if not _WARNED_FALLBACK:
            warnings.warn("quant: the FP8/INT8 kernels need an sm_90 GPU; using the PyTorch reference GEMM "
                          "(set module.backend = 'kernels' to get the error instead)", stacklevel=3)
            _WARNED_FALLBACK = True
        return False
    return x.is_cuda


def weight_only_eligible(module, x2: torch.Tensor) -> bool:
    """Whether this FP8Linear (per-channel) / Int8Linear runs x2 [M, K] weight-only: decode
    sizes (<= 8 rows, 16-bit, on a GPU the kernels serve) on the skinny GEMM with 16-bit
    activations against the 8-bit weights and their per-channel scale."""
    from cute_kernels.matmul.gemv import GEMV_MAX_M, gemv_enabled

    return (
        (isinstance(module, Int8Linear) or (isinstance(module, FP8Linear) and module.mode == "row"))
        and x2.is_cuda and 0 < x2.shape[0] <= GEMV_MAX_M and x2.dtype in (torch.bfloat16, torch.float16)
        and gemv_enabled() and _use_kernels(module.backend, x2)
    )


def _weight_only_decode(module, x2: torch.Tensor, bias, r2) -> torch.Tensor | None:
    """module(x2) on the weight-only skinny GEMM, or None where it does not apply."""
    if not weight_only_eligible(module, x2):
        return None
    from cute_kernels.matmul.gemv import weight_only_gemv

    return weight_only_gemv(x2.contiguous(), module.weight, module.weight_scale.view(-1), bias, module.activation,
                            None if r2 is None else r2.contiguous(), module.inv_smooth)


class _QuantLinearBase(nn.Module):
    weight: torch.Tensor
    weight_scale: torch.Tensor
    bias: torch.Tensor | None
    inv_smooth: torch.Tensor | None
    # Epilogue fusion, the protocol inference.patch_model uses for its own linears: an
    # activation applied after the bias (GPT-2's c_fc takes gelu_tanh) and
    # forward(x, residual=...) adding the block's residual, both inside the GEMM epilogue.
    activation: str | None = None
    fuses_residual = True

    def __init__(self, in_features, out_features, bias, qdtype, scale_shape, bias_dtype, device):
        super().__init__()
        if in_features <= 0 or out_features <= 0:
            raise ValueError(f"in/out features must be positive, got {in_features}, {out_features}")
        self.in_features = in_features
        self.out_features = out_features
        self.backend = "auto"
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=qdtype, device=device))
        self.register_buffer("weight_scale", torch.ones(scale_shape, dtype=torch.float32, device=device))
        if bias:
            self.register_buffer("bias", torch.zeros(out_features, dtype=bias_dtype, device=device))
        else:
            self.register_buffer("bias", None)
        self.register_buffer("inv_smooth", None)

    # -- construction -------------------------------------------------------

    def _prepare_weight(self, module: nn.Module, smooth: torch.Tensor | None) -> torch.Tensor:
        """[N, K] float32 weight, with input channels multiplied by `smooth`."""
        w = linear_weight_nk(module).detach().float()
        if smooth is not None:
            smooth = torch.as_tensor(smooth).to(device=w.device, dtype=torch.float32)
            if smooth.shape != (w.shape[1],):
                raise ValueError(f"smooth must have shape [K] = [{w.shape[1]}], got {tuple(smooth.shape)}")
            if not (torch.isfinite(smooth).all() and (smooth > 0).all()):
                raise ValueError("smooth factors must be finite and > 0")
            w = w * smooth[None, :]
            self.inv_smooth = (1.0 / smooth).contiguous()
        return w

    def _copy_bias(self, module: nn.Module) -> None:
        if module.bias is not None:
            self.bias = module.bias.detach().clone()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # A skeleton built without smoothing has no inv_smooth buffer; create it
        # when the checkpoint carries one, so int8-smoothquant checkpoints load
        # into a skeleton built by any int8 scheme.
        key = prefix + "inv_smooth"
        if key in state_dict and self.inv_smooth is None:
            self.inv_smooth = torch.empty(self.in_features, dtype=torch.float32, device=self.weight.device)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    _KEEP_DTYPE = ("weight", "weight_scale", "inv_smooth")

    def _apply(self, fn, recurse=True):
        # model.half() / .to(torch.bfloat16) convert every floating buffer, and
        # fp8 counts as floating: that would turn the fp8 weight into bf16 and
        # round the fp32 scales. Keep the quantized state's dtypes, follow the device.
        saved = {n: self._buffers[n] for n in self._KEEP_DTYPE if self._buffers.get(n) is not None}
        super()._apply(fn, recurse)
        for name, orig in saved.items():
            new = self._buffers[name]
            if new.dtype != orig.dtype:
                self._buffers[name] = orig.to(device=new.device)
        return self

    # -- forward helpers ---------------------------------------------------

    def _prologue(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if x.shape[-1] != self.in_features:
            raise ValueError(
                f"{type(self).__name__} expects input [..., {self.in_features}], got {tuple(x.shape)}"
            )
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        x2 = x if x.dim() == 2 else x.reshape(-1, self.in_features)  # a reshape costs ~1-2 us of CPU
        bias = self.bias
        if bias is not None and bias.dtype != x.dtype:
            bias = bias.to(x.dtype)
        return x2, bias, self._residual_2d(residual, x2)

    def _epilogue(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], self.out_features)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        return self._run(x, residual, None)

    def forward_layernorm(self, x: torch.Tensor, ln: nn.LayerNorm, residual: torch.Tensor | None = None):
        """self(ln(x), residual), with the LayerNorm fused into the activation quantization
        (per token, or per 1 x 128 group in block mode) where the W8A8 GEMM runs (CUDA
        kernels, more rows than the weight-only decode path takes): the normalized
        activations never reach memory in 16 bits (GPT-2 XL 8 x 1024 prefill: two quantize
        passes per layer)."""
        return self._run(x, residual, ln)

    def _run(self, x, residual, ln):
        x2, bias, r2 = self._prologue(x, residual)
        if x2.shape[0] == 0:
            return x.new_empty(*x.shape[:-1], self.out_features)
        use_kernels = _use_kernels(self.backend, x2)
        fuse = (ln is not None and use_kernels and isinstance(ln, nn.LayerNorm)
                and ln.weight is not None and ln.bias is not None and not weight_only_eligible(self, x2))
        if ln is not None and not fuse:
            x2 = ln(x2)
        if fuse:
            q, sa = layernorm_quantize(x2, ln.weight, ln.bias, ln.eps, self.weight.dtype, multiplier=self.inv_smooth,
                                       granularity=self._act_granularity)
        else:
            y = _weight_only_decode(self, x2, bias, r2)
            if y is not None:
                return self._epilogue(y, x)
            q, sa = self._quantize_input(x2)
        return self._epilogue(self._gemm(q, sa, x2.dtype, bias, r2, use_kernels), x)

    def _residual_2d(self, residual: torch.Tensor | None, x2: torch.Tensor) -> torch.Tensor | None:
        if residual is None:
            return None
        if residual.shape[-1] != self.out_features or residual.numel() != x2.shape[0] * self.out_features:
            raise ValueError(f"residual must have shape [..., {self.out_features}] matching the input's rows")
        return residual.reshape(x2.shape[0], self.out_features)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, smooth={self.inv_smooth is not None}"
        )


class FP8Linear(_QuantLinearBase):
    """y = x @ W^T + b with FP8 operands.

    mode "row": dynamic per-token activation scales [M, 1], static per-output-
    channel weight scales [N, 1], via `scaled_mm`.
    mode "block": 1x128 activation scales [M, ceil(K/128)] and 128x128 weight
    scales [ceil(N/128), ceil(K/128)] (DeepSeek-V3 style), via `scaled_mm_blockwise`;
    tolerates outliers better because each scale covers 128 values.

    fast_accum (row mode): accumulate in the fp8 tensor-core accumulator without
    promoting each k-tile into fp32 (`scaled_mm(use_fast_accum=True)`), as torchao's
    Float8Linear does for the forward pass. It is ~1.3x faster on GPT-2 XL's GEMMs;
    its extra error is measured in `tests/test_quant.py` (docs/quant-and-decode.md). False gives the
    promoted ("2xAcc") kernel.
    """

    MODES = ("row", "block")

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        mode: str = "row",
        fp8_dtype: torch.dtype = torch.float8_e4m3fn,
        bias_dtype: torch.dtype = torch.float32,
        device=None,
        fast_accum: bool = True,
    ):
        if mode not in self.MODES:
            raise ValueError(f"mode must be one of {self.MODES}, got {mode!r}")
        if fp8_dtype not in FP8_DTYPES:
            raise ValueError(f"fp8_dtype must be one of {FP8_DTYPES}, got {fp8_dtype}")
        if mode == "row":
            scale_shape = (out_features, 1)
        else:
            scale_shape = (-(-out_features // BLOCK), -(-in_features // BLOCK))
        super().__init__(in_features, out_features, bias, fp8_dtype, scale_shape, bias_dtype, device)
        self.mode = mode
        self.fast_accum = fast_accum

    @classmethod
    @torch.no_grad()
    def from_float(
        cls,
        module: nn.Module,
        *,
        smooth: torch.Tensor | None = None,
        mode: str = "row",
        fp8_dtype: torch.dtype = torch.float8_e4m3fn,
        fast_accum: bool = True,
    ) -> "FP8Linear":
        """Quantize an nn.Linear or GPT-2 Conv1D (on its device); `smooth` [K] optional."""
        w_nk = linear_weight_nk(module)
        N, K = w_nk.shape
        bias_dtype = module.bias.dtype if module.bias is not None else w_nk.dtype
        self = cls(K, N, module.bias is not None, mode=mode, fp8_dtype=fp8_dtype,
                   bias_dtype=bias_dtype, device=w_nk.device, fast_accum=fast_accum)
        w = self._prepare_weight(module, smooth)
        if mode == "row":
            q, s = quantize_weight(w, fp8_dtype, per_channel=True)
        else:
            q, s = quantize_weight_fp8_block(w, fp8_dtype)
        self.weight.copy_(q)
        self.weight_scale.copy_(s)
        self._copy_bias(module)
        return self

    @property
    def _act_granularity(self) -> str:
        return self.mode  # "row" (per token) or "block" (1 x 128 groups)

    def _quantize_input(self, x2):
        return quantize(x2, self.weight.dtype, self._act_granularity, multiplier=self.inv_smooth)

    def _gemm(self, q, sa, out_dtype, bias, r2, use_kernels):
        act = self.activation
        if self.mode == "row":
            sb = self.weight_scale.view(1, -1)
            if use_kernels:
                import cute_kernels

                y = cute_kernels.scaled_mm(q, self.weight.t(), sa, sb, bias=bias, out_dtype=out_dtype,
                                           activation=act, residual=r2, use_fast_accum=self.fast_accum)
            else:
                from cute_kernels.quantized.reference import scaled_mm_ref

                y = scaled_mm_ref(q, self.weight.t(), sa, sb, bias=bias, out_dtype=out_dtype,
                                  activation=act, residual=r2)
        else:
            if use_kernels:
                import cute_kernels

                y = cute_kernels.scaled_mm_blockwise(
                    q, self.weight, sa, self._kernel_block_scale(), bias=bias, out_dtype=out_dtype, activation=act,
                    residual=r2,
                )
            else:
                from cute_kernels.quantized.reference import scaled_mm_blockwise_ref

                y = scaled_mm_blockwise_ref(
                    q, self.weight, sa, self.weight_scale, bias=bias, out_dtype=out_dtype, activation=act,
                    residual=r2,
                )
        return y

    def _kernel_block_scale(self) -> torch.Tensor:
        """weight_scale [N/128, K/128] with 16-byte rows, as the kernel TMA-loads it. The
        buffer itself stays contiguous (state_dict, .to()); the padded copy is cached and
        rebuilt when the buffer changes (load_state_dict, .to())."""
        ws = self.weight_scale
        key = (ws.data_ptr(), ws._version, ws.device)
        cached = getattr(self, "_block_scale_cache", None)
        if cached is None or cached[0] != key:
            from cute_kernels.quantized.api import block_scales_for_kernel

            cached = (key, block_scales_for_kernel(None, ws)[1])
            self._block_scale_cache = cached
        return cached[1]

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, mode={self.mode}, dtype={self.weight.dtype}, fast_accum={self.fast_accum}"


class Int8Linear(_QuantLinearBase):
    """y = x @ W^T + b with INT8 operands (W8A8): dynamic per-token activation
    scales [M, 1], static per-output-channel weight scales [N, 1], int32
    accumulation, dequantized with bias in the `int8_mm` epilogue.

    INT8 has a uniform grid, so activation outliers hurt it far more than FP8;
    pair it with SmoothQuant (`smooth=`) for real models.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        bias_dtype: torch.dtype = torch.float32,
        device=None,
    ):
        super().__init__(in_features, out_features, bias, torch.int8, (out_features, 1), bias_dtype, device)

    @classmethod
    @torch.no_grad()
    def from_float(cls, module: nn.Module, *, smooth: torch.Tensor | None = None) -> "Int8Linear":
        """Quantize an nn.Linear or GPT-2 Conv1D (on its device); `smooth` [K] optional."""
        w_nk = linear_weight_nk(module)
        N, K = w_nk.shape
        bias_dtype = module.bias.dtype if module.bias is not None else w_nk.dtype
        self = cls(K, N, module.bias is not None, bias_dtype=bias_dtype, device=w_nk.device)
        w = self._prepare_weight(module, smooth)
        q, s = quantize_weight(w, torch.int8, per_channel=True)
        self.weight.copy_(q)
        self.weight_scale.copy_(s)
        self._copy_bias(module)
        return self

    _act_granularity = "row"

    def _quantize_input(self, x2):
        return quantize(x2, torch.int8, self._act_granularity, multiplier=self.inv_smooth)

    def _gemm(self, q, sa, out_dtype, bias, r2, use_kernels):
        sb = self.weight_scale.view(1, -1)
        if use_kernels:
            import cute_kernels

            return cute_kernels.int8_mm(q, self.weight.t(), sa, sb, bias=bias, out_dtype=out_dtype,
                                        activation=self.activation, residual=r2)
        from cute_kernels.quantized.reference import int8_mm_ref

        return int8_mm_ref(q, self.weight.t(), sa, sb, bias=bias, out_dtype=out_dtype,
                           activation=self.activation, residual=r2)
