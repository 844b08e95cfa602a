"""Compute per GPU type for the planner: measured per-layer profiles where given, else peak.

A GPU type's sustained rate at micro-batch ``mbs`` is its FP16 peak (:mod:`system.gpus`) times
an efficiency:

- ``profile``: from Sailor's per-layer profiles (``profiles_tmp.json`` and the profiled models'
  ``training_config_*.json``, read by :mod:`system.external.sailor.profile`): the transformer
  layer's FLOPs per sequence, (24·s·h² + 4·s²·h)·mbs forward and twice that backward
  (Narayanan et al., SC'21), over the measured forward + backward time at tp = 1, as a fraction
  of the FP16 peak. The profiled model whose hidden size is nearest the planned model's is used
  (ties: the larger), at the profiled micro-batch nearest the planned one. A row whose rate does
  not exceed the type's plain FP32 peak was measured without tensor cores (the rule of
  :mod:`repro.studies.external.precision`) and says nothing about an FP16 run: it is not used;
- ``peak``: the shared achievable fraction of :mod:`system.simulator.hardware` (0.30 of the
  FP16 peak, one value for every type).

Every type's row says which one it got (:attr:`TypeCompute.source`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from system.gpus import get_gpu
from system.simulator.hardware import ADAM_BYTES_PER_PARAM, V100
from system.workload import GPTConfig

__all__ = ["TypeCompute", "ComputeModel", "compute_model", "SHARED_EFFICIENCY"]

SHARED_EFFICIENCY = V100.achievable_fraction  # 0.30 of the FP16 peak (hardware.py)
PROFILE_TP = 1  # the planner's runs have no tensor parallelism (our runtime has none)


@dataclass(frozen=True)
class TypeCompute:
    """One GPU type's sustained rates: an efficiency per profiled micro-batch, or the shared
    one."""

    gpu: str
    source: str  # "peak" or "profile: <model> (<file>)"
    efficiency_by_mbs: dict[int, float] = field(default_factory=dict)

    def efficiency(self, mbs: int) -> float:
        if not self.efficiency_by_mbs:
            return SHARED_EFFICIENCY
        near = min(self.efficiency_by_mbs, key=lambda b: (abs(math.log(b / mbs)), -b))
        return self.efficiency_by_mbs[near]

    def flops(self, mbs: int) -> float:
        """Sustained FLOP/s at micro-batch ``mbs``."""
        return get_gpu(self.gpu).peak_flops * self.efficiency(mbs)

    def row(self) -> dict:
        eff = self.efficiency_by_mbs or {0: SHARED_EFFICIENCY}
        return {
            "gpu": self.gpu,
            "peak_tflops": get_gpu(self.gpu).peak_flops / 1e12,
            "compute_source": self.source,
            "efficiency_by_mbs": {str(k): round(v, 4) for k, v in sorted(eff.items())},
        }


@dataclass(frozen=True)
class ComputeModel:
    """Per-layer seconds of ``model`` on each GPU type."""

    model: GPTConfig
    types: dict[str, TypeCompute]

    def rate(self, gpu: str, mbs: int) -> float:
        return self.types[gpu].flops(mbs)

    def optimizer_s_per_param(self, gpu: str) -> float:
        """Seconds of a mixed-precision Adam step per parameter (memory-bound, hardware.py)."""
        return 8.0 * ADAM_BYTES_PER_PARAM / get_gpu(gpu).hbm_bandwidth_bps

    def rows(self) -> list[dict]:
        return [self.types[g].row() for g in sorted(self.types)]


def _profile_efficiencies(folder: Path, model: GPTConfig) -> dict[str, tuple[str, dict]]:
    """{project GPU type: (source, {mbs: efficiency})} from a Sailor-format folder."""
    from system.external.sailor.gpus import SAILOR_GPUS
    from system.external.sailor.profile import load_profiles, load_training_config

    shapes = {}
    for cfg in sorted(folder.glob("training_config_*.json")):
        shape = load_training_config(cfg)
        shapes[shape.name] = shape
    profiles = load_profiles(folder / "profiles_tmp.json")
    out: dict[str, tuple[str, dict]] = {}
    fp32: set[str] = set()
    for sailor, project in SAILOR_GPUS.items():  # listed order: A100-40 before A100-80
        if project in out:
            continue
        gpu = get_gpu(project)
        candidates = []
        for name, sh in shapes.items():
            rows = {
                mbs: t
                for (m, g, mbs, tp), t in profiles.rows.items()
                if m == name and g == sailor and tp == PROFILE_TP and t.num_layers > 2
            }
            eff = {}
            for mbs, t in rows.items():
                s, h = sh.seq_length, sh.hidden_size
                fwd = (24.0 * s * h * h + 4.0 * s * s * h) * mbs
                took = float(t.fwd_s[1:-1].mean() + t.bwd_s[1:-1].mean())
                rate = 3.0 * fwd / took if took > 0 else 0.0
                if gpu.fp32_flops is not None and rate <= gpu.fp32_flops:
                    fp32.add(project)  # measured without tensor cores (module docstring)
                    continue
                eff[mbs] = min(1.0, rate / gpu.peak_flops)
            if eff:
                candidates.append(
                    (abs(sh.hidden_size - model.hidden_size), -sh.hidden_size, name, eff)
                )
        if candidates:
            _, _, name, eff = min(candidates, key=lambda c: (c[0], c[1]))
            out[project] = (f"profile: {name} ({sailor}, tp {PROFILE_TP})", eff)
    for project in fp32 - set(out):
        out[project] = (f"peak x {SHARED_EFFICIENCY:.2f} (its profiles are FP32)", {})
    return out


def compute_model(
    model: GPTConfig, gpus: set[str] | list[str], profiles: str | Path | None = None
) -> ComputeModel:
    """The compute model of ``gpus`` for ``model``: profiles from the Sailor-format folder
    ``profiles`` where it has a usable row for the type, else the shared efficiency."""
    found = {} if profiles is None else _profile_efficiencies(Path(profiles), model)
    types = {}
    for g in sorted(set(gpus)):
        get_gpu(g)
        if g in found:
            types[g] = TypeCompute(g, found[g][0], dict(found[g][1]))
        else:
            types[g] = TypeCompute(g, f"peak x {SHARED_EFFICIENCY:.2f}")
    return ComputeModel(model=model, types=types)
