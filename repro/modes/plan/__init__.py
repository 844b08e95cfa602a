"""``mode=plan``: the planner (system/planner) on one fleet, the plan written as JSON.

Its options are in ``config.py`` (imported by the mode registry), its work in ``run.py``.
"""
