"""``mode=sailor_planner``: Sailor's planner on its own studies beside ours.

Its options are in ``config.py`` (imported by the mode registry), its work in ``run.py``.
"""
