"""``mode=external``: predict a peer's published training runs from their plans and score the
predictions against the runs that carry measurements.

``source=sailor`` (the one source so far): every ``plan_config_*.json`` under ``plans`` is
predicted by the model of Sailor's framework (:mod:`system.external.sailor.framework`, on the
plans' own per-layer profiles and link fits, read from ``data_dir``, by default the plans
folder's parent), its all-reduces by ``dp_collective``'s algorithm. Writes into ``results_dir``:

- ``predictions.csv`` — one row per plan (``plan`` relative to ``plans``), the predicted
  iteration and its parts, the predicted peak memory; an excluded plan keeps its row and reason;
- ``warnings.csv`` — the data defects the model worked around, per plan;
- where plans carry a measurement: ``errors.csv`` (signed and absolute error per plan, beside
  Sailor's own simulator; the logged gradient reduction beside its prediction), ``REPORT.md``
  (MAPE per set, per-plan table, the logged reduction per set and plan, excluded plans,
  warnings, constants) and ``predicted_vs_measured.png``.

Every input is checked with the config, before any prediction runs or any folder is made
(:class:`repro.studies.external.config.ExternalConfig` calls :func:`system.external.sailor.check.
check_inputs`: one line naming the file and what is wrong, exit 2), and the files are written as
one set (:func:`system.results.write_set`): a reader sees the previous run's files or this
run's, never a mix, and a failing run leaves the previous set as it was.

Prints the MAPE table. Nothing is fitted.
"""

from __future__ import annotations

import logging
import shlex
import sys
from pathlib import Path

import baselines.deepspeed.schedule  # noqa: F401  (registers DeepSpeed's op order for the replay)
from repro.studies.external.config import ExternalConfig
from repro.studies.external.report import plot_predicted_vs_measured, render_report
from repro.studies.external.score import (
    errors_frame,
    mape_table,
    predictions_frame,
    warnings_frame,
)
from system.external.sailor.predict import predict_plans
from system.results import write_set

__all__ = ["run"]

log = logging.getLogger("repro.external")
FIGURE = "predicted_vs_measured.png"
# The set this mode writes (``errors.csv``, the figure and the report only where plans are
# measured): every one of them is replaced or removed by each run.
OUTPUTS = ("predictions.csv", "warnings.csv", "errors.csv", FIGURE, "REPORT.md")


def _csv(frame, path) -> None:
    frame.to_csv(path, index=False, float_format="%.6g")


def run(cfg: ExternalConfig) -> dict:
    rows = predict_plans(cfg.plans, cfg.data_dir, dp_collective=str(cfg.dp_collective))
    out = Path(cfg.results_dir)
    measured = [r for r in rows if r.real_s is not None]
    table = mape_table(rows)
    with write_set(out, name="external", owns=OUTPUTS) as stage:
        _csv(predictions_frame(rows), stage / "predictions.csv")
        _csv(warnings_frame(rows), stage / "warnings.csv")
        if measured:
            _csv(errors_frame(rows), stage / "errors.csv")
            plot_predicted_vs_measured(rows, stage / FIGURE)
            command = "python repro/run.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
            report = render_report(rows, command=command, figure=FIGURE)
            (stage / "REPORT.md").write_text(report, encoding="utf-8")
    if measured:
        print(table.to_string(index=False, float_format=lambda x: f"{x:.1f}"))
    excluded = [r.plan for r in rows if r.prediction is None]
    log.info(
        "%d plans predicted, %d excluded, into %s", len(rows) - len(excluded), len(excluded), out
    )
    return {
        "plans": len(rows),
        "excluded": excluded,
        "mape_pct": {t["set"]: round(float(t["mape_pct"]), 2) for _, t in table.iterrows()},
    }
