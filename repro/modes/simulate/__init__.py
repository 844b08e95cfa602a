"""``mode=simulate``: the paper's Fig. 3 experiment in the performance simulator.

Its options are in ``config.py`` (imported by the mode registry), its work in ``run.py``.
"""
