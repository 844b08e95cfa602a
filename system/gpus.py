"""GPU types: public peak throughput and memory, for heterogeneous clusters.

Numbers are the vendors' datasheet values for dense FP16/BF16 tensor-core math (no structured
sparsity) and on-board memory:

- V100 SXM2 16 GB: 125 TFLOPS FP16 tensor, 16 GB HBM2, 900 GB/s (NVIDIA Tesla V100 datasheet).
- A100 SXM4 40 GB: 312 TFLOPS FP16/BF16 tensor, 40 GB HBM2, 1,555 GB/s (NVIDIA A100 datasheet).
- T4: 65 TFLOPS FP16 tensor (mixed precision), 16 GB GDDR6, 320 GB/s (NVIDIA T4 datasheet).
- L4: 121 TFLOPS FP16 tensor dense (242 with sparsity), 24 GB GDDR6, 300 GB/s (NVIDIA L4
  datasheet).

Every compute time in this repository derives from ``peak_flops`` times one achievable fraction
shared by all types (the V100 calibration of :mod:`system.simulator.hardware`), so only the
*ratios* between types matter to the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GpuType", "GPU_TYPES", "get_gpu", "DEFAULT_GPU"]


@dataclass(frozen=True, slots=True)
class GpuType:
    name: str
    peak_flops: float  # dense FP16 tensor-core FLOP/s
    memory_bytes: float  # on-board memory
    hbm_bandwidth_bps: float  # memory bandwidth, bit/s

    def __post_init__(self) -> None:
        if self.peak_flops <= 0 or self.memory_bytes <= 0 or self.hbm_bandwidth_bps <= 0:
            raise ValueError(f"GPU type {self.name!r}: flops, memory and bandwidth must be > 0")


GPU_TYPES: dict[str, GpuType] = {
    "V100": GpuType("V100", 125e12, 16e9, 900e9 * 8),
    "A100": GpuType("A100", 312e12, 40e9, 1555e9 * 8),
    "T4": GpuType("T4", 65e12, 16e9, 320e9 * 8),
    "L4": GpuType("L4", 121e12, 24e9, 300e9 * 8),
}
DEFAULT_GPU = "V100"  # the paper's testbed (§4.1): a device without a type is a V100


def get_gpu(name: str) -> GpuType:
    if name not in GPU_TYPES:
        raise ValueError(f"unknown GPU type {name!r}; known: {', '.join(GPU_TYPES)}")
    return GPU_TYPES[name]
