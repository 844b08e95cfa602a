"""Importer of Sailor's plan files into the project's objects.

A plan (``plan_config_*.json``; README of the shared data for the format) describes one run:
``pipeline_list[0]`` holds ``num_stages``, ``layers_per_stage`` (layer ids; 0 the embedding,
1..L−2 the transformer blocks, L−1 the final norm + head + loss), ``dp`` per stage and
``tmp_per_stage``: per stage one entry per data-parallel replica, ``[[[gpu, gpus_per_node,
zone]], tp]`` — each replica of a stage is one node whose ``tp`` GPUs form its tensor-parallel
group. Also ``mbs``, ``gbs``, ``N`` (nodes) and, for measured runs, ``real`` (seconds per
iteration) and ``max_mem`` (bytes).

:func:`load_plan` checks the file against the model it trains and returns a :class:`SailorPlan`:
``stages`` (:class:`Stage`: layers and :class:`Replica` per data-parallel index), the micro-
batches per replica (m = ⌈gbs / (mbs·dp)⌉), the cluster's nodes in stage-major order
(:meth:`SailorPlan.nodes`), the project's :class:`~system.assignment.Assignment` of those nodes
(:meth:`SailorPlan.assignment`) and the warnings found (:class:`Finding`). A layer listed twice
while another is missing is a warning when the two layers' profiles are identical (the time
does not change) and an error otherwise (:class:`LayerMismatch`: the plan does not describe a
run of its model); an unknown GPU type, a non-numeric field or a measurement outside its physical
range (``real`` and ``red_grads`` in (0, :data:`MAX_ITER_S`], ``max_mem`` in (0,
:data:`MAX_GPU_MEMORY_BYTES`]) is an error. :func:`plan_files` lists the plans of a folder,
refusing one whose path leads out of it or is not a plain name (:data:`PLAN_PATH`: it names the
plan in the tables and the report).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from system.assignment import Assignment
from system.external.sailor.bandwidth import NodeSpec
from system.external.sailor.errors import (
    Finding,
    SailorFormatError,
    inside,
    number,
    positive_int,
    read_json,
)
from system.external.sailor.gpus import project_gpu

__all__ = [
    "Replica",
    "Stage",
    "SailorPlan",
    "LayerMismatch",
    "load_plan",
    "plan_files",
    "MAX_PLAN_BYTES",
    "PLAN_PATH",
    "MAX_ITER_S",
    "MAX_GPU_MEMORY_BYTES",
]

# A plan's path under the plans folder names it in the tables and the report: plain names only.
PLAN_PATH = re.compile(r"[A-Za-z0-9_.+-]+(/[A-Za-z0-9_.+-]+)*")
MAX_PLAN_BYTES = 2**20  # a plan of 64 nodes and 34 layers is 10 kB
# Physical ranges of a plan's measurements: a training iteration longer than a day, or a GPU
# with more than 1 TiB of memory, is not a run any cluster of Sailor's set made.
MAX_ITER_S = 86_400.0
MAX_GPU_MEMORY_BYTES = float(2**40)


class LayerMismatch(SailorFormatError):
    """A well-formed plan whose layer list does not make up its model: it does not describe the
    run (kept as an excluded plan, with this reason)."""


@dataclass(frozen=True, slots=True)
class Replica:
    """One data-parallel replica of a stage: a node of ``gpus`` GPUs of type ``gpu`` (Sailor's
    name), ``tp`` of them in the stage's tensor-parallel group."""

    gpu: str
    gpus: int
    zone: str
    tp: int

    @property
    def node(self) -> NodeSpec:
        return NodeSpec(self.zone, self.gpu, self.gpus)


@dataclass(frozen=True, slots=True)
class Stage:
    layers: tuple[int, ...]
    replicas: tuple[Replica, ...]

    @property
    def dp(self) -> int:
        return len(self.replicas)


