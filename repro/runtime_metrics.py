"""Per-stage compute measured by a runtime run, in the simulator's terms.

Used where a run's own compute is fed to the simulator (``mode=emulate``'s diagnostic, the
validation driver, the two-host test), so that only communication is predicted there.
"""

from __future__ import annotations

import numpy as np

__all__ = ["measured_compute"]


def measured_compute(metrics: dict, pp: int, warmup: int):
    """Per-stage medians (over ranks of the stage and iterations after the ``warmup`` ones) of the
    runtime's forward/backward micro-batch spans and optimizer step."""
    from system.simulator import StageCompute

    stage_of = np.asarray(metrics["stage_of_rank"])
    pr = metrics["per_rank"]
    out = {}
    for key, field in (("fwd_s", "fwd_mb_s"), ("bwd_s", "bwd_mb_s"), ("opt_s", "optim_s")):
        arr = np.asarray(pr[field])  # [rank][iteration]
        arr = arr[:, warmup:] if arr.shape[1] > warmup else arr[:, -1:]
        out[key] = [float(np.median(arr[stage_of == s])) for s in range(pp)]
    return StageCompute(**out)
