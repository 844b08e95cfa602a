"""``mode=predict``: register the simulator's predictions for the validation settings.

    python repro/run.py mode=predict predict.settings=results/validation/settings.json \\
        predict.profile=results/validation/compute_profile.json \\
        predict.out=results/validation/predictions.json

Keys (``predict.*``): ``settings`` (JSON settings file, :mod:`repro.validation.settings`),
``profile`` (compute profile from ``python -m repro.validation.profile``), ``out`` (the
predictions JSON; default ``<results_dir>/predictions.json``), ``only`` (setting names; default
all), ``schedule_trials`` (genetic scheduler trials for the scheduled layout). Commit the
written file before measuring (:mod:`repro.validation.measure`); the score refuses otherwise.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from omegaconf import DictConfig

from repro.modes import mode_options
from repro.validation.predict import predict_file
from system.results import atomic_write_text

log = logging.getLogger(__name__)

DEFAULTS = {
    "settings": "results/validation/settings.json",
    "profile": "results/validation/compute_profile.json",
    "out": None,
    "only": None,
    "schedule_trials": 300,
}


def run(cfg: DictConfig) -> dict:
    o = mode_options(cfg, "predict", DEFAULTS)
    out = Path(o["out"] or Path(str(cfg.results_dir)) / "predictions.json")
    trials = int(o["schedule_trials"])
    if trials < 1:
        raise ValueError(f"mode=predict: predict.schedule_trials must be >= 1, got {trials}")
    doc = predict_file(
        o["settings"],
        o["profile"],
        schedule_trials=trials,
        only=list(o["only"]) if o["only"] else None,
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