@dataclass(frozen=True, slots=True)
class SailorPlan:
    file: str
    model: str  # Sailor's model name, e.g. "OPT-350"
    stages: tuple[Stage, ...]
    mbs: int
    gbs: int
    nodes_declared: int
    real_s: float | None
    max_mem_bytes: float | None
    findings: tuple[Finding, ...] = field(default=())

    @property
    def pp(self) -> int:
        return len(self.stages)

    @property
    def dp(self) -> int:
        return self.stages[0].dp

    @property
    def micro_batches(self) -> int:
        """Micro-batches per replica per iteration, ⌈gbs / (mbs·dp)⌉."""
        return math.ceil(self.gbs / (self.mbs * self.dp))

    def nodes(self) -> list[NodeSpec]:
        """One node per (stage, replica), stage-major: node ``s·dp + r``."""
        return [r.node for st in self.stages for r in st.replicas]

    def assignment(self) -> Assignment:
        """The project's layout of the nodes: ``stages[s][r]`` = node ``s·dp + r``."""
        return Assignment.from_stages(np.arange(self.pp * self.dp).reshape(self.pp, self.dp))


def _get(d: dict, key: str, file, where: str = ""):
    if not isinstance(d, dict) or key not in d:
        raise SailorFormatError(file, f"{where}{key}", "missing")
    return d[key]


def load_plan(
    path,
    model: str,
    num_layers: int,
    same_layer_time: Callable[[int, int], bool] | None = None,
    *,
    fields: Collection[str] | None = None,
    mixed_tp: bool = False,
) -> SailorPlan:
    """Read and check one plan of ``model`` (which has ``num_layers`` layers in all).

    ``same_layer_time(a, b)``: whether layers a and b have identical profiled times (lets a
    layer listed twice stand in for a missing one, with a warning); None: that is an error.
    ``fields``: the only top-level fields read (the rest dropped as the file is parsed, before
    anything looks at them); None: all. ``mixed_tp``: replicas of one stage may differ in tp
    (Sailor's planner makes such plans); otherwise that is an error.
    """
    f = str(path)
    d = read_json(path, max_bytes=MAX_PLAN_BYTES)
    if fields is not None:
        d = {k: v for k, v in d.items() if k in fields}
    pipes = _get(d, "pipeline_list", f)
    if not isinstance(pipes, list) or len(pipes) != 1:
        raise SailorFormatError(f, "pipeline_list", "expected exactly one pipeline description")
    pl = pipes[0]
    where = "pipeline_list[0]."
    pp = positive_int(_get(pl, "num_stages", f, where), f, where + "num_stages")
    layers = _get(pl, "layers_per_stage", f, where)
    tmp = _get(pl, "tmp_per_stage", f, where)
    dps = _get(pl, "dp", f, where)
    for name, v in (("layers_per_stage", layers), ("tmp_per_stage", tmp), ("dp", dps)):
        if not isinstance(v, list) or len(v) != pp:
            raise SailorFormatError(f, where + name, f"expected {pp} entries (num_stages)")
    stages, findings = [], []
    for s in range(pp):
        ls = layers[s]
        if not isinstance(ls, list) or not ls:
            raise SailorFormatError(f, f"{where}layers_per_stage[{s}]", "expected layer ids")
        ids = tuple(_layer_id(x, f, f"{where}layers_per_stage[{s}][{i}]") for i, x in enumerate(ls))
        dp = positive_int(dps[s], f, f"{where}dp[{s}]")
        reps = tmp[s]
        if not isinstance(reps, list) or len(reps) != dp:
            raise SailorFormatError(f, f"{where}tmp_per_stage[{s}]", f"expected {dp} replicas (dp)")
        replicas = []
        for r, rep in enumerate(reps):
            w = f"{where}tmp_per_stage[{s}][{r}]"
            if not (isinstance(rep, list) and len(rep) == 2 and isinstance(rep[0], list)):
                raise SailorFormatError(f, w, "expected [[[gpu, gpus_per_node, zone]], tp]")
            if len(rep[0]) != 1 or not isinstance(rep[0][0], list) or len(rep[0][0]) != 3:
                raise SailorFormatError(f, w + "[0]", "expected one [gpu, gpus_per_node, zone]")
            gpu, gpus, zone = rep[0][0]
            project_gpu(gpu, f, w + "[0][0][0]")
            gpus = positive_int(gpus, f, w + "[0][0][1]")
            if not isinstance(zone, str) or not zone:
                raise SailorFormatError(f, w + "[0][0][2]", f"expected a zone name, got {zone!r}")
            tp = positive_int(rep[1], f, w + "[1]")
            if tp > gpus:
                raise SailorFormatError(f, w + "[1]", f"tp={tp} exceeds the node's {gpus} GPUs")
            replicas.append(Replica(gpu, gpus, zone, tp))
        tps = {r.tp for r in replicas}
        if len(tps) != 1 and not mixed_tp:
            raise SailorFormatError(
                f, f"{where}tmp_per_stage[{s}]", f"replicas differ in tp: {sorted(tps)}"
            )
        stages.append(Stage(ids, tuple(replicas)))
    if len({st.dp for st in stages}) != 1:
        raise SailorFormatError(f, where + "dp", f"stages differ in dp: {dps}")
    # every other field before the layer list: a plan refused for its layers (kept as an
    # excluded row) is otherwise a valid plan
    real, mem, red = d.get("real"), d.get("max_mem"), d.get("red_grads")
    mbs = positive_int(_get(d, "mbs", f), f, "mbs")
    gbs = positive_int(_get(d, "gbs", f), f, "gbs")
    nodes = positive_int(_get(d, "N", f), f, "N")
    real_s = None if real is None else _measured(real, f, "real", MAX_ITER_S, "s")
    mem_bytes = None if mem is None else _measured(mem, f, "max_mem", MAX_GPU_MEMORY_BYTES)
    if red is not None:  # the logged gradient reduction, seconds
        _measured(red, f, "red_grads", MAX_ITER_S, "s")
    if nodes != pp * stages[0].dp:
        raise SailorFormatError(
            f, "N", f"{nodes} nodes declared, the stages use {pp * stages[0].dp}"
        )
    findings += _check_layers(f, stages, num_layers, same_layer_time)
    if real is not None and red is not None and red == real:
        findings.append(Finding(f, "red_grads", "equals real (a copied field; not used)"))
    return SailorPlan(
        file=f,
        model=model,
        stages=tuple(stages),
        mbs=mbs,
        gbs=gbs,
        nodes_declared=nodes,
        real_s=real_s,
        max_mem_bytes=mem_bytes,
        findings=tuple(findings),
    )


