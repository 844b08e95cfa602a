"""A fast surrogate of one training iteration's time for heterogeneous GPUs (``iteration_time``).

The paper's objective (TOTAL = DATAP + 2·PIPELINEP, §3) counts communication only. With GPUs of
different speeds the slowest device of each stage sets its pace, and layers can be split unevenly
so that faster stages hold more of them. For a partition into ``pp`` groups this module computes

    iteration_time ≈ (m + pp − 1) · max_g t_g  +  TOTAL

- ``t_g = layers_g · layer_flops / v_g``: compute of one micro-batch (forward, backward and
  recomputation: 4× the forward FLOPs 24·s·h² + 4·s²·h per sequence and layer, Narayanan et al.
  SC'21) on group g, whose speed ``v_g`` is its slowest device's peak × :data:`ACHIEVABLE`;
- ``layers_g``: the split of the model's layers that minimises ``max_g t_g`` subject to each group's
  memory (:func:`split_layers`, water-filling: optimal for a min–max of linear terms);
- ``(m + pp − 1)``: the pipeline with ``m`` micro-batches per replica and its fill/drain bubble
  (GPipe / 1F1B, Huang et al. 2019; Narayanan et al. 2021);
- TOTAL: the paper's communication cost (:mod:`system.cost.partition`), charged in full (no
  overlap assumed, an upper estimate of its exposed part).

Memory per layer: 16 B per parameter for mixed-precision Adam (fp16 weights and gradients, fp32
master weights and two moments; Rajbhandari et al., ZeRO, SC'20) plus the checkpointed layer
input of every micro-batch in flight (s·h·b fp16 values). The event simulator
(:mod:`system.simulator`) confirms the plans this surrogate chooses.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from system.cluster import Cluster
from system.cost.partition import MAX_GROUP_CACHE, BoundedCache, Group, PartitionEvaluator
from system.workload import TaskletSizes, Workload

__all__ = ["ACHIEVABLE", "ComputeModel", "split_layers", "IterationTimeEvaluator"]

ACHIEVABLE = 0.30  # sustained / peak FLOP/s, one value for every GPU type (V100 calibration,
# Megatron-LM: 39 of 125 TFLOPS)
ADAM_BYTES_PER_PARAM = 16.0  # ZeRO (Rajbhandari et al. 2020), mixed-precision Adam
MEMORY_HEADROOM = 0.9  # share of a GPU's memory the model states and activations may use


@dataclass(frozen=True, slots=True)
class ComputeModel:
    """Per-layer compute and memory of a workload on a ``pp × dp`` layout."""

    num_layers: int
    layer_flops: float  # forward + backward + recomputation FLOPs of one layer, one micro-batch
    layer_bytes: float  # memory one layer needs on its device
    micro_batches: int  # per replica per iteration

    @classmethod
    def of(cls, workload: Workload, pp: int, dp: int) -> ComputeModel:
        m = workload.model
        b, s, h = workload.micro_batch_size, m.seq_length, m.hidden_size
        fwd = b * (24.0 * s * h * h + 4.0 * s * s * h)
        mb = workload.micro_batches(dp)
        in_flight = min(mb, pp)  # 1F1B keeps at most pp micro-batches in flight per stage
        layer_bytes = ADAM_BYTES_PER_PARAM * m.params_per_layer + in_flight * b * s * h * 2.0
        return cls(
            num_layers=m.num_layers,
            layer_flops=4.0 * fwd,
            layer_bytes=layer_bytes,
            micro_batches=mb,
        )


def split_layers(
    speeds_flops: Sequence[float],
    caps: Sequence[int],
    num_layers: int,
) -> np.ndarray | None:
    """Layers per group minimising max_g layers_g / speed_g with layers_g <= caps[g].

    Each layer goes to the group whose time after taking it is smallest (a heap): for a
    min–max of terms linear in the layer count this greedy is optimal. Returns None when the
    groups' memory cannot hold ``num_layers`` layers; every group gets at least one layer.
    """
    v = np.asarray(speeds_flops, dtype=float)
    cap = np.asarray(caps, dtype=np.int64)
    k = len(v)
    if num_layers < k or np.any(cap < 1) or cap.sum() < num_layers:
        return None
    layers = np.ones(k, dtype=np.int64)
    heap = [(2.0 / v[g], g) for g in range(k) if cap[g] > 1]
    heapq.heapify(heap)
    for _ in range(num_layers - k):
        _, g = heapq.heappop(heap)
        layers[g] += 1
        if layers[g] < cap[g]:
            heapq.heappush(heap, ((layers[g] + 1) / v[g], g))
    return layers


class IterationTimeEvaluator(PartitionEvaluator):
    """:class:`PartitionEvaluator` whose totals are the iteration-time surrogate (seconds).

    ``assume_homogeneous=True`` prices every device as the cluster's fastest GPU type with
    unlimited memory: the plan a scheduler blind to GPU types would make (then the compute term
    is the same for every partition, and the search optimises TOTAL alone).
    """

    def __init__(
        self,
        cluster: Cluster,
        sizes: TaskletSizes,
        *,
        pp: int,
        dp: int,
        workload: Workload,
        assume_homogeneous: bool = False,
    ) -> None:
        super().__init__(cluster, sizes, pp=pp, dp=dp)
        self.compute = ComputeModel.of(workload, pp, dp)
        speed = cluster.peak_flops() * ACHIEVABLE
        memory = cluster.memory_bytes()
        if assume_homogeneous:
            speed = np.full_like(speed, speed.max())
            memory = np.full_like(memory, np.inf)
        self.device_speed = speed
        self.device_memory = memory
        self._compute_cache: dict[tuple[bytes, bytes], float] = BoundedCache(MAX_GROUP_CACHE)

    def _group_terms(self, partitions: Sequence[Sequence[Group]]) -> tuple[np.ndarray, np.ndarray]:
        """(K, pp) speed of each group's slowest device and its memory cap in layers."""
        g = np.array([list(p) for p in partitions], dtype=np.int64)  # (K, pp, dp)
        v = self.device_speed[g].min(axis=2)
        mem = self.device_memory[g].min(axis=2)
        with np.errstate(invalid="ignore", over="ignore"):
            caps = np.floor(np.minimum(MEMORY_HEADROOM * mem / self.compute.layer_bytes, 1e9))
        return v, caps.astype(np.int64)

    def layers(self, partition: Sequence[Group]) -> np.ndarray | None:
        """Layers per group (partition order), or None if the model does not fit."""
        v, caps = self._group_terms([partition])
        return split_layers(v[0], caps[0], self.compute.num_layers)

    def compute_s(self, partition: Sequence[Group]) -> float:
        """(m + pp − 1) · slowest stage's micro-batch time; inf when the model does not fit."""
        return float(self.compute_values([partition])[0])

    def compute_values(self, partitions: Sequence[Sequence[Group]]) -> np.ndarray:
        """:meth:`compute_s` of many partitions.

        The compute term depends only on the multiset of (speed, memory cap) pairs of the groups:
        with a few GPU types only a few such multisets occur, so the layer split is solved once
        per multiset and cached.
        """
        if not partitions:
            return np.zeros(0)
        v, caps = self._group_terms(partitions)
        out = np.empty(len(partitions))
        bubble = self.compute.micro_batches + self.pp - 1
        for k in range(len(partitions)):
            order = np.lexsort((caps[k], v[k]))
            key = (v[k][order].tobytes(), caps[k][order].tobytes())
            got = self._compute_cache.get(key)
            if got is None:
                layers = split_layers(v[k][order], caps[k][order], self.compute.num_layers)
                if layers is None:
                    got = float("inf")
                else:
                    t = layers * self.compute.layer_flops / v[k][order]
                    got = float(bubble * t.max())
                self._compute_cache[key] = got
            out[k] = got
        return out

    def _extra(self, partitions: Sequence[Sequence[Group]]) -> np.ndarray:
        """The compute term, added to TOTAL by the base class's batched, pruned costing."""
        return self.compute_values(partitions)
