"""Sailor's GPU type names and the project's (:data:`system.gpus.GPU_TYPES`) for them."""

from __future__ import annotations

from system.external.sailor.errors import SailorFormatError

__all__ = ["SAILOR_GPUS", "project_gpu"]

# Sailor name -> project name. GH-96 is Clariden's GH200 (96 GB HBM3); the others are the cards
# of Sailor's heterogeneous cluster and its cloud profiles.
SAILOR_GPUS: dict[str, str] = {
    "GH-96": "GH200",
    "V100-16": "V100",
    "A100-40": "A100",
    "A100-80": "A100",
    "RTX-3090": "RTX3090",
    "RTX-2080": "RTX2080",
    "Titan-RTX": "TitanRTX",
}


def project_gpu(name, file, field: str) -> str:
    """The project's GPU type for Sailor's ``name``; SailorFormatError naming it otherwise."""
    if not isinstance(name, str) or name not in SAILOR_GPUS:
        raise SailorFormatError(
            file, field, f"unknown GPU type {name!r}; known: {', '.join(SAILOR_GPUS)}"
        )
    return SAILOR_GPUS[name]
