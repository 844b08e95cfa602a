"""``mode=schedule``: one case's layout search (paper §3.4), written as JSON.

Its options are in ``config.py`` (imported by the mode registry), its work in ``run.py``.
"""
