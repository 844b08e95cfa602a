"""Reporting: everything that turns a study's results store into tables, figures and verdicts.

It reads only ``results/<study>/runs.parquet`` (:func:`system.results.read_rows`) and, for the
scheduler claims, the ablation table; it never runs a model.

- :mod:`~repro.report.build`: ``REPORT.md`` with ``best.csv``, ``variance.csv``, ``claims.csv`` and
  the figures (``mode=report``), and ``mode=collect``;
- :mod:`~repro.report.claims`: the paper's claims checked against the rows;
- :mod:`~repro.report.protocols`: the claims under each baseline placement protocol, ``claims.md``;
- :mod:`~repro.report.variance`: repeats of a setting, the best configuration per setting;
- :mod:`~repro.report.summary`: the per-setting summary of a simulated grid (speed-ups) and its
  console tables;
- :mod:`~repro.report.tables`: Markdown tables (the one writer);
- :mod:`~repro.report.figures`: Fig. 3 and Fig. 4 analogues;
- :mod:`~repro.report.emulation`: simulator vs emulated runs (``mode=emulation_report``);
- :mod:`~repro.report.baselines`: real baselines vs our runtime (``mode=compare_baselines``);
- :mod:`~repro.report.wandb_log`: the wandb mirror of a study.
"""
