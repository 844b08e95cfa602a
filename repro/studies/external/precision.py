"""In which precision were Sailor's V100 profiles measured, and what efficiency do they show?

For every V100 profile row: the transformer layer's FLOPs per GPU, (24·s·h² + 4·s²·h)·mbs/tp
forward and twice that backward (Narayanan et al., SC'21), over its measured forward + backward
time is the rate it reached; beside it, that rate as a fraction of the V100's plain FP32 peak
(15.7 TFLOPS) and of its FP16 tensor-core peak (125 TFLOPS) (NVIDIA's V100 datasheet), and the
ratio of the measured time to the project's V100 compute model at the same shape
(:mod:`system.simulator.hardware`: 30% of 125 TFLOPS; forward + backward, no recomputation, like
the profile).

How to read it: a rate can exceed the FP32 peak only with tensor cores, and FP16 GEMMs of these
sizes run several times faster than FP32 ones. What the rows show, with the configuration
evidence, is in ``results/external/sailor/PRECISION.md``.
"""

from __future__ import annotations

import pandas as pd

from system.external.sailor.framework import SailorInputs
from system.gpus import get_gpu
from system.simulator.hardware import V100

__all__ = ["layer_rates", "efficiency_by_micro_batch"]


def layer_rates(
    inputs: SailorInputs, gpu: str = "V100-16", project_gpu: str = "V100"
) -> pd.DataFrame:
    """One row per (model, mbs, tp) profile of ``gpu``: rates, fractions of peak, and the ratio
    of the measured transformer-layer time to the project's model of it."""
    peak32 = get_gpu(project_gpu).fp32_flops
    peak16 = get_gpu(project_gpu).peak_flops
    out = []
    for (model, g, mbs, tp), t in sorted(inputs.profiles.rows.items()):
        if g != gpu or model not in inputs.shapes:
            continue
        sh = inputs.shapes[model]
        s, h = sh.seq_length, sh.hidden_size
        fwd_flops = (24.0 * s * h * h + 4.0 * s * s * h) * mbs / tp
        f = float(t.fwd_s[1:-1].mean())
        b = float(t.bwd_s[1:-1].mean())
        rate = 3.0 * fwd_flops / (f + b)
        out.append(
            {
                "model": model,
                "mbs": mbs,
                "tp": tp,
                "layer_fwd_bwd_ms": 1e3 * (f + b),
                "tflops_per_gpu": rate / 1e12,
                "fraction_of_fp32_peak": rate / peak32,
                "fraction_of_fp16_tensor_peak": rate / peak16,
                "project_model_ms": 1e3 * 3.0 * fwd_flops / V100.flops,
                "measured_over_project": (f + b) / (3.0 * fwd_flops / V100.flops),
            }
        )
    return pd.DataFrame(out)


def efficiency_by_micro_batch(rates: pd.DataFrame, tp: int = 1) -> pd.DataFrame:
    """Fraction of FP32 peak per model and micro-batch size at ``tp`` (no TP collectives), and
    each micro-batch size's efficiency relative to the model's micro-batch-1 row."""
    r = rates[rates["tp"] == tp].copy()
    base = r[r["mbs"] == 1].set_index("model")["fraction_of_fp32_peak"]
    r["relative_to_mbs1"] = r["fraction_of_fp32_peak"] / r["model"].map(base)
    return r[
        [
            "model",
            "mbs",
            "fraction_of_fp32_peak",
            "fraction_of_fp16_tensor_peak",
            "relative_to_mbs1",
        ]
    ].reset_index(drop=True)
