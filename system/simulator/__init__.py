"""Performance simulator for ours, Megatron and DeepSpeed on the paper's network cases (§4).

Pure Python + NumPy (no torch). Entry points:

- :func:`simulate_ours` — our runtime on any (cluster, assignment, workload), with the V100
  compute model or measured :class:`StageCompute` times;
- :func:`simulate_1f1b_ring` — 1F1B pipelines + the DP all-reduce the framework would run
  (Megatron, DeepSpeed pipe+ZeRO-1); the baselines' grid search lives in ``baselines/``;
- :func:`replay` / :func:`replay_end_s` — the event replay of a pipeline from an op-order
  program (:mod:`system.simulator.replay`); the frameworks' programs live in ``baselines/``.

Links are shared as the cluster's link-sharing model says (:mod:`system.simulator.sharing`)
and a transfer takes α + 8·X/β (:mod:`system.simulator.transfers`); the collectives (ring,
sharded parameter server, double binary tree, two-level) and the choice between them — NCCL's
own, from its tuner re-implemented in :mod:`system.simulator.nccl_tuner`, or the fastest under
the link model — are in :mod:`system.simulator.collectives`.
"""

from system.simulator.baseline_training import rank_grid, simulate_1f1b_ring
from system.simulator.hardware import V100, Hardware, StageCompute, stage_compute
from system.simulator.ours import simulate_ours
from system.simulator.replay import (
    Key,
    Msg,
    Op,
    ProgramFn,
    gpipe_blocking_program,
    register_program,
    replay,
    replay_end_s,
)
from system.simulator.result import SimResult

__all__ = [
    "SimResult",
    "StageCompute",
    "Hardware",
    "V100",
    "stage_compute",
    "simulate_ours",
    "simulate_1f1b_ring",
    "rank_grid",
    "Key",
    "Msg",
    "Op",
    "ProgramFn",
    "gpipe_blocking_program",
    "register_program",
    "replay",
    "replay_end_s",
]
