"""``mode=sensitivity``: how the case-5 claims move with the simulator's untested assumptions.

Its options are in ``config.py`` (imported by the mode registry), its work in ``run.py``.
"""
