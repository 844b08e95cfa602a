"""``mode=link_sharing``: one step of the link-sharing experiment
(:mod:`repro.studies.link_sharing.experiment`) on the folder ``results_dir``.

    python repro/run.py mode=link_sharing step=register results_dir=results/emulation/sharing
    python repro/run.py mode=link_sharing step=measure results_dir=results/emulation/sharing
    python repro/run.py mode=link_sharing step=verdict results_dir=results/emulation/sharing

``register`` writes ``predictions.json`` with the git revision; ``measure`` (root) the measured
runs into ``measured.csv``; ``verdict`` scores them into ``verdict.{csv,md}`` and prints the
table.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pandas as pd

from repro.studies.link_sharing import experiment as sc
from repro.studies.link_sharing.config import LinkSharingConfig
from system.results import atomic_write_text
from system.schema import git_state

log = logging.getLogger(__name__)

__all__ = ["run"]


def run(cfg: LinkSharingConfig) -> dict:
    out = Path(cfg.results_dir)
    reg_path = out / "predictions.json"
    if cfg.step == "register":
        out.mkdir(parents=True, exist_ok=True)
        sha, dirty = git_state()
        reg = {**sc.predict(sc.SharingExperiment()), "git_sha": sha, "git_dirty": dirty}
        atomic_write_text(reg_path, json.dumps(reg, indent=1) + "\n")
        print(reg_path)
        return {"written": str(reg_path)}
    reg, exp = sc.read_registration(reg_path)
    if cfg.step == "measure":
        sha, dirty = git_state()
        rows = [{**r, "git_sha": sha, "git_dirty": dirty} for r in sc.measure(exp)]
        atomic_write_text(out / "measured.csv", pd.DataFrame(rows).to_csv(index=False))
        print(out / "measured.csv")
        return {"written": str(out / "measured.csv")}
    table = sc.verdict(reg, sc.read_measured(out / "measured.csv"))
    atomic_write_text(out / "verdict.csv", table.to_csv(index=False, float_format="%.4g"))
    atomic_write_text(out / "verdict.md", sc.verdict_markdown(table) + "\n")
    print(sc.verdict_markdown(table))
    return {"written": str(out / "verdict.md")}
