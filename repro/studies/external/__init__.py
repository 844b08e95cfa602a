"""``mode=external``: a peer's published GPU runs predicted and scored.

Its options are in ``config.py`` (imported by the mode registry, they check every input file),
its work in ``run.py``; the tables of predictions and errors (``score.py``), ``REPORT.md`` and
its figure (``report.py``) and the precision of Sailor's V100 profiles (``precision.py``) are
this study's. The model of Sailor's framework it predicts with is in :mod:`system.external`.
"""
