"""``mode=scheduler_ablation``: Fig. 4's data, best TOTAL against trials per search method.

Its options are in ``config.py`` (imported by the mode registry), its work in ``run.py``.
"""
