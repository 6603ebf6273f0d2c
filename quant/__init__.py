"""FP8 / INT8 quantization for inference on Hopper.

- `quantize_fp8`, `quantize_int8`: fused amax/scale/cast of activations (Triton
  on CUDA, PyTorch reference elsewhere), per tensor, per row or per 1x128 block.
- `quantize_weight`, `quantize_weight_fp8_block`: offline weight quantization,
  per output channel / per tensor / per 128x128 block.
- `dequantize`: the inverse, for checking.
- `FP8Linear`, `Int8Linear`: nn.Linear / GPT-2 Conv1D replacements running the
  `cute_kernels` scaled GEMMs.
- `quantize_model(model, scheme)`: swap all of a model's linears in place.
- `smoothquant`: calibration of SmoothQuant factors for int8.

Importing this package does not import Triton or cutlass, or touch the GPU.
Numerics (rounding, saturation, zero and NaN handling) are documented in
`quant/_reference.py`; scale shapes in `quant/quantize.py`.
"""

from . import smoothquant
from .model import SCHEMES, quantize_model
from .nn import FP8Linear, Int8Linear
from .quantize import (
    dequantize,
    layernorm_quantize,
    quantize,
    quantize_fp8,
    quantize_int8,
    quantize_weight,
    quantize_weight_fp8_block,
)

__all__ = [
    "SCHEMES",
    "FP8Linear",
    "Int8Linear",
    "dequantize",
    "layernorm_quantize",
    "quantize",
    "quantize_fp8",
    "quantize_int8",
    "quantize_model",
    "quantize_weight",
    "quantize_weight_fp8_block",
    "smoothquant",
]
