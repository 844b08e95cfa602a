"""``mode=gpu_check``'s options: our runtime on CUDA, and the GPU calibration."""

from __future__ import annotations

from dataclasses import dataclass

from repro.config.base import RunConfig, register_mode
from repro.config.options import option

__all__ = ["GpuCheckConfig"]


@dataclass
@register_mode("gpu_check")
class GpuCheckConfig(RunConfig):
    """Our runtime on CUDA: correctness, mixed precision, throughput; the GPU calibration."""

    check_runtime: bool = option(True, "the correctness and throughput checks")
    calibrate: bool | None = option(None, "the performance model's calibration (null: on a GPU)")
    dry: bool = option(False, "the calibration's code on the CPU with a tiny model")
    calibration_dir: str | None = option(None, "calibration files (null: results_dir)")
