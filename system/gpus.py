"""GPU types: public peak throughput and memory, for heterogeneous clusters.

Numbers are the vendors' datasheet values for dense FP16/BF16 tensor-core math (no structured
sparsity) and on-board memory:

- V100 SXM2 16 GB: 125 TFLOPS FP16 tensor, 16 GB HBM2, 900 GB/s (NVIDIA Tesla V100 datasheet).
- A100 SXM4 40 GB: 312 TFLOPS FP16/BF16 tensor, 40 GB HBM2, 1,555 GB/s (NVIDIA A100 datasheet).
- T4: 65 TFLOPS FP16 tensor (mixed precision), 16 GB GDDR6, 320 GB/s (NVIDIA T4 datasheet).
- L4: 121 TFLOPS FP16 tensor dense (242 with sparsity), 24 GB GDDR6, 300 GB/s (NVIDIA L4
  datasheet).
- GH200 (its H100 GPU, 96 GB): 989 TFLOPS BF16/FP16 tensor dense, 96 GB HBM3, 4.0 TB/s (NVIDIA
  GH200 Grace Hopper Superchip datasheet).
- GeForce RTX 3090: 71 TFLOPS FP16 tensor with FP32 accumulate (142 with FP16 accumulate), 24 GB
  GDDR6X, 936 GB/s (NVIDIA Ampere GA102 GPU architecture whitepaper, appendix A).
- GeForce RTX 2080: 40.3 TFLOPS FP16 tensor with FP32 accumulate (80.5 with FP16 accumulate),
  8 GB GDDR6, 448 GB/s (NVIDIA Turing GPU architecture whitepaper, appendix A).
- TITAN RTX: 130 TFLOPS FP16 tensor (FP32 accumulate at full rate), 24 GB GDDR6, 672 GB/s
  (NVIDIA TITAN RTX product page / Turing whitepaper).

``fp32_flops`` is the plain FP32 (CUDA-core, no tensor core) peak from the same sources: V100
15.7, A100 19.5, T4 8.1, L4 30.3, GH200 67, RTX 3090 35.6, RTX 2080 10.1, TITAN RTX 16.3 TFLOPS.
It is what an FP32 training run can reach on GPUs without TF32 (the V100 and the Turing cards);
:mod:`repro.studies.external.precision` uses it to tell measured FP32 from FP16 profiles.

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
    fp32_flops: float | None = None  # plain FP32 peak FLOP/s (module docstring)

    def __post_init__(self) -> None:
        if self.peak_flops <= 0 or self.memory_bytes <= 0 or self.hbm_bandwidth_bps <= 0:
            raise ValueError(f"GPU type {self.name!r}: flops, memory and bandwidth must be > 0")


GPU_TYPES: dict[str, GpuType] = {
    "V100": GpuType("V100", 125e12, 16e9, 900e9 * 8, 15.7e12),
    "A100": GpuType("A100", 312e12, 40e9, 1555e9 * 8, 19.5e12),
    "T4": GpuType("T4", 65e12, 16e9, 320e9 * 8, 8.1e12),
    "L4": GpuType("L4", 121e12, 24e9, 300e9 * 8, 30.3e12),
    "GH200": GpuType("GH200", 989e12, 96e9, 4000e9 * 8, 67e12),
    "RTX3090": GpuType("RTX3090", 71e12, 24e9, 936e9 * 8, 35.6e12),
    "RTX2080": GpuType("RTX2080", 40.3e12, 8e9, 448e9 * 8, 10.1e12),
    "TitanRTX": GpuType("TitanRTX", 130e12, 24e9, 672e9 * 8, 16.3e12),
}
DEFAULT_GPU = "V100"  # the paper's testbed (§4.1): a device without a type is a V100


def get_gpu(name: str) -> GpuType:
    if name not in GPU_TYPES:
        raise ValueError(f"unknown GPU type {name!r}; known: {', '.join(GPU_TYPES)}")
    return GPU_TYPES[name]
