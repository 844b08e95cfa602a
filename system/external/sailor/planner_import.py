"""Importer of Sailor's planner studies: the plan Sailor's planner chose at each point of a GPU
availability trace, with what Sailor's own simulator said of it, in the project's forms.

A study file (JSON, one per trace and model, written by the driver in
``results/planner/sailor/COMMANDS.md``) holds ``model`` (Sailor's name: ``OPT-350``,
``GPT-Neo-2.7``), ``trace`` (the trace file's name) and ``points``: per trace point ``point``,
``duration_s``, ``gpus`` ({``GPU_zone``: count}), ``search_time_s`` (the planner call's wall
time), ``planner_init_s`` (building the planner's tables, paid once per study), and ``chosen``:
``plan`` (Sailor's plan format: ``pipeline_list``, ``mbs``, ``gbs``), ``planner_iter_time_s``
(the planner's own estimate) and ``sailor_sim`` (Sailor's simulator: ``fits``, ``iter_time_s``,
``compute_usd_per_iter``, ``comm_usd_per_iter``, ``usd_per_iter``); ``chosen`` is null where no
plan fits.

:func:`load_study` checks a study file and returns a :class:`SailorStudy`;
:func:`plan_config` turns a point's plan into a ``plan_config`` document that
:func:`~system.external.sailor.plan.load_plan` reads (the form of Sailor's validation plans:
``N`` = stages × replicas); :func:`write_plans` writes them where
:func:`~system.external.sailor.predict.model_of` finds the model (``<study>/<MODEL>/``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from system.external.sailor.errors import SailorFormatError, number, positive_int, read_json
from system.results import atomic_write_text

__all__ = [
    "StudyPoint",
    "SailorStudy",
    "load_study",
    "plan_config",
    "write_plans",
    "MODEL_DIRS",
    "parse_gpus_key",
]

# Sailor's model name -> the folder name :func:`system.external.sailor.predict.model_of` reads
MODEL_DIRS = {"OPT-350": "OPT-350", "GPT-Neo-2.7": "GPT-NEO"}
_KEY = re.compile(r"([A-Za-z0-9.]+(?:-[A-Za-z0-9.]+)*)_([a-z0-9]+(?:-[a-z0-9]+)*)")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
SIM_FIELDS = ("iter_time_s", "compute_usd_per_iter", "comm_usd_per_iter", "usd_per_iter")


@dataclass(frozen=True, slots=True)
class StudyPoint:
    """One trace point: the GPUs on offer, Sailor's chosen plan (None: nothing fits) and what
    Sailor's planner and simulator said of it."""

    point: int
    duration_s: float
    gpus: dict[tuple[str, str], int]  # (Sailor GPU name, zone) -> count
    search_time_s: float
    planner_init_s: float
    plan: dict | None
    planner_iter_time_s: float | None
    sailor_sim: dict[str, float] | None

    @property
    def gpus_offered(self) -> int:
        return sum(self.gpus.values())


@dataclass(frozen=True, slots=True)
class SailorStudy:
    file: str
    model: str
    trace: str
    points: tuple[StudyPoint, ...]


def parse_gpus_key(key, file, field: str) -> tuple[str, str]:
    """``"A100-40_us-central1-a"`` -> ``("A100-40", "us-central1-a")``."""
    m = _KEY.fullmatch(key) if isinstance(key, str) else None
    if m is None:
        raise SailorFormatError(
            file, field, f"expected GPU_zone (e.g. A100-40_us-west1-b), got {key!r}"
        )
    return m.group(1), m.group(2)


