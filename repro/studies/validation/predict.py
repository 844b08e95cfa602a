"""Registered predictions: the simulator's iteration time per validation setting and system.

    python repro/run.py mode=predict settings=results/validation/round6/settings.json \\
        profile=results/validation/round6/compute_profile.json \\
        results_dir=results/validation/round6      # its predictions.json

Every prediction uses the compute profile (:mod:`~repro.studies.validation.profile`), never a
measured validation run, and fixes what the measurement must run: the scheduled layout (genetic
scheduler on the scaled cluster, seeded), the random layout (seeded), and the baselines at
launch placement (rank i on emulated device i; Megatron ``rank = dp + DP·pp``, DeepSpeed ``rank
= pipe·DP + data``) or, for ``<framework>_topology``, the rank map the baselines' topology-aware
search picks (:func:`baselines.placement.search_placement`) with this simulator, transport and
profile: the same search the grid runs, so both placements of the fair comparison are scored.
The file carries the full git revision it was computed at and the hash of the settings and
profile files; it is committed before any measured run, and
:mod:`~repro.studies.validation.score` checks that order in git.

Compute: per stage, the profiled forward and backward seconds per micro-batch and the AdamW
step (ZeRO-1 shards the step over ``dp``). Communication: the simulator's gloo transport on the
emulated cluster (bandwidths × ``bandwidth_scale``, delays × ``delay_scale``).
"""

from __future__ import annotations

import hashlib
import subprocess
import time
from pathlib import Path

import numpy as np

from baselines.placement import Placement
from repro.studies.validation.config import PredictConfig
from repro.studies.validation.profile import load_profile, stage_times
from repro.studies.validation.settings import (
    Setting,
    baseline_placement,
    load_rules,
    load_settings,
    read_document,
)

__all__ = [
    "PREDICTION_VERSION",
    "git_revision",
    "sha256_file",
    "scaled_cluster",
    "baseline_kwargs",
    "predict_setting",
    "predict_file",
    "load_predictions",
    "run",
]

PREDICTION_VERSION = 1
RANDOM_LAYOUT_SEED_OFFSET = 1000  # the scored random layout's seed: the setting's seed + this
_ROOT = Path(__file__).resolve().parents[3]


def baseline_kwargs(system: str) -> dict:
    """simulate_1f1b_ring's arguments that make it ``system``'s model (the baselines' own)."""
    from baselines.deepspeed.perf import RING_KWARGS as DEEPSPEED
    from baselines.megatron.perf import RING_KWARGS as MEGATRON

    known = {"megatron": MEGATRON, "deepspeed": DEEPSPEED}
    if system not in known:
        raise ValueError(f"no baseline model for system {system!r}; known: {sorted(known)}")
    return dict(known[system])


def git_revision(root: Path = _ROOT) -> tuple[str, bool]:
    """(full HEAD sha, whether tracked files differ from it); ("unknown", False) outside git."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=root,
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
        )
        return sha, dirty
    except (OSError, subprocess.SubprocessError):
        return "unknown", False


def sha256_file(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def scaled_cluster(s: Setting):
    """The emulated cluster of ``s``: the case's devices, links scaled as the emulation does."""
    from system.cases import get_case
    from system.emulation.plan import make_plan

    cluster = get_case(s.case, "paper").subset(list(s.devices))
    return make_plan(
        cluster, bandwidth_scale=s.bandwidth_scale, delay_scale=s.delay_scale, tag="predict"
    ).scaled_cluster()


def _compute(entry: dict, pp: int, opt_shards: int = 1):
    from system.simulator import StageCompute

    return StageCompute(
        fwd_s=tuple(entry["fwd_s"][:pp]),
        bwd_s=tuple(entry["bwd_s"][:pp]),
        opt_s=tuple(x / opt_shards for x in entry["opt_s"][:pp]),
    )


