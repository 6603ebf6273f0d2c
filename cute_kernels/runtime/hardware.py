"""Hopper parts: the facts the heuristics and every report use, in one table.

Dense peaks (no sparsity) and HBM bandwidth from NVIDIA's datasheets. The kernels'
heuristics were tuned on the H100 SXM (`H100_SXM`); reports (MFU, MBU, % of peak, % of
HBM) use the part present (`current()`), so an H200 or an H100 PCIe is not measured
against an H100 SXM's roofline. Nothing here touches the GPU at import.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class Part:
    name: str
    sms: int
    bf16_tflops: float  # dense; fp16 is the same
    fp8_tflops: float  # dense; int8 TOPS is the same
    hbm_tbps: float
    l2_mb: int
    smem_per_sm_kb: int = 228  # 227 KB usable by one CTA
    max_cluster: int = 8  # portable cluster size (16 with the non-portable opt-in)

    def peak_tflops(self, kind: str) -> float:
        """kind: "bf16"/"fp16", or "fp8"/"int8"/"8bit"."""
        if kind in ("bf16", "fp16"):
            return self.bf16_tflops
        if kind in ("fp8", "int8", "8bit"):
            return self.fp8_tflops
        raise ValueError(f"no peak for {kind!r}: expected bf16, fp16, fp8, int8 or 8bit")


H100_SXM = Part("H100 SXM", 132, 989.4, 1978.9, 3.35, 50)
PARTS = {
    "H100 SXM": H100_SXM,
    "H100 PCIe": Part("H100 PCIe", 114, 756.0, 1513.0, 2.0, 50),
    "H100 NVL": Part("H100 NVL", 132, 835.0, 1671.0, 3.9, 50),
    "H200": Part("H200", 132, 989.4, 1978.9, 4.8, 60),
    "GH200": Part("GH200", 132, 989.4, 1978.9, 4.0, 60),
}


def lookup(device_name: str, sms: int | None = None) -> Part:
    """The part for a CUDA device name ('NVIDIA H100 80GB HBM3', 'NVIDIA H200', ...); the
    H100 SXM's figures for an unknown name."""
    n = device_name.upper()
    if "GH200" in n:
        return PARTS["GH200"]
    if "H200" in n:
        return PARTS["H200"]
    if "H100" in n and "NVL" in n:
        return PARTS["H100 NVL"]
    if "H100" in n and ("PCIE" in n or sms == 114):
        return PARTS["H100 PCIe"]
    return H100_SXM


@functools.lru_cache(maxsize=None)
def current(device_index: int = 0) -> Part:
    """The part present (queried on first use, then cached); the H100 SXM without a GPU."""
    import torch

    if not torch.cuda.is_available():
        return H100_SXM
    props = torch.cuda.get_device_properties(device_index)
    return lookup(props.name, props.multi_processor_count)
