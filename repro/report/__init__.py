"""Reporting: everything that turns a study's results store into tables, figures and verdicts.

It reads only ``results/<study>/runs.parquet`` (:func:`system.results.read_rows`) and, for the
scheduler claims, the ablation table; it never runs a model.

- :mod:`~repro.report.build`: ``REPORT.md`` with ``best.csv``, ``variance.csv``, ``claims.csv`` and
  the figures (``python -m repro.report results/<study>``);
- :mod:`~repro.report.claims`: the paper's claims checked against the rows;
- :mod:`~repro.report.protocols`: the claims under each baseline placement protocol, ``claims.md``;
- :mod:`~repro.report.variance`: repeats of a setting, the best configuration per setting;
- :mod:`~repro.report.summary`: the per-setting summary of a simulated grid (speed-ups) and its
  console tables;
- :mod:`~repro.report.tables`: Markdown tables (the one writer);
- :mod:`~repro.report.figures`: Fig. 3 and Fig. 4 analogues;
- :mod:`~repro.report.emulation`: simulator vs emulated runs;
- :mod:`~repro.report.wandb_log`: the wandb mirror of a study.
"""

from __future__ import annotations

from repro.report.build import ReportPaths, build_report, main
from repro.report.tables import markdown_table

__all__ = ["ReportPaths", "build_report", "main", "markdown_table"]