def predict_setting(s: Setting, profile: dict, *, schedule_trials: int = 300) -> list[dict]:
    """One prediction per system of ``s`` (module docstring), each with what the run must use."""
    from baselines.placement import search_placement
    from baselines.space import BaselineConfig
    from system.assignment import random_assignment
    from system.scheduler import schedule
    from system.simulator import simulate_ours
    from system.simulator.baseline_training import simulate_1f1b_ring
    from system.simulator.transfers import GLOO
    from system.workload import tasklet_sizes

    entry = stage_times(profile, s)
    wl = s.workload
    cluster = scaled_cluster(s)
    m = wl.micro_batches(s.dp)
    out = []
    for system in s.systems:
        rec: dict = {"setting": s.name, "system": system}
        if system in ("ours", "ours_random"):
            if system == "ours":
                res = schedule(
                    cluster,
                    tasklet_sizes(wl, s.pp, s.dp),
                    pp=s.pp,
                    dp=s.dp,
                    method="genetic",
                    seed=s.seed,
                    trials=schedule_trials,
                    time_limit_s=60,
                )
                assign, layout_seed = res.assignment, s.seed
            else:
                layout_seed = s.seed + RANDOM_LAYOUT_SEED_OFFSET
                assign = random_assignment(s.pp, s.dp, layout_seed)
            compute = _compute(entry, s.pp)
            sim = simulate_ours(cluster, assign, wl, compute=compute, system=system)
            rec.update(
                layout="scheduled" if system == "ours" else "random",
                layout_seed=layout_seed,
                stages=assign.stages.tolist(),
            )
        else:
            framework, placement = baseline_placement(system)
            zero = 1 if framework == "deepspeed" else None
            compute = _compute(entry, s.pp, opt_shards=s.dp if zero else 1)

            def simulate(rank_map=None, framework=framework, compute=compute):
                return simulate_1f1b_ring(
                    cluster,
                    wl,
                    tp=1,
                    pp=s.pp,
                    dp=s.dp,
                    transport=GLOO,
                    compute=compute,
                    rank_map=rank_map,
                    **baseline_kwargs(framework),
                )

            rec.update(layout=placement, zero=zero)
            if placement == Placement.launch:
                sim = simulate()
            else:  # the grid search's placement, ranked by this very simulator and profile
                config = BaselineConfig(
                    system=framework,
                    tp=1,
                    pp=s.pp,
                    dp=s.dp,
                    micro_batch_size=s.micro_batch_size,
                    zero=zero or 0,
                )
                sim, rm = search_placement(
                    cluster, wl, config, lambda cand: simulate(list(cand.devices))
                )
                rec.update(rank_map=list(rm.devices), placement_how=rm.how)
        f, b, opt = compute.per_stage(s.pp)
        busy = float(np.max(m * (f + b) + opt))
        rec.update(
            predicted_iter_time_s=float(sim.iter_time_s),
            predicted_compute_s=busy,
            predicted_compute_share=busy / float(sim.iter_time_s),
            breakdown={k: v for k, v in sim.breakdown.items() if isinstance(v, int | float)},
        )
        out.append(rec)
    return out


def predict_file(
    settings_path: str | Path,
    profile_path: str | Path,
    *,
    schedule_trials: int = 300,
    only: list[str] | None = None,
) -> dict:
    """The predictions document for every setting of ``settings_path`` (or those in ``only``)."""
    settings = load_settings(settings_path)
    if only:
        unknown = sorted(set(only) - {s.name for s in settings})
        if unknown:
            raise ValueError(f"predict: unknown setting name(s) {unknown}")
        settings = [s for s in settings if s.name in set(only)]
    profile = load_profile(profile_path)
    sha, dirty = git_revision()
    rows = [
        p for s in settings for p in predict_setting(s, profile, schedule_trials=schedule_trials)
    ]
    return {
        "prediction_version": PREDICTION_VERSION,
        "git_revision": sha,
        "git_dirty": dirty,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "settings_file": str(settings_path),
        "settings_sha256": sha256_file(settings_path),
        "profile_file": str(profile_path),
        "profile_sha256": sha256_file(profile_path),
        "schedule_trials": schedule_trials,
        "settings": [s.to_dict() for s in settings],
        "rules": load_rules(settings_path),
        "predictions": rows,
    }


def load_predictions(path: str | Path) -> dict:
    return read_document(
        path,
        "predictions file",
        lambda d: d.get("prediction_version") == PREDICTION_VERSION and "predictions" in d,
        f"not a version-{PREDICTION_VERSION} predictions document",
    )


def run(cfg: PredictConfig) -> dict:
    """``mode=predict``: write the predictions file."""
    import json
    import logging

    from system.results import atomic_write_text

    log = logging.getLogger(__name__)
    out = Path(cfg.out or Path(cfg.results_dir) / "predictions.json")
    doc = predict_file(
        cfg.settings, cfg.profile, schedule_trials=cfg.schedule_trials, only=cfg.only
    )
    atomic_write_text(out, json.dumps(doc, indent=1) + "\n")
    for p in doc["predictions"]:
        log.info(
            "predict %-14s %-11s %7.3f s (compute share %.2f)",
            p["setting"],
            p["system"],
            p["predicted_iter_time_s"],
            p["predicted_compute_share"],
        )
    log.info(
        "mode=predict: %d predictions at %s%s -> %s",
        len(doc["predictions"]),
        doc["git_revision"][:10],
        " (dirty tree)" if doc["git_dirty"] else "",
        out,
    )
    return {
        "predictions": len(doc["predictions"]),
        "out": str(out),
        "git_revision": doc["git_revision"],
        "git_dirty": doc["git_dirty"],
    }