def _measured(value, f, field: str, most: float, unit: str = "") -> float:
    """A measurement: finite, > 0 and at most ``most``."""
    x = number(value, f, field, minimum=None)
    if not 0.0 < x <= most:
        raise SailorFormatError(
            f, field, f"{value!r} is outside the physical range (0, {most:g}{unit}]"
        )
    return x


def _check_layers(f, stages, num_layers: int, same) -> list[Finding]:
    """Layer ids must be a partition of 0..num_layers−1 in order; see :func:`load_plan`."""
    listed = [i for st in stages for i in st.layers]
    where = "pipeline_list[0].layers_per_stage"
    out_of_range = sorted({i for i in listed if i >= num_layers})
    if out_of_range or len(listed) != num_layers:
        raise LayerMismatch(
            f,
            where,
            f"the layer list ({len(listed)} ids, {min(listed)}..{max(listed)}) does not match "
            f"the model's {num_layers} layers",
        )
    counts = Counter(listed)
    twice = sorted(i for i, c in counts.items() if c > 1)
    missing = sorted(set(range(num_layers)) - set(counts))
    if not twice and not missing:
        if listed != sorted(listed):
            raise LayerMismatch(f, where, "layers are not in pipeline order")
        return []
    if (
        len(twice) == 1
        and len(missing) == 1
        and counts[twice[0]] == 2
        and same is not None
        and same(twice[0], missing[0])
    ):
        return [
            Finding(
                f,
                where,
                f"layer {twice[0]} is listed twice and layer {missing[0]} is missing; both have "
                f"identical profiles, so the duplicate is timed in the missing layer's place",
            )
        ]
    raise LayerMismatch(f, where, f"layers listed twice: {twice[:5]}, missing: {missing[:5]}")


def _layer_id(x, f, where: str) -> int:
    v = number(x, f, where, minimum=0.0)
    if v != int(v):
        raise SailorFormatError(f, where, f"expected a layer id, got {x!r}")
    return int(v)


def plan_files(root) -> list[Path]:
    """Every ``plan_config_*.json`` under ``root``, sorted by relative path; SailorFormatError for
    one that is a link leading out of ``root`` (its kind, a regular file, is checked on reading)."""
    r = Path(root)
    files = sorted(r.rglob("plan_config_*.json"), key=lambda p: p.relative_to(r).as_posix())
    for p in files:
        rel = p.relative_to(r).as_posix()
        if not PLAN_PATH.fullmatch(rel):  # shown as ascii(): it may hold a newline
            raise SailorFormatError(
                r, ascii(rel), f"a plan's path must be plain names ({PLAN_PATH.pattern})"
            )
        inside(p, r, "the plans folder")
    return files
