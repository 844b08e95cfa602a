"""``mode=sailor_planner``: Sailor's planner met on its own studies, each plan scored by two
judges.

Inputs (``results_dir`` holds them; ``COMMANDS.md`` there says how each was made):

- ``sailor_runs/<study>_<model>.json`` — Sailor's planner on one trace (its heterogeneous study
  ``het``: A100-40 + V100-16 in one zone; its geo study ``geo``: A100-40 in five zones), the plan
  it chose per trace point and what its own simulator said of it
  (:mod:`system.external.sailor.planner_import`);
- ``ours/<study>_<model>_p<k>.json`` — ``mode=plan``'s record on that point's fleet (optional);
- ``ours_sailor/<study>_<model>_p<k>.json`` — ``mode=plan framework=sailor``'s record (ours
  planning for Sailor's framework; its ``plan_config`` is the plan; optional);
- ``sailor_judge/<study>_<model>_ours.json`` and ``..._ours_sailor.json`` — Sailor's simulator on
  each of ours' plans in its format (optional; one entry per point, null where ours has none).

Writes, beside them: ``fleets/<study>_p<k>.json`` (each point's fleet as a topology file: one
device per GPU, hosts of ``gpus_per_host``, zone = region, links from Sailor's bandwidth fits),
``sailor_plans/``, ``ours_plans/`` and ``ours_sailor_plans/`` (every plan as a ``plan_config``
document), and
``table.csv``: per point and planner the iteration time and dollars per iteration under our
judge (:func:`system.external.sailor.framework.predict_plan`, the model of Sailor's framework on
the plan's own profiles and link fits) and under Sailor's simulator, and each planner's wall
time.

Dollars: GPU-hours at the GCP on-demand prices Sailor's study uses
(:data:`GCP_USD_PER_GPU_HOUR`) times the judge's iteration time; Sailor's judge adds its
cross-zone traffic charge.
"""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path

import pandas as pd

import baselines.deepspeed.schedule  # noqa: F401  (registers DeepSpeed's op order for the replay)
from system.external.sailor.bandwidth import (
    NodeSpec,
    load_bandwidth_fits,
    load_intra_node_fits,
)
from system.external.sailor.errors import read_json
from system.external.sailor.framework import replicas_fit
from system.external.sailor.gpus import project_gpu
from system.external.sailor.plan import load_plan
from system.external.sailor.planner_import import (
    MODEL_DIRS,
    SailorStudy,
    StudyPoint,
    load_study,
    write_plans,
)
from system.external.sailor.predict import load_inputs, predict_plans
from system.results import atomic_write, atomic_write_text

__all__ = [
    "GCP_USD_PER_GPU_HOUR",
    "fleet_devices",
    "fleet_document",
    "ours_plan_config",
    "run",
]

log = logging.getLogger("repro.sailor_planner")

# US dollars per GPU-hour, GCP on-demand (https://cloud.google.com/compute/gpus-pricing and the
# A2 machine types): the constants Sailor's planner study prices every plan with. Other types:
# no price (NaN dollars).
GCP_USD_PER_GPU_HOUR = {"A100-40": 3.673385, "V100-16": 2.859998}
_RUN = re.compile(r"(?P<study>[a-z]+)_(?P<model>OPT-350|GPT-Neo-2\.7)\.json")


