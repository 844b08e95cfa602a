"""``mode=collectives``: one step of the all-reduce experiment
(:mod:`repro.studies.collectives.experiment`) on the folder ``results_dir``.

    python repro/run.py mode=collectives step=register results_dir=results/emulation/collectives
    python repro/run.py mode=collectives step=measure results_dir=results/emulation/collectives
    python repro/run.py mode=collectives step=posthoc results_dir=results/emulation/collectives
    python repro/run.py mode=collectives step=verdict results_dir=results/emulation/collectives

``register`` writes ``predictions.csv`` for ``experiment.json`` (the default experiment, written
there, when absent; an existing registration is never rewritten); ``measure`` (root) the
measured runs into ``measured.csv``; ``posthoc`` the current model's predictions of the
registered experiment into ``posthoc.csv`` (made after the measurement, they are scored beside
the registered ones, never as the registered verdict); ``verdict`` scores them into
``verdict.{csv,md}`` and prints the table.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pandas as pd

from repro.studies.collectives import experiment as cc
from repro.studies.collectives.config import CollectivesConfig
from system.results import atomic_write_text
from system.schema import git_state

log = logging.getLogger(__name__)

__all__ = ["run"]


def run(cfg: CollectivesConfig) -> dict:
    out = Path(cfg.results_dir)
    sha, dirty = git_state()
    if cfg.step == "register":
        exp = cc.read_experiment(out) if (out / "experiment.json").exists() else None
        exp = exp or cc.CollectivesExperiment()
        pred = cc.predict(exp).assign(git_sha=sha, git_dirty=dirty)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "experiment.json", json.dumps(exp.to_json(), indent=1) + "\n")
        atomic_write_text(out / "predictions.csv", pred.to_csv(index=False))
        print(out / "predictions.csv")
        return {"written": str(out / "predictions.csv")}
    exp, pred = cc.read_registration(out)
    if cfg.step == "measure":
        rows = [{**r, "git_sha": sha, "git_dirty": dirty} for r in cc.measure(exp, pred)]
        atomic_write_text(out / "measured.csv", pd.DataFrame(rows).to_csv(index=False))
        print(out / "measured.csv")
        return {"written": str(out / "measured.csv")}
    if cfg.step == "posthoc":
        post = cc.predict(exp).assign(git_sha=sha, git_dirty=dirty)
        atomic_write_text(out / "posthoc.csv", post.to_csv(index=False))
        print(out / "posthoc.csv")
        return {"written": str(out / "posthoc.csv")}
    post = cc.read_predictions(out / "posthoc.csv", exp) if (out / "posthoc.csv").exists() else None
    table = cc.verdict(pred, cc.read_measured(out / "measured.csv"), exp=exp, posthoc=post)
    atomic_write_text(out / "verdict.csv", table.to_csv(index=False, float_format="%.4g"))
    atomic_write_text(out / "verdict.md", cc.verdict_markdown(table) + "\n")
    print(cc.verdict_markdown(table))
    return {"written": str(out / "verdict.md")}
