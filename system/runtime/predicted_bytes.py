"""The bytes the simulator predicts for each iteration of one run of the runtime.

:func:`system.simulator.compressed_traffic.iteration_bytes` counts a step's messages from the
options and the model's shapes; for AQ-SGD it also needs which samples each boundary has seen,
which depends on the run's data order. :func:`predicted_iteration_bytes` supplies that from the
spec's data (the same ``sample_ids`` the workers use) and the CPU runtime's fp32 wire format, so
a run's counted bytes (``pipe_bytes``, ``dp_bytes`` in its metrics) can be set beside the
prediction.
"""

from __future__ import annotations

from dataclasses import replace

from system.runtime.data import make_data, micro_samples
from system.runtime.spec import RunSpec
from system.simulator.compressed_traffic import aq_sgd_new_rows, iteration_bytes

__all__ = ["predicted_iteration_bytes"]


def predicted_iteration_bytes(spec: RunSpec) -> tuple[list[float], list[float]]:
    """Per iteration of ``spec``: (pipeline bytes, data-parallel bytes) over all ranks."""
    options = spec.compression
    new_rows = None
    if options.pipe.method == "aq_sgd":
        data = make_data(spec)
        per_replica = [
            aq_sgd_new_rows(
                micro_samples(
                    data.sample_ids(it),
                    dp=spec.dp,
                    replica=r,
                    micro_batch_size=spec.micro_batch_size,
                )
                for it in range(spec.iters)
            )
            for r in range(spec.dp)
        ]
        new_rows = [[per_replica[r][it] for r in range(spec.dp)] for it in range(spec.iters)]
    wl = spec.workload()
    wire = 2 if spec.amp else 4  # fp16 with amp, else fp32, as the runtime sends them
    wl = replace(wl, activation_bytes=wire, gradient_bytes=4)
    pipe, dp = [], []
    for it in range(spec.iters):
        b = iteration_bytes(
            wl,
            spec.pp,
            spec.dp,
            options,
            dp_mode=spec.dp_mode,
            new_rows=None if new_rows is None else new_rows[it],
            outer_step=options.local.active and (it + 1) % options.local.inner_steps == 0,
        )
        pipe.append(b["pipe_bytes"])
        dp.append(b["dp_bytes"])
    return pipe, dp