def fleet_devices(point: StudyPoint, gpus_per_host: int) -> list[tuple[str, str, str]]:
    """(zone, Sailor GPU name, host) per device: zones in name order, then GPU types, hosts of
    ``gpus_per_host`` (a remainder is a smaller host)."""
    out = []
    for (gpu, zone), n in sorted(point.gpus.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        for i in range(n):
            out.append((zone, gpu, f"{zone}-{gpu}-{i // gpus_per_host}"))
    return out


def fleet_document(point: StudyPoint, name: str, data_dir, gpus_per_host: int = 4) -> dict:
    """The point's fleet as a topology file: per device ``{region: zone, gpu, host}``; per zone
    pair the slowest per-GPU peak of Sailor's fits between the GPU types there (one GPU per
    node sending), delay 0 ms (the fits carry the latency); inside a host the slowest type's
    intra-node fit at ``gpus_per_host`` GPUs, per GPU."""
    d = Path(data_dir)
    fits = load_bandwidth_fits(d / "multizone_bandwidths_het.json")
    intra = load_intra_node_fits(d / "intra_node_bandwidths.json")
    devices = fleet_devices(point, gpus_per_host)
    types = {}
    for zone, gpu, _ in devices:
        types.setdefault(zone, set()).add(gpu)
    zones = sorted(types)
    pairs = []
    for i, za in enumerate(zones):
        for zb in zones[i:]:
            gbps = min(
                c.peak_bps / c.flows / 1e9
                for ga in types[za]
                for gb in types[zb]
                for c in (
                    fits.curve(NodeSpec(za, ga, 1), NodeSpec(zb, gb, 1)),
                    fits.curve(NodeSpec(zb, gb, 1), NodeSpec(za, ga, 1)),
                )
            )
            pairs.append(
                {"region_a": za, "region_b": zb, "delay_ms": 0.0, "bandwidth_gbps": round(gbps, 4)}
            )
    host_gbps = min(
        intra[(g, gpus_per_host)].peak_bps / intra[(g, gpus_per_host)].flows / 1e9
        for g in {g for _, g, _ in devices}
    )
    return {
        "name": name,
        "devices": [
            {"region": z, "gpu": project_gpu(g, "fleet", "gpu"), "host": h} for z, g, h in devices
        ],
        "pairs": pairs,
        "intra_host_bandwidth_gbps": round(host_gbps, 2),
        "intra_host_delay_ms": 0.0,
    }


def ours_plan_config(record: dict, devices, gbs: int, where: str) -> dict:
    """``mode=plan``'s record as a ``plan_config`` document: stage ``s`` of replica ``r`` on one
    GPU (tp = 1) of its device's type and zone; the first stage also holds Sailor's layer 0 (the
    embedding), the last its final layer (norm, head and loss)."""
    try:
        stages = [[int(x) for x in row] for row in record["stages"]]
        counts = [int(x) for x in record["layers_per_stage"]]
        mbs = int(record["config"]["micro_batch_size"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where}: not a plan record ({e})") from None
    if len(counts) != len(stages) or min(counts) < 1:
        raise ValueError(f"{where}: layers_per_stage {counts} does not match {len(stages)} stages")
    layers, nxt = [], 1
    for s, c in enumerate(counts):
        ids = list(range(nxt, nxt + c))
        nxt += c
        if s == 0:
            ids = [0, *ids]
        if s == len(counts) - 1:
            ids.append(nxt)
        layers.append(ids)
    tmp = []
    for row in stages:
        if any(not 0 <= x < len(devices) for x in row):
            raise ValueError(f"{where}: a stage names a device outside the fleet's {len(devices)}")
        tmp.append([[[[devices[x][1], 1, devices[x][0]]], 1] for x in row])
    return {
        "pipeline_list": [
            {
                "num_stages": len(stages),
                "layers_per_stage": layers,
                "tmp_per_stage": tmp,
                "dp": [len(r) for r in stages],
            }
        ],
        "mbs": mbs,
        "gbs": gbs,
        "N": sum(len(r) for r in stages),
    }


def _fits(pred, path: Path, model: str, inputs) -> bool | None:
    """Whether ours' judge finds every stage replica's peak bytes within its own GPU's memory."""
    if pred is None:
        return None
    plan = load_plan(path, model, inputs.shapes[model].num_all_layers, mixed_tp=True)
    return replicas_fit(plan, inputs)


def _gpu_usd_per_s(plan: dict) -> float:
    total = 0.0
    for st in plan["pipeline_list"][0]["tmp_per_stage"]:
        for rep in st:
            total += rep[1] * GCP_USD_PER_GPU_HOUR.get(rep[0][0][0], math.nan) / 3600.0
    return total


def _json(path: Path, doc) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(doc, indent=1) + "\n")


def _studies(out: Path) -> list[tuple[str, SailorStudy]]:
    runs = sorted((out / "sailor_runs").glob("*.json"))
    if not runs:
        raise FileNotFoundError(f"{out / 'sailor_runs'}: no Sailor study files")
    found = []
    for f in runs:
        m = _RUN.fullmatch(f.name)
        if m is None:
            raise ValueError(f"{f}: expected <study>_<OPT-350|GPT-Neo-2.7>.json")
        found.append((m["study"], load_study(f)))
    return found


def _predicted(plans_dir: Path, data_dir) -> dict[str, object]:
    if not plans_dir.is_dir():
        return {}
    return {r.plan: r for r in predict_plans(plans_dir, data_dir, mixed_tp=True)}


def run(cfg) -> dict:
    out = Path(cfg.results_dir)
    studies = _studies(out)
    sailor_dir, ours_dir = out / "sailor_plans", out / "ours_plans"
    target_dir = out / "ours_sailor_plans"
    rows = []
    for name, study in studies:
        write_plans(study, sailor_dir, name)
        devices_of = {}
        for p in study.points:
            doc = fleet_document(p, f"{name}-p{p.point}", cfg.data_dir, cfg.gpus_per_host)
            _json(out / "fleets" / f"{name}_p{p.point}.json", doc)
            devices_of[p.point] = fleet_devices(p, cfg.gpus_per_host)
        stem = f"{name}_{study.model}"
        judge_file = out / "sailor_judge" / f"{stem}_ours.json"
        judged = read_json(judge_file)["points"] if judge_file.is_file() else None
        judge_file2 = out / "sailor_judge" / f"{stem}_ours_sailor.json"
        judged2 = read_json(judge_file2)["points"] if judge_file2.is_file() else None
        for p in study.points:
            rec_file = out / "ours" / f"{stem}_p{p.point}.json"
            rec = read_json(rec_file) if rec_file.is_file() else None
            if rec is not None:
                gbs = int(rec.get("batch", 0) or (p.plan or {}).get("gbs", 0))
                doc = ours_plan_config(rec, devices_of[p.point], gbs, str(rec_file))
                _json(
                    ours_dir
                    / name
                    / MODEL_DIRS[study.model]
                    / f"plan_config_{name}_p{p.point}.json",
                    doc,
                )
            rec2_file = out / "ours_sailor" / f"{stem}_p{p.point}.json"
            rec2 = read_json(rec2_file) if rec2_file.is_file() else None
            if rec2 is not None:
                rel = f"{name}/{MODEL_DIRS[study.model]}/plan_config_{name}_p{p.point}.json"
                _json(target_dir / rel, rec2["plan_config"])
            rows.append(
                (
                    name,
                    study,
                    p,
                    rec,
                    judged[p.point] if judged else None,
                    rec2,
                    judged2[p.point] if judged2 else None,
                )
            )
    inputs = load_inputs(cfg.data_dir)
    ours_judge_sailor = _predicted(sailor_dir, cfg.data_dir)
    ours_judge_ours = _predicted(ours_dir, cfg.data_dir)
    ours_judge_target = _predicted(target_dir, cfg.data_dir)
    table = []
    for name, study, p, rec, judged, rec2, judged2 in rows:
        rel = f"{name}/{MODEL_DIRS[study.model]}/plan_config_{name}_p{p.point}.json"
        base = {
            "study": name,
            "model": study.model,
            "point": p.point,
            "gpus_offered": " + ".join(f"{n} {g}@{z}" for (g, z), n in sorted(p.gpus.items())),
        }
        s_row = ours_judge_sailor.get(rel)
        s_pred = getattr(s_row, "prediction", None)
        usd_s = _gpu_usd_per_s(p.plan) if p.plan else float("nan")
        table.append(
            {
                **base,
                "planner": "sailor",
                "plan": f"sailor_plans/{rel}" if p.plan else "",
                "shape": _shape(p.plan),
                "planner_wall_s": p.search_time_s,
                "planner_setup_s": p.planner_init_s,
                "planner_estimate_s": p.planner_iter_time_s,
                "ours_judge_iter_time_s": s_pred.iter_time_s if s_pred else None,
                "ours_judge_usd_per_iter": s_pred.iter_time_s * usd_s if s_pred else None,
                "ours_judge_fits": _fits(s_pred, sailor_dir / rel, study.model, inputs),
                "ours_judge_note": getattr(s_row, "excluded", "") if s_row else "no plan",
                "sailor_judge_fits": True if p.sailor_sim else None,
                "sailor_judge_iter_time_s": p.sailor_sim["iter_time_s"] if p.sailor_sim else None,
                "sailor_judge_usd_per_iter": p.sailor_sim["usd_per_iter"] if p.sailor_sim else None,
                "sailor_judge_comm_usd_per_iter": (
                    p.sailor_sim["comm_usd_per_iter"] if p.sailor_sim else None
                ),
            }
        )
        o_row = ours_judge_ours.get(rel)
        o_pred = getattr(o_row, "prediction", None)
        odoc = None
        if rec is not None:
            odoc = json.loads((ours_dir / rel).read_text())
        usd_o = _gpu_usd_per_s(odoc) if odoc else float("nan")
        table.append(
            {
                **base,
                "planner": "ours (our runtime)",
                "plan": f"ours_plans/{rel}" if odoc else "",
                "shape": _shape(odoc),
                "planner_wall_s": rec.get("search_time_s") if rec else None,
                "planner_setup_s": None,
                "planner_estimate_s": rec.get("iteration_time_s") if rec else None,
                "ours_judge_iter_time_s": o_pred.iter_time_s if o_pred else None,
                "ours_judge_usd_per_iter": o_pred.iter_time_s * usd_o if o_pred else None,
                "ours_judge_fits": _fits(o_pred, ours_dir / rel, study.model, inputs),
                "ours_judge_note": (getattr(o_row, "excluded", "") if o_row else "no plan"),
                "sailor_judge_fits": judged.get("fits") if judged else None,
                "sailor_judge_iter_time_s": judged.get("iter_time_s") if judged else None,
                "sailor_judge_usd_per_iter": judged.get("usd_per_iter") if judged else None,
                "sailor_judge_comm_usd_per_iter": (
                    judged.get("comm_usd_per_iter") if judged else None
                ),
            }
        )
        if rec2 is not None:
            t_row = ours_judge_target.get(rel)
            t_pred = getattr(t_row, "prediction", None)
            tdoc = rec2["plan_config"]
            usd_t = _gpu_usd_per_s(tdoc)
            table.append(
                {
                    **base,
                    "planner": "ours (framework=sailor)",
                    "plan": f"ours_sailor_plans/{rel}",
                    "shape": _shape(tdoc),
                    "planner_wall_s": rec2.get("search_time_s"),
                    "planner_setup_s": rec2.get("load_time_s"),
                    "planner_estimate_s": rec2.get("iteration_time_s"),
                    "ours_judge_iter_time_s": t_pred.iter_time_s if t_pred else None,
                    "ours_judge_usd_per_iter": t_pred.iter_time_s * usd_t if t_pred else None,
                    "ours_judge_fits": _fits(t_pred, target_dir / rel, study.model, inputs),
                    "ours_judge_note": (getattr(t_row, "excluded", "") if t_row else "no plan"),
                    "sailor_judge_fits": judged2.get("fits") if judged2 else None,
                    "sailor_judge_iter_time_s": judged2.get("iter_time_s") if judged2 else None,
                    "sailor_judge_usd_per_iter": judged2.get("usd_per_iter") if judged2 else None,
                    "sailor_judge_comm_usd_per_iter": (
                        judged2.get("comm_usd_per_iter") if judged2 else None
                    ),
                }
            )
    frame = pd.DataFrame(table)
    atomic_write(out / "table.csv", lambda tmp: frame.to_csv(tmp, index=False, float_format="%.6g"))
    cols = [
        "study",
        "model",
        "point",
        "planner",
        "shape",
        "planner_wall_s",
        "ours_judge_iter_time_s",
        "sailor_judge_iter_time_s",
        "ours_judge_usd_per_iter",
        "sailor_judge_usd_per_iter",
    ]
    atomic_write_text(out / "table.md", _markdown(frame) + "\n" + _ratios(frame))
    print(frame[cols].to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    log.info("%d rows into %s", len(frame), out / "table.csv")
    return {"rows": len(frame)}


def _shape(plan: dict | None) -> str:
    """``pp×dp mbs m`` and the GPUs used per (type, tp), e.g. ``7x20 mbs1 A100-40/tp1:80``."""
    if not plan:
        return ""
    pl = plan["pipeline_list"][0]
    used: dict[str, int] = {}
    for st in pl["tmp_per_stage"]:
        for rep in st:
            k = f"{rep[0][0][0]}/tp{rep[1]}"
            used[k] = used.get(k, 0) + rep[1]
    dps = sorted(set(pl["dp"]))
    dp = str(dps[0]) if len(dps) == 1 else "/".join(map(str, pl["dp"]))
    gpus = " ".join(f"{k}:{v}" for k, v in sorted(used.items()))
    return f"{pl['num_stages']}x{dp} mbs{plan['mbs']} {gpus}"


def _cell(x, fmt: str, fits=None) -> str:
    if x is None or (isinstance(x, float) and x != x):
        return "—"
    text = format(x, fmt)
    return text + (" (OOM)" if fits is False else "")


def _markdown(frame: pd.DataFrame) -> str:
    """``table.csv`` as a Markdown table: per point Sailor's row, ours' row, ours' ratios."""
    lines = [
        "| study | model | point | GPUs offered | planner | plan (pp×dp, mbs, GPUs/tp) | "
        "planner wall s | ours' judge s/iter | Sailor's judge s/iter | ours' judge $/iter | "
        "Sailor's judge $/iter |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for _, r in frame.iterrows():
        lines.append(
            f"| {r.study} | {r.model} | {r.point} | {r.gpus_offered} | {r.planner} | "
            f"{r['shape'] or '—'} | {_cell(r.planner_wall_s, '.2f')} | "
            f"{_cell(r.ours_judge_iter_time_s, '.3f', r.ours_judge_fits)} | "
            f"{_cell(r.sailor_judge_iter_time_s, '.3f', r.sailor_judge_fits)} | "
            f"{_cell(r.ours_judge_usd_per_iter, '.3f')} | "
            f"{_cell(r.sailor_judge_usd_per_iter, '.3f')} |"
        )
    return "\n".join(lines) + "\n"


def _ratio(a, b, fits_a=None) -> str:
    if a is None or b is None or a != a or b != b:
        return "—"
    return f"{a / b:.2f}x" + (" (OOM)" if fits_a is False else "")


def _ratios(frame: pd.DataFrame) -> str:
    """Per point: each of ours' plans over Sailor's, under each judge, and the planners' wall
    times (Sailor's one-time table build in brackets)."""
    lines = [
        "| study | model | point | Sailor: plan | ours (framework=sailor): plan | "
        "ours/Sailor, ours' judge | ours/Sailor, Sailor's judge | "
        "ours (our runtime)/Sailor, ours' judge | ours (our runtime)/Sailor, Sailor's judge | "
        "wall s: Sailor (+setup) / ours (framework=sailor) / ours (our runtime) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (study, model, point), g in frame.groupby(["study", "model", "point"], sort=True):
        by = {r.planner: r for _, r in g.iterrows()}
        s, t, o = by.get("sailor"), by.get("ours (framework=sailor)"), by.get("ours (our runtime)")

        def cell(r, col):
            return None if r is None else r[col]

        setup = cell(s, "planner_setup_s")
        wall_s = _cell(cell(s, "planner_wall_s"), ".2f") + (
            f" (+{setup:.1f})" if setup is not None and setup == setup and setup > 0 else ""
        )

        def vs(r, judge, s=s):
            col = f"{judge}_iter_time_s"
            return _ratio(cell(r, col), cell(s, col), cell(r, f"{judge}_fits"))

        lines.append(
            f"| {study} | {model} | {point} | {cell(s, 'shape') or '—'} | "
            f"{cell(t, 'shape') or '—'} | {vs(t, 'ours_judge')} | {vs(t, 'sailor_judge')} | "
            f"{vs(o, 'ours_judge')} | {vs(o, 'sailor_judge')} | "
            f"{wall_s} / {_cell(cell(t, 'planner_wall_s'), '.1f')} / "
            f"{_cell(cell(o, 'planner_wall_s'), '.1f')} |"
        )
    return "\n".join(lines) + "\n"