def load_study(path) -> SailorStudy:
    """Read and check one study file (module docstring); SailorFormatError names the field."""
    f = str(path)
    d = read_json(path)
    model = d.get("model")
    if model not in MODEL_DIRS:
        raise SailorFormatError(
            f, "model", f"expected one of {', '.join(MODEL_DIRS)}, got {model!r}"
        )
    trace = d.get("trace")
    if not isinstance(trace, str) or not _NAME.fullmatch(trace):
        raise SailorFormatError(f, "trace", f"expected a trace file name, got {trace!r}")
    raw = d.get("points")
    if not isinstance(raw, list) or not raw:
        raise SailorFormatError(f, "points", "expected a non-empty list of trace points")
    points = []
    for i, p in enumerate(raw):
        w = f"points[{i}]."
        if not isinstance(p, dict):
            raise SailorFormatError(f, f"points[{i}]", "expected an object")
        gpus_raw = p.get("gpus")
        if not isinstance(gpus_raw, dict) or not gpus_raw:
            raise SailorFormatError(f, w + "gpus", "expected {GPU_zone: count}")
        gpus = {}
        for k, v in gpus_raw.items():
            gpus[parse_gpus_key(k, f, w + "gpus")] = int(number(v, f, f"{w}gpus[{k}]"))
        chosen = p.get("chosen")
        plan = est = sim = None
        if chosen is not None:
            if not isinstance(chosen, dict) or not isinstance(chosen.get("plan"), dict):
                raise SailorFormatError(
                    f, w + "chosen", "expected {plan, planner_iter_time_s, sailor_sim}"
                )
            plan = chosen["plan"]
            est = number(chosen.get("planner_iter_time_s"), f, w + "chosen.planner_iter_time_s")
            s = chosen.get("sailor_sim")
            if not isinstance(s, dict):
                raise SailorFormatError(f, w + "chosen.sailor_sim", "expected an object")
            sim = {k: number(s.get(k), f, f"{w}chosen.sailor_sim.{k}") for k in SIM_FIELDS}
        points.append(
            StudyPoint(
                point=int(number(p.get("point"), f, w + "point")),
                duration_s=number(p.get("duration_s"), f, w + "duration_s"),
                gpus=gpus,
                search_time_s=number(p.get("search_time_s"), f, w + "search_time_s"),
                planner_init_s=number(p.get("planner_init_s"), f, w + "planner_init_s"),
                plan=plan,
                planner_iter_time_s=est,
                sailor_sim=sim,
            )
        )
    if [p.point for p in points] != list(range(len(points))):
        raise SailorFormatError(f, "points", "points must be numbered 0, 1, ... in order")
    return SailorStudy(f, model, trace, tuple(points))


def plan_config(plan: dict, file, field: str) -> dict:
    """A point's plan as a ``plan_config`` document: ``pipeline_list``, ``mbs``, ``gbs`` and
    ``N`` (one node per stage replica, as Sailor's planner places a replica on one node)."""
    pipes = plan.get("pipeline_list")
    if not isinstance(pipes, list) or len(pipes) != 1 or not isinstance(pipes[0], dict):
        raise SailorFormatError(file, field + ".pipeline_list", "expected one pipeline description")
    tmp = pipes[0].get("tmp_per_stage")
    if not isinstance(tmp, list) or not tmp or not all(isinstance(s, list) for s in tmp):
        raise SailorFormatError(file, field + ".pipeline_list[0].tmp_per_stage", "expected stages")
    return {
        "pipeline_list": pipes,
        "mbs": positive_int(plan.get("mbs"), file, field + ".mbs"),
        "gbs": positive_int(plan.get("gbs"), file, field + ".gbs"),
        "N": sum(len(s) for s in tmp),
    }


def write_plans(study: SailorStudy, root, name: str) -> list[Path]:
    """Each point's chosen plan as ``root/<name>/<MODEL>/plan_config_<name>_p<k>.json``
    (atomic writes); points without a plan write nothing."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"study name {name!r}: expected letters, digits, '_', '.', '-'")
    folder = Path(root) / name / MODEL_DIRS[study.model]
    out = []
    for p in study.points:
        if p.plan is None:
            continue
        doc = plan_config(p.plan, study.file, f"points[{p.point}].chosen.plan")
        path = folder / f"plan_config_{name}_p{p.point}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(doc, indent=1) + "\n")
        out.append(path)
    return out
