"""``mode=scheduler_worth``: the scheduler's layout against the layouts a user would try first.

Its options are in ``config.py`` (imported by the mode registry), its work in ``run.py``.
"""
