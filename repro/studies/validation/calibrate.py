"""In-situ compute calibration: one short run of our runtime per setting, on the emulated links.

    python repro/run.py mode=calibrate settings=results/validation/round4/settings.json \\
        results_dir=results/validation/round4 nice=-10      # its compute_profile.json

:mod:`~repro.studies.validation.profile` times each stage shape in processes of their own. On 2
cores that misses what a validation run shares the cores with: the emulation's packet delayer
and the other ranks, which compute or wait depending on the schedule. An oversubscribed
profile made the predictions of round 1 high, an idle one those of round 3 low
(``results/validation/FINDINGS.md``).

This calibration instead starts the setting's own emulated network (fresh namespaces, tag
``<prefix><setting>r0``), runs our runtime once on a *calibration layout* (a random rank map,
seed ``seed + 2000`` or the next seed whose table differs from the scored random layout's, which
uses ``seed + 1000``; the scheduled layout is made later, from this profile, and is recorded in
the predictions beside it), and keeps per stage the median forward and backward seconds per
micro-batch and the optimizer step after the warm-up iterations. The file has the format of
:mod:`~repro.studies.validation.profile` (``max_procs`` null), with one entry per setting, keyed
``<shape>@<setting>`` because the CPU sharing depends on the setting's links, not only on its
shape; :func:`~repro.studies.validation.profile.stage_times` prefers such an entry. It is still a
separate run made before the predictions are registered, never a scored run. What it cannot
carry: how much the CPU sharing differs between the calibration layout and a scored system's
schedule (a more communication-heavy schedule leaves the cores freer), and the Megatron and
DeepSpeed GPT's own compute, calibrated here with our stage shape.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

from repro.studies.validation.config import CALIBRATE_TAG_PREFIX, CalibrateConfig
from repro.studies.validation.profile import PROFILE_VERSION, load_profile, shape_key
from repro.studies.validation.settings import Setting, load_settings

log = logging.getLogger("repro.studies.validation.calibrate")

__all__ = [
    "CALIBRATION_SEED_OFFSET",
    "entry_key",
    "calibration_stages",
    "calibrate_setting",
    "calibrate",
]

CALIBRATION_SEED_OFFSET = 2000  # first seed tried, beside the scored random layout's
TAG_PREFIX = CALIBRATE_TAG_PREFIX


def entry_key(s: Setting) -> str:
    """The profile key of ``s``'s in-situ entry: its shape and its name."""
    return f"{shape_key(s)}@{s.name}"


def calibration_stages(s: Setting) -> tuple[list[list[int]], int]:
    """The calibration layout's stage table (stage x replica -> device index of ``s``) and its
    seed: the first from ``seed + 2000`` whose table is not the scored random layout's."""
    from repro.studies.validation.predict import RANDOM_LAYOUT_SEED_OFFSET
    from system.assignment import random_assignment

    scored = random_assignment(s.pp, s.dp, s.seed + RANDOM_LAYOUT_SEED_OFFSET).stages.tolist()
    for k in range(1000):
        seed = s.seed + CALIBRATION_SEED_OFFSET + k
        stages = random_assignment(s.pp, s.dp, seed).stages.tolist()
        if stages != scored or s.num_devices == 1:
            return stages, seed
    raise ValueError(f"setting {s.name!r}: no calibration layout differs from the scored one")


def calibrate_setting(
    s: Setting, index: int, *, tag_prefix: str = TAG_PREFIX, timeout_s: float = 300.0
) -> dict:
    """One in-situ run of ``s`` on its calibration layout; the profile entry of its shape."""
    from repro.studies.validation.measure import _run_ours, tag_for
    from repro.studies.validation.predict import scaled_cluster
    from system.cases import get_case
    from system.emulation import netns
    from system.emulation.plan import make_plan

    stages, layout_seed = calibration_stages(s)
    margin = max(0.5, 4.0 * float(scaled_cluster(s).delay_s.max()))
    plan = make_plan(
        get_case(s.case, "paper").subset(list(s.devices)),
        bandwidth_scale=s.bandwidth_scale,
        delay_scale=s.delay_scale,
        tag=tag_for(index, 0, tag_prefix),
    )
    plan.check_capacity()
    load0, t0 = os.getloadavg()[0], time.monotonic()
    with netns.Emulation(plan) as emu:
        run = _run_ours(s, {"stages": stages}, emu, margin, timeout_s)
    return {
        "key": entry_key(s),
        "method": "in_situ",
        "setting": s.name,
        "layout_stages": stages,
        "layout_seed": layout_seed,
        "processes": s.num_devices,
        "warmup": s.warmup_iters,
        "repeats": s.iters - s.warmup_iters,
        "fwd_s": run["run_fwd_s"],
        "bwd_s": run["run_bwd_s"],
        "opt_s": run["run_opt_s"],
        "iter_times_s": run["iter_times_s"],
        "wall_s": time.monotonic() - t0,
        "load_avg_1m_before": load0,
        "load_avg_1m_after": os.getloadavg()[0],
        "nice": os.nice(0),
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def calibrate(
    settings: list[Setting],
    *,
    tag_prefix: str = TAG_PREFIX,
    old: dict | None = None,
    timeout_s: float = 300.0,
) -> dict:
    """A profile document with one in-situ entry per setting of ``settings`` (entries of
    ``old`` are kept and their settings not run again)."""
    from repro.studies.validation.measure import cleanup_own
    from system.schema import git_state

    cleanup_own(tag_prefix)
    sha, dirty = git_state()
    entries = dict(old["entries"]) if old else {}
    for i, s in enumerate(settings):
        k = entry_key(s)
        if k in entries:
            continue
        entries[k] = calibrate_setting(s, i, tag_prefix=tag_prefix, timeout_s=timeout_s)
        e = entries[k]
        log.info(
            "calibrated %s (%s): fwd %s bwd %s opt %s, load %.1f",
            s.name,
            k,
            e["fwd_s"],
            e["bwd_s"],
            e["opt_s"],
            e["load_avg_1m_after"],
        )
    return {
        "profile_version": PROFILE_VERSION,
        "method": "in_situ",
        "git_sha": sha,
        "git_dirty": dirty,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpu_count": os.cpu_count(),
        "torch_threads_per_process": 1,
        "max_procs": None,
        "entries": entries,
    }


def run(cfg: CalibrateConfig) -> dict:
    from repro.studies.validation.measure import require_root
    from system.results import atomic_write_text

    require_root("the in-situ calibration")
    out = cfg.out or str(Path(cfg.results_dir) / "compute_profile.json")
    if cfg.nice:
        os.nice(cfg.nice)
    settings = load_settings(cfg.settings)
    if cfg.only:
        unknown = sorted(set(cfg.only) - {s.name for s in settings})
        if unknown:
            raise ValueError(f"only: unknown setting name(s) {unknown}")
        settings = [s for s in settings if s.name in set(cfg.only)]
    old = load_profile(out) if cfg.merge and Path(out).exists() else None
    prof = calibrate(settings, tag_prefix=cfg.tag_prefix, old=old, timeout_s=cfg.timeout_s)
    atomic_write_text(out, json.dumps(prof, indent=1) + "\n")
    print(f"wrote {out}: {len(prof['entries'])} shapes", file=sys.stderr)
    return {"out": out, "shapes": len(prof["entries"])}
